"""Unit conversion of the neutral model, hostile captures, partitions, and the ``gpucost devices`` command."""

from __future__ import annotations

import json
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpucost.cli import main
from gpucost.producers.accelerators import amd_exporter, xbutil
from gpucost.producers.accelerators.detect import FORMATS, parse
from gpucost.schemas.devices import UnitError, platform_for, platforms, to_bytes, to_pct, to_watts

FIELDS = [
    "vendor",
    "model",
    "device_id",
    "parent_id",
    "ts_ns",
    "busy_pct",
    "power_w",
    "mem_used_bytes",
    "mem_total_bytes",
    "temperature_c",
    "processes",
    # the fault fields (docs/definitions.md, "Device faults"), after the list
    "ecc_corrected",
    "ecc_uncorrected",
    "retired_pages",
    "remapped_rows",
    "remap_failed",
    "xid",
    "xid_events",
    "throttle_reasons",
    "link_errors",
    "pcie_replays",
    "hardware_errors",
]


@given(st.integers(0, 1 << 40))
def test_mib_is_exact(n: int) -> None:
    assert to_bytes(n, "MiB") == n * 1048576 and to_bytes(str(n), "MB") == n * 10**6


@given(st.decimals(0, 10**6, places=2, allow_nan=False))
def test_gib_rounds_half_even_once(d: Decimal) -> None:
    assert to_bytes(str(d), "GiB") == round(Fraction(d) * 2**30)  # Python rounds a Fraction half-even


@given(st.integers(0, 10**8))
def test_milliwatts_are_exact(mw: int) -> None:
    assert to_watts(str(mw), "mW") * 1000 == mw


@given(st.decimals(0, 1, places=18, allow_nan=False))
def test_ratio_and_percent_agree(r: Decimal) -> None:
    assert to_pct(r, ratio=True) == to_pct(r * 100) == r * 100


@pytest.mark.parametrize("bad", [("-1", "MiB"), ("1e30", "GiB"), ("nan", "B"), ("1", "furlongs"), ("x", "B")])
def test_bad_sizes_are_refused(bad: tuple[str, str]) -> None:
    with pytest.raises(UnitError):
        to_bytes(*bad)


@pytest.mark.parametrize("bad", ["101", "-0.5", "inf", "true"])
def test_bad_percentages_are_refused(bad: str) -> None:
    with pytest.raises(UnitError):
        to_pct(bad)


HOSTILE = [
    '[{"gpu": 0, "power": {"socket_power": {"value": 1',  # truncated JSON
    '[{"gpu": "zero", "power": {"socket_power": {"value": [], "unit": "W"}}}]',  # wrong types
    '[{"gpu": 0, "power": {"socket_power": {"value": 1e400, "unit": "W"}}}]',  # huge
    '{"card0": {"VRAM Total Memory (B)": "99999999999999999999999999", "GPU use (%)": "250"}}',
    '{"card0": "not an object", "system": {"PID1": "x"}}',
    '{"devices": [{"device_id": "0000:01:00.1", "electrical": {"power_consumption_watts": "lots"}}]}',
    'gpu_power_usage{gpu_id="0"} 1e999\ngpu_usage{gpu_id="0"} 300\n',
    'neuron_hardware_info{neuroncore_per_device_count="4",neuron_device_memory_size="-8"} 1\n'
    'neuroncore_utilization_ratio{neuroncore="0",runtime_tag="7"} 5.0\n',
    "| Chip | HBM Usage (GiB) | Duty cycle |\n|---|---|---|\n| 0 | lots / 31.25 GiB | 900% |\n",
    "GPU  POWER  GPU_TEMP\n  0  9e99 W  hot\n",
    "GPU: 0\n    POWER:\n        SOCKET_POWER: -5 W\n",
    "HL-SMI Version\n|   0  HL-225  N/A  | 0000:4d:00.0  N/A |  0  |\n"
    "| N/A  31C  N/A  79kW / 600W | x / y | 0% N/A |\n",
    "utilization.aip [%], bus_id\n",
    "",
    "\x00\xff garbage",
]


