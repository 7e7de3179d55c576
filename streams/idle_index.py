"""The rolling idle index: per GPU, idle and covered ms over the panes of the last window.

Reading taken of METRICS.md: its window is "panes whose start lies in (pane_end − 72 h,
pane_end]". Literally that admits the *next* pane (start = pane_end), which has not closed,
and leaves only 71 h 59 min of closed panes. We sum the 72 h ending at pane_end: the panes
whose *end* lies in (pane_end − 72 h, pane_end], i.e. start in (pane_start − 72 h, pane_start].

State per GPU is one entry per pane in the window (O(window / P) numbers) and two running
totals, so each closed pane costs O(1) amortised.
"""
from __future__ import annotations

from collections import deque
from typing import Any

from schemas.records import IdleIndexRecord
from streams.panes import PaneTotals

__all__ = ["IdleIndex"]


class IdleIndex:
    def __init__(self, window_ns: int) -> None:
        self.window_ns = window_ns
        # gpu → panes in the window as [start_ns, idle_ms, covered_ms], plus [idle_sum, covered_sum]
        self._panes: dict[str, deque[list[int]]] = {}
        self._sums: dict[str, list[int]] = {}

    def on_close(self, pane: PaneTotals) -> IdleIndexRecord | None:
        """Roll a closed pane in; panes close per GPU in ascending start order."""
        if pane.node_id is None or pane.gpu_model is None:
            return None  # no GPU samples in this pane: nothing to publish
        ring = self._panes.setdefault(pane.gpu_uuid, deque())
        sums = self._sums.setdefault(pane.gpu_uuid, [0, 0])
        ring.append([pane.pane_start_ns, pane.idle_ms, pane.covered_ms])
        sums[0] += pane.idle_ms
        sums[1] += pane.covered_ms
        horizon = pane.pane_start_ns - self.window_ns  # window: starts in (start − W, start]
        while ring[0][0] <= horizon:  # never empties: window ≥ pane (settings)
            _, idle, covered = ring.popleft()
            sums[0] -= idle
            sums[1] -= covered
        return IdleIndexRecord.model_construct(
            gpu_uuid=pane.gpu_uuid, node_id=pane.node_id, gpu_model=pane.gpu_model,
            pane_start_ns=pane.pane_start_ns, pane_end_ns=pane.pane_end_ns,
            idle_ms=pane.idle_ms, covered_ms=pane.covered_ms,
            idle_ms_72h=sums[0], covered_ms_72h=sums[1], idle_index_72h=sums[0] / sums[1])

    def to_state(self) -> dict[str, Any]:
        return {g: [list(ring), self._sums[g]] for g, ring in self._panes.items()}

    def restore(self, state: dict[str, Any]) -> None:
        self._panes = {g: deque(ring) for g, (ring, _) in state.items()}
        self._sums = {g: list(sums) for g, (_, sums) in state.items()}
