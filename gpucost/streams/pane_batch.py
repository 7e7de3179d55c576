"""The batch entry of ``GpuPanes`` (``judge_many`` then ``add_many``: a batch's rows as columns), over the
state the row entry (``gpucost.streams.panes``) keeps; it decides every row as the row entry would in
arrival order (``tests/test_operator_entries.py`` holds them to it). Kept apart for size: the row entry is
the definition, this is the same rules over arrays.
"""

from __future__ import annotations

from bisect import insort

import numpy as np

from gpucost.streams.pane_rules import (
    GPU,
    KINDS,
    NO_TS,
    NUMA,
    PROC,
    TRACE,
    gpu_sums,
    jump,
    overlaps,
    pane_closed,
    process_sums,
    who_code,
)
from gpucost.streams.pane_totals import (
    EFFICIENCY_SUMS,
    PaneColumns,
    PaneRows,
    PaneTotals,
    Verdicts,
    nearest_gap,
    objects,
)
from gpucost.streams.runs import Levels, runs
from gpucost.streams.tables import UNATTRIBUTED, Tenant

__all__ = ["PaneBatch"]


class PaneBatch:
    """The batch entry; ``GpuPanes`` extends it and holds the state."""

    pane_ns: int
    lateness_ns: int
    idle_threshold_cp: int
    max_jump_ns: int
    _max_ts: dict[str, int]
    _pending: dict[str, int]
    _open: dict[str, dict[int, PaneTotals]]
    _forgotten: int | None

    def _set_max_ts(self, gpu_uuid: str, ts_ns: int, pending: int | None) -> None:
        if pending is None and ts_ns == self._forgotten and gpu_uuid not in self._max_ts:
            return  # still at the floor: nothing of its own to keep (both entries take this path)
        self._max_ts[gpu_uuid] = ts_ns
        if pending is None:
            self._pending.pop(gpu_uuid, None)
        else:
            self._pending[gpu_uuid] = pending

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
            members: dict[tuple[int, int], list[int]] = {}
            for k, p in zip(who.tolist(), where.tolist()):
                if (k, int(pane[p])) in suspect:
                    members.setdefault((k, int(pane[p])), []).append(p)
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

    def add_many(
        self, rows: PaneRows, verdicts: Verdicts, tenant_of: np.ndarray, tenants: list[Tenant]
    ) -> tuple[np.ndarray, PaneColumns]:
        """The accepted rows summed into their panes (``tenant_of``: each process sample's and NUMA event's
        tenant, an index into ``tenants``), the watermarks moved; returns the panes that close, and for
        each the batch row that closes it (``PaneRows.row``), in no particular order."""
        blas = np.zeros(len(rows.kind), bool)
        blas[list(rows.flops)] = True
        acc = np.flatnonzero(verdicts.accepted & ((rows.kind != TRACE) | blas))  # a launch trace sums nothing
        group, pane = rows.group[acc], rows.ts_ns[acc] - rows.ts_ns[acc] % self.pane_ns
        order = np.lexsort((pane, group))  # by GPU, pane, then arrival
        at, group, pane = acc[order], group[order], pane[order]
        firsts, lasts = runs(group, pane)
        kind = rows.kind[at]
        is_gpu, is_trace = kind == GPU, kind == TRACE
        interval = rows.interval_ms[at]
        seg_all = np.repeat(np.arange(len(firsts)), lasts - firsts)  # each accepted row's pane here

        def per_pane(values: np.ndarray, reduce: np.ufunc = np.add) -> list[int]:
            return reduce.reduceat(values, firsts).tolist() if len(at) else []

        covered, idle, busy, energy = (
            per_pane(np.where(is_gpu, v, 0))
            for v in gpu_sums(interval, rows.sm_cp[at], rows.power_mw[at], self.idle_threshold_cp)
        )
        unattributed = tenants.index(UNATTRIBUTED) if UNATTRIBUTED in tenants else -1
        placed = per_pane(((kind == PROC) & (tenant_of[at] != unattributed)).astype(np.int64))
        gpu_rows = per_pane(is_gpu.astype(np.int64))
        trace_rows = per_pane(is_trace.astype(np.int64))
        tensor, dram = rows.tensor_cp[at], rows.dram_cp[at]
        has_tensor, has_dram = is_gpu & (tensor >= 0), is_gpu & (dram >= 0)
        sums = dict(
            zip(
                EFFICIENCY_SUMS,
                (
                    per_pane(v)
                    for v in (
                        np.where(is_gpu, rows.bw_cp[at] * interval, 0),
                        np.where(has_tensor, tensor * interval, 0),
                        np.where(has_tensor, interval, 0),
                        np.where(has_dram, dram * interval, 0),
                        np.where(has_dram, interval, 0),
                    )
                ),
            )
        )
        flops: dict[int, dict[int, int]] = {}  # pane here → pid → Σ flops, in Python integers
        for k, p in zip(seg_all[is_trace].tolist(), at[is_trace].tolist()):
            by_pid = flops.setdefault(k, {})
            by_pid[int(rows.pid[p])] = by_pid.get(int(rows.pid[p]), 0) + rows.flops[p]

        # (pane, tenant) sums of the process samples and NUMA events, in order of first arrival
        t_at = np.flatnonzero(~is_gpu & ~is_trace)
        seg = seg_all[t_at]
        tenant = tenant_of[at[t_at]]
        t_order = np.lexsort((tenant, seg))
        t_at, seg, tenant = t_at[t_order], seg[t_order], tenant[t_order]
        t_firsts, _ = runs(seg, tenant)
        t_pos = at[t_at]
        t_pane, t_who = seg[t_firsts], tenant[t_firsts]
        t_sums = [np.zeros(0, np.int64)] * 4
        t_first = np.zeros(0, np.int64)
        if len(t_at):
            is_proc = kind[t_at] == PROC
            sm, bw = process_sums(interval[t_at], rows.sm_cp[t_pos], rows.bw_cp[t_pos])
            t_sums = [
                np.add.reduceat(v, t_firsts)
                for v in (
                    np.where(is_proc, sm, 0),
                    np.where(is_proc, bw, 0),
                    np.where(is_proc, 0, rows.numa[t_pos]),
                    is_proc.astype(np.int64),
                )
            ]
            t_first = np.minimum.reduceat(rows.row[t_pos], t_firsts)

        # the smallest node and model name of each pane's GPU samples (a GPU that reports two names
        # in one pane gets the same one whatever the order), by rank among the batch's names
        node_by_rank, model_by_rank = sorted(rows.node_names), sorted(rows.model_names)
        big = max(len(node_by_rank), len(model_by_rank))
        # rank of each batch name, and `big` at index -1 (no name)
        node_rank, model_rank = (
            np.array([*np.argsort(np.argsort(np.array(v, dtype=object))).tolist(), big])
            for v in (rows.node_names, rows.model_names)
        )
        node_min = per_pane(np.where(is_gpu, node_rank[rows.node[at]], big), np.minimum)
        model_min = per_pane(np.where(is_gpu, model_rank[rows.model[at]], big), np.minimum)
        group_k, starts_k = group[firsts], pane[firsts]  # each pane's GPU and start
        at_rows = np.array(self._close_rows(rows, verdicts, group_k, starts_k) if len(at) else [], np.int64)
        keys = [t.key for t in tenants]
        tenant_events = lasts - firsts - np.array(gpu_rows, np.int64) - np.array(trace_rows, np.int64)

        # a pane held open here, or that stays open, goes through its PaneTotals; the others, new panes
        # that close within the batch (nearly all of a replay's), straight to columns
        slow = at_rows < 0
        by_gpu = np.searchsorted(group_k, np.arange(len(rows.names) + 1))  # each GPU's panes, in start order
        untouched: dict[str, list[int]] = {}  # open panes that took no row here
        for j, name in enumerate(rows.names):
            held = list(self._open.get(name, ()))
            if held:  # a few panes: found by bisection among the GPU's panes here, which are in start order
                here, wanted = starts_k[by_gpu[j] : by_gpu[j + 1]], np.array(held, np.int64)
                found = np.searchsorted(here, wanted)
                hit = found < len(here)
                hit[hit] = here[found[hit]] == wanted[hit]
                slow[by_gpu[j] + found[hit]] = True
                untouched[name] = [start for start, h in zip(held, hit.tolist()) if not h]
        fast = np.flatnonzero(~slow)
        by_tenant: dict[int, list[tuple[int, int, int, int, int, int]]] = {}
        for k in np.flatnonzero(slow[t_pane]).tolist():
            by_tenant.setdefault(int(t_pane[k]), []).append(
                (int(t_first[k]), int(t_who[k]), *(int(v[k]) for v in t_sums))
            )  # type: ignore[arg-type]

        closes: list[tuple[int, PaneTotals]] = []
        for k in np.flatnonzero(slow).tolist():
            first, last, name, start = int(firsts[k]), int(lasts[k]), rows.names[int(group_k[k])], int(starts_k[k])
            kept = self._open.get(name, {})
            totals = kept.pop(start, None) or PaneTotals(name, start, start + self.pane_ns)
            if gpu_rows[k]:
                node, model = node_by_rank[node_min[k]], model_by_rank[model_min[k]]
                totals.node_id = node if totals.node_id is None else min(node, totals.node_id)
                totals.gpu_model = model if totals.gpu_model is None else min(model, totals.gpu_model)
            totals.covered_ms += covered[k]
            totals.idle_ms += idle[k]
            totals.energy_uj += energy[k]
            totals.busy_cp_ms += busy[k]
            totals.placed += placed[k]
            for field, values in sums.items():
                setattr(totals, field, getattr(totals, field) + values[k])
            for pid, n in flops.get(k, {}).items():
                totals.flops[pid] = totals.flops.get(pid, 0) + n
            totals.tenant_events += int(tenant_events[k])
            for _, tn, sm, bw, numa, samples in sorted(by_tenant.get(k, ())):
                t = totals.tenant(tenants[tn], keys[tn])
                t.sm += sm
                t.bw += bw
                t.numa += numa
                t.samples += samples
            if at_rows[k] >= 0:
                closes.append((int(at_rows[k]), totals))
                continue
            members = at[first:last]
            for code, pid, ts in zip(
                rows.kind[members].tolist(), rows.pid[members].tolist(), rows.ts_ns[members].tolist()
            ):
                totals.remember(KINDS[code], pid, ts)  # a sample's, a NUMA event's or a blas call's
            self._open.setdefault(name, {})[start] = totals
        for j, name in enumerate(rows.names):  # open panes that took no row here may close too
            idle_panes = untouched.get(name, [])
            for start, row in zip(
                idle_panes,
                self._close_rows(rows, verdicts, np.full(len(idle_panes), j), np.array(idle_panes, np.int64)),
            ):
                if row >= 0:
                    closes.append((row, self._open[name].pop(start)))
        for j, name in enumerate(rows.names):
            if (high := int(verdicts.high[rows.ends[j] - 1])) != NO_TS:  # a GPU of traces alone has no time yet
                self._set_max_ts(name, high, verdicts.pending.get(j))

        position = np.full(len(firsts), -1, np.int64)
        position[fast] = np.arange(len(fast))
        tenant_rows = np.flatnonzero(~slow[t_pane])
        key_rank = np.argsort(np.argsort(np.array(keys, dtype=object))) if keys else np.zeros(0, np.int64)
        tenant_rows = tenant_rows[np.lexsort((key_rank[t_who[tenant_rows]], position[t_pane[tenant_rows]]))]
        who = t_who[tenant_rows]
        no_name = [None] * (big + 1)  # a rank of `big`: the pane had no GPU sample
        f_rows = sorted(
            (int(position[k]), pid, n) for k, by_pid in flops.items() if not slow[k] for pid, n in by_pid.items()
        )
        # one starred list: mypy would give ``*(…)`` every parameter after it (as in ``PaneColumns.of``)
        columns = PaneColumns(
            *[
                objects(rows.names)[group_k[fast]],
                starts_k[fast],
                starts_k[fast] + self.pane_ns,
                objects(node_by_rank + no_name)[np.array(node_min, np.int64)[fast]],
                objects(model_by_rank + no_name)[np.array(model_min, np.int64)[fast]],
                np.array(covered, np.int64)[fast],
                np.array(idle, np.int64)[fast],
                tenant_events[fast],
                *(np.array(v, np.int64)[fast] for v in (energy, busy, placed, *sums.values())),
                position[t_pane[tenant_rows]],
                objects(keys)[who],
                objects(tenants)[who],
                *(v[tenant_rows].astype(object) for v in t_sums[:3]),
                t_sums[3][tenant_rows].astype(np.int64),
                np.array([k for k, _, _ in f_rows], np.int64),
                np.array([pid for _, pid, _ in f_rows], np.int64),
                objects(n for _, _, n in f_rows),
            ]
        )
        return (
            np.concatenate([at_rows[fast], np.array([row for row, _ in closes], np.int64)]),
            PaneColumns.concat([columns, PaneColumns.of([totals for _, totals in closes])]),
        )

    def _close_rows(self, rows: PaneRows, verdicts: Verdicts, group_of: np.ndarray, start: np.ndarray) -> list[int]:
        """For panes of these GPUs (indices into ``rows.names``) and starts, the batch row whose watermark first
        reaches the pane's end plus the lateness (the row that closes it), or -1 if none does."""
        target = group_of * verdicts.levels.width + verdicts.levels.of(start + self.pane_ns + self.lateness_ns)
        k = np.searchsorted(verdicts.upto, target)
        last = len(rows.row) - 1
        return np.where(k < rows.ends[group_of], rows.row[np.minimum(k, last)], -1).tolist()  # type: ignore
