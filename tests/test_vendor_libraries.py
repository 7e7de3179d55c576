"""The vendor libraries as live sources (``--device-tool amdsmi`` and ``hlml``), on stand-in modules written from
their documentation (tests/support/vendor_libraries.py): units converted exactly, "N/A" and unsupported queries
not reported (never 0) and counted, a compute-partitioned AMD GPU billed as its partitions, and a Gaudi read
through HLML giving the neutral samples hl-smi's table of the same devices gives."""

from __future__ import annotations

import dataclasses
import sys
from decimal import Decimal
from pathlib import Path

import pytest

from gpucost.cli import main
from gpucost.producers.accelerators.detect import parse
from gpucost.producers.accelerators.libraries import AmdSmi, Hlml
from gpucost.producers.accelerators.live import ToolSampler
from gpucost.schemas.events import GpuSample, ProcessSample
from gpucost.sinks.views import connect
from tests.support.vendor_libraries import AmdGpu, GaudiDevice, amdsmi_module, pyhlml_module

S = 10**9
T0 = 1_780_000_000 * S
MIB = 1 << 20


def test_an_amd_gpu_is_read_in_the_librarys_units() -> None:
    gpu = AmdGpu(
        "0000:05:00.0",
        gfx_activity=37,
        vram_mb=(196_592, 2_048),
        temp_c=51,
        ecc=(3, 1),
        processes=[{"name": "python", "pid": 4242, "mem": 1024, "memory_usage": {"vram_mem": 2 * MIB, "gtt_mem": 0}}],
    )
    reader = AmdSmi(amdsmi_module([gpu]))
    reader.open()
    (s,) = reader.read().samples
    assert (s.model, s.device_id, s.parent_id) == ("AMD Instinct MI300X", "0000:05:00.0", None)
    assert (s.busy_pct, s.power_w, s.temperature_c) == (Decimal(37), Decimal(300), Decimal(51))
    assert (s.mem_total_bytes, s.mem_used_bytes) == (196_592 * MIB, 2_048 * MIB)  # MB of 1024 × 1024 bytes
    assert (s.ecc_corrected, s.ecc_uncorrected) == (3, 1)
    assert [(p.pid, p.mem_used_bytes, p.busy_pct) for p in s.processes or ()] == [(4242, 2 * MIB, None)]


def test_what_amdsmi_does_not_report_is_not_reported_and_counted() -> None:
    gpu = AmdGpu("0000:05:00.0", gfx_activity="N/A", power={"current_socket_power": "N/A", "average_socket_power": 88})
    gpu.unsupported = {"temp", "ecc"}
    reader = AmdSmi(amdsmi_module([gpu]))
    parsed = reader.read()
    (s,) = parsed.samples
    assert (s.busy_pct, s.power_w, s.temperature_c, s.ecc_uncorrected) == (None, Decimal(88), None, None)
    assert sorted(parsed.dead_letters) == [
        "amdsmi: amdsmi_get_gpu_total_ecc_count failed (AmdSmiLibraryException)",
        "amdsmi: amdsmi_get_temp_metric failed (AmdSmiLibraryException)",
    ]
    gpu.gfx_activity = 250  # out of 0-100: counted, not billed
    parsed = reader.read()
    assert parsed.samples[0].busy_pct is None and any("gfx_activity" in r for r in parsed.dead_letters)


def test_a_gpu_in_cpx_mode_is_billed_as_eight_partitions_of_one_mi300x(monkeypatch: pytest.MonkeyPatch) -> None:
    parts = [AmdGpu(f"0000:05:00.{i}", gfx_activity=10 * i, power={"current_socket_power": 400}) for i in range(8)]
    monkeypatch.setitem(sys.modules, "amdsmi", amdsmi_module(parts))
    sampler = ToolSampler("amdsmi", "mi-a")
    sampler.first()
    events = sampler.sample(T0, 10.0)
    gpus = [e for e in events if isinstance(e, GpuSample)]
    assert [g.gpu_uuid for g in gpus] == [f"mi-a/0000:05:00.{i}" for i in range(8)]  # the socket itself: never
    assert {g.gpu_model for g in gpus} == {"MI300X 1/8"}
    assert [g.sm_util_pct for g in gpus] == [10.0 * i for i in range(8)]
    assert sum(round(g.power_w * 1000) for g in gpus) == 400_000  # the socket's 400 W once, not 8 times
    assert sum(g.mem_total_bytes for g in gpus) == 196_592 * MIB


