"""The rolling idle index: per GPU, idle and covered ms over the panes of the last window.

Reading taken of the specification (docs/definitions.md, "Idle index"): its window is "panes whose start lies in
(pane_end − 72 h,
pane_end]". Literally that admits the *next* pane (start = pane_end), which has not closed,
and leaves only 71 h 59 min of closed panes. We sum the 72 h ending at pane_end: the panes
whose *end* lies in (pane_end − 72 h, pane_end], i.e. start in (pane_start − 72 h, pane_start].

State per GPU is, while it has few panes in the window, the list of them; past
``SPARSE_PANES``, a ring of n = ⌈window / P⌉ slots, one per pane index modulo n, of two
unsigned 32-bit numbers (idle and covered ms; a GPU whose pane ever needs more switches to 64
bits), plus the two running totals: 34 KiB per GPU at 72 h of 60 s panes, where a list of
Python objects per pane took ten times that. Each closed pane costs O(1) amortised.
"""

from __future__ import annotations

import base64
from array import array
from collections.abc import Container
from typing import Any

import numpy as np
import pyarrow as pa

from gpucost.schemas.arrow import ARROW_SCHEMAS
from gpucost.schemas.exact import ratios
from gpucost.schemas.records import IdleIndexRecord, computed
from gpucost.streams.pane_totals import PaneColumns, PaneTotals
from gpucost.streams.settings import AuditSettings

__all__ = ["IdleIndex", "IdleWindow"]


#: a GPU with at most this many panes in its window keeps them as a list, not as a ring of ⌈W/P⌉ slots:
#: 200,000 GPUs of one pane each took a replay to 8 GB in rings
SPARSE_PANES = 64


