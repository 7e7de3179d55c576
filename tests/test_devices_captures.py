"""Every capture in ../shared/data/accelerators/ parsed field by field.

Each expected value was read by eye from the capture (file and line in the comment) and converted
by hand here (``283 * MIB``), never copied from a parser's output.
"""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import pytest

from gpucost.producers.accelerators.detect import detect, parse
from gpucost.schemas.devices import DeviceSample

MIB, GIB = 1 << 20, 1 << 30
ACC = "accelerators"


def _read(shared_data: Path, name: str) -> str:
    return (shared_data / ACC / name).read_text(encoding="utf-8")


def _by_id(samples: list[DeviceSample]) -> dict[str, DeviceSample]:
    return {s.device_id: s for s in samples}


def _gib(text: str) -> int:
    """GiB display text to bytes, rounded half-even (Python's round of an exact Fraction)."""
    return round(Fraction(text) * GIB)


# file → (format, samples, dead letters the capture deserves)
EXPECTED = {
    "amd-instinct/amd-smi_metric-p_json.txt": ("amd-smi-json", 1, 0),
    "amd-instinct/amd-smi_metric-power.txt": ("amd-smi-text", 2, 0),
    "amd-instinct/amd-smi_metric-usage_xcp.txt": ("amd-smi-text", 18, 0),  # 2 GPUs + 2 × 8 XCP partitions
    "amd-instinct/amd-smi_monitor-ptumv_8gpu.txt": ("amd-smi-text", 8, 0),
    "amd-instinct/amd-smi_monitor-q_with-process.txt": ("amd-smi-text", 1, 0),
    "amd-instinct/amd-smi_process.txt": ("amd-smi-text", 1, 0),
    "amd-instinct/amd-smi_process_json.txt": ("amd-smi-json", 1, 0),
    "amd-instinct/rocm-smi_telegraf_mi100_rocm571.json": ("rocm-smi", 6, 1),  # line 485: a process on no GPU
    "amd-instinct/rocm-smi_telegraf_mi100_rocm602.json": ("rocm-smi", 4, 0),
    "amd-instinct/rocm-smi_telegraf_rx6700xt_rocm430.json": ("rocm-smi", 1, 0),
    "amd-instinct/rocm-smi_telegraf_rx6700xt_rocm571.json": ("rocm-smi", 1, 0),
    "amd-instinct/rocm-smi_telegraf_rx6700xt_rocm602.json": ("rocm-smi", 1, 0),
    "amd-instinct/rocm-smi_telegraf_rx6700xt_rocm612.json": ("rocm-smi", 1, 0),
    "amd-instinct/rocm-smi_telegraf_vega-10-XT.json": ("rocm-smi", 1, 0),
    "amd-instinct/rocm-smi_telegraf_vega-20-WKS-GL-XE.json": ("rocm-smi", 1, 0),
    "amd-device-metrics-exporter/metrics_mini.txt": ("amd-exporter", 1, 0),
    "amd-device-metrics-exporter/metricslist_gpu_clock_spx.txt": ("amd-exporter", 3, 0),  # gpu_id 3, 0, 5
    "aws-neuron/aws_neuron_metrics.txt": ("neuron-monitor", 5, 0),  # 1 device + 4 NeuronCores
    "aws-neuron/neuron-ls_inf1.6xlarge.txt": ("neuron-ls", 4, 0),
    "aws-neuron/neuron-ls_trn2n.48xlarge.txt": ("neuron-ls", 16, 0),
    "aws-neuron/neuron-ls_show-all-procs_trn2n.48xlarge.txt": ("neuron-ls", 16, 0),
    "google-tpu/tpu-info_metric_duty-cycle_hbm_readme-0.14.2.txt": ("tpu-info", 8, 0),
    "google-tpu/tpu-info_process_readme-0.14.2.txt": ("tpu-info", 8, 0),
    "google-tpu/tpu-info_v4_rich_readme-0.1.0.txt": ("tpu-info", 4, 0),
    "google-tpu/tpu-info_v6e_static_readme-0.14.2.txt": ("tpu-info", 4, 0),
    # lines 14-17: chips /dev/vfio/0-3 against runtime ids 8, 9, 12, 13 (lines 23-26): PIDs not joined
    "google-tpu/tpu-info_v6e_streaming_readme-0.14.2.txt": ("tpu-info", 4, 4),
    "intel-gaudi/hl-smi_2x_hl-225_1.17.1_oc-logs.txt": ("hl-smi", 2, 0),
    "intel-gaudi/hl-smi_log_gaudi2_hl-225_1.18.0.txt": ("hl-smi", 2, 0),
}