def test_a_gaudi_through_hlml_reads_as_hl_smi_prints_it(shared_data: Path) -> None:
    """The two HL-225s of an hl-smi table, with the values it prints given in HLML's units (mW, bytes): the same
    neutral samples, whichever HLML version's utilisation."""
    capture = shared_data / "accelerators" / "intel-gaudi" / "hl-smi_2x_hl-225_1.17.1_oc-logs.txt"
    _, table = parse(capture.read_text(encoding="utf-8"))
    devices = [  # row by row: "0 HL-225 | 0000:4d:00.0 … 31C … 95W / 600W | 768MiB / 98304MiB | 0%", and AIP 1's
        GaudiDevice("0000:4d:00.0", aip=0, power_mw=95_000, total_bytes=98_304 * MIB, used_bytes=768 * MIB, temp_c=31),
        GaudiDevice("0000:b4:00.0", aip=0, power_mw=85_000, total_bytes=98_304 * MIB, used_bytes=768 * MIB, temp_c=28),
    ]
    for struct in (True, False):
        reader = Hlml(pyhlml_module(devices, utilization_struct=struct))
        reader.open()
        got = reader.read()
        assert not got.dead_letters
        # hl-smi's table lists its processes (none here); HLML has no process query: not reported
        assert got.samples == [dataclasses.replace(s, processes=None) for s in table.samples]


def test_gpucost_run_reads_a_library_or_says_it_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = ["--out", str(tmp_path / "out"), "--period-s", "0.1", "--duration-s", "0.5", "--node-id", "gaudi-a"]
    monkeypatch.setitem(sys.modules, "pyhlml", None)  # not installed, whatever this machine has
    assert main(["run", "--source", "devices", "--device-tool", "hlml", *out]) == 2
    assert "hlml: the Python module 'pyhlml' is not installed" in capsys.readouterr().err
    lib = pyhlml_module([GaudiDevice("0000:4d:00.0", aip=50, power_mw=300_000, total_bytes=MIB, used_bytes=MIB)])
    monkeypatch.setitem(sys.modules, "pyhlml", lib)
    assert main(["run", "--source", "devices", "--device-tool", "hlml", *out]) == 0
    assert "reading the hlml library every 0.1 s: 1 device(s)" in capsys.readouterr().err
    assert lib.calls == ["hlmlInit", "hlmlShutdown"]  # opened once, closed at the end
    con = connect(tmp_path / "out")
    assert con.execute("SELECT DISTINCT gpu_uuid, gpu_model FROM idle_index").fetchall() == [
        ("gaudi-a/0000:4d:00.0", "Gaudi 2")
    ]
    (unattributed,) = con.execute("SELECT count(*) FROM cost WHERE team = 'unattributed'").fetchone()
    assert unattributed > 0  # HLML names no process: its 50 % busy is no one's, never idle


def test_amd_processes_are_billed_under_their_pids(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = AmdGpu("0000:05:00.0", gfx_activity=60, processes=[{"pid": 7, "mem": 5}, {"pid": 9, "mem": 6}])
    monkeypatch.setitem(sys.modules, "amdsmi", amdsmi_module([gpu]))
    sampler = ToolSampler("amdsmi", "mi-b")
    sampler.first()
    procs = [(e.pid, e.sm_util_pct) for e in sampler.sample(T0, 10.0) if isinstance(e, ProcessSample)]
    assert procs == [(7, 30.0), (9, 30.0)]  # the library gives no per-process busy: an equal share of the GPU's
