"""A drift-free sampling loop shared by the live sources (NVML, dcgm-exporter)."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Protocol

from gpucost.schemas.events import Event

__all__ = ["Deadlined", "Sampler", "sample_forever"]

log = logging.getLogger("gpucost.sampling")


class Sampler(Protocol):
    def sample(self, ts_ns: int, interval_s: float) -> list[Event]: ...


class Deadlined:
    """``sampler``, each ``sample`` given at most ``timeout_s``. Why: a library call has no deadline of its own (NVML,
    amdsmi, HLML), and a wedged driver would hold the whole run, its panes and ``/healthz`` with it. So each sample
    runs in a thread of its own: one that has not answered in time costs that period's events (counted
    ``sample_timed_out``), never the loop; while it is still running no other is started (counted
    ``sample_still_running``), so a driver that never answers holds one thread, not one a period. What it answers
    late is dropped, its period a gap. An exception the sample raises is raised here, as without the deadline."""

    def __init__(self, sampler: Sampler, timeout_s: float, counts: Counter[str]) -> None:
        self.sampler, self.timeout_s, self.counts = sampler, timeout_s, counts
        self._running: threading.Thread | None = None

    def sample(self, ts_ns: int, interval_s: float) -> list[Event]:
        if self._running is not None and self._running.is_alive():
            self.counts["sample_still_running"] += 1
            return []
        answer: list[list[Event] | BaseException] = []

        def run() -> None:
            try:
                answer.append(self.sampler.sample(ts_ns, interval_s))
            except BaseException as exc:  # noqa: BLE001 (raised again in the caller's thread)
                answer.append(exc)

        self._running = threading.Thread(target=run, name="gpucost-sample", daemon=True)
        self._running.start()
        self._running.join(self.timeout_s)
        if not answer:
            self.counts["sample_timed_out"] += 1
            log.warning("a sample took over %g s (--device-timeout-s): that period is a gap", self.timeout_s)
            return []
        if isinstance(answer[0], BaseException):
            raise answer[0]
        return answer[0]


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
