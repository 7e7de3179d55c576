"""A sample that hangs (a wedged driver, a library call with no deadline of its own) costs its period, never the run
(docs/sources.md, "Accelerators beyond NVIDIA": ``--device-timeout-s``)."""

from __future__ import annotations

import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from gpucost.producers.periodic import Deadlined
from gpucost.schemas.events import Event, GpuSample
from tests.fake_nvml import FakeState, fake_pynvml, parse

NS = 1_000_000_000
T0 = 1_767_571_200 * NS


class _Gated:
    """A sampler whose ``hang``-th call waits for ``gate``; each call's answer names the call."""

    def __init__(self, hang: int) -> None:
        self.hang, self.calls, self.gate, self.released = hang, 0, threading.Event(), threading.Event()

    def sample(self, ts_ns: int, interval_s: float) -> list[Event]:
        self.calls += 1
        call = self.calls
        if call == self.hang:
            self.gate.wait()
            answer = [_gpu(ts_ns, call)]
            self.released.set()
            return answer
        return [_gpu(ts_ns, call)]


def _gpu(ts_ns: int, call: int, uuid: str | None = None, faults: tuple[int, int] | None = None) -> GpuSample:
    return GpuSample(
        fault_fatal=None if faults is None else faults[0],
        fault_warning=None if faults is None else faults[1],
        node_id="n",
        gpu_uuid=uuid or f"GPU-call-{call}",
        gpu_model="H100",
        ts_ns=ts_ns,
        interval_s=1.0,
        sm_util_pct=1.0,
        mem_bw_util_pct=1.0,
        mem_used_bytes=1,
        mem_total_bytes=2,
        power_w=1.0,
        temp_c=1.0,
    )


def test_a_hung_sample_is_a_counted_gap_and_the_next_answer_is_its_own() -> None:
    gated, counts = _Gated(hang=2), Counter[str]()
    deadlined = Deadlined(gated, 0.2, counts)
    assert [e.gpu_uuid for e in deadlined.sample(T0, 1.0)] == ["GPU-call-1"]
    began = time.monotonic()
    assert deadlined.sample(T0 + NS, 1.0) == []  # waited for at most the deadline
    assert 0.2 <= time.monotonic() - began < 2 and counts == Counter(sample_timed_out=1)
    assert deadlined.sample(T0 + 2 * NS, 1.0) == []  # still hung: no second call started
    assert gated.calls == 2 and counts == Counter(sample_timed_out=1, sample_still_running=1)
    gated.gate.set()
    assert gated.released.wait(5)
    time.sleep(0.05)  # the hung call's thread ends once its answer is dropped
    # the late answer (call 2) is dropped; the next period is answered by a call of its own
    assert [e.gpu_uuid for e in deadlined.sample(T0 + 3 * NS, 1.0)] == ["GPU-call-3"]


class _LateFault:
    """A GPU whose second sample hangs until ``gate`` and then reports a fatal fault (or raises ``error``)."""

    def __init__(self, error: Exception | None = None) -> None:
        self.calls, self.gate, self.error = 0, threading.Event(), error

    def sample(self, ts_ns: int, interval_s: float) -> list[Event]:
        self.calls += 1
        if self.calls == 2:
            self.gate.wait()
            if self.error is not None:
                raise self.error
            return [_gpu(ts_ns, 2, "GPU-a", (1, 2))]
        return [_gpu(ts_ns, self.calls, "GPU-a", (0, 1))]


def _release(late: _LateFault, deadlined: Deadlined) -> None:
    late.gate.set()
    for _ in range(500):  # the hung call returns at once; wait for its thread to end
        if not deadlined.busy:
            return
        time.sleep(0.01)
    raise AssertionError("the released call never ended")


def test_the_faults_of_a_late_answer_come_with_the_gpus_next_sample() -> None:
    late, counts = _LateFault(), Counter[str]()
    deadlined = Deadlined(late, 0.1, counts)
    got = [deadlined.sample(T0 + k * NS, 1.0) for k in range(2)]
    _release(late, deadlined)
    got += [deadlined.sample(T0 + k * NS, 1.0) for k in (2, 3)]
    assert [[(e.fault_fatal, e.fault_warning) for e in events if isinstance(e, GpuSample)] for events in got] == [
        [(0, 1)],
        [],  # the hung period: a gap
        [(0 + 1, 1 + 2)],  # its own faults and the late answer's
        [(0, 1)],
    ]


