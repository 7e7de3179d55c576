"""The NVML source's device faults (docs/sources.md, "Device faults"), against the fake NVML of tests/fake_nvml.py
serving the real H100 capture's ``nvidia-smi -q`` values.

The capture's values are read by eye (file and line below); a rise is the test changing one of them, written out.
The expected counts follow from the contract: faults new since the device's last sample sent, the GPU's readings
when the source opens being the baseline; an uncorrectable ECC rise and a fatal XID are fatal, a corrected rise, a
replay, a warning XID and a slowdown warnings.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pynvml
import pytest

from gpucost.producers.nvml import NvmlSampler
from gpucost.producers.nvml_faults import NvmlFaults
from gpucost.schemas.events import Event, GpuSample
from gpucost.streams.settings import AuditSettings
from tests.fake_nvml import Capture, FakeState, fake_pynvml, parse
from tests.support.bills import bills, run

NS = 1_000_000_000
T0 = 1_767_571_200 * NS
H100 = "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"
H100_MIG = "linux-x86_64__nvidia-h100-mig__590.48.01.txt"
DBE = "NVML_FI_DEV_ECC_DBE_VOL_TOTAL"


def _capture(shared_data: Path, name: str = H100) -> Capture:
    path = shared_data / "nvidia-smi" / name
    if not path.exists():
        pytest.skip(f"{path} is absent")
    return parse(path, "idle")


def _faults(events: list[Event]) -> list[tuple[int | None, int | None]]:
    return [(e.fault_fatal, e.fault_warning) for e in events if isinstance(e, GpuSample)]


def test_the_captures_fault_fields_are_read(shared_data: Path) -> None:
    cap = _capture(shared_data)
    assert cap.fields == {
        "NVML_FI_DEV_ECC_SBE_VOL_TOTAL": 0,  # line 1626 SRAM Correctable 0, line 1629 DRAM Correctable 0
        "NVML_FI_DEV_ECC_DBE_VOL_TOTAL": 0,  # lines 1627, 1628, 1630: SRAM parity, SEC-DED, DRAM uncorrectable 0
        "NVML_FI_DEV_ECC_SBE_AGG_TOTAL": 0,  # lines 1632, 1635
        "NVML_FI_DEV_ECC_DBE_AGG_TOTAL": 0,  # lines 1633, 1634, 1636
        "NVML_FI_DEV_PCIE_REPLAY_COUNTER": 9,  # line 1564: Replays Since Reset 9
        "NVML_FI_DEV_REMAPPED_COR": 0,  # line 1652
        "NVML_FI_DEV_REMAPPED_UNC": 0,  # line 1653
        "NVML_FI_DEV_REMAPPED_FAILURE": 0,  # line 1655: Remapping Failure Occurred No
    }
    assert cap.clocks == 0x1  # line 1573: Idle Active, the rest Not Active
    nv = fake_pynvml(FakeState(cap))
    faults = NvmlFaults(nv, Counter())
    faults.open({cap.gpu_uuid: "gpu0"})
    got = faults.read(cap.gpu_uuid, "gpu0", cap.gpu_uuid)
    assert (got.ecc_corrected, got.ecc_uncorrected, got.pcie_replays, got.remapped_rows, got.remap_failed) == (
        0,
        0,
        9,
        0,
        False,
    )
    # retired pages N/A (line 1648-1649: the H100 remaps rows), NVLink errors not in the capture: not reported
    assert (got.retired_pages, got.link_errors, got.throttle_reasons, got.xid) == (None, None, ("gpu_idle",), 0)


def test_causes_and_links_are_summed_and_the_lifetime_count_stands_in(shared_data: Path) -> None:
    """A GPU whose field values differ from the capture's, as written here."""
    cap = _capture(shared_data)
    del cap.fields["NVML_FI_DEV_ECC_SBE_VOL_TOTAL"]  # no volatile count: the lifetime one stands in
    cap.fields |= {
        "NVML_FI_DEV_ECC_SBE_AGG_TOTAL": 40,
        "NVML_FI_DEV_RETIRED_SBE": 1,
        "NVML_FI_DEV_RETIRED_DBE": 2,
        "NVML_FI_DEV_REMAPPED_COR": 3,
        "NVML_FI_DEV_REMAPPED_UNC": 4,
        "NVML_FI_DEV_REMAPPED_FAILURE": 1,
        "NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": 5,
        "NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": 6,
        "NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": 7,
        "NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": 8,
    }
    cap.clocks = 0x8 | 0x20  # HW Slowdown, SW Thermal Slowdown
    faults = NvmlFaults(fake_pynvml(FakeState(cap, xids=None)), Counter())
    faults.open({cap.gpu_uuid: "gpu0"})
    got = faults.read(cap.gpu_uuid, "gpu0", cap.gpu_uuid)
    assert (got.ecc_corrected, got.retired_pages, got.remapped_rows, got.remap_failed, got.link_errors) == (
        40,
        1 + 2,
        3 + 4,
        True,
        5 + 6 + 7 + 8,
    )
    assert (got.throttle_reasons, got.xid) == (("hw_slowdown", "sw_thermal_slowdown"), None)  # no XID events


