"""The live sources' one interface: ``events()`` ends soon after ``stop()``, and leaves nothing running."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator

from gpucost.producers.live import LiveSettings, LiveSource, TracedSource, open_live
from gpucost.schemas.events import Event, MemAccess

T0 = 1_736_121_600 * 10**9


class _Probe:
    """bpftrace's stand-in: a fault now and then until stopped."""

    def __init__(self) -> None:
        self.stopped = threading.Event()
        self.counts: Counter[str] = Counter()

    def events(self) -> Iterator[Event]:
        while not self.stopped.wait(0.02):
            yield MemAccess(node_id="n", pid=1, ts_ns=T0, address=4096)

    def stop(self) -> None:
        self.stopped.set()

    def summary(self) -> str:
        return "summary"


def _drain(source: LiveSource) -> tuple[threading.Thread, list[Event]]:
    got: list[Event] = []
    thread = threading.Thread(target=lambda: got.extend(source.events()))
    thread.start()
    return thread, got


def test_a_traced_source_stopped_before_its_duration_leaves_no_timer_behind() -> None:
    """`run --source ebpf --duration-s 30`, Ctrl-C at 7 s, exited only at 32 s: its timer kept the process."""
    said: list[str] = []
    source = TracedSource(_Probe(), "tracing", LiveSettings(node_id="n", duration_s=30), None, said.append)
    thread, got = _drain(source)
    time.sleep(0.2)
    source.stop()
    thread.join(5)
    assert not thread.is_alive() and got and said == ["summary"]
    time.sleep(0.05)
    assert not [t for t in threading.enumerate() if isinstance(t, threading.Timer) and t.is_alive()]


def test_a_traced_source_ends_at_its_duration() -> None:
    source = TracedSource(_Probe(), "tracing", LiveSettings(node_id="n", duration_s=0.3), None, lambda _: None)
    started = time.monotonic()
    thread, got = _drain(source)
    thread.join(5)
    assert not thread.is_alive() and got and 0.25 < time.monotonic() - started < 3


def test_a_sampled_source_ends_after_stop_and_closes_what_it_opened() -> None:
    closed = threading.Event()

    class Sampler:
        """NVML's stand-in, opened already (as ``--source auto`` hands one to ``open_live``)."""

        devices: list[object] = []

        def sample(self, ts_ns: int, interval_s: float) -> list[Event]:
            return [MemAccess(node_id="n", pid=1, ts_ns=ts_ns, address=0)]

        def close(self) -> None:
            closed.set()

    source = open_live("nvml", LiveSettings(node_id="n", period_s=0.05), nvml=Sampler())  # type: ignore[arg-type]
    thread, got = _drain(source)
    time.sleep(0.3)
    source.stop()
    thread.join(5)
    assert not thread.is_alive() and got and closed.is_set()
