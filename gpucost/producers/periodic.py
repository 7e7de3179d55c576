"""A drift-free sampling loop shared by the live sources (NVML, dcgm-exporter)."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Protocol

from gpucost.schemas.events import FAULT_COUNT_MAX, Event, GpuSample

__all__ = ["Deadlined", "Sampler", "sample_forever"]

log = logging.getLogger("gpucost.sampling")


class Sampler(Protocol):
    def sample(self, ts_ns: int, interval_s: float) -> list[Event]: ...


class Deadlined:
    """``sampler``, each ``sample`` given at most ``timeout_s``. Why: a library call has no deadline of its own (NVML,
    amdsmi, HLML), and a wedged driver would hold the source, so that the run billed nothing and could not stop. So
    each sample runs in a thread of its own: one that has not answered in time costs that period's events (counted
    ``sample_timed_out``), never the loop; while it is still running no other is started (counted
    ``sample_still_running``), so a driver that never answers holds one thread, not one a period. What it answers
    late is dropped, its period a gap, but for its device faults: the sampler has taken them as seen, so they come
    with the device's next sample sent, as a skipped sample's do. An error it raises late is logged and counted
    (``sample_failed_late``). ``stopped`` is asked while waiting, so that a stop is heard within a tenth of a
    second."""

    def __init__(
        self, sampler: Sampler, timeout_s: float, counts: Counter[str], stopped: Callable[[], bool] = lambda: False
    ) -> None:
        self.sampler, self.timeout_s, self.counts, self.stopped = sampler, timeout_s, counts, stopped
        self._running: threading.Thread | None = None
        self._heard = time.monotonic()  # when a call last answered in time with events (or when this began)
        self._late: list[list[Event] | BaseException] = []  # the answer of the call that ran late, once it comes
        self._faults: dict[str, tuple[int, int]] = {}  # GPU → the faults of late answers, not yet sent

    @property
    def busy(self) -> bool:
        """Whether a call that ran late has still not returned (a wedged driver: not to be closed under it)."""
        return self._running is not None and self._running.is_alive()

    def silent_s(self) -> float | None:
        """How long no call has answered in time with events, once that is longer than the deadline (None: not so
        long), for ``/healthz`` (``metrics.Health.watch``): a wedged driver holds its call for good, and an exporter
        that never answers fails every call, while the loop goes on, billing nothing; a slow call within a long
        ``--device-timeout-s`` is no fault."""
        quiet = time.monotonic() - self._heard
        return quiet if quiet > self.timeout_s else None

    def settle(self, grace_s: float = 1.0) -> bool:
        """Whether no call is running, after waiting up to ``grace_s`` for one (a sample a stop interrupted the
        wait for, which ends at once, unless its driver is wedged)."""
        if self._running is not None:
            self._running.join(grace_s)
        return not self.busy

    def sample(self, ts_ns: int, interval_s: float) -> list[Event]:
        if self.busy:
            self.counts["sample_still_running"] += 1
            return []
        self._take_late()
        answer: list[list[Event] | BaseException] = []

        def run() -> None:
            try:
                answer.append(self.sampler.sample(ts_ns, interval_s))
            except BaseException as exc:  # noqa: BLE001 (raised again in the caller's thread)
                answer.append(exc)

        self._running = thread = threading.Thread(target=run, name="gpucost-sample", daemon=True)
        thread.start()
        waited_until = time.monotonic() + self.timeout_s
        while thread.is_alive() and time.monotonic() < waited_until and not self.stopped():
            thread.join(min(0.1, max(0.0, waited_until - time.monotonic())))
        if not answer:
            self._late = answer
            if not self.stopped():
                self.counts["sample_timed_out"] += 1
                log.warning("a sample took over %g s (--device-timeout-s): that period is a gap", self.timeout_s)
            return []
        if isinstance(answer[0], BaseException):
            raise answer[0]
        if answer[0]:
            self._heard = time.monotonic()
        return self._with_late_faults(answer[0])

    def _take_late(self) -> None:
        """The faults of the answer that came late (an error it raised, logged), kept for each GPU's next sample."""
        late, self._late = self._late, []
        if late and isinstance(late[0], BaseException):
            self.counts["sample_failed_late"] += 1
            log.warning("a sample that ran late failed: %s", late[0])
        elif late:
            for e in late[0]:
                if isinstance(e, GpuSample) and e.fault_fatal is not None:
                    fatal, warning = self._faults.get(e.gpu_uuid, (0, 0))
                    self._faults[e.gpu_uuid] = (fatal + e.fault_fatal, warning + (e.fault_warning or 0))

    def _with_late_faults(self, events: list[Event]) -> list[Event]:
        """``events`` with the faults of a late answer added to each GPU's sample (each GPU's once)."""
        if not self._faults:
            return events
        out: list[Event] = []
        for e in events:
            carried = self._faults.pop(e.gpu_uuid, None) if isinstance(e, GpuSample) else None
            if isinstance(e, GpuSample) and carried is not None:
                fatal = min((e.fault_fatal or 0) + carried[0], FAULT_COUNT_MAX)
                warning = min((e.fault_warning or 0) + carried[1], FAULT_COUNT_MAX)
                e = e.model_copy(update={"fault_fatal": fatal, "fault_warning": warning})
            out.append(e)
        return out


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
    live NVML run once died of it under load). ``ticks`` bounds the grid, not the samples: the loop ends at its
    last point (``--duration-s`` is wall-clock time, however many samples a slow source took in it). ``stopped``
    is asked before each sample."""
    period_ns = int(period_s * 1e9)
    start = prev = clock_ns()
    k = 0
    while True:
        if stopped():  # asked each period, whether or not the last gave events (a source failing every period)
            return
        earliest = max(start + (k + 1) * period_ns, clock_ns(), prev + period_ns // 2)
        k = -(-(earliest - start) // period_ns)  # the first grid point at or after it
        if ticks is not None and k > ticks:  # past the grid's last point: the duration is over
            return
        wait_ns = start + k * period_ns - clock_ns()
        if wait_ns > 0:
            sleep(wait_ns / 1e9)
        now = clock_ns()
        interval_s = round((now - prev) / 1e9, 6)
        prev = now
        yield from sampler.sample(now, interval_s)