def test_every_capture_is_listed(shared_data: Path) -> None:
    on_disk = {
        str(p.relative_to(shared_data / ACC))
        for p in (shared_data / ACC).rglob("*")
        if p.is_file() and not p.name.startswith("LICENSE")
    }
    assert on_disk == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_capture_detected_and_parsed(shared_data: Path, name: str) -> None:
    fmt, count, dead = EXPECTED[name]
    text = _read(shared_data, name)
    assert detect(text) == fmt
    got_fmt, parsed = parse(text)
    assert got_fmt == fmt
    assert len(parsed.samples) == count
    assert sum(parsed.dead_letters.values()) == dead, parsed.dead_letters


def test_amd_smi_monitor(shared_data: Path) -> None:
    s = _by_id(parse(_read(shared_data, "amd-instinct/amd-smi_monitor-ptumv_8gpu.txt"))[1].samples)
    # line 6: "0  171 W  32 °C  33 °C  0 %  114 MHz  0 %  900 MHz  283 MB  196300 MB" (amd-smi's MB is MiB)
    assert (s["gpu0"].power_w, s["gpu0"].temperature_c, s["gpu0"].busy_pct) == (171, 32, 0)
    assert (s["gpu0"].mem_used_bytes, s["gpu0"].mem_total_bytes) == (283 * MIB, 196300 * MIB)
    assert s["gpu0"].processes is None and s["gpu0"].ts_ns is None and s["gpu0"].model is None
    assert (s["gpu4"].power_w, s["gpu4"].mem_used_bytes) == (178, 284 * MIB)  # line 10
    assert (s["gpu7"].power_w, s["gpu7"].temperature_c) == (175, 34)  # line 13


def test_amd_smi_monitor_with_processes(shared_data: Path) -> None:
    [g] = parse(_read(shared_data, "amd-instinct/amd-smi_monitor-q_with-process.txt"))[1].samples
    # line 6: "0  199 W  103 °C  84 °C  99 % … 1235 MB  16335 MB  N/A Mb/s"
    assert (g.power_w, g.temperature_c, g.busy_pct) == (199, 103, 99)
    assert (g.mem_used_bytes, g.mem_total_bytes) == (1235 * MIB, 16335 * MIB)
    # line 10: "0  rvs  1564865  0.0 B  0.0 B  1.1 GB  0.0 B  0 ns  0 ns": VRAM 1.1 GiB; GFX ns is no fraction
    [p] = g.processes or ()
    assert (p.pid, p.mem_used_bytes, p.busy_pct) == (1564865, _gib("1.1"), None)


def test_amd_smi_metric_power_and_json(shared_data: Path) -> None:
    s = _by_id(parse(_read(shared_data, "amd-instinct/amd-smi_metric-power.txt"))[1].samples)
    assert (s["gpu0"].power_w, s["gpu1"].power_w) == (11, 17)  # lines 7 and 16: SOCKET_POWER
    assert s["gpu0"].busy_pct is None and s["gpu0"].mem_total_bytes is None
    [g] = parse(_read(shared_data, "amd-instinct/amd-smi_metric-p_json.txt"))[1].samples
    assert (g.device_id, g.power_w) == ("gpu0", 10)  # lines 7 and 10: {"value": 10, "unit": "W"}


def test_amd_smi_processes(shared_data: Path) -> None:
    [g] = parse(_read(shared_data, "amd-instinct/amd-smi_process.txt"))[1].samples
    # line 8 PID 1693982, line 12 VRAM_MEM 10.1 GB (line 13 MEM_USAGE 0.0 B is not VRAM)
    assert [(p.pid, p.mem_used_bytes) for p in g.processes or ()] == [(1693982, _gib("10.1"))]
    assert g.power_w is None
    [j] = parse(_read(shared_data, "amd-instinct/amd-smi_process_json.txt"))[1].samples
    # lines 12 and 22; their mem_usage (lines 13-16, 23-26) is not VRAM: not reported
    assert [(p.pid, p.mem_used_bytes) for p in j.processes or ()] == [(420157, None), (420315, None)]


def test_amd_smi_partitions_carry_no_power(shared_data: Path) -> None:
    samples = parse(_read(shared_data, "amd-instinct/amd-smi_metric-usage_xcp.txt"))[1].samples
    s = _by_id(samples)
    assert s["gpu0"].busy_pct == 0 and s["gpu0"].parent_id is None  # line 7: GFX_ACTIVITY: 0 %
    parts = [x for x in samples if x.parent_id == "gpu0"]
    assert [x.device_id for x in parts] == [f"gpu0.xcp{n}" for n in range(8)]  # lines 15-22
    assert all(x.busy_pct == 0 and x.power_w is None and x.mem_total_bytes is None for x in parts)
    assert len([x for x in samples if x.parent_id == "gpu1"]) == 8  # lines 77-84


