"""The NVML producer against a fake NVML serving real nvidia-smi captures (H100, H200, H200 MIG)."""

from __future__ import annotations

import math
from pathlib import Path

import pynvml
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpucost.producers.nvml import NvmlSampler, NvmlUnavailable
from gpucost.producers.periodic import sample_forever
from gpucost.producers.synthetic import unclaimed_pid
from gpucost.schemas.events import GpuSample, ProcessSample
from tests.fake_nvml import FakeState, fake_pynvml, parse

NS = 1_000_000_000
T0 = 1_767_571_200 * NS
CAPTURES = ["linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt", "linux-x86_64__nvidia-h200__590.48.01.txt"]


def capture_path(shared_data: Path, name: str) -> Path:
    path = shared_data / "nvidia-smi" / name
    if not path.exists():
        pytest.skip(f"{path} is absent")
    return path


def opened(state: FakeState) -> NvmlSampler:
    sampler = NvmlSampler("node-a", fake_pynvml(state))
    sampler.open()
    return sampler


@pytest.mark.parametrize("name", CAPTURES)
@pytest.mark.parametrize("phase", ["idle", "load"])
def test_samples_carry_the_capture_values(shared_data: Path, name: str, phase: str) -> None:
    cap = parse(capture_path(shared_data, name), phase)
    state = FakeState(cap, now_us=10**9)  # every pmon sample already taken
    events = opened(state).sample(T0, 1.0)
    (gpu,) = [e for e in events if isinstance(e, GpuSample)]
    row = cap.dmon[0]
    assert (gpu.gpu_uuid, gpu.gpu_model, gpu.sm_util_pct, gpu.mem_bw_util_pct) == (
        cap.gpu_uuid,
        cap.name,
        row["sm"],
        row["mem"],
    )
    assert (gpu.power_w, gpu.temp_c) == (row["pwr"], row["gtemp"])
    assert (gpu.mem_used_bytes, gpu.mem_total_bytes) == (cap.fb_used_mib << 20, cap.fb_total_mib << 20)
    assert (gpu.pcie_tx_bytes_s, gpu.pcie_rx_bytes_s) == (cap.tx_kb_s * 1024, cap.rx_kb_s * 1024)
    procs = {e.pid: e for e in events if isinstance(e, ProcessSample)}
    assert set(procs) == set(cap.apps) | {p for p, sm, _ in cap.pmon if sm is not None}
    for pid, ev in procs.items():
        sms = [sm for p, sm, _ in cap.pmon if p == pid and sm is not None]
        assert ev.sm_util_pct == pytest.approx(sum(sms) / len(sms) if sms else 0.0, abs=0.005)
        assert ev.mem_used_bytes == cap.apps.get(pid, 0) << 20
    if phase == "load":
        assert any(ev.sm_util_pct > 50 for ev in procs.values())  # the burner really shows up


