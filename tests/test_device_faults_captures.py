"""Device faults read from the real captures, field by field.

Every expected value was read by eye from the capture (file and line in the comment). The captures
are of healthy devices, so their counts are 0; a nonzero reading is tested on the capture's own line
with its value changed here (the change is written out in the test), never on a line made up whole.
A fault field the capture does not have must be null, never 0.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from gpucost.producers.accelerators.detect import parse
from gpucost.schemas.devices import FAULT_FIELDS, DeviceSample
from tests.support.dcgm_exporter import l4_with, metric_text

ACC = "accelerators"
L4 = "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c"  # l4-kops-output.md line 72, label UUID


def _read(shared_data: Path, name: str) -> str:
    path = shared_data / name
    if not path.exists():
        pytest.skip(f"{path} is absent")
    return path.read_text(encoding="utf-8")


def _line(text: str, number: int) -> str:
    return text.splitlines()[number - 1]


def _faults(sample: DeviceSample) -> dict[str, object]:
    """The fault fields that are not null."""
    return {f: getattr(sample, f) for f in FAULT_FIELDS if getattr(sample, f) is not None}


def _only(text: str, fmt: str) -> DeviceSample:
    name, parsed = parse(text)
    assert name == fmt and not parsed.dead_letters, parsed.dead_letters
    (sample,) = parsed.samples
    return sample


def test_dcgm_l4_remapped_rows_and_pcie_replays(shared_data: Path) -> None:
    # l4-kops-output.md holds the same GPU's scrape twice (lines 52-120, 130-198)
    sample = _only(metric_text(shared_data, "l4-kops-output.md"), "dcgm-exporter")
    assert sample.device_id == L4 and sample.model == "NVIDIA L4"
    assert _faults(sample) == {
        "pcie_replays": 0,  # line 72 (and 150): DCGM_FI_DEV_PCIE_REPLAY_COUNTER ... 0
        "remapped_rows": 0,  # lines 96 + 99: UNCORRECTABLE_REMAPPED_ROWS 0 + CORRECTABLE_REMAPPED_ROWS 0
        "remap_failed": False,  # line 102: DCGM_FI_DEV_ROW_REMAP_FAILURE ... 0
    }


def test_dcgm_l40s_and_t4_and_vgpu(shared_data: Path) -> None:
    l40s = _only(metric_text(shared_data, "l40s-upcloud.md"), "dcgm-exporter")
    # lines 58, 82 + 85, 88: PCIE_REPLAY_COUNTER 0, remapped rows 0 + 0, ROW_REMAP_FAILURE 0
    assert _faults(l40s) == {"pcie_replays": 0, "remapped_rows": 0, "remap_failed": False}
    t4 = _only(metric_text(shared_data, "t4-ericsson-ccd.md"), "dcgm-exporter")
    assert _faults(t4) == {"pcie_replays": 0}  # line 22; the T4 scrape has no remapping fields
    # t4 line 23 GPU_UTIL 91, line 20 POWER_USAGE 68.244000, line 28 FB_USED 5120 MiB
    assert (t4.busy_pct, t4.power_w, t4.mem_used_bytes) == (91, Decimal("68.244"), 5120 << 20)
    # lines 27-29: FB_FREE 9791 + FB_USED 5120 + FB_RESERVED 447 MiB
    assert t4.mem_total_bytes == (9791 + 5120 + 447) << 20
    vgpu = _only(metric_text(shared_data, "a100-vgpu-vks.md"), "dcgm-exporter")
    assert _faults(vgpu) == {}  # a vGPU scrape (lines 61-93) reports none of them


@pytest.mark.parametrize("typed", [False, True], ids=["untyped", "typed"])
def test_dcgm_ecc_xid_throttle_nvlink(shared_data: Path, typed: bool) -> None:
    # typed: prometheus_client's parser names a counter typed without ``_total`` NAME_total; read as NAME
    text = l4_with(
        shared_data,
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL 5",
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL 40",  # lifetime: the volatile count is the one read
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL 1",  # no volatile DBE: the aggregate stands in
        "DCGM_FI_DEV_XID_ERRORS 79",
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS 72",  # 64 + 8
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL 2",
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL 3",
        "DCGM_FI_DEV_RETIRED_SBE 4",
        "DCGM_FI_DEV_RETIRED_DBE 1",
        typed=typed,
    )
    faults = _faults(_only(text, "dcgm-exporter"))
    assert faults == {
        "ecc_corrected": 5,
        "ecc_uncorrected": 1,
        "retired_pages": 4 + 1,
        "remapped_rows": 0,
        "remap_failed": False,
        "xid": 79,
        # NVML: 0x40 HwThermalSlowdown, 0x08 HwSlowdown
        "throttle_reasons": ("hw_slowdown", "hw_thermal_slowdown"),
        "link_errors": 2 + 3,
        "pcie_replays": 0,
    }


def test_dcgm_newer_clocks_event_name_and_bad_values(shared_data: Path) -> None:
    text = l4_with(shared_data, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS 1", "DCGM_FI_DEV_XID_ERRORS 1.5")
    name, parsed = parse(text)
    (sample,) = parsed.samples
    assert sample.throttle_reasons == ("gpu_idle",)  # NVML 0x01 GpuIdle
    assert sample.xid is None and sample.busy_pct == 0  # the bad XID is null, the readings stand
    assert list(parsed.dead_letters) == ["DCGM_FI_DEV_XID_ERRORS: count 1.5 is not a whole number 0 or above"]
    blank = l4_with(shared_data, "DCGM_FI_DEV_XID_ERRORS 9223372036854775794")  # the exporter's "blank"
    name, parsed = parse(blank)
    assert parsed.samples[0].xid is None and sum(parsed.dead_letters.values()) == 1


def test_dcgm_the_later_of_two_scrapes_wins(shared_data: Path) -> None:
    # one file, two scrapes of the GPU (as l4-kops-output.md is): each metric's later value is the reading
    first = l4_with(shared_data, "DCGM_FI_DEV_XID_ERRORS 13", "DCGM_FI_DEV_RETIRED_SBE 2")
    again = first + "".join(first.splitlines(keepends=True)[-2:]).replace("} 13", "} 79").replace("} 2", "} 3")
    faults = _faults(_only(again, "dcgm-exporter"))
    assert (faults["xid"], faults["retired_pages"]) == (79, 3)


def test_amd_smi_monitor_ecc_and_replays(shared_data: Path) -> None:
    text = _read(shared_data, f"{ACC}/amd-instinct/amd-smi_monitor-q_with-process.txt")
    sample = _only(text, "amd-smi-text")
    # line 6, columns SINGLE_ECC, DOUBLE_ECC, PCIE_REPLAY (header line 5): 0, 0, 0
    assert _faults(sample) == {"ecc_corrected": 0, "ecc_uncorrected": 0, "pcie_replays": 0}
    row = _line(text, 6)
    changed = text.replace(row, row.replace("   0           0            0", "   7           2            9"))
    assert _faults(_only(changed, "amd-smi-text")) == {"ecc_corrected": 7, "ecc_uncorrected": 2, "pcie_replays": 9}


def test_amd_smi_monitor_without_ecc_columns_is_null(shared_data: Path) -> None:
    _, parsed = parse(_read(shared_data, f"{ACC}/amd-instinct/amd-smi_monitor-ptumv_8gpu.txt"))
    assert len(parsed.samples) == 8 and all(_faults(s) == {} for s in parsed.samples)


def test_amd_smi_throttle_status(shared_data: Path) -> None:
    power = _read(shared_data, f"{ACC}/amd-instinct/amd-smi_metric-power.txt")
    _, parsed = parse(power)
    # lines 12 and 21: THROTTLE_STATUS: UNTHROTTLED — reported, and nothing throttles
    assert [_faults(s) for s in parsed.samples] == [{"throttle_reasons": ()}] * 2
    throttled = power.replace("THROTTLE_STATUS: UNTHROTTLED", "THROTTLE_STATUS: THROTTLED", 1)
    _, parsed = parse(throttled)
    assert parsed.samples[0].throttle_reasons == ("throttled",) and parsed.samples[1].throttle_reasons == ()
    js = _read(shared_data, f"{ACC}/amd-instinct/amd-smi_metric-p_json.txt")
    assert _faults(_only(js, "amd-smi-json")) == {"throttle_reasons": ()}  # line 26: "UNTHROTTLED"


def test_amd_smi_ecc_block_as_documented() -> None:
    # ROCm/amdsmi CHANGELOG, "Added deferred ecc counts": `amd-smi metric --ecc --ecc-blocks` (trimmed);
    # documentation, not a capture
    text = "GPU: 0\n    ECC:\n        TOTAL_CORRECTABLE_COUNT: 0\n        TOTAL_UNCORRECTABLE_COUNT: 0\n"
    assert _faults(_only(text, "amd-smi-text")) == {"ecc_corrected": 0, "ecc_uncorrected": 0}
    js = '[{"gpu": 0, "ecc": {"total_correctable_count": 12, "total_uncorrectable_count": "N/A"}}]'
    assert _faults(_only(js, "amd-smi-json")) == {"ecc_corrected": 12}


def test_amd_exporter_ecc_as_documented(shared_data: Path) -> None:
    # series names from device-metrics-exporter docs/configuration/metricslist.md (GPU_ECC_CORRECT_TOTAL,
    # GPU_ECC_UNCORRECT_TOTAL, PCIE_REPLAY_COUNT), on the labels of metrics_mini.txt's line 9
    mini = _read(shared_data, f"{ACC}/amd-device-metrics-exporter/metrics_mini.txt")
    line = next(ln for ln in mini.splitlines() if ln.startswith("gpu_power_usage{"))
    labels = line[line.index("{") : line.rindex("}") + 1]
    added = ("gpu_ecc_correct_total", 3), ("gpu_ecc_uncorrect_total", 0), ("pcie_replay_count", 11)
    scrape = mini + "".join(f"{name}{labels} {value}\n" for name, value in added)
    _, parsed = parse(scrape)
    assert not parsed.dead_letters
    assert [_faults(s) for s in parsed.samples] == [{"ecc_corrected": 3, "ecc_uncorrected": 0, "pcie_replays": 11}]
    _, plain = parse(mini)
    assert all(_faults(s) == {} for s in plain.samples)  # the capture itself has no ECC series


def test_neuron_ecc_events_and_hardware_errors(shared_data: Path) -> None:
    text = _read(shared_data, f"{ACC}/aws-neuron/aws_neuron_metrics.txt")
    _, parsed = parse(text)
    device = next(s for s in parsed.samples if s.device_id == "nd0")
    # lines 51-54: mem/sram ECC corrected and uncorrected 0.0; lines 81, 87, 93, 99: hardware errors 0.0
    assert _faults(device) == {"ecc_corrected": 0, "ecc_uncorrected": 0, "hardware_errors": 0}
    assert all(_faults(s) == {} for s in parsed.samples if s.parent_id == "nd0")  # cores carry none
    changed = text.splitlines()
    changed[52 - 1] = changed[52 - 1].replace("} 0.0", "} 2.0")  # mem_ecc_uncorrected
    changed[54 - 1] = changed[54 - 1].replace("} 0.0", "} 1.0")  # sram_ecc_uncorrected
    changed[53 - 1] = changed[53 - 1].replace("} 0.0", "} 5.0")  # sram_ecc_corrected
    changed[87 - 1] = changed[87 - 1].replace("} 0.0", "} 4.0")  # hardware, the second runtime
    # line 80, the first runtime's error_type="runtime", set to 6 and moved after its "hardware" line 81:
    # the workload's errors, not the device's
    changed.append(changed.pop(80 - 1).replace("} 0.0", "} 6.0"))
    _, parsed = parse("\n".join(changed) + "\n")
    device = next(s for s in parsed.samples if s.device_id == "nd0")
    assert _faults(device) == {"ecc_corrected": 5, "ecc_uncorrected": 2 + 1, "hardware_errors": 4}
    # a second device (line 51 with neuron_device_index="1"): a runtime's errors name no device
    second = changed[51 - 1].replace('neuron_device_index="0"', 'neuron_device_index="1"')
    _, parsed = parse("\n".join([*changed, second]) + "\n")
    devices = {s.device_id: s for s in parsed.samples if s.parent_id is None}
    assert [devices[d].hardware_errors for d in ("nd0", "nd1")] == [None, None]
    assert devices["nd1"].ecc_corrected == 0 and devices["nd0"].ecc_uncorrected == 3
    assert any("hardware execution errors are per runtime" in reason for reason in parsed.dead_letters)


def test_gaudi_volatile_uncorrected_ecc(shared_data: Path) -> None:
    log = _read(shared_data, f"{ACC}/intel-gaudi/hl-smi_log_gaudi2_hl-225_1.18.0.txt")
    _, parsed = parse(log)
    # lines 8 and 23: the "Volatile Uncorr. ECC" cell (header lines 5, 20) reads 0
    assert [_faults(s) for s in parsed.samples] == [{"ecc_uncorrected": 0}] * 2
    two = _read(shared_data, f"{ACC}/intel-gaudi/hl-smi_2x_hl-225_1.17.1_oc-logs.txt")
    row = _line(two, 15)  # device 1's row: "|                   0  |"
    _, parsed = parse(two.replace(row, row.replace("                   0  |", "                   3  |")))
    assert [s.ecc_uncorrected for s in parsed.samples] == [0, 3]  # line 12 unchanged, line 15 now 3
    # newer hl-smi heads the column "Volatile Uncor-Events" (shared README): not mapped to ECC
    _, parsed = parse(two.replace("Volatile Uncorr. ECC", "Volatile Uncor-Events"))
    assert [s.ecc_uncorrected for s in parsed.samples] == [None, None] and parsed.samples[0].power_w == 95


@pytest.mark.parametrize(
    "name",
    [
        "google-tpu/tpu-info_v6e_static_readme-0.14.2.txt",
        "amd-instinct/rocm-smi_telegraf_mi100_rocm602.json",
        "aws-neuron/neuron-ls_trn2n.48xlarge.txt",
    ],
)
def test_captures_without_faults_leave_them_null(shared_data: Path, name: str) -> None:
    _, parsed = parse(_read(shared_data, f"{ACC}/{name}"))
    assert parsed.samples and all(_faults(s) == {} for s in parsed.samples)
