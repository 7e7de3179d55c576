"""A sample that hangs (a wedged driver, a library call with no deadline of its own) costs its period, never the run
(docs/sources.md, "Accelerators beyond NVIDIA": ``--device-timeout-s``)."""

from __future__ import annotations

import sys
import threading
import time
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


def _gpu(ts_ns: int, call: int) -> GpuSample:
    return GpuSample(
        node_id="n",
        gpu_uuid=f"GPU-call-{call}",
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


def test_an_exception_of_the_sample_is_raised_as_without_the_deadline() -> None:
    class Failing:
        def sample(self, ts_ns: int, interval_s: float) -> list[Event]:
            raise RuntimeError("the sampler's own error")

    with pytest.raises(RuntimeError, match="the sampler's own error"):
        Deadlined(Failing(), 1.0, Counter()).sample(T0, 1.0)


def test_a_live_nvml_run_outlives_a_hung_driver(
    shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``gpucost run`` (NVML, default settings but the deadline) whose driver stops answering on its third sample
    and never answers again: the run ends on time, with the samples before, and says what its source counted."""
    from gpucost.cli import main
    from gpucost.sinks.views import connect

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
    out = tmp_path / "out"
    args = ["run", "--node-id", "n", "--period-s", "0.05", "--duration-s", "1", "--device-timeout-s", "0.1"]
    began = time.monotonic()
    try:
        assert main([*args, "--out", str(out)]) == 0
    finally:
        never.set()
    assert time.monotonic() - began < 30
    assert "sample_timed_out" in capsys.readouterr().err
    (samples,) = connect(out).execute("SELECT count(*) FROM idle_index").fetchone()
    assert samples >= 1  # the panes of the samples before the driver hung are billed