def test_a_late_error_is_counted_and_the_source_goes_on() -> None:
    late, counts = _LateFault(RuntimeError("the driver's late error")), Counter[str]()
    deadlined = Deadlined(late, 0.1, counts)
    deadlined.sample(T0, 1.0), deadlined.sample(T0 + NS, 1.0)
    _release(late, deadlined)
    assert len(deadlined.sample(T0 + 2 * NS, 1.0)) == 1 and counts["sample_failed_late"] == 1


def test_a_stop_is_heard_while_a_sample_hangs() -> None:
    late, counts, stop = _LateFault(), Counter[str](), threading.Event()
    deadlined = Deadlined(late, 60.0, counts, stop.is_set)
    deadlined.sample(T0, 1.0)
    threading.Timer(0.2, stop.set).start()
    began = time.monotonic()
    assert deadlined.sample(T0 + NS, 1.0) == [] and time.monotonic() - began < 5
    assert counts["sample_timed_out"] == 0  # a stop, not a timeout
    late.gate.set()


def test_an_exception_of_the_sample_is_raised_as_without_the_deadline() -> None:
    class Failing:
        def sample(self, ts_ns: int, interval_s: float) -> list[Event]:
            raise RuntimeError("the sampler's own error")

    with pytest.raises(RuntimeError, match="the sampler's own error"):
        Deadlined(Failing(), 1.0, Counter()).sample(T0, 1.0)