def test_process_samples_are_read_once_across_calls(shared_data: Path) -> None:
    cap = parse(capture_path(shared_data, CAPTURES[1]), "load")
    state = FakeState(cap, now_us=2_000_000)
    sampler = opened(state)
    first = {e.pid: e.sm_util_pct for e in sampler.sample(T0, 1.0) if isinstance(e, ProcessSample)}
    state.now_us = 10**9
    second = {e.pid: e.sm_util_pct for e in sampler.sample(T0 + NS, 1.0) if isinstance(e, ProcessSample)}
    per_cycle = len({p for p, _, _ in cap.pmon})
    for pid in {p for p, sm, _ in cap.pmon if sm is not None}:
        sms = [sm for i, (p, sm, _) in enumerate(cap.pmon) if p == pid and sm is not None]
        early = [sm for i, (p, sm, _) in enumerate(cap.pmon) if p == pid and sm is not None and i // per_cycle < 2]
        late = sms[len(early) :]
        assert first.get(pid, 0.0) == pytest.approx(sum(early) / len(early) if early else 0.0, abs=0.005)
        assert second.get(pid, 0.0) == pytest.approx(sum(late) / len(late) if late else 0.0, abs=0.005)


def test_mig_instances_are_the_billed_devices(shared_data: Path) -> None:
    cap = parse(capture_path(shared_data, "linux-x86_64__nvidia-h200-mig__590.48.01.txt"), "load")
    assert len(cap.mig) == 5
    sampler = opened(FakeState(cap, mig_enabled=True))
    assert [d.uuid for d in sampler.devices] == [u for _, u in cap.mig]
    events = sampler.sample(T0, 1.0)
    assert not any(isinstance(e, GpuSample) for e in events)  # MIG has no utilisation counters here …
    assert sampler.counts["gpu_sample_skipped"] == 5  # … which is counted, never guessed


MIG_CAPTURES = ["linux-x86_64__nvidia-h100-mig__590.48.01.txt", "linux-x86_64__nvidia-h200-mig__590.48.01.txt"]
pct = st.one_of(st.just(0.0), st.floats(0, 100), st.floats(100, 120))  # GPM can read past 100 %
gpm_rows = st.lists(st.tuples(pct, pct, pct), min_size=3, max_size=3)


@pytest.mark.slow
@pytest.mark.parametrize("name", MIG_CAPTURES)
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])  # shared_data: a path, never changed
@given(data=st.data())
def test_gpm_bills_each_mig_instance_from_its_own_counters(shared_data: Path, name: str, data: st.DataObject) -> None:
    """Each MIG instance's sample carries its GPU instance's GPM readings over the period just ended; an
    instance whose GPU instance holds other compute instances is skipped and counted (its counters are
    theirs too); a busy instance's time goes to its one process, or else to a synthetic unclaimed one."""
    cap = parse(capture_path(shared_data, name), "load")
    if data.draw(st.booleans(), "move a process"):  # a single process in an instance, as no capture has
        pid = min(cap.mig_processes)
        cap.mig_processes = {**cap.mig_processes, pid: data.draw(st.sampled_from(cap.mig_instance), "to")}
    state = FakeState(cap, mig_enabled=True, gpm={gi: data.draw(gpm_rows, f"GI {gi}") for gi, _ in cap.mig_instance})
    sampler = opened(state)
    for tick in (1, 2):
        state.tick = tick
        events = sampler.sample(T0 + tick * NS, 1.0)
        gpus = {e.gpu_uuid: e for e in events if isinstance(e, GpuSample)}
        shared = 0
        for (profile, uuid), (gi, ci) in zip(cap.mig, cap.mig_instance):
            if [g for g, _ in cap.mig_instance].count(gi) > 1:
                shared += 1
                assert uuid not in gpus
                continue
            busy, tensor, dram = (min(v, 100.0) for v in state.gpm[gi][tick])  # type: ignore[index]
            gpu = gpus[uuid]
            assert gpu.gpu_model == f"{cap.name} MIG {profile}"
            assert [gpu.sm_util_pct, gpu.mem_bw_util_pct, gpu.tensor_active_pct, gpu.dram_active_pct] == pytest.approx(
                [busy, dram, tensor, dram], abs=0.005
            )  # to 1/100 %
            procs = {e.pid: e for e in events if isinstance(e, ProcessSample) and e.gpu_uuid == uuid}
            running = {p for p, at in cap.mig_processes.items() if at == (gi, ci)}
            assert set(procs) - running <= {unclaimed_pid(uuid)}
            claimed = procs.get(next(iter(running))) if len(running) == 1 else procs.get(unclaimed_pid(uuid))
            if gpu.sm_util_pct == 0:
                assert unclaimed_pid(uuid) not in procs and all(p.sm_util_pct == 0 for p in procs.values())
            else:
                assert claimed is not None
                assert (claimed.sm_util_pct, claimed.mem_bw_util_pct) == (gpu.sm_util_pct, gpu.mem_bw_util_pct)
                assert sum(p.sm_util_pct for p in procs.values()) == gpu.sm_util_pct  # the others: memory, 0 %
        assert sampler.counts["gpm_shared_instance"] == tick * shared
    assert not any(e.gpu_uuid == cap.gpu_uuid for e in events)  # the parent is never billed as well


