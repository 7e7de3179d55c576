"""The batch entry's verdicts for ``GpuPanes`` (``judge_many``: each row of a batch late, a duplicate or an
overlap, and the watermarks the accepted rows leave), decided as the row entry (``gpucost.streams.panes``,
``is_late`` and ``admit``) decides them in arrival order, without changing any state; ``add_many``
(``gpucost.streams.pane_batch``) then takes the accepted rows. Kept apart from it for size.
"""

from __future__ import annotations

from bisect import insort

import numpy as np

from gpucost.streams.pane_rules import KINDS, NO_TS, NUMA, TRACE, jump, overlaps, pane_closed, who_code
from gpucost.streams.pane_totals import PaneRows, PaneTotals, Verdicts, nearest_gap
from gpucost.streams.runs import Levels, runs

__all__ = ["PaneVerdicts"]


class PaneVerdicts:
    """``judge_many`` and what it reads of ``GpuPanes``' state; ``PaneBatch`` extends it."""

    pane_ns: int
    lateness_ns: int
    max_jump_ns: int
    _max_ts: dict[str, int]
    _pending: dict[str, int]
    _open: dict[str, dict[int, PaneTotals]]
    _forgotten: int | None

    def judge_many(self, rows: PaneRows) -> Verdicts:
        """Each row late, a duplicate or an overlap, as ``is_late`` and ``admit`` decide it row by row in
        arrival order; and the watermarks the accepted rows leave. Changes nothing here (``add_many`` does).
        Late rows' watermarks: ``watermarks_before``."""
        pane_ns, lateness_ns, max_jump_ns = self.pane_ns, self.lateness_ns, self.max_jump_ns
        names, starts, ends, ts = rows.names, rows.starts, rows.ends, rows.ts_ns
        group = rows.group
        pane = ts - ts % pane_ns
        # each GPU's running maximum from where the state left it; its largest may be a pending jump
        floor = NO_TS if self._forgotten is None else self._forgotten
        max0 = np.array([self._max_ts.get(name, floor) for name in names], np.int64)
        pending0 = {j: self._pending[name] for j, name in enumerate(names) if name in self._pending}
        levels = Levels(
            np.concatenate([ts, max0[max0 != NO_TS], np.array(list(pending0.values()), np.int64)]), len(names)
        )
        width = levels.width
        key0 = np.arange(len(names)) * width + np.where(max0 == NO_TS, 0, levels.of(max0))

        def running(effective: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            """Each row's running maximum key over ``effective`` (``upto``; ``NO_TS``: moves nothing), that
            maximum as a time (``high``), and the maximum before the row (``before``)."""
            upto = (
                np.maximum(
                    np.maximum.accumulate(group * width + np.where(effective == NO_TS, 0, levels.of(effective))),
                    key0[group],
                )
                if len(ts)
                else np.zeros(0, np.int64)
            )
            at_level = upto - group * width
            high = np.where(at_level > 0, levels.time(np.maximum(at_level, 1)), NO_TS)
            before = np.empty_like(high)
            before[1:] = high[:-1]
            before[starts] = max0
            return upto, high, before

        def watermarks(moves: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[int, int | None]]:
            """``running`` over the rows that ``moves``, with the jump rule (``jump``), and each GPU's pending
            jump after the batch where it may have one. Only a GPU with a row further than ``max_jump_ns``
            ahead of the maximum before it, or a pending jump in the state, can differ from the plain running
            maximum: those few go row by row, in arrival order."""
            effective = np.where(moves, ts, NO_TS)
            upto, high, before = running(effective)
            ahead = moves & (before != NO_TS) & (ts > before + max_jump_ns)
            pending: dict[int, int | None] = {}
            for j in sorted(set(group[ahead].tolist()) | set(pending0)):
                top, held = (None if max0[j] == NO_TS else int(max0[j])), pending0.get(j)
                for p in range(int(starts[j]), int(ends[j])):
                    if moves[p]:  # a late row lies below ``top``: ``jump`` leaves both as they are
                        top, held = jump(top, held, int(ts[p]), max_jump_ns)
                    effective[p] = NO_TS if top is None else top
                pending[j] = held
            if pending:
                upto, high, before = running(effective)
            return upto, high, before, pending

        # a refused row moves no watermark. A late row cannot (it lies below it); a duplicate or an overlap
        # can (it may lie above, or confirm a jump), so the watermarks are taken again without the refused
        # rows until they agree: each round settles at least the next row in arrival order, and a batch
        # where no refused row lies above the maximum before it takes one
        can_move = rows.kind != TRACE
        moves = can_move
        while True:
            upto, high, before, pending = watermarks(moves)
            late = pane_closed(ts, before, pane_ns, lateness_ns)
            dup, overlap = self._refusals(rows, group, pane, late)
            settled = can_move & ~(dup | overlap)
            if np.array_equal(settled, moves) or moves is can_move and not (can_move & ~settled & (ts > before)).any():
                return Verdicts(late, dup, overlap, before, levels, upto, high, pending)
            moves = settled

    def watermarks_before(self, verdicts: Verdicts, positions: np.ndarray) -> list[int]:
        """The watermark each row at ``positions`` met (where it is late: what its dead letter names)."""
        return (verdicts.before[positions] - self.lateness_ns).tolist()  # type: ignore[no-any-return]

    def _refusals(
        self, rows: PaneRows, group: np.ndarray, pane: np.ndarray, late: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """The on-time rows refused as duplicates (their (GPU, kind, pid, ts_ns) an earlier on-time row, or an
        open pane here, holds) and as overlaps (``overlaps``).

        An overlap depends on which earlier samples were taken, so it is decided in arrival order; but only
        where it can occur: a (GPU, kind, pid, pane) with two distinct times closer than three quarters of
        the larger of their intervals (no pair of neighbours that close, no pair at all), or one an open
        pane holds counted times of. Those few go one by one, as ``admit`` does (``_in_order``).
        Traces are never overlaps (a process makes many calls a nanosecond apart); a ``blas`` trace at the
        ``ts_ns`` of an earlier one of its process is a duplicate (its FLOPs would count twice), a ``launch``
        trace never (it sums nothing)."""
        n = len(rows.ts_ns)
        dup, overlap = np.zeros(n, bool), np.zeros(n, bool)
        blas = np.zeros(n, bool)
        blas[list(rows.flops)] = True
        checked = ~late & ((rows.kind != TRACE) | blas)
        on_time = np.flatnonzero(checked)
        who = who_code(group[on_time], rows.kind[on_time].astype(np.int64), rows.pid[on_time])
        ts = rows.ts_ns[on_time]
        order = np.lexsort((ts, who))  # stable: equal keys stay in arrival order
        who, ts, where = who[order], ts[order], on_time[order]
        same = who[1:] == who[:-1]
        dup[where[1:][same & (ts[1:] == ts[:-1])]] = True
        # neighbouring distinct times, each with the largest interval of the rows at it
        firsts, _ = runs(who, ts)
        interval = np.maximum.reduceat(rows.interval_ms[where], firsts) if len(firsts) else np.zeros(0, np.int64)
        w, t, in_pane = who[firsts], ts[firsts], pane[where[firsts]]
        near = (
            (w[1:] == w[:-1])
            & (in_pane[1:] == in_pane[:-1])
            & overlaps(t[1:] - t[:-1], np.maximum(interval[1:], interval[:-1]))
            & (rows.kind[where[firsts[1:]]] < NUMA)
        )
        suspect: set[tuple[int, int]] = set(zip(w[1:][near].tolist(), in_pane[1:][near].tolist()))
        for j, name in enumerate(rows.names):
            span = slice(int(rows.starts[j]), int(rows.ends[j]))
            for start, open_pane in self._open.get(name, {}).items():
                for p in (np.flatnonzero((pane[span] == start) & checked[span]) + rows.starts[j]).tolist():
                    kind, pid = KINDS[rows.kind[p]], int(rows.pid[p])
                    if rows.kind[p] < NUMA and (kind, pid) in open_pane.seen:
                        suspect.add((who_code(j, int(rows.kind[p]), pid), start))
                    elif open_pane.holds(kind, pid, int(rows.ts_ns[p])):
                        dup[p] = True
        if suspect:
            # the rows of each suspect (who, pane), found on dense codes of both rather than row by row in Python
            # (a batch's every on-time row was once looked up here: the open panes make a suspect of most batches)
            picked = np.array(sorted(suspect), np.int64).reshape(-1, 2)
            at_pane = pane[where]
            _, who_codes = np.unique(np.concatenate([who, picked[:, 0]]), return_inverse=True)
            _, pane_codes = np.unique(np.concatenate([at_pane, picked[:, 1]]), return_inverse=True)
            code = who_codes * (int(pane_codes.max()) + 1) + pane_codes
            hit = np.flatnonzero(np.isin(code[: len(who)], code[len(who) :]))
            members: dict[tuple[int, int], list[int]] = {}
            for k, p, start in zip(who[hit].tolist(), where[hit].tolist(), at_pane[hit].tolist()):
                members.setdefault((k, start), []).append(p)
            for (k, start), positions in members.items():
                self._in_order(rows, sorted(positions), rows.names[k >> 35], start, dup, overlap)
        return dup, overlap

    def _in_order(
        self, rows: PaneRows, positions: list[int], gpu: str, start: int, dup: np.ndarray, overlap: np.ndarray
    ) -> None:
        """Duplicates and overlaps of one (GPU, kind, pid, pane)'s on-time rows, in arrival order, as
        ``admit`` decides them (on a copy of the pane's counted times: nothing here changes)."""
        key = (KINDS[rows.kind[positions[0]]], int(rows.pid[positions[0]]))
        held = self._open.get(gpu, {}).get(start)
        times = list(held.seen.get(key, ())) if held is not None else []
        for p in positions:
            ts = int(rows.ts_ns[p])
            gap = nearest_gap(times, ts)
            dup[p], overlap[p] = gap == 0, gap is not None and gap > 0 and overlaps(gap, int(rows.interval_ms[p]))
            if gap != 0 and not overlap[p]:
                insort(times, ts)
