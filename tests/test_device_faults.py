"""The fault classification, the clocks event mask, fault counts, and how ``gpucost devices`` shows faults.

The expected names of the mask bits are NVML's documented values (nvml.h, ``nvmlClocksEventReasons``:
``#define nvmlClocksEventReasonGpuIdle 0x0000000000000001LL`` …), written out here on their own; the
fatal XIDs are the NVIDIA catalogue's codes that need a GPU reset or mean memory corrupted past
correction (docs/sources.md, "Device faults").
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from gpucost.devices import DEVICES
from gpucost.producers.accelerators.detect import FORMATS, parse
from gpucost.producers.accelerators.prometheus import series
from gpucost.schemas.devices import DeviceSample, Parsed, UnitError, to_count
from gpucost.schemas.faults import faults, is_fatal, throttle_names

# NVML clocks event reasons, from its header: value → documented name
NVML = {
    0x0000000000000001: "gpu_idle",
    0x0000000000000002: "applications_clocks_setting",
    0x0000000000000004: "sw_power_cap",
    0x0000000000000008: "hw_slowdown",
    0x0000000000000010: "sync_boost",
    0x0000000000000020: "sw_thermal_slowdown",
    0x0000000000000040: "hw_thermal_slowdown",
    0x0000000000000080: "hw_power_brake_slowdown",
    0x0000000000000100: "display_clock_setting",
}


COUNTS = ("ecc_corrected", "ecc_uncorrected", "retired_pages", "remapped_rows", "xid", "link_errors", "pcie_replays")


def _gpu(**faults: object) -> DeviceSample:
    return DeviceSample("NVIDIA", "NVIDIA H100", "GPU-x", **faults)  # type: ignore[arg-type]


@pytest.mark.parametrize("bit", sorted(NVML))
def test_each_nvml_bit_alone(bit: int) -> None:
    assert throttle_names(bit) == (NVML[bit],)


def test_mask_of_several_bits_and_none() -> None:
    assert throttle_names(0) == ()  # nvmlClocksEventReasonNone
    # 0x48 = HwThermalSlowdown | HwSlowdown; 0x1FF: every documented reason
    assert throttle_names(0x48) == ("hw_slowdown", "hw_thermal_slowdown")
    assert set(throttle_names(0x1FF)) == set(NVML.values())
    assert throttle_names(0x200 | 0x1) == ("gpu_idle", "bit9")  # an undocumented bit is kept, not dropped


@pytest.mark.parametrize("bad", [-1, 1 << 64, True])
def test_mask_out_of_range_is_refused(bad: int) -> None:
    with pytest.raises(UnitError):
        throttle_names(bad)


def test_counts_are_whole_and_never_negative() -> None:
    assert (to_count("3"), to_count(7.0), to_count("0.0")) == (3, 7, 0)
    for bad in ("1.5", "-1", "x", "nan", "inf"):
        with pytest.raises(UnitError):
            to_count(bad)


def test_uncorrectable_ecc_fails_the_window() -> None:
    assert is_fatal(_gpu(ecc_uncorrected=1))
    assert not is_fatal(_gpu(ecc_uncorrected=0))
    assert not is_fatal(_gpu())  # not reported is no fault
    # cumulative: the same count as the window before is nothing new
    assert not is_fatal(_gpu(ecc_uncorrected=3), _gpu(ecc_uncorrected=3))
    assert is_fatal(_gpu(ecc_uncorrected=4), _gpu(ecc_uncorrected=3))
    # a count below the one before was reset (driver reload): all of it is new
    assert [f.detail for f in faults(_gpu(ecc_uncorrected=2), _gpu(ecc_uncorrected=9))] == ["+2"]
    assert not is_fatal(_gpu(ecc_uncorrected=0), _gpu(ecc_uncorrected=9))


def test_neuron_hardware_errors_and_failed_remapping_are_fatal() -> None:
    assert is_fatal(_gpu(hardware_errors=1), _gpu(hardware_errors=0))
    assert is_fatal(_gpu(remap_failed=True))
    assert not is_fatal(_gpu(remap_failed=True), _gpu(remap_failed=True))  # already failed the window before
    assert not is_fatal(_gpu(remap_failed=False))


@pytest.mark.parametrize("xid", [48, 79, 94, 95, 119, 120])
def test_fatal_xids(xid: int) -> None:
    # 48 double-bit ECC, 79 fallen off the bus, 94/95 contained/uncontained ECC, 119/120 GSP timeout/error
    assert is_fatal(_gpu(xid=xid))
    assert not is_fatal(_gpu(xid=xid), _gpu(xid=xid))  # the same last XID: logged before


@pytest.mark.parametrize(("xid", "severity"), [(79, "fatal"), (13, "warning")])
def test_the_same_xid_again_is_new_where_the_source_counts_xid_events(xid: int, severity: str) -> None:
    """NVML sends each XID as an event: the same code a second time (a GPU fallen off the bus again a day later) is a
    new fault; where the tool gives only the last code (DCGM: no ``xid_events``), a repeat cannot be told apart."""
    (fault,) = faults(_gpu(xid=xid, xid_events=2), _gpu(xid=xid, xid_events=1))
    assert (fault.field, fault.severity) == ("xid", severity)
    assert faults(_gpu(xid=xid, xid_events=2), _gpu(xid=xid, xid_events=2)) == ()
    assert faults(_gpu(xid=xid), _gpu(xid=xid)) == ()
    assert faults(_gpu(xid=0, xid_events=3), _gpu(xid=0, xid_events=2)) == ()  # no XID: nothing to be new


@pytest.mark.parametrize("xid", [13, 31, 43, 63, 92])
def test_other_xids_warn(xid: int) -> None:
    # 13 graphics exception, 31 page fault, 43 stopped processing (the application's), 63 row
    # remapping pending, 92 high single-bit ECC rate
    (fault,) = faults(_gpu(xid=xid))
    assert (fault.field, fault.severity, fault.detail) == ("xid", "warning", f"XID {xid}")


def test_xid_zero_is_none() -> None:
    assert faults(_gpu(xid=0)) == ()


def test_corrected_counts_warn() -> None:
    before = _gpu(ecc_corrected=1, retired_pages=2, remapped_rows=3, link_errors=4, pcie_replays=5)
    now = _gpu(ecc_corrected=2, retired_pages=2, remapped_rows=4, link_errors=9, pcie_replays=5)
    got = {(f.field, f.severity, f.detail) for f in faults(now, before)}
    assert got == {
        ("ecc_corrected", "warning", "+1"),
        ("remapped_rows", "warning", "+1"),
        ("link_errors", "warning", "+5"),
    }
    assert not is_fatal(now, before)


def test_slowdowns_warn_and_benign_reasons_do_not() -> None:
    assert faults(_gpu(throttle_reasons=("gpu_idle", "sw_power_cap", "applications_clocks_setting"))) == ()
    assert faults(_gpu(throttle_reasons=())) == ()
    (fault,) = faults(_gpu(throttle_reasons=("gpu_idle", "hw_power_brake_slowdown", "sw_thermal_slowdown")))
    assert (fault.severity, fault.detail) == ("warning", "hw_power_brake_slowdown,sw_thermal_slowdown")
    assert faults(_gpu(throttle_reasons=("throttled",)))[0].severity == "warning"  # amd-smi's bare status


def test_fatal_faults_come_first() -> None:
    found = faults(_gpu(ecc_corrected=5, xid=79, throttle_reasons=("hw_slowdown",), ecc_uncorrected=1))
    assert [f.severity for f in found] == ["fatal", "fatal", "warning", "warning"]
    assert {f.field for f in found[:2]} == {"ecc_uncorrected", "xid"}


def _devices(capsys: pytest.CaptureFixture[str], *argv: str) -> list[str]:
    parser = argparse.ArgumentParser()
    DEVICES.arguments(parser)
    assert DEVICES.run(parser.parse_args(list(argv))) == 0
    return capsys.readouterr().out.splitlines()


def test_cli_prints_faults(shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    acc = shared_data / "accelerators"
    monitor = acc / "amd-instinct" / "amd-smi_monitor-q_with-process.txt"
    if not monitor.exists():
        pytest.skip(f"{monitor} is absent")
    bad = tmp_path / "monitor.txt"  # line 6 with DOUBLE_ECC 2 and PCIE_REPLAY 9
    bad.write_text(monitor.read_text().replace("   0           0            0", "   0           2            9"))
    rows = [json.loads(line) for line in _devices(capsys, str(monitor), str(bad), "--format", "json")]
    assert [(r["ecc_corrected"], r["ecc_uncorrected"], r["pcie_replays"], r["xid"]) for r in rows] == [
        (0, 0, 0, None),
        (0, 2, 9, None),
    ]
    text = _devices(capsys, str(monitor), str(bad), "--format", "text")
    assert text[0].split("\t")[-2:] == ["pids", "faults"]
    # all reported and clear, then the two counts that are set
    assert [line.split("\t")[-1] for line in text[1:]] == ["none", "ecc_uncorrected=2,pcie_replays=9"]


def test_cli_text_of_unreported_faults(shared_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tpu = shared_data / "accelerators" / "google-tpu" / "tpu-info_process_readme-0.14.2.txt"
    if not tpu.exists():
        pytest.skip(f"{tpu} is absent")
    text = _devices(capsys, str(tpu), "--format", "text")
    assert {line.split("\t")[-1] for line in text[1:]} == {"-"}  # tpu-info reports no fault: unknown, not clear


HOSTILE_FAULTS = [
    'DCGM_FI_DEV_XID_ERRORS{UUID="GPU-x"} -3\nDCGM_FI_DEV_CLOCK_THROTTLE_REASONS{UUID="GPU-x"} 1e30\n',
    'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu="0"} 1\nDCGM_FI_DEV_RETIRED_SBE{UUID="GPU-x"} nan\n',
    'gpu_ecc_uncorrect_total{gpu_id="0"} 0.5\npcie_replay_count{gpu_id="0"} -1\n',
    'neuron_hardware_info{neuroncore_per_device_count="4"} 1\n'
    'hardware_ecc_events_total{event_type="mem_ecc_melted",neuron_device_index="x"} 1\n'
    'execution_errors_total{error_type="hardware",runtime_tag="NEURON_PROCESS"} 2\n',
    "GPU  POWER  SINGLE_ECC  DOUBLE_ECC  PCIE_REPLAY\n  0  10 W  many  -2  0.5\n",
    "GPU: 0\n    POWER:\n        THROTTLE_STATUS: MAYBE\n    ECC:\n        TOTAL_UNCORRECTABLE_COUNT: lots\n",
    '[{"gpu": 0, "ecc": {"total_uncorrectable_count": {"value": []}}, "power": {"throttle_status": 3}}]',
]


@pytest.mark.parametrize("text", HOSTILE_FAULTS)
def test_malformed_faults_are_reported_never_raised(text: str) -> None:
    for fmt in [None, *FORMATS]:
        _name, parsed = parse(text, fmt)
        for sample in parsed.samples:  # a fault kept is a valid one
            assert all(getattr(sample, f) is None or getattr(sample, f) >= 0 for f in COUNTS)
    _name, parsed = parse(text)  # the format the text is written in says what was wrong with it
    assert parsed.dead_letters


@pytest.mark.parametrize(
    "text",
    [
        "GPU  POWER  SINGLE_ECC  DOUBLE_ECC  PCIE_REPLAY\n  0  10 W  many  -2  0.5\n",
        '[{"gpu": 0, "power": {"socket_power": {"value": 10, "unit": "W"}, "throttle_status": "HOT"},'
        ' "ecc": {"total_correctable_count": -4}}]',
        "HL-SMI Version\n| AIP  Name  Persistence-M| Bus-Id  Disp.A | Volatile Uncorr. ECC |\n"
        "|   0  HL-225  N/A  | 0000:4d:00.0  N/A |  lots  |\n| N/A  31C  N/A  10W / 600W | 1MiB / 2MiB | 0% N/A |\n",
    ],
)
def test_a_bad_fault_value_leaves_the_readings(text: str) -> None:
    _name, parsed = parse(text)
    (sample,) = parsed.samples
    assert sample.power_w == 10 and all(getattr(sample, f) is None for f in COUNTS)
    assert parsed.dead_letters


def test_counters_are_read_under_the_names_the_scrape_writes() -> None:
    # prometheus_client's parser names the samples of a counter typed without ``_total`` NAME_total (its
    # OpenMetrics name); one typed with ``_total`` (Neuron's ``execution_errors_total``) keeps its name
    text = (
        '# TYPE DCGM_FI_DEV_PCIE_REPLAY_COUNTER counter\nDCGM_FI_DEV_PCIE_REPLAY_COUNTER{UUID="a"} 3\n'
        '# TYPE execution_errors_total counter\nexecution_errors_total{error_type="hardware"} 2\n'
        '# TYPE DCGM_FI_DEV_XID_ERRORS gauge\nDCGM_FI_DEV_XID_ERRORS{UUID="a"} 79\n'
    )
    wanted = {"DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "execution_errors_total", "DCGM_FI_DEV_XID_ERRORS"}
    out = Parsed()
    got = [(name, int(value)) for name, _, value in series(text, out, wanted)]
    assert got == [
        ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", 3),
        ("execution_errors_total", 2),
        ("DCGM_FI_DEV_XID_ERRORS", 79),
    ]
    assert not out.dead_letters
    # the AMD exporter's PCIe replay count, typed counter, is read as well
    amd = '# TYPE pcie_replay_count counter\npcie_replay_count{gpu_id="0",serial_number="S"} 4\n'
    assert [s.pcie_replays for s in parse(amd, "amd-exporter")[1].samples] == [4]