@pytest.mark.parametrize("name", CAPTURES)
def test_gpm_adds_tensor_and_dram_activity_to_a_whole_gpu(shared_data: Path, name: str) -> None:
    cap = parse(capture_path(shared_data, name), "load")
    state = FakeState(cap, gpm={"gpu0": [(1.0, 2.0, 3.0), (99.5, 41.25, 63.126)]}, gpm_unsupported=set())
    sampler = opened(state)
    state.tick = 1
    (gpu,) = [e for e in sampler.sample(T0, 1.0) if isinstance(e, GpuSample)]
    # utilisation stays NVML's own (the dmon row); GPM adds what it alone has
    assert (gpu.sm_util_pct, gpu.mem_bw_util_pct) == (cap.dmon[1]["sm"], cap.dmon[1]["mem"])
    assert (gpu.tensor_active_pct, gpu.dram_active_pct) == (41.25, 63.13)
    state.gpm_unsupported, state.tick = {"NVML_GPM_METRIC_ANY_TENSOR_UTIL"}, 0
    (gpu,) = [e for e in sampler.sample(T0 + NS, 1.0) if isinstance(e, GpuSample)]
    assert (gpu.tensor_active_pct, gpu.dram_active_pct) == (None, 3.0)
    assert sampler.counts["gpm_not_supported:tensor"] == 1
    # a reading NVML computes as NaN or infinite is not a measurement: left out and counted, never 0 %
    state.gpm_unsupported, state.gpm["gpu0"][1] = set(), (50.0, math.nan, math.inf)  # type: ignore[index]
    state.tick = 1
    (gpu,) = [e for e in sampler.sample(T0 + 2 * NS, 1.0) if isinstance(e, GpuSample)]
    assert (gpu.tensor_active_pct, gpu.dram_active_pct) == (None, None)
    assert (sampler.counts["gpm_not_finite:tensor"], sampler.counts["gpm_not_finite:dram"]) == (1, 1)


def test_without_gpm_the_fields_are_absent_and_a_mig_instance_is_skipped(shared_data: Path) -> None:
    cap = parse(capture_path(shared_data, CAPTURES[0]), "load")
    (gpu,) = [e for e in opened(FakeState(cap)).sample(T0, 1.0) if isinstance(e, GpuSample)]
    assert (gpu.tensor_active_pct, gpu.dram_active_pct) == (None, None)


def test_unsupported_pcie_and_a_gpu_falling_off_the_bus(shared_data: Path) -> None:
    cap = parse(capture_path(shared_data, CAPTURES[0]), "idle")
    state = FakeState(cap, unsupported={"pcie"})
    sampler = opened(state)
    (gpu,) = [e for e in sampler.sample(T0, 1.0) if isinstance(e, GpuSample)]
    assert gpu.pcie_tx_bytes_s is None and sampler.counts["not_supported:pcie"] == 2
    state.lost_after_calls = state.calls
    assert sampler.sample(T0 + NS, 1.0) == [] and sampler.devices == [] and sampler.counts["gpu_lost"] == 1


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_DRIVER_NOT_LOADED, pynvml.NVML_ERROR_LIBRARY_NOT_FOUND])
def test_no_driver_is_one_clear_error(shared_data: Path, code: int) -> None:
    cap = parse(capture_path(shared_data, CAPTURES[0]), "idle")
    with pytest.raises(NvmlUnavailable, match="--source simulate"):
        opened(FakeState(cap, init_error=code))


def test_sampling_stays_on_its_grid(shared_data: Path) -> None:
    """Each sample takes 0.3 s; the loop still samples at start + k·period, intervals = real elapsed."""
    cap = parse(capture_path(shared_data, CAPTURES[0]), "idle")
    sampler = opened(FakeState(cap))
    clock = [T0]

    def slow_sample(ts_ns: int, interval_s: float) -> list:
        clock[0] += 300_000_000
        return [(ts_ns, interval_s)]

    sampler.sample = slow_sample  # type: ignore[method-assign]
    sleeps: list[float] = []

    def sleep(s: float) -> None:
        sleeps.append(s)
        clock[0] += int(s * 1e9)

    ticks = list(sample_forever(sampler, 1.0, ticks=5, clock_ns=lambda: clock[0], sleep=sleep))
    assert [ts for ts, _ in ticks] == [T0 + k * NS for k in range(1, 6)]
    assert [i for _, i in ticks] == [1.0] * 5
    assert sleeps[1:] == [pytest.approx(0.7)] * 4