class IdleWindow:
    """One GPU's panes in the window, ``(last − n, last]``: while they are few, as ``panes`` (pane k →
    (idle, covered), ascending); past ``SPARSE_PANES``, as a ring where slot k % n holds pane k (and
    ``panes`` is None). A ring whose panes all left the window is a list again; a state is written in
    the one form its panes call for, whatever form held them (``to_state``). Public, a unit of its own: that
    ``roll_many`` sums as ``roll`` does and ``sums_ending`` at any pane a revision reaches is checked on it."""

    __slots__ = ("n", "keep", "left", "panes", "idle", "covered", "last", "idle_sum", "covered_sum")

    def __init__(self, n: int, keep: int = 0) -> None:
        self.n = n
        #: the revision horizon in panes: the panes that left the window within the last ``keep`` panes stay in
        #: ``left`` (k → (idle, covered), none of 0), so that the window ending at any pane a revision can reach
        #: is known (``sums_ending``)
        self.keep = keep
        self.left: dict[int, tuple[int, int]] = {}
        self.panes: dict[int, tuple[int, int]] | None = {}
        self.idle = self.covered = array("I")
        self.last: int | None = None
        self.idle_sum = 0
        self.covered_sum = 0

    def _leave(self, k: int, idle_ms: int, covered_ms: int) -> None:
        if self.keep and (idle_ms or covered_ms):
            self.left[k] = (idle_ms, covered_ms)

    def _forget_left(self) -> None:
        if self.left and self.last is not None:
            floor = self.last - self.n - self.keep
            self.left = {k: v for k, v in self.left.items() if k > floor}

    def roll(self, k: int, idle_ms: int, covered_ms: int) -> None:
        """Pane ``k`` (the newest so far) in; the panes that leave the window out."""
        n = self.n
        if self.last is None or k - self.last >= n:  # nothing before stays
            if self.keep and self.last is not None:
                for held, idle, covered in self._in_window():
                    self._leave(held, idle, covered)
            self.panes, self.idle, self.covered = {}, array("I"), array("I")
            self.idle_sum = self.covered_sum = 0
        if self.panes is not None:
            while self.panes and (oldest := next(iter(self.panes))) <= k - n:
                idle, covered = self.panes.pop(oldest)
                self._leave(oldest, idle, covered)
                self.idle_sum -= idle
                self.covered_sum -= covered
            self.panes[k] = (idle_ms, covered_ms)
            self.idle_sum += idle_ms
            self.covered_sum += covered_ms
            self.last = k
            self._forget_left()
            if len(self.panes) > SPARSE_PANES:
                self._ring()
            return
        assert self.last is not None
        for gone in range(self.last + 1, k):  # panes without GPU samples: their slots empty out
            self._leave(gone - n, self.idle[gone % n], self.covered[gone % n])
            self._put(gone % n, 0, 0)
        self._leave(k - n, self.idle[k % n], self.covered[k % n])
        self._put(k % n, idle_ms, covered_ms)
        self.last = k
        self._forget_left()

    def _entry(self, k: int) -> tuple[int, int]:
        """Pane ``k``'s (idle, covered), for ``k`` in the window ``(last − n, last]``."""
        if self.panes is not None:
            return self.panes.get(k, (0, 0))
        return self.idle[k % self.n], self.covered[k % self.n]

    def sums_ending(self, k: int) -> tuple[int, int]:
        """The window's sums ending at pane ``k`` (``(k − n, k]``), for ``k`` at most ``keep`` panes before
        ``last`` or after it: the window now, less its panes after ``k``, plus those that left it since
        (or, for a ``k`` that left the window itself, the panes that left, alone)."""
        if self.last is None:
            return 0, 0
        last, n = self.last, self.n
        if k >= last:
            gone = [self._entry(j) for j in range(last - n + 1, min(k - n, last) + 1)]
            return self.idle_sum - sum(i for i, _ in gone), self.covered_sum - sum(c for _, c in gone)
        if k <= last - n:  # the whole window ending at k has left (a horizon longer than the window)
            back = [v for j, v in self.left.items() if k - n < j <= k]
            return sum(i for i, _ in back), sum(c for _, c in back)
        after = [self._entry(j) for j in range(k + 1, last + 1)]
        back = [v for j, v in self.left.items() if k - n < j <= last - n]
        return (
            self.idle_sum - sum(i for i, _ in after) + sum(i for i, _ in back),
            self.covered_sum - sum(c for _, c in after) + sum(c for _, c in back),
        )

    def revise(self, k: int, idle_ms: int, covered_ms: int) -> tuple[int, int]:
        """Pane ``k``'s figures as a revision has them (a pane not in the window yet rolls in); the window's
        sums ending at ``k`` then."""
        if self.last is None or k > self.last:
            self.roll(k, idle_ms, covered_ms)
            return self.idle_sum, self.covered_sum
        if k <= self.last - self.n:  # left the window already (a horizon longer than the window)
            self._leave(k, idle_ms, covered_ms)
            return self.sums_ending(k)
        before = self._entry(k)
        self.idle_sum += idle_ms - before[0]
        self.covered_sum += covered_ms - before[1]
        if self.panes is not None:
            self.panes[k] = (idle_ms, covered_ms)
            self.panes = dict(sorted(self.panes.items()))  # ``roll`` drops the oldest first
        else:
            try:
                self.idle[k % self.n], self.covered[k % self.n] = idle_ms, covered_ms
            except OverflowError:
                self.idle, self.covered = array("Q", self.idle), array("Q", self.covered)
                self.idle[k % self.n], self.covered[k % self.n] = idle_ms, covered_ms
        return self.sums_ending(k)

    def _ring(self) -> None:
        """The panes as a ring (4-byte slots, 8 where a pane needs more)."""
        assert self.panes is not None
        wide = any(max(v) >> 32 for v in self.panes.values())
        self.idle, self.covered = (array("Q" if wide else "I", bytes(self.n * (8 if wide else 4))) for _ in range(2))
        for k, (idle, covered) in self.panes.items():
            self.idle[k % self.n], self.covered[k % self.n] = idle, covered
        self.panes = None

    def roll_many(self, ks: np.ndarray, idle_ms: np.ndarray, covered_ms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``roll`` of ascending panes ``ks`` at once; the window sums after each.

        Touches only the slots of panes that leave the window or arrive, so a few panes cost
        a few slots, not the whole ring. The ring ends as ``roll`` leaves it: slot ``k % n``
        holds pane ``k`` for ``k`` in ``(last − n, last]``, 0 where no pane came.
        """
        n = self.n
        first, newest = int(ks[0]), int(ks[-1])
        fresh = self.last is None or first - self.last >= n  # nothing before stays
        if self.panes is not None and not fresh and len(self.panes) + len(ks) > SPARSE_PANES:
            self._ring()
        # few panes starting afresh, panes added to a list, a ring of 64-bit slots: roll's own path
        one_by_one = len(ks) <= SPARSE_PANES if fresh else self.panes is not None or self.idle.typecode != "I"
        if one_by_one or max(int(idle_ms.max()), int(covered_ms.max())) >> 32:
            pairs = []  # a few panes, a ring of 64-bit slots, or a pane past 32 bits (forged data): one by one
            for k, idle, covered in zip(ks.tolist(), idle_ms.tolist(), covered_ms.tolist()):
                self.roll(k, idle, covered)
                pairs.append((self.idle_sum, self.covered_sum))
            return np.array([i for i, _ in pairs], np.int64), np.array([c for _, c in pairs], np.int64)
        if fresh:  # an empty ring, as roll makes (what was in the window left it)
            if self.keep and self.last is not None:
                for held, idle, covered in self._in_window():
                    self._leave(held, idle, covered)
            self.panes, self.idle, self.covered = None, array("I", bytes(4 * n)), array("I", bytes(4 * n))
            self.idle_sum = self.covered_sum = 0
            self.last = first - 1
        last = self.last
        assert last is not None
        leaving = np.arange(last - n + 1, max(min(last, newest - n), last - n) + 1)  # earlier panes that leave
        arriving = np.arange(max(last, newest - n) + 1, newest + 1)  # slots the new panes' range takes over
        kept = ks > newest - n
        if self.keep:  # with a revision horizon, the panes that leave the window are kept a while (as roll does)
            old = [np.frombuffer(ring, np.uint32)[leaving % n].astype(np.int64) for ring in (self.idle, self.covered)]
            for source_ks, idle, covered in ((leaving, *old), (ks[~kept], idle_ms[~kept], covered_ms[~kept])):
                held = (source_ks > newest - n - self.keep) & ((idle != 0) | (covered != 0))
                self.left.update(zip(source_ks[held].tolist(), zip(idle[held].tolist(), covered[held].tolist())))
        sums: list[np.ndarray] = []
        for ring, new, total in ((self.idle, idle_ms, self.idle_sum), (self.covered, covered_ms, self.covered_sum)):
            slots = np.frombuffer(ring, np.uint32)  # a view: written in place
            removed = np.concatenate([[0], np.cumsum(slots[leaving % n], dtype=np.int64)])
            added = np.concatenate([[0], np.cumsum(new)])
            sums.append(
                total
                + added[1:]
                - removed[np.searchsorted(leaving, ks - n, "right")]
                - added[np.searchsorted(ks, ks - n, "right")]
            )
            slots[arriving % n] = 0
            slots[ks[kept] % n] = new[kept]
        self.last = newest
        self._forget_left()
        self.idle_sum, self.covered_sum = int(sums[0][-1]), int(sums[1][-1])
        return sums[0], sums[1]

    def _put(self, slot: int, idle_ms: int, covered_ms: int) -> None:
        self.idle_sum += idle_ms - self.idle[slot]
        self.covered_sum += covered_ms - self.covered[slot]
        try:
            self.idle[slot], self.covered[slot] = idle_ms, covered_ms
        except OverflowError:  # over 49 days of samples in one pane: only forged data does that, but count it
            self.idle, self.covered = array("Q", self.idle), array("Q", self.covered)
            self.idle[slot], self.covered[slot] = idle_ms, covered_ms

    def _in_window(self) -> list[tuple[int, int, int]]:
        """(k, idle, covered) of each pane in the window, ascending."""
        if self.panes is not None:
            return [(k, idle, covered) for k, (idle, covered) in self.panes.items() if idle or covered]
        assert self.last is not None
        idle, covered = np.asarray(self.idle), np.asarray(self.covered)
        ks = np.arange(self.last - self.n + 1, self.last + 1)
        held = ks[(covered[ks % self.n] != 0) | (idle[ks % self.n] != 0)]
        return list(zip(held.tolist(), idle[held % self.n].tolist(), covered[held % self.n].tolist()))

    def to_state(self) -> list[Any]:
        held = self._in_window()
        left = [[k, *v] for k, v in self.left.items()] if self.left else []
        if len(held) <= SPARSE_PANES:
            return [
                "panes",
                self.last,
                self.idle_sum,
                self.covered_sum,
                [list(p) for p in held],
                *([left] if left else []),
            ]
        wide = max(int(np.asarray(self.idle).max()), int(np.asarray(self.covered).max())) >> 32
        idle, covered = (array("Q" if wide else "I", ring) for ring in (self.idle, self.covered))
        return [
            idle.typecode,
            self.last,
            self.idle_sum,
            self.covered_sum,
            base64.b64encode(idle.tobytes()).decode(),
            base64.b64encode(covered.tobytes()).decode(),
            *([left] if left else []),
        ]

    @classmethod
    def from_state(cls, state: list[Any], n: int, keep: int = 0) -> IdleWindow:
        window = cls(n, keep)
        form, window.last, window.idle_sum, window.covered_sum = state[:4]
        rest = 5 if form == "panes" else 6
        window.left = {k: (idle, covered) for k, idle, covered in (state[rest] if len(state) > rest else [])}
        if form == "panes":
            window.panes = {k: (idle, covered) for k, idle, covered in state[4]}
            return window
        window.panes = None
        window.idle, window.covered = array(form), array(form)
        window.idle.frombytes(base64.b64decode(state[4]))
        window.covered.frombytes(base64.b64decode(state[5]))
        return window


class IdleIndex:
    def __init__(self, settings: AuditSettings) -> None:
        self.pane_ns = settings.pane_ns
        self.window_ns = settings.window_ns
        self.slots = -(-self.window_ns // self.pane_ns)  # panes with start in (s − W, s]: ⌈W / P⌉ of them
        self.keep = -(-settings.revision_horizon_ns // self.pane_ns)  # panes a revision can reach back
        self._gpus: dict[str, IdleWindow] = {}
        #: changes to the windows so far (a pane rolled in, a window expired): the windows are most of a
        #: GPU's state and change only then, so a changelog writes them again only when this moved
        self.rolls = 0

    def on_close(self, pane: PaneTotals) -> IdleIndexRecord | None:
        """Roll a closed pane in; panes close per GPU in ascending start order."""
        if pane.node_id is None or pane.gpu_model is None:
            return None  # no GPU samples in this pane: nothing to publish
        window = self._window(pane.gpu_uuid)
        window.roll(pane.pane_start_ns // self.pane_ns, pane.idle_ms, pane.covered_ms)
        self.rolls += 1
        return computed(
            IdleIndexRecord,
            gpu_uuid=pane.gpu_uuid,
            node_id=pane.node_id,
            gpu_model=pane.gpu_model,
            pane_start_ns=pane.pane_start_ns,
            pane_end_ns=pane.pane_end_ns,
            idle_ms=pane.idle_ms,
            covered_ms=pane.covered_ms,
            idle_ms_72h=window.idle_sum,
            covered_ms_72h=window.covered_sum,
            idle_index_72h=window.idle_sum / window.covered_sum,
            revision=0,
        )

    def revise(
        self,
        gpu_uuid: str,
        node_id: str,
        gpu_model: str,
        pane_start_ns: int,
        idle_ms: int,
        covered_ms: int,
        revision: int,
    ) -> IdleIndexRecord:
        """A closed pane's figures changed by late data: its record again, with its revision number, its 72 h
        sums over the GPU's closed panes as known now. Later panes' records are not revised, but their
        windows hold the new figures from now on."""
        idle_72h, covered_72h = self._window(gpu_uuid).revise(pane_start_ns // self.pane_ns, idle_ms, covered_ms)
        self.rolls += 1
        return computed(
            IdleIndexRecord,
            gpu_uuid=gpu_uuid,
            node_id=node_id,
            gpu_model=gpu_model,
            pane_start_ns=pane_start_ns,
            pane_end_ns=pane_start_ns + self.pane_ns,
            idle_ms=idle_ms,
            covered_ms=covered_ms,
            idle_ms_72h=idle_72h,
            covered_ms_72h=covered_72h,
            idle_index_72h=idle_72h / covered_72h,
            revision=revision,
        )

    def close_many(self, panes: PaneColumns) -> pa.Table:
        """``on_close`` of panes that all have GPU samples (each GPU's in ascending order), as columns:
        each GPU's panes rolled in at once."""
        ks = panes.pane_start_ns // self.pane_ns
        self.rolls += len(panes)
        idle_72h, covered_72h = np.zeros(len(panes), np.int64), np.zeros(len(panes), np.int64)
        of, gpus = panes.gpus
        order = np.argsort(of, kind="stable")  # each GPU's panes together, in their order
        bounds = np.searchsorted(of[order], np.arange(len(gpus) + 1)).tolist()
        for j, gpu in enumerate(gpus):
            members = order[bounds[j] : bounds[j + 1]]
            window = self._window(gpu)
            idle_72h[members], covered_72h[members] = window.roll_many(
                ks[members], panes.idle_ms[members], panes.covered_ms[members]
            )
        return pa.table(
            [
                panes.gpu_uuid,
                panes.node_id,
                panes.gpu_model,
                panes.pane_start_ns,
                panes.pane_end_ns,
                panes.idle_ms,
                panes.covered_ms,
                idle_72h,
                covered_72h,
                ratios(idle_72h, covered_72h),
                np.zeros(len(panes), np.int64),
            ],
            schema=ARROW_SCHEMAS["idle_index"],
        )

    def expire(self, watermark_ns: int, only: Container[str | tuple[str, int]] | None = None) -> None:
        """Drop the windows whose every pane lies more than the window behind ``watermark_ns`` (of the GPUs in
        ``only``, if given): a GPU gone silent that long holds nothing a later pane of it would sum (a pane
        that far ahead starts a window afresh), and its ring would otherwise stay for good."""
        gone = [
            g
            for g, w in self._gpus.items()
            if w.last is not None
            and (w.last + 1) * self.pane_ns + self.window_ns <= watermark_ns
            and (only is None or g in only)
        ]
        for g in gone:
            del self._gpus[g]
        if gone:
            self.rolls += 1

    def _window(self, gpu_uuid: str) -> IdleWindow:
        window = self._gpus.get(gpu_uuid)
        if window is None:
            window = self._gpus[gpu_uuid] = IdleWindow(self.slots, self.keep)
        return window

    def to_state(self) -> dict[str, Any]:
        return {g: w.to_state() for g, w in self._gpus.items()}

    @classmethod
    def from_state(cls, state: dict[str, Any], settings: AuditSettings) -> IdleIndex:
        index = cls(settings)
        index._gpus = {g: IdleWindow.from_state(s, index.slots, index.keep) for g, s in state.items()}
        return index