@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_input_never_crashes(text: str) -> None:
    for fmt in [None, *FORMATS]:
        _name, parsed = parse(text, fmt)
        for sample in parsed.samples:  # whatever was kept is a valid reading
            assert sample.busy_pct is None or 0 <= sample.busy_pct <= 100
            assert sample.power_w is None or 0 <= sample.power_w <= 100_000
        assert parsed.samples or parsed.dead_letters or text.strip() == "" or fmt is not None


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=300))
def test_random_text_never_crashes(text: str) -> None:
    for fmt in [None, *FORMATS]:
        parse(text, fmt)


def test_unknown_format_is_a_counted_reason() -> None:
    name, parsed = parse("hello, world\n")
    assert name is None and not parsed.samples
    [(reason, count)] = parsed.dead_letters.items()
    assert count == 1 and "unknown format" in reason and "--input-format" in reason


def test_cpx_partitions_never_count_socket_power_twice() -> None:
    """Eight CPX partitions on two sockets, each repeating its socket's 700 W: 1400 W in all, not 5600."""
    lines = []
    for g in range(8):
        labels = f'gpu_id="{g}",gpu_compute_partition_type="cpx",gpu_partition_id="{g % 4}",serial_number="S{g // 4}"'
        lines += [
            f"gpu_power_usage{{{labels}}} 700",
            f"gpu_gfx_activity{{{labels}}} {g}",
            f"gpu_total_vram{{{labels}}} 196592",
        ]
    samples = amd_exporter.parse("\n".join(lines) + "\n").samples
    assert sum(s.power_w or 0 for s in samples) == 1400
    assert sum(s.mem_total_bytes or 0 for s in samples) == 2 * 196592 * 2**20
    parts = [s for s in samples if s.parent_id is not None]
    assert [(s.device_id, s.parent_id, s.busy_pct) for s in parts] == [(f"gpu{g}", f"S{g // 4}", g) for g in range(8)]
    assert all(s.power_w is None and s.mem_total_bytes is None for s in parts)


# Quoted to the layout of XRT's documented JSON report (no public capture of a real card exists).
XBUTIL_EXAMPLE = json.dumps(
    {
        "devices": [
            {
                "interface_type": "pcie",
                "device_id": "0000:d8:00.1",
                "platforms": [{"static_region": {"vbnv": "xilinx_u280_gen3x16_xdma_base_1"}}],
                "electrical": {"power_consumption_max_watts": "225.000000", "power_consumption_watts": "26.683750"},
                "thermals": [
                    {"location_id": "pcb_top_front", "temp_C": "33", "is_present": "true"},
                    {"location_id": "fpga0", "temp_C": "38", "is_present": "true"},
                ],
            }
        ]
    }
)


def test_xbutil_example() -> None:
    [s] = xbutil.parse(XBUTIL_EXAMPLE).samples
    assert (s.device_id, s.model) == ("0000:d8:00.1", "xilinx_u280_gen3x16_xdma_base_1")
    assert (s.power_w, s.temperature_c, s.busy_pct, s.processes) == (Decimal("26.683750"), 38, None, None)


