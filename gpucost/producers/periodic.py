"""A drift-free sampling loop shared by the live sources (NVML, dcgm-exporter)."""

from __future__ import annotations

import itertools
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
    stopped: Callable[[], bool] = lambda: False,
) -> Iterator[Event]:
    """Sample every ``period_s`` on a fixed grid (no drift), each sample standing for the real elapsed time.

    A loop held up past grid points (a slow sample, a consumer that kept the generator waiting) takes its next
    sample at the next grid point at least half a period after the last one, not at each missed point back to
    back: those would stand for microseconds each, intervals that round to 0 ms, which the events refuse (a
    live NVML run once died of it under load). ``stopped`` is asked before each sample."""
    period_ns = int(period_s * 1e9)
    start = prev = clock_ns()
    k = 0
    for _ in itertools.repeat(None) if ticks is None else range(ticks):
        if stopped():  # asked each period, whether or not the last gave events (a source failing every period)
            return
        earliest = max(start + (k + 1) * period_ns, clock_ns(), prev + period_ns // 2)
        k = -(-(earliest - start) // period_ns)  # the first grid point at or after it
        wait_ns = start + k * period_ns - clock_ns()
        if wait_ns > 0:
            sleep(wait_ns / 1e9)
        now = clock_ns()
        interval_s = round((now - prev) / 1e9, 6)
        prev = now
        yield from sampler.sample(now, interval_s)
