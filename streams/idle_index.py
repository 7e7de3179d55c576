"""The rolling idle index: per GPU, idle and covered ms over the panes of the last window.

Reading taken of METRICS.md: its window is "panes whose start lies in (pane_end − 72 h,
pane_end]". Literally that admits the *next* pane (start = pane_end), which has not closed,
and leaves only 71 h 59 min of closed panes. We sum the 72 h ending at pane_end: the panes
whose *end* lies in (pane_end − 72 h, pane_end], i.e. start in (pane_start − 72 h, pane_start].

State per GPU is a ring of n = ⌈window / P⌉ slots, one per pane index modulo n, of two
unsigned 32-bit numbers (idle and covered ms; a GPU whose pane ever needs more switches to 64
bits), plus the two running totals: 34 KiB per GPU at 72 h of 60 s panes, where a list of
Python objects per pane took ten times that. Each closed pane costs O(1) amortised.
"""
from __future__ import annotations

import base64
from array import array
from typing import Any

import numpy as np
import pyarrow as pa

from schemas.arrow import ARROW_SCHEMAS
from schemas.exact import ratios
from schemas.records import IdleIndexRecord, computed
from streams.panes import PaneColumns, PaneTotals

__all__ = ["IdleIndex"]


class _Window:
    """One GPU's panes in the window: slot k % n holds pane k, for k in (last − n, last]."""

    __slots__ = ("idle", "covered", "last", "idle_sum", "covered_sum")

    def __init__(self, n: int, typecode: str = "I") -> None:
        self.idle = array(typecode, bytes(n * array(typecode).itemsize))
        self.covered = array(typecode, bytes(n * array(typecode).itemsize))
        self.last: int | None = None
        self.idle_sum = 0
        self.covered_sum = 0

    def roll(self, k: int, idle_ms: int, covered_ms: int) -> None:
        """Pane ``k`` (the newest so far) in; the panes that leave the window out."""
        n = len(self.idle)
        if self.last is None or k - self.last >= n:
            self.idle = array(self.idle.typecode, bytes(len(self.idle.tobytes())))
            self.covered = array(self.covered.typecode, bytes(len(self.covered.tobytes())))
            self.idle_sum = self.covered_sum = 0
        else:
            for gone in range(self.last + 1, k):  # panes without GPU samples: their slots empty out
                self._put(gone % n, 0, 0)
        self._put(k % n, idle_ms, covered_ms)
        self.last = k

    def roll_many(self, ks: np.ndarray, idle_ms: np.ndarray, covered_ms: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
        """``roll`` of ascending panes ``ks`` at once; the window sums after each.

        Touches only the slots of panes that leave the window or arrive, so a few panes cost
        a few slots, not the whole ring. The ring ends as ``roll`` leaves it: slot ``k % n``
        holds pane ``k`` for ``k`` in ``(last − n, last]``, 0 where no pane came.
        """
        n = len(self.idle)
        if self.idle.typecode != "I" or max(int(idle_ms.max()), int(covered_ms.max())) >> 32:
            sums = []  # a pane past 32 bits (forged data): one by one, as roll widens the ring
            for k, idle, covered in zip(ks.tolist(), idle_ms.tolist(), covered_ms.tolist()):
                self.roll(k, idle, covered)
                sums.append((self.idle_sum, self.covered_sum))
            return np.array([i for i, _ in sums], np.int64), np.array([c for _, c in sums], np.int64)
        first, newest = int(ks[0]), int(ks[-1])
        if self.last is None or first - self.last >= n:  # nothing before stays: an empty ring, as roll makes
            self.idle, self.covered = array("I", bytes(4 * n)), array("I", bytes(4 * n))
            self.idle_sum = self.covered_sum = 0
            self.last = first - 1
        last = self.last
        leaving = np.arange(last - n + 1, max(min(last, newest - n), last - n) + 1)  # earlier panes that leave
        arriving = np.arange(max(last, newest - n) + 1, newest + 1)  # slots the new panes' range takes over
        kept = ks > newest - n
        sums = []
        for ring, new, total in ((self.idle, idle_ms, self.idle_sum), (self.covered, covered_ms, self.covered_sum)):
            slots = np.frombuffer(ring, np.uint32)  # a view: written in place
            old = np.concatenate([[0], np.cumsum(slots[leaving % n], dtype=np.int64)])
            added = np.concatenate([[0], np.cumsum(new)])
            sums.append(total + added[1:] - old[np.searchsorted(leaving, ks - n, "right")]
                        - added[np.searchsorted(ks, ks - n, "right")])
            slots[arriving % n] = 0
            slots[ks[kept] % n] = new[kept]
        self.last = newest
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

    def to_state(self) -> list[Any]:
        return [self.idle.typecode, self.last, self.idle_sum, self.covered_sum,
                base64.b64encode(self.idle.tobytes()).decode(), base64.b64encode(self.covered.tobytes()).decode()]

    @classmethod
    def from_state(cls, state: list[Any]) -> "_Window":
        typecode, last, idle_sum, covered_sum, idle, covered = state
        window = cls(0, typecode)
        window.idle.frombytes(base64.b64decode(idle))
        window.covered.frombytes(base64.b64decode(covered))
        window.last, window.idle_sum, window.covered_sum = last, idle_sum, covered_sum
        return window


class IdleIndex:
    def __init__(self, window_ns: int, pane_ns: int) -> None:
        self.pane_ns = pane_ns
        self.slots = -(-window_ns // pane_ns)  # panes with start in (s − W, s]: ⌈W / P⌉ of them
        self._gpus: dict[str, _Window] = {}
        #: panes rolled in so far: the windows are most of a GPU's state and change only when one
        #: is, so a changelog writes them again only when this moved
        self.rolls = 0

    def on_close(self, pane: PaneTotals) -> IdleIndexRecord | None:
        """Roll a closed pane in; panes close per GPU in ascending start order."""
        if pane.node_id is None or pane.gpu_model is None:
            return None  # no GPU samples in this pane: nothing to publish
        window = self._window(pane.gpu_uuid)
        window.roll(pane.pane_start_ns // self.pane_ns, pane.idle_ms, pane.covered_ms)
        self.rolls += 1
        return computed(
            IdleIndexRecord, gpu_uuid=pane.gpu_uuid, node_id=pane.node_id, gpu_model=pane.gpu_model,
            pane_start_ns=pane.pane_start_ns, pane_end_ns=pane.pane_end_ns,
            idle_ms=pane.idle_ms, covered_ms=pane.covered_ms, idle_ms_72h=window.idle_sum,
            covered_ms_72h=window.covered_sum, idle_index_72h=window.idle_sum / window.covered_sum)

    def close_many(self, panes: PaneColumns) -> pa.Table:
        """``on_close`` of panes that all have GPU samples (each GPU's in ascending order), as columns:
        each GPU's panes rolled in at once."""
        ks = panes.pane_start_ns // self.pane_ns
        self.rolls += len(panes)
        idle_72h, covered_72h = np.zeros(len(panes), np.int64), np.zeros(len(panes), np.int64)
        by_gpu: dict[str, list[int]] = {}
        for i, gpu in enumerate(panes.gpu_uuid):
            by_gpu.setdefault(gpu, []).append(i)
        for gpu, members in by_gpu.items():
            window = self._window(gpu)
            idle_72h[members], covered_72h[members] = window.roll_many(
                ks[members], panes.idle_ms[members], panes.covered_ms[members])
        return pa.table([panes.gpu_uuid, panes.node_id, panes.gpu_model, panes.pane_start_ns, panes.pane_end_ns,
                         panes.idle_ms, panes.covered_ms, idle_72h, covered_72h, ratios(idle_72h, covered_72h)],
                        schema=ARROW_SCHEMAS["idle_index"])

    def _window(self, gpu_uuid: str) -> _Window:
        window = self._gpus.get(gpu_uuid)
        if window is None:
            window = self._gpus[gpu_uuid] = _Window(self.slots)
        return window

    def to_state(self) -> dict[str, Any]:
        return {g: w.to_state() for g, w in self._gpus.items()}

    def restore(self, state: dict[str, Any]) -> None:
        self._gpus = {g: _Window.from_state(s) for g, s in state.items()}