def test_a_loop_held_up_past_grid_points_skips_them_instead_of_sampling_them_back_to_back() -> None:
    """A consumer that keeps the generator waiting 3.5 periods: the next sample is at the next grid point, and no
    sample stands for less than half a period (back to back, they stood for microseconds and rounded to 0 ms)."""
    clock = [T0]
    taken: list[tuple[int, float]] = []

    class Sampler:
        def sample(self, ts_ns: int, interval_s: float) -> list:
            taken.append((ts_ns, interval_s))
            return [None]

    def sleep(s: float) -> None:
        clock[0] += int(s * 1e9)

    loop = sample_forever(Sampler(), 1.0, ticks=7, clock_ns=lambda: clock[0], sleep=sleep)
    next(loop)
    clock[0] += 3_500_000_000  # held up between samples
    list(loop)
    assert [ts for ts, _ in taken] == [T0 + NS, T0 + 5 * NS, T0 + 6 * NS, T0 + 7 * NS]
    assert [i for _, i in taken] == [1.0, 4.0, 1.0, 1.0]
    # a sleep that overshoots by 0.9 s: the first sample at 1.9 s, and the grid point 0.1 s after it is skipped
    clock[0], taken[:], late = T0, [], [900_000_000]

    def overshooting(s: float) -> None:
        clock[0] += int(s * 1e9) + (late.pop() if late else 0)

    list(sample_forever(Sampler(), 1.0, ticks=3, clock_ns=lambda: clock[0], sleep=overshooting))
    assert taken == [(T0 + 1_900_000_000, 1.9), (T0 + 3 * NS, 1.1)]


def test_the_duration_is_wall_clock_time_however_slow_the_samples() -> None:
    """``--duration-s 10`` at 1 s whose samples each take 3 s (an exporter timing out): samples at 1, 4, 7 and 10 s,
    and the loop ends there, not after ten samples (a newcomer's 85 s run took 166 s)."""
    clock = [T0]
    taken: list[int] = []

    class Slow:
        def sample(self, ts_ns: int, interval_s: float) -> list:
            taken.append(ts_ns)
            clock[0] += 3 * NS
            return []

    def sleep(s: float) -> None:
        clock[0] += int(s * 1e9)

    assert list(sample_forever(Slow(), 1.0, ticks=10, clock_ns=lambda: clock[0], sleep=sleep)) == []
    assert taken == [T0 + k * NS for k in (1, 4, 7, 10)] and clock[0] == T0 + 13 * NS


def test_gpucost_run_audits_the_nvml_source(
    shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`gpucost run` (source auto) finds the (fake) NVML, samples it, and writes the audit."""
    import sys

    from gpucost.cli import main
    from gpucost.sinks.views import connect

    cap = parse(capture_path(shared_data, CAPTURES[1]), "load")
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(FakeState(cap, now_us=10**9)))
    prices = tmp_path / "prices.jsonl"
    prices.write_text(
        f'{{"kind": "price", "gpu_model": "{cap.name}", "ts_ns": 1000000000000000000, '
        '"usd_per_gpu_hour": "36.000000"}\n'
    )  # 10 µ$ per ms
    out = tmp_path / "out"
    assert (
        main(
            [
                "run",
                "--node-id",
                "node-a",
                "--period-s",
                "0.05",
                "--duration-s",
                "0.5",
                "--out",
                str(out),
                "--prices",
                str(prices),
            ]
        )
        == 0
    )
    assert "via NVML" in capsys.readouterr().err
    con = connect(out)
    (gpus,) = con.execute("SELECT list(DISTINCT gpu_uuid) FROM idle_index").fetchone()
    assert gpus == [cap.gpu_uuid]
    rows = con.execute("SELECT sum(covered_ms), sum(idle_ms) FROM idle_index").fetchone()
    assert 400 <= rows[0] <= 700 and rows[1] == 0  # ~10 samples of ~50 ms, the burner never idle
    teams = {t for (t,) in con.execute("SELECT DISTINCT team FROM cost").fetchall()}
    assert teams == {"idle", "unattributed"}  # no bindings on this node: attributed to nobody, not dropped
    (total,) = con.execute("SELECT sum(cost_micro_usd) FROM cost").fetchone()
    assert total == 10 * rows[0] and not con.execute("SELECT bool_or(unpriced) FROM cost").fetchone()[0]