def test_rocm_smi_mi100(shared_data: Path) -> None:
    s = parse(_read(shared_data, "amd-instinct/rocm-smi_telegraf_mi100_rocm571.json"))[1].samples
    c = s[0]
    # Unique ID N/A (line 5) and Serial Number "0" (line 46): the PCI Bus (line 48) names it
    assert c.device_id == "0000:1E:00.0"
    assert c.model == "Arcturus GL-XL [Instinct MI100]"  # line 76
    assert (c.power_w, c.busy_pct, c.temperature_c) == (39, 0, 31)  # lines 24, 41, 7
    assert (c.mem_used_bytes, c.mem_total_bytes) == (6782976, 34342961152)  # lines 50, 49
    assert c.processes is None


def test_rocm_smi_identity_model_and_na(shared_data: Path) -> None:
    [v] = parse(_read(shared_data, "amd-instinct/rocm-smi_telegraf_vega-20-WKS-GL-XE.json"))[1].samples
    assert v.device_id == "0x2f048617326b1ea"  # line 4: Unique ID
    assert (v.model, v.power_w, v.temperature_c) == ("Radeon Instinct MI50 32GB", 26, 36)  # lines 71, 27, 6
    assert (v.mem_used_bytes, v.mem_total_bytes) == (10850304, 34342961152)  # lines 45, 44
    [r] = parse(_read(shared_data, "amd-instinct/rocm-smi_telegraf_rx6700xt_rocm430.json"))[1].samples
    assert r.model is None  # line 59: "Card series": "0x1002", a vendor id, not a model
    [n] = parse(_read(shared_data, "amd-instinct/rocm-smi_telegraf_rx6700xt_rocm602.json"))[1].samples
    assert n.power_w is None  # line 26: "N/A (Secondary die)"


def test_amd_exporter(shared_data: Path) -> None:
    [g] = parse(_read(shared_data, "amd-device-metrics-exporter/metrics_mini.txt"))[1].samples
    assert g.device_id == "6699c0a8-4200-4242-037f-f97e6cae0f09"  # line 3: GPU_UUID
    assert (g.power_w, g.busy_pct) == (41, 0)  # lines 9, 15
    assert (g.mem_total_bytes, g.mem_used_bytes) == (68702 * MIB, None)  # line 12 (MB, as amd-smi's)
    clocks = parse(_read(shared_data, "amd-device-metrics-exporter/metricslist_gpu_clock_spx.txt"))[1].samples
    # lines 5-9 (serial masked "xxxx"): gpu_id 3, 0, 5 in spx mode — whole GPUs, nothing measured
    assert [(c.device_id, c.parent_id, c.power_w) for c in clocks] == [
        ("gpu3", None, None),
        ("gpu0", None, None),
        ("gpu5", None, None),
    ]


def test_neuron_monitor_scrape(shared_data: Path) -> None:
    s = _by_id(parse(_read(shared_data, "aws-neuron/aws_neuron_metrics.txt"))[1].samples)
    dev = s["nd0"]
    assert dev.model == "Inferentia"  # line 73: instance_type inf1.xlarge
    assert dev.mem_total_bytes == 8589934592  # line 73: neuron_device_memory_size
    assert dev.mem_used_bytes == 188901012 + 0 + 0 + 188901012  # lines 197, 199, 201, 203 (neuron_device)
    assert (dev.power_w, dev.temperature_c, dev.ts_ns) == (None, None, None)
    core0 = s["nd0.nc0"]
    assert core0.parent_id == "nd0"
    # line 306 (runtime 31961) 1.6491081503838823e-12 and line 318 (runtime 32786) 0.003054895299654302
    assert core0.busy_pct == (Decimal("1.6491081503838823e-12") + Decimal("0.003054895299654302")) * 100
    procs = {p.pid: p.busy_pct for p in core0.processes or ()}
    assert procs[32786] == Decimal("0.3054895299654302") and procs[32265] == 0  # lines 318, 310
    assert s["nd0.nc1"].busy_pct == Decimal("0.31171891334815026")  # line 319
    assert s["nd0.nc3"].busy_pct == 0  # lines 309, 313, 317, 321


def test_neuron_ls(shared_data: Path) -> None:
    s = _by_id(parse(_read(shared_data, "aws-neuron/neuron-ls_inf1.6xlarge.txt"))[1].samples)
    # lines 9-10: device 0, 8 GB (GiB: the scrape reports 8589934592 B for an inf1 device), PIDs 23518, 23531
    assert (s["nd0"].mem_total_bytes, [p.pid for p in s["nd0"].processes or ()]) == (8 * GIB, [23518, 23531])
    assert s["nd3"].processes == ()  # line 16: NA, no process
    t = _by_id(parse(_read(shared_data, "aws-neuron/neuron-ls_show-all-procs_trn2n.48xlarge.txt"))[1].samples)
    assert t["nd0"].model == "Trainium2"  # line 5: trn2n.48xlarge
    assert [p.pid for p in t["nd0"].processes or ()] == [268911, 269192]  # lines 12-13
    assert t["nd15"].mem_total_bytes == 96 * GIB
    plain = parse(_read(shared_data, "aws-neuron/neuron-ls_trn2n.48xlarge.txt"))[1].samples
    assert all(x.processes is None and x.power_w is None for x in plain)  # no PID column: not reported