def test_each_sample_carries_the_faults_new_since_the_last(shared_data: Path) -> None:
    cap = _capture(shared_data)
    state = FakeState(cap)
    sampler = NvmlSampler("n", fake_pynvml(state))
    sampler.open()
    steps = [
        (lambda: None, (0, 0)),  # the 9 replays from before the run are not the run's
        (lambda: cap.fields.update({DBE: 1}), (1, 0)),  # one uncorrectable ECC error
        (lambda: state.xids.append(79), (1, 0)),  # fallen off the bus (a fatal XID)
        (lambda: (state.xids.append(13), setattr(cap, "clocks", 0x1 | 0x40)), (0, 2)),  # a warning XID; too hot
        (lambda: (setattr(cap, "clocks", 0x1), cap.fields.update({"NVML_FI_DEV_PCIE_REPLAY_COUNTER": 12})), (0, 1)),
        (lambda: None, (0, 0)),
    ]
    got = []
    for k, (change, _) in enumerate(steps):
        change()
        got += _faults(sampler.sample(T0 + k * NS, 1.0))
    assert got == [want for _, want in steps]


def test_the_faults_of_a_skipped_sample_come_with_the_next(shared_data: Path) -> None:
    cap = _capture(shared_data)
    state = FakeState(cap)
    sampler = NvmlSampler("n", fake_pynvml(state))
    sampler.open()
    state.unsupported.add("utilization")  # no utilisation this period: no sample to bill
    state.xids.append(79)
    assert _faults(sampler.sample(T0, 1.0)) == []
    state.unsupported.discard("utilization")
    assert _faults(sampler.sample(T0 + NS, 1.0)) == [(1, 0)]


def test_a_reading_no_event_can_hold_skips_the_device_and_keeps_its_faults(shared_data: Path) -> None:
    """A power of 20 kW (above any GPU's), 0xFFFFFFFF mW (4.3 MW: a driver's garbage) or a process said to hold 2^63
    bytes skips the device's events that period, counted and never raised (the source goes on); the fatal XID of
    that period fails the device's next sample sent."""
    cap = _capture(shared_data)
    state = FakeState(cap)
    nvml = fake_pynvml(state)
    sampler = NvmlSampler("n", nvml)
    sampler.open()
    power, processes = nvml.nvmlDeviceGetPowerUsage, nvml.nvmlDeviceGetComputeRunningProcesses
    spoilers = [
        ("nvmlDeviceGetPowerUsage", lambda h: 20_000_000),
        ("nvmlDeviceGetPowerUsage", lambda h: 0xFFFFFFFF),
        (
            "nvmlDeviceGetComputeRunningProcesses",
            lambda h: processes(h) + [SimpleNamespace(pid=4242, usedGpuMemory=2**63)],
        ),
    ]
    for k, ((call, spoilt), xid) in enumerate(zip(spoilers, (79, 48, 94), strict=True)):  # three fatal XIDs
        setattr(nvml, call, spoilt)
        state.xids.append(xid)
        assert _faults(sampler.sample(T0 + 2 * k * NS, 1.0)) == [] and sampler.counts["gpu_sample_invalid"] == k + 1
        nvml.nvmlDeviceGetPowerUsage, nvml.nvmlDeviceGetComputeRunningProcesses = power, processes
        assert _faults(sampler.sample(T0 + (2 * k + 1) * NS, 1.0)) == [(1, 0)]


