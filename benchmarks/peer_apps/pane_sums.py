"""What the peers of benchmark 11 compute, from docs/definitions.md ("Time, panes and watermarks", "Idle
index"), shared by both apps: a GPU
sample's pane, and its idle and covered milliseconds (gpucost's ``idle_ms``, ``covered_ms``)."""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

PANE_MS = 60_000
LATENESS_MS = 120_000  # gpucost's default allowed lateness: a window takes events that late, as a pane does
IDLE_BELOW_CP = 500  # 5 % in hundredths


def scaled(value: float, scale: int) -> int:
    """``value · scale`` rounded half-even, from the decimal the producer wrote (ms from s, 1/100 % from %)."""
    return int((Decimal(repr(value)) * scale).quantize(Decimal(1), ROUND_HALF_EVEN))


def sample(event: dict[str, Any]) -> tuple[int, int, int]:
    """(pane start in ms, idle ms, covered ms) of one GPU sample."""
    ms = scaled(event["interval_s"], 1000)
    idle = ms if scaled(event["sm_util_pct"], 100) < IDLE_BELOW_CP else 0
    return event["ts_ns"] // 1_000_000 // PANE_MS * PANE_MS, idle, ms