def test_cli_json_lines(shared_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    acc = shared_data / "accelerators"
    files = [acc / "intel-gaudi" / "hl-smi_log_gaudi2_hl-225_1.18.0.txt", acc / "aws-neuron" / "aws_neuron_metrics.txt"]
    assert main(["devices", *map(str, files), "--format", "json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 2 + 5 and all(list(r) == FIELDS for r in rows)
    assert rows[0]["power_w"] == 79 and rows[2]["power_w"] is None  # Gaudi reports power, Neuron does not
    assert rows[3]["processes"][3] == {"pid": 32786, "mem_used_bytes": None, "busy_pct": 0.3054895299654302}


def test_cli_forced_format_and_errors(shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    unknown = tmp_path / "notes.txt"
    unknown.write_text("nothing to see\n")
    assert main(["devices", str(unknown)]) == 2
    assert "format not recognised" in capsys.readouterr().err
    assert main(["devices", str(tmp_path / "absent.txt")]) == 2
    assert "cannot read" in capsys.readouterr().err
    tpu = shared_data / "accelerators" / "google-tpu" / "tpu-info_process_readme-0.14.2.txt"
    assert main(["devices", str(tpu), "--input-format", "hl-smi"]) == 2  # forced wrong: nothing, said so
    assert main(["devices", str(tpu), "--input-format", "tpu-info", "--format", "text"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("vendor\tmodel") and len(out) == 1 + 8


def test_platform_table_rows_cite_sources_and_never_zero() -> None:
    table = platforms()
    wanted = {
        "H100",
        "H100 PCIe",
        "H200",
        "B200",
        "A100",
        "A100 40GB",
        "L4",
        "T4",
        "L40S",
        "MI300X",
        "MI325X",
        "Trn1",
        "Trn2",
        "Inf2",
        "TPU v4",
        "TPU v5e",
        "TPU v5p",
        "TPU v6e",
        "Gaudi 2",
        "Gaudi 3",
        "Alveo U280",
        "Alveo U55C",
    }
    assert set(table) == wanted
    for name, row in table.items():
        assert row["source"].strip(), name
        figures = {k: v for k, v in row.items() if k not in ("aliases", "source")}
        assert "mem_bw_gbps" in figures and all(v > 0 for v in figures.values()), name


@pytest.mark.parametrize(
    ("model", "row"),
    [
        ("HL-225", "Gaudi 2"),
        ("TPU v6e", "TPU v6e"),
        ("TPU v4", "TPU v4"),
        ("Trainium2", "Trn2"),
        ("xilinx_u280_gen3x16_xdma_base_1", "Alveo U280"),
        ("Inferentia", None),
        ("Arcturus GL-XL [Instinct MI100]", None),
        (None, None),
        ("H1000", None),
    ],
)
def test_platform_lookup_never_guesses(model: str | None, row: str | None) -> None:
    found = platform_for(model)
    assert (found[0] if found else None) == row


def test_exporter_prefers_gfx_activity_and_junction_whatever_the_order() -> None:
    for lines in (
        [
            'gpu_usage{gpu_id="0"} 10',
            'gpu_gfx_activity{gpu_id="0"} 20',
            'gpu_edge_temperature{gpu_id="0"} 40',
            'gpu_junction_temperature{gpu_id="0"} 50',
        ],
        [
            'gpu_gfx_activity{gpu_id="0"} 20',
            'gpu_usage{gpu_id="0"} 10',
            'gpu_junction_temperature{gpu_id="0"} 50',
            'gpu_edge_temperature{gpu_id="0"} 40',
        ],
    ):
        [s] = amd_exporter.parse("\n".join(lines) + "\n").samples
        assert (s.busy_pct, s.temperature_c) == (20, 50)


# Written to the layout neuron-monitor's user guide documents (no public capture of its JSON was found).
NEURON_JSON = json.dumps(
    {
        "period": "5.000s",
        "neuron_runtime_data": [
            {
                "pid": 4321,
                "neuron_runtime_tag": "4321",
                "error": "",
                "report": {
                    "neuroncore_counters": {
                        "period": 5.0,
                        "neuroncores_in_use": {
                            "0": {"neuroncore_utilization": 42.5},
                            "3": {"neuroncore_utilization": 7.25},
                        },
                    },
                    "memory_used": {"neuron_runtime_used_bytes": {"host": 6997643264, "neuron_device": 12519788544}},
                },
            },
            {
                "pid": 4400,
                "report": {"neuroncore_counters": {"neuroncores_in_use": {"0": {"neuroncore_utilization": 10}}}},
            },
        ],
        "instance_info": {"instance_type": "trn1.2xlarge"},
        "neuron_hardware_info": {"neuron_device_count": 1, "neuroncore_per_device_count": 2},
    }
)


def test_neuron_monitor_json_example() -> None:
    name, parsed = parse(NEURON_JSON)
    assert name == "neuron-monitor-json"
    rows = {s.device_id: s for s in parsed.samples}
    # core 3 ÷ 2 cores per device = device 1; every core of each device, those no runtime uses at 0 %
    assert sorted(rows) == ["nd0", "nd0.nc0", "nd0.nc1", "nd1", "nd1.nc2", "nd1.nc3"]
    assert rows["nd0.nc0"].busy_pct == Decimal("52.5")  # 42.5 % (pid 4321) + 10 % (pid 4400)
    assert (rows["nd0.nc1"].busy_pct, rows["nd0.nc1"].processes) == (Decimal(0), ())
    assert rows["nd0"].model == "Trainium" and rows["nd0"].power_w is None
    assert rows["nd0"].mem_used_bytes is None  # two devices: a runtime's memory names no device, counted once
    assert list(parsed.dead_letters.values()) == [1] and "multi-device" in next(iter(parsed.dead_letters))
