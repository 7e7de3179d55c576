"""A drift-free sampling loop shared by the live sources (NVML, dcgm-exporter)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Protocol

from gpucost.schemas.events import Event

__all__ = ["Sampler", "sample_forever"]


class Sampler(Protocol):
    def sample(self, ts_ns: int, interval_s: float) -> list[Event]: ...


def sample_forever(
    sampler: Sampler,
    period_s: float,
    ticks: int | None = None,
    clock_ns: Callable[[], int] = time.time_ns,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[Event]:
    """Sample every ``period_s`` on a fixed grid (no drift), each sample standing for the real elapsed time."""
    period_ns = int(period_s * 1e9)
    start = prev = clock_ns()
    k = 0
    while ticks is None or k < ticks:
        k += 1
        wait_ns = start + k * period_ns - clock_ns()
        if wait_ns > 0:
            sleep(wait_ns / 1e9)
        now = clock_ns()
        interval_s = round((now - prev) / 1e9, 6)
        prev = now
        yield from sampler.sample(now, interval_s)