def test_the_same_xid_again_is_a_new_fault(shared_data: Path) -> None:
    """A GPU that falls off the bus twice (XID 79, periods apart) fails both samples, not only the first: NVML sends
    each XID as an event, whatever the last one was; two in one period are one fault of that period."""
    state = FakeState(_capture(shared_data))
    sampler = NvmlSampler("n", fake_pynvml(state))
    sampler.open()
    got = []
    for xids in ([79], [], [79], [79, 79], [13], [13]):
        state.xids += xids
        got += _faults(sampler.sample(T0 + len(got) * NS, 1.0))
    assert got == [(1, 0), (0, 0), (1, 0), (1, 0), (0, 1), (0, 1)]


def test_a_gpu_without_fault_readings_reports_none(shared_data: Path) -> None:
    cap = _capture(shared_data)
    cap.clocks = None
    state = FakeState(cap, unsupported={"fields"}, xids=None)
    sampler = NvmlSampler("n", fake_pynvml(state))
    sampler.open()
    assert _faults(sampler.sample(T0, 1.0)) == [(None, None)]  # not reported, which is not "none"
    assert sampler.counts["xid_events_unavailable"] == 1 and sampler.counts["fault_fields_unavailable"] >= 1


def test_mig_instances_report_their_gpus_faults(shared_data: Path) -> None:
    cap = _capture(shared_data, H100_MIG)
    state = FakeState(cap, mig_enabled=True, now_us=10**9, gpm={gi: [(50.0, 1.0, 2.0)] for gi, _ in cap.mig_instance})
    sampler = NvmlSampler("n", fake_pynvml(state))
    sampler.open()
    first = _faults(sampler.sample(T0, 1.0))
    cap.fields[DBE] = cap.fields[DBE] + 1
    second = _faults(sampler.sample(T0 + NS, 1.0))
    assert len(first) == len(second) > 1 and set(first) == {(0, 0)} and set(second) == {(1, 0)}
    # the GPU's counters are read once a period (and once at open), however many instances it has
    assert state.fault_calls["nvmlDeviceGetFieldValues"] == 1 + 2


def test_a_failed_read_is_no_fault(shared_data: Path) -> None:
    """A field NVML fails to read for one period (not "not supported") is unread, never the lifetime count standing
    in for a volatile one, nor a sum short of a part: no fault appears from nothing."""
    cap = _capture(shared_data)
    cap.fields |= {"NVML_FI_DEV_ECC_DBE_AGG_TOTAL": 2, "NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": 5}
    cap.fields |= {"NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": 6}
    state = FakeState(cap)
    sampler = NvmlSampler("n", fake_pynvml(state))
    sampler.open()
    got = _faults(sampler.sample(T0, 1.0))
    state.field_errors = {DBE: pynvml.NVML_ERROR_UNKNOWN, "NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": 999}
    got += _faults(sampler.sample(T0 + NS, 1.0))
    state.field_errors = {}
    got += _faults(sampler.sample(T0 + 2 * NS, 1.0))
    assert got == [(0, 0)] * 3


def test_a_clocks_error_or_an_old_driver_never_stops_the_source(shared_data: Path) -> None:
    cap = _capture(shared_data)
    old = FakeState(cap, clocks_error=pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)  # a driver before R535
    sampler = NvmlSampler("n", fake_pynvml(old))
    sampler.open()
    assert _faults(sampler.sample(T0, 1.0)) == [(0, 0)] and old.fault_calls["throttle"] == 2  # the older call
    failing = FakeState(cap, clocks_error=pynvml.NVML_ERROR_UNKNOWN)
    sampler = NvmlSampler("n", fake_pynvml(failing))
    sampler.open()
    assert _faults(sampler.sample(T0, 1.0)) == [(0, 0)] and sampler.counts["clocks_failed"] == 2


def test_a_fatal_xid_is_kept_over_a_later_warning_in_one_period(shared_data: Path) -> None:
    state = FakeState(_capture(shared_data))
    sampler = NvmlSampler("n", fake_pynvml(state))
    sampler.open()
    state.xids += [79, 13]  # fallen off the bus, then a warning XID, before one sample
    assert _faults(sampler.sample(T0, 1.0)) == [(1, 0)]