def _wedged_on_third_sample(shared_data: Path, monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """pynvml stood in for by the fake NVML serving the H100 capture, whose driver stops answering on the third
    sample until the event returned is set."""
    path = shared_data / "nvidia-smi" / "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"
    if not path.exists():
        pytest.skip(f"{path} is absent")
    nv = fake_pynvml(FakeState(parse(path, "idle"), now_us=10**9))
    memory, calls, never = nv.nvmlDeviceGetMemoryInfo, [0], threading.Event()

    def wedged(h: object) -> object:
        calls[0] += 1
        if calls[0] >= 3:
            never.wait()  # a wedged driver: the call never returns
        return memory(h)

    nv.nvmlDeviceGetMemoryInfo = wedged
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    return never


def test_a_live_nvml_run_outlives_a_hung_driver(
    shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``gpucost run`` (NVML, default settings but the deadline) whose driver stops answering on its third sample
    and never answers again: the run ends on time, with the samples before, and says what its source counted."""
    from gpucost.cli import main
    from gpucost.sinks.views import connect

    never = _wedged_on_third_sample(shared_data, monkeypatch)
    out = tmp_path / "out"
    args = ["run", "--node-id", "n", "--period-s", "0.05", "--duration-s", "1", "--device-timeout-s", "0.1"]
    began = time.monotonic()
    try:
        assert main([*args, "--out", str(out)]) == 0
    finally:
        never.set()
    assert time.monotonic() - began < 30
    err = capsys.readouterr().err
    assert "sample_timed_out" in err and "close_skipped_sample_hung 1" in err  # never closed under the hung call
    (samples,) = connect(out).execute("SELECT count(*) FROM idle_index").fetchone()
    assert samples >= 1  # the panes of the samples before the driver hung are billed


def test_a_stop_during_a_sample_still_closes_the_source() -> None:
    """A stop heard while a sample is running (not hung): the source waits for it, then closes what it opened."""
    from gpucost.producers.live import LiveSettings, open_live

    closed, sampling = threading.Event(), threading.Event()

    class Slow:
        devices: list[object] = []

        def sample(self, ts_ns: int, interval_s: float) -> list[Event]:
            sampling.set()
            time.sleep(0.3)
            return []

        def close(self) -> None:
            closed.set()

    source = open_live("nvml", LiveSettings(node_id="n", period_s=0.05), nvml=Slow())  # type: ignore[arg-type]
    threading.Thread(target=lambda: (sampling.wait(5), source.stop()), daemon=True).start()
    assert list(source.events()) == [] and closed.is_set()


def test_healthz_fails_while_a_sample_goes_unanswered_past_the_stall() -> None:
    """A wedged driver holds its call while the run goes on, billing nothing: ``/healthz`` says so once the call has
    gone unanswered past the stall (60 s in a run; 0.5 s here), and is well again once it answers."""
    from gpucost.metrics import Health
    from gpucost.producers.live import LiveSettings, open_live

    never, sampling = threading.Event(), threading.Event()

    class Wedged:
        devices: list[object] = []

        def sample(self, ts_ns: int, interval_s: float) -> list[Event]:
            sampling.set()
            never.wait()
            return []

        def close(self) -> None:
            pass

    settings = LiveSettings(node_id="n", period_s=0.05, device_timeout_s=0.1)
    source = open_live("nvml", settings, nvml=Wedged())  # type: ignore[arg-type]
    health = Health(stall_s=0.5)
    health.watch("the source (NVML)", source.silent_s)
    run = threading.Thread(target=lambda: list(source.events()), daemon=True)
    run.start()
    try:
        assert sampling.wait(5) and health.problem() is None  # running, not yet past the stall
        until = time.monotonic() + 10
        while health.problem() is None and time.monotonic() < until:
            health.beat()  # the run's loop goes on
            time.sleep(0.05)
        assert "the source (NVML) has given no events for" in (health.problem() or "")
    finally:
        never.set()
        source.stop()
        run.join(5)
    health.beat()
    assert health.problem() is None and source.silent_s() is None  # the run is over


def test_a_run_s_healthz_says_its_driver_is_wedged(
    shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``gpucost run --metrics-address`` whose NVML stops answering: its ``/healthz`` turns 503 with the reason once
    the call has gone unanswered past the stall (60 s; 0.3 s here), though its loop goes on."""
    from gpucost.cli import main
    from gpucost.metrics import Health
    from tests.conftest import free_ports

    never = _wedged_on_third_sample(shared_data, monkeypatch)
    monkeypatch.setattr(Health.__init__, "__defaults__", (0.3, time.monotonic))  # the stall, shortened
    port, seen, done = free_ports(1), [], threading.Event()

    def poll() -> None:
        while not done.is_set():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
                    seen.append((r.status, r.read().decode()))
            except urllib.error.HTTPError as exc:
                seen.append((exc.code, exc.read().decode()))
            except OSError:
                pass  # not serving yet, or no longer
            time.sleep(0.05)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    args = ["run", "--node-id", "n", "--period-s", "0.05", "--duration-s", "3", "--device-timeout-s", "0.1"]
    try:
        assert main([*args, "--metrics-address", f"127.0.0.1:{port}", "--out", str(tmp_path / "out")]) == 0
    finally:
        never.set()
        done.set()
        poller.join(10)
    assert (200, "ok\n") in seen
    assert [text for code, text in seen if code == 503 and "has given no events for" in text and "NVML" in text]


def test_a_slow_sample_within_its_deadline_is_healthy() -> None:
    """A tool that takes 0.6 s where the deadline allows 1.5 s (a long ``--device-timeout-s``) is billed, and
    ``/healthz`` stays well however short the stall: only a call past its deadline can be a wedged driver."""
    from gpucost.metrics import Health

    class Slow:
        def sample(self, ts_ns: int, interval_s: float) -> list[Event]:
            time.sleep(0.6)
            return [_gpu(ts_ns, 1)]

    counts: Counter[str] = Counter()
    deadlined = Deadlined(Slow(), 1.5, counts)
    health, seen, done = Health(stall_s=0.1), [], threading.Event()
    health.watch("the source", deadlined.silent_s)

    def watch() -> None:
        while not done.is_set():
            health.beat()
            seen.append(health.problem())
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        assert all(len(deadlined.sample(T0 + k * NS, 1.0)) == 1 for k in range(3))
    finally:
        done.set()
        watcher.join(5)
    assert seen and set(seen) == {None} and not counts["sample_timed_out"]


def test_healthz_fails_while_every_call_fails_fast() -> None:
    """An exporter that never answers (each scrape refused or timed out, each period a counted gap) leaves nothing
    unanswered for long, yet nothing is billed: ``/healthz`` says so past the stall, and is well at the first events."""
    from gpucost.metrics import Health

    answers: list[list[Event]] = []

    class Down:
        def sample(self, ts_ns: int, interval_s: float) -> list[Event]:
            return answers.pop() if answers else []

    deadlined = Deadlined(Down(), 0.1, Counter())
    health = Health(stall_s=0.3)
    health.watch("the source (dcgm-exporter)", deadlined.silent_s)
    until = time.monotonic() + 10
    while health.problem() is None and time.monotonic() < until:
        assert deadlined.sample(T0, 1.0) == []
        health.beat()
        time.sleep(0.05)
    assert "the source (dcgm-exporter) has given no events for" in (health.problem() or "")
    answers.append([_gpu(T0, 1)])
    assert len(deadlined.sample(T0, 1.0)) == 1 and health.problem() is None