def test_tpu_info(shared_data: Path) -> None:
    s = _by_id(parse(_read(shared_data, "google-tpu/tpu-info_v6e_static_readme-0.14.2.txt"))[1].samples)
    t0 = s["tpu0"]
    assert t0.model == "TPU v6e"  # line 6: Accelerator type: v6e
    assert (t0.mem_used_bytes, t0.mem_total_bytes, t0.busy_pct) == (_gib("18.45"), _gib("31.25"), 100)  # line 21
    assert [p.pid for p in t0.processes or ()] == [1469584]  # line 12: /dev/vfio/0
    assert (t0.power_w, t0.ts_ns) == (None, None)
    st = _by_id(parse(_read(shared_data, "google-tpu/tpu-info_v6e_streaming_readme-0.14.2.txt"))[1].samples)
    assert sorted(st) == ["tpu12", "tpu13", "tpu8", "tpu9"]  # lines 23-26
    assert st["tpu8"].mem_used_bytes == _gib("17.26") and st["tpu8"].processes is None  # line 23
    assert st["tpu8"].ts_ns == 1753354859 * 10**9  # line 6: 2025-07-24 11:00:59 UTC
    [v4] = [
        x
        for x in parse(_read(shared_data, "google-tpu/tpu-info_v4_rich_readme-0.1.0.txt"))[1].samples
        if x.device_id == "tpu0"
    ]
    # line 9 (box drawing): /dev/accel0 TPU v4 chip PID 130007; line 19: 0.00 GiB / 31.75 GiB, 0.00%
    assert (v4.model, v4.mem_used_bytes, v4.mem_total_bytes, v4.busy_pct) == ("TPU v4", 0, _gib("31.75"), 0)
    m = _by_id(parse(_read(shared_data, "google-tpu/tpu-info_metric_duty-cycle_hbm_readme-0.14.2.txt"))[1].samples)
    assert (m["tpu0"].busy_pct, m["tpu0"].mem_used_bytes) == (100, _gib("29.50"))  # lines 9, 22
    assert m["tpu1"].mem_used_bytes == _gib("21.50")  # line 23


def test_hl_smi(shared_data: Path) -> None:
    log = parse(_read(shared_data, "intel-gaudi/hl-smi_log_gaudi2_hl-225_1.18.0.txt"))[1].samples
    first, second = log
    # lines 8-9: "0  HL-225 … 0000:4d:00.0", "N/A 31C N/A 79W / 600W | 24065MiB / 98304MiB | 0%", at .352
    assert (first.device_id, first.model) == ("0000:4d:00.0", "HL-225")
    assert (first.power_w, first.temperature_c, first.busy_pct) == (79, 31, 0)
    assert (first.mem_used_bytes, first.mem_total_bytes) == (24065 * MIB, 98304 * MIB)
    assert first.ts_ns == (1730851200 + 4 * 3600 + 40 * 60 + 27) * 10**9 + 352_000_000  # 2024-11-06 04:40:27.352
    assert first.processes == ()  # line 14: "0  N/A  N/A  N/A  N/A", idle
    assert (second.power_w, second.mem_used_bytes) == (81, 768 * MIB)  # line 24
    oc = _by_id(parse(_read(shared_data, "intel-gaudi/hl-smi_2x_hl-225_1.17.1_oc-logs.txt"))[1].samples)
    assert (oc["0000:b4:00.0"].power_w, oc["0000:b4:00.0"].temperature_c) == (85, 28)  # lines 15-16
    assert oc["0000:4d:00.0"].ts_ns is None  # no log prefix: no time


def test_capture_times_do_not_depend_on_the_local_zone(shared_data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    try:
        [t8, *_] = parse(_read(shared_data, "google-tpu/tpu-info_v6e_streaming_readme-0.14.2.txt"))[1].samples
        [g, _] = parse(_read(shared_data, "intel-gaudi/hl-smi_log_gaudi2_hl-225_1.18.0.txt"))[1].samples
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    assert t8.ts_ns == 1753354859 * 10**9  # line 6: 2025-07-24 11:00:59 UTC
    assert g.ts_ns == 1730868027_352_000_000  # line 9: 2024-11-06 04:40:27.352, read as UTC