def _mig(shared_data: Path) -> tuple[FakeState, NvmlSampler, dict[str, int]]:
    """The fake NVML serving the H100 MIG capture with GPM, opened, and each instance's GPU instance by UUID."""
    cap = _capture(shared_data, H100_MIG)
    state = FakeState(cap, mig_enabled=True, now_us=10**9, gpm={gi: [(50.0, 1.0, 2.0)] for gi, _ in cap.mig_instance})
    sampler = NvmlSampler("n", fake_pynvml(state))
    sampler.open()
    return state, sampler, {mig_uuid: cap.mig_instance[j][0] for j, (_, mig_uuid) in enumerate(cap.mig)}


def test_an_xid_of_one_gpu_instance_is_its_instances_alone(shared_data: Path) -> None:
    """An XID NVML attributes to a MIG GPU instance fails the samples of that instance's devices only; one it
    attributes to none, every instance's."""
    state, sampler, gi_of = _mig(shared_data)
    first_gi = next(iter(gi_of.values()))  # the first instance's GPU instance
    state.xids += [(94, first_gi)]  # a contained ECC error in one GPU instance
    got = {e.gpu_uuid: e.fault_fatal for e in sampler.sample(T0, 1.0) if isinstance(e, GpuSample)}
    assert got and got == {u: int(gi_of[u] == first_gi) for u in got}
    assert 0 < sum(got.values()) < len(got)
    state.xids += [79]  # the whole GPU fell off the bus
    got = {e.gpu_uuid: e.fault_fatal for e in sampler.sample(T0 + NS, 1.0) if isinstance(e, GpuSample)}
    assert set(got.values()) == {1}


def test_a_fatal_xid_of_an_instance_is_kept_over_a_later_warning_of_its_gpu(shared_data: Path) -> None:
    """An instance's fatal XID then a whole-GPU warning in one period, or a whole-GPU fatal XID then a warning of the
    instance: the instance's sample fails either way (its worst XID of the period, not its latest)."""
    state, sampler, gi_of = _mig(shared_data)
    first_gi = next(iter(gi_of.values()))  # the first instance's GPU instance
    for k, xids in enumerate(([(79, first_gi), 13], [79, (13, first_gi)])):
        state.xids += xids
        got = {
            e.gpu_uuid: (e.fault_fatal, e.fault_warning)
            for e in sampler.sample(T0 + k * NS, 1.0)
            if isinstance(e, GpuSample)
        }
        first = {u: faults for u, faults in got.items() if gi_of.get(u) == first_gi}
        assert first and set(first.values()) == {(1, 0)}
        others = {u: faults for u, faults in got.items() if u not in first and u in gi_of}
        assert others and set(others.values()) == {(0, 1) if k == 0 else (1, 0)}


def test_faults_leave_the_bill_unchanged(shared_data: Path) -> None:
    cap = _capture(shared_data)
    state = FakeState(cap, now_us=10**9)
    sampler = NvmlSampler("n", fake_pynvml(state))
    sampler.open()
    events: list[Event] = []
    for k in range(120):
        if k % 30 == 29:  # fatal XIDs, 79 and 48 by turns
            state.xids.append((79, 48)[k // 30 % 2])
        state.tick = k
        events += sampler.sample(T0 + k * NS, 1.0)
    plain = [
        e.model_copy(update={"fault_fatal": None, "fault_warning": None}) if isinstance(e, GpuSample) else e
        for e in events
    ]
    assert sum(f or 0 for f, _ in _faults(events)) == 4
    assert bills(run(AuditSettings(), events)) == bills(run(AuditSettings(), plain)) != {}


def test_a_live_run_fails_the_window_of_a_fatal_xid(
    shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``gpucost run`` (NVML, its default settings) with one fatal XID during the run: the health record of the
    window that saw it fails on ``device_fault``; no other fails on it."""
    from gpucost.cli import main
    from gpucost.sinks.views import connect

    cap = _capture(shared_data)
    state = FakeState(cap, now_us=10**9, xids=[79])
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(state))
    out = tmp_path / "out"
    assert main(["run", "--node-id", "n", "--period-s", "0.05", "--duration-s", "0.4", "--out", str(out)]) == 0
    rows = connect(out).execute("SELECT faults_fatal, fail_reasons FROM health").fetchall()
    assert sum(f or 0 for f, _ in rows) == 1
    assert [("device_fault" in r) for _, r in rows] == [bool(f) for f, _ in rows]
