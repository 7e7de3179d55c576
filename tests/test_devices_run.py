"""A vendor's tool as a live source (``gpucost run --source devices --device-tool NAME``), against the stand-in
executables of tests/stand_ins/ that print the real captures: each period's answer billed by the rules a replayed
capture is (docs/sources.md, "Billing a mixed fleet"), the faults of each sample counted against the previous
run's, a failed run counted and never fatal, and what the source needs said before it starts."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from gpucost.cli import main
from gpucost.producers.accelerators.live import ToolSampler
from gpucost.schemas.events import GpuSample, ProcessSample
from gpucost.sinks.views import connect
from tests.support.dcgm_exporter import serving

STAND_INS = Path(__file__).parent / "stand_ins"
S = 10**9
T0 = 1_780_000_000 * S
WITH_PROCESS = "amd-instinct/amd-smi_monitor-q_with-process.txt"  # line 6: GPU 0, 99 % busy, ECC 0 and 0
GAUDI = "intel-gaudi/hl-smi_log_gaudi2_hl-225_1.18.0.txt"  # one HL-225 read twice, at 04:40:27 and 04:40:34


@pytest.fixture
def tool(monkeypatch: pytest.MonkeyPatch, shared_data: Path, tmp_path: Path) -> Path:
    """The stand-ins and this Python alone on PATH; the capture they print, a copy the test may change."""
    monkeypatch.setenv("PATH", f"{STAND_INS}{os.pathsep}{Path(sys.executable).parent}")
    copy = tmp_path / "capture.txt"
    copy.write_text((shared_data / "accelerators" / WITH_PROCESS).read_text(encoding="utf-8"))
    monkeypatch.setenv("STAND_IN_CAPTURE", str(copy))
    return copy


def test_each_run_bills_the_tool_s_answer_at_the_sampling_time_with_new_faults(tool: Path) -> None:
    sampler = ToolSampler("amd-smi-text", "mi-a", model="MI300X")
    first, second = sampler.sample(T0, 10.0), sampler.sample(T0 + 10 * S, 10.0)
    tool.write_text(
        tool.read_text().replace("           0           0            0", "           0           2            0")
    )
    third = sampler.sample(T0 + 20 * S, 10.0)
    for k, events in enumerate((first, second, third)):
        gpu = [e for e in events if isinstance(e, GpuSample)]
        procs = [e for e in events if isinstance(e, ProcessSample)]
        assert [(g.gpu_uuid, g.gpu_model, g.ts_ns, g.interval_s, g.sm_util_pct) for g in gpu] == [
            ("mi-a/gpu0", "MI300X", T0 + 10 * k * S, 10.0, 99.0)
        ]
        assert [(p.pid, p.sm_util_pct, p.ts_ns) for p in procs] == [(1564865, 99.0, T0 + 10 * k * S)]  # all of it
    faults = [next(e for e in run if isinstance(e, GpuSample)) for run in (first, second, third)]
    assert sampler.counts["readings_superseded"] == 0  # amd-smi prints one reading a device
    # two new uncorrectable errors: one fatal fault (a field that rose), as docs/definitions.md counts them
    assert [(g.fault_fatal, g.fault_warning) for g in faults] == [(0, 0), (0, 0), (1, 0)]


def test_a_failed_run_is_counted_and_the_next_one_bills_against_the_last_answer(
    tool: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tool.write_text(
        tool.read_text().replace("           0           0            0", "           0           2            0")
    )
    sampler = ToolSampler("amd-smi-text", "mi-a", model="MI300X")
    gpu = next(e for e in sampler.sample(T0, 10.0) if isinstance(e, GpuSample))
    assert (gpu.fault_fatal, gpu.fault_warning) == (0, 0)  # errors from before its first reading are not the run's
    monkeypatch.setenv("STAND_IN_EXIT", "3")
    assert sampler.sample(T0 + 10 * S, 10.0) == []
    assert [reason for reason in sampler.counts if "exit status 3" in reason]
    monkeypatch.setenv("STAND_IN_EXIT", "0")
    tool.write_text(
        tool.read_text().replace("           0           2            0", "           0           3            0")
    )
    gpu = next(e for e in sampler.sample(T0 + 20 * S, 10.0) if isinstance(e, GpuSample))
    assert (gpu.fault_fatal, gpu.fault_warning) == (1, 0)  # against the last answer (2), kept over the failed run


def test_gpucost_run_bills_a_fleet_of_gaudis_from_hl_smi(
    tool: Path, shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("STAND_IN_CAPTURE", str(shared_data / "accelerators" / GAUDI))
    prices = tmp_path / "prices.jsonl"
    prices.write_text('{"kind":"price","gpu_model":"Gaudi 2","ts_ns":1000000000000000000,"usd_per_gpu_hour":"3.6"}\n')
    flags = ["run", "--source", "devices", "--device-tool", "hl-smi", "--node-id", "gaudi-a", "--prices", str(prices)]
    assert main([*flags, "--period-s", "0.1", "--duration-s", "0.6", "--out", str(tmp_path / "out")]) == 0
    assert "running hl-smi (hl-smi) every 0.1 s: 1 device(s)" in capsys.readouterr().err
    con = connect(tmp_path / "out")
    gpus = con.execute("SELECT DISTINCT gpu_uuid, gpu_model FROM idle_index ORDER BY 1").fetchall()
    assert gpus == [("gaudi-a/0000:4d:00.0", "Gaudi 2")]  # hl-smi names a device by its bus id
    (priced,) = con.execute("SELECT sum(pane_cost_micro_usd) FROM cost WHERE team = 'idle'").fetchone()
    assert priced > 0
    # each run at the sampling grid's time, not the log's: no run is a duplicate of the one before
    assert con.execute("SELECT count(*) FROM dlq").fetchone() == (0,)
    (covered,) = con.execute("SELECT sum(covered_ms) FROM idle_index").fetchone()
    assert covered >= 300  # of the 0.6 s sampled every 0.1 s, each run its own 0.1 s


def test_what_the_source_needs_is_said_before_it_starts(
    tool: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = ["--out", str(tmp_path / "out"), "--duration-s", "0.2"]
    assert main(["run", "--source", "devices", *out]) == 2
    assert "--source devices needs --device-tool NAME" in capsys.readouterr().err
    assert main(["run", "--source", "devices", "--device-tool", "amd-smi-text", *out]) == 2
    assert "give --device-model NAME" in capsys.readouterr().err  # amd-smi monitor names no model
    assert main(["run", "--source", "devices", "--device-tool", "xbutil", *out]) == 2
    assert "xbutil: not installed" in capsys.readouterr().err
    monkeypatch.setenv("GPUCOST_DEVICES_TIMEOUT_S", "ten")
    with pytest.raises(SystemExit) as refused:
        main(["run", "--source", "devices", "--device-tool", "amd-smi-text", *out])
    assert refused.value.code == 2 and "'ten': give a number of seconds above 0" in capsys.readouterr().err
    monkeypatch.delenv("GPUCOST_DEVICES_TIMEOUT_S")
    for bad in ("0", "nan", "inf", "3601"):  # the flag as the variable, and `devices --timeout-s` as `run`'s
        for command in (["run", "--source", "devices", "--device-tool", "amd-smi-text", *out], ["devices"]):
            flag = "--device-timeout-s" if command[0] == "run" else "--timeout-s"
            with pytest.raises(SystemExit) as refused:
                main([*command, flag, bad])
            assert refused.value.code == 2 and "give a number of seconds" in capsys.readouterr().err
    bogus = ["--device-model", "Acme X1", "--period-s", "0.1"]
    assert main(["run", "--source", "devices", "--device-tool", "amd-smi-text", *bogus, *out]) == 0
    assert "--device-model 'Acme X1' is no row or alias" in capsys.readouterr().err  # said, and billed all the same


def test_faults_are_new_since_the_device_s_last_reading_from_the_start_of_the_run(tool: Path) -> None:
    """The answer read before the run starts is the baseline (a device's lifetime errors are not the run's, nor
    counted again at a restart); a device missing from an answer, or a counter one answer could not read, keeps its
    last reading as the baseline."""
    text = tool.read_text()
    row = next(r for r in text.splitlines() if r.startswith("  0  199 W"))  # GPU 0's row, DOUBLE_ECC 0
    ecc, ecc2 = "           0           0            0", "           0           2            0"
    both = row.replace(ecc, ecc2) + "\n" + row.replace(ecc, ecc2).replace("  0", "  1", 1)
    two, one = text.replace(row, both), text.replace(row, row.replace(ecc, ecc2))
    unread = text.replace(row, both.replace(ecc2, "           0         N/A            0", 1))
    tool.write_text(two)
    sampler = ToolSampler("amd-smi-text", "mi-a", model="MI300X")
    latest, _ = sampler.first()
    assert sorted(s.device_id for s in latest) == ["gpu0", "gpu1"] and all(s.ecc_uncorrected == 2 for s in latest)
    seen = []
    for k, answer in enumerate((two, one, unread, two)):
        tool.write_text(answer)
        seen += [(e.gpu_uuid, e.fault_fatal) for e in sampler.sample(T0 + k * S, 1.0) if isinstance(e, GpuSample)]
    assert all(fatal == 0 for _, fatal in seen) and len(seen) == 2 + 1 + 2 + 2
    tool.write_text(two.replace(ecc2, "           0           3            0", 1))
    assert [(e.gpu_uuid, e.fault_fatal) for e in sampler.sample(T0 + 9 * S, 1.0) if isinstance(e, GpuSample)] == [
        ("mi-a/gpu0", 1),
        ("mi-a/gpu1", 0),
    ]


def test_a_counter_first_read_mid_run_is_its_own_baseline(tool: Path) -> None:
    """A counter the answers before could not read (``N/A``) counts from its first value, never all of it: what it
    held before is not the run's (docs/sources.md, "Device faults")."""
    text = tool.read_text()
    ecc = "           0           0            0"  # GPU 0's SINGLE_ECC, DOUBLE_ECC, PCIE_REPLAY
    sampler = ToolSampler("amd-smi-text", "mi-a", model="MI300X")
    tool.write_text(text.replace(ecc, "           0         N/A            0"))
    sampler.first()
    seen = []
    for k, double in enumerate(("5", "5", "6")):
        tool.write_text(text.replace(ecc, f"           0           {double}            0"))
        seen += [e.fault_fatal for e in sampler.sample(T0 + k * S, 1.0) if isinstance(e, GpuSample)]
    assert seen == [0, 0, 1]


def test_the_faults_of_a_reading_whose_event_is_refused_come_with_the_next_sample_sent(tool: Path) -> None:
    """An answer whose GPU event cannot be made (its power, 199 W on line 6, rewritten as 20,000 W: above any GPU's)
    is counted, not billed; the uncorrectable ECC error it shows is not lost with it but fails the next
    sample sent, as the NVML and dcgm sources keep a skipped sample's faults (docs/sources.md, "Device faults")."""
    text = tool.read_text()
    ecc = "           0           0            0"  # GPU 0's SINGLE_ECC, DOUBLE_ECC, PCIE_REPLAY
    sampler = ToolSampler("amd-smi-text", "mi-a", model="MI300X")
    sampler.first()
    risen = text.replace(ecc, "           0           1            0")
    tool.write_text(risen.replace("  0  199 W", "  0  20000 W"))
    assert [e for e in sampler.sample(T0, 1.0) if isinstance(e, GpuSample)] == []
    assert [reason for reason in sampler.counts if reason.startswith("gpu_sample of mi-a/gpu0: power_w")]
    tool.write_text(risen)
    assert [e.fault_fatal for e in sampler.sample(T0 + S, 1.0) if isinstance(e, GpuSample)] == [1]


def test_an_answer_the_parser_refuses_is_a_counted_reason_never_an_exception(tool: Path, shared_data: Path) -> None:
    capture = (shared_data / "accelerators" / "google-tpu" / "tpu-info_v6e_streaming_readme-0.14.2.txt").read_text()
    tool.write_text(capture.replace("11:00:59 UTC", "11:00:59 PDT"))
    sampler = ToolSampler("tpu-info", "tpu-a")
    assert sampler.sample(T0, 1.0) == []
    assert [reason for reason in sampler.counts if reason.startswith("tpu-info: its output could not be read")]
    tool.write_text(capture)
    assert sampler.sample(T0 + S, 1.0)  # the next answer bills


def test_a_process_listed_twice_on_a_device_is_one_process_billed_its_whole_share() -> None:
    from decimal import Decimal

    from gpucost.producers.accelerators.events import Placement, to_events
    from gpucost.schemas.devices import DeviceSample, Parsed, ProcessUsage

    twice = (ProcessUsage(7, 10), ProcessUsage(7, 20), ProcessUsage(8, 5))
    device = DeviceSample("AMD", "MI300X", "gpu0", busy_pct=Decimal(50), processes=twice)
    events = to_events([device], Placement("n", Decimal(1), T0), Parsed())
    procs = [(e["pid"], e["sm_util_pct"], e["mem_used_bytes"]) for e in events if e["kind"] == "process_sample"]
    assert procs == [(7, 25.0, 30), (8, 25.0, 5)]  # two processes share the busy; 7's memory is both entries'


AMD_EXPORTER = "amd-device-metrics-exporter/metrics_mini.txt"  # line 3: gpu_average_package_power … 41
NEURON = "aws-neuron/aws_neuron_metrics.txt"  # inf1.xlarge: one device, neuroncore="0".."3"


@pytest.mark.parametrize(
    ("fmt", "capture", "node", "model"),
    [("amd-exporter", AMD_EXPORTER, "mi-x", "MI300X"), ("neuron-monitor", NEURON, "inf-a", None)],
)
def test_an_exporter_read_each_period_bills_as_its_scrape_replayed_from_a_file(
    fmt: str, capture: str, node: str, model: str | None, shared_data: Path, tmp_path: Path
) -> None:
    """The exporter's page read from its URL at the grid's time gives the events ``gpucost devices --events`` writes
    from the same scrape saved to a file, given that time and step: one rule for a capture and a live read."""
    text = (shared_data / "accelerators" / capture).read_text(encoding="utf-8")
    events = tmp_path / "e.jsonl"
    at = "2026-05-28T20:26:40Z"  # T0
    gpucost_cli = ["devices", str(shared_data / "accelerators" / capture), "--events", str(events), "--node", node]
    assert main([*gpucost_cli, "--at", at, "--interval-s", "10", *(["--model", model] if model else [])]) == 0
    want = [json.loads(line) for line in events.read_text().splitlines()]
    with serving(text) as url:
        live = ToolSampler(fmt, node, model=model, url=url).sample(T0, 10.0)
    got = [e.model_dump(mode="json", exclude_none=True) for e in live]
    # what a file's events say of their figures and device, for its reader; the event models (and so the pipeline,
    # and a live source's events) keep none of them
    labels = ("not_reported", "estimated", "partition_of")
    assert got == [{k: v for k, v in e.items() if k not in labels} for e in want]
    gpus = [e for e in got if e["kind"] == "gpu_sample"]
    if fmt == "amd-exporter":  # one GPU at 41 W, 68,702 MB of VRAM (the exporter's MB are MiB)
        assert [(g["gpu_model"], g["power_w"], g["mem_total_bytes"]) for g in gpus] == [("MI300X", 41.0, 68702 << 20)]
    else:  # four NeuronCores of one device, each a quarter of it
        assert [g["gpu_uuid"] for g in gpus] == [f"{node}/nd0.nc{c}" for c in range(4)]
        assert {g["gpu_model"] for g in gpus} == {"Inferentia 1/4"}


def test_an_exporter_that_stops_answering_is_counted_and_the_next_read_bills(shared_data: Path) -> None:
    text = (shared_data / "accelerators" / NEURON).read_text(encoding="utf-8")
    with serving(text) as url:
        sampler = ToolSampler("neuron-monitor", "inf-a", url=url)
        assert sampler.sample(T0, 1.0)
    assert sampler.sample(T0 + S, 1.0) == []  # the server is gone
    assert [reason for reason in sampler.counts if reason.startswith("neuron-monitor: cannot scrape")]
    with serving("<html>502 Bad Gateway</html>\n") as url:
        sampler.url = url
        assert sampler.sample(T0 + 2 * S, 1.0) == []
    with serving(text) as url:
        sampler.url = url
        assert sampler.sample(T0 + 3 * S, 1.0)


def test_gpucost_run_reads_an_exporter_at_its_url_or_says_what_it_needs(
    shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("GPUCOST_DEVICES_URL", raising=False)
    out = ["--out", str(tmp_path / "out"), "--period-s", "0.1", "--duration-s", "0.5", "--node-id", "inf-a"]
    assert main(["run", "--source", "devices", "--device-tool", "neuron-monitor", *out]) == 2
    assert "reads an exporter: give --url (or GPUCOST_DEVICES_URL), e.g. http://" in capsys.readouterr().err
    with serving("") as dead:
        pass
    assert main(["run", "--source", "devices", "--device-tool", "neuron-monitor", "--url", dead, *out]) == 2
    assert "cannot scrape" in capsys.readouterr().err
    with serving((shared_data / "accelerators" / NEURON).read_text(encoding="utf-8")) as url:
        monkeypatch.setenv("GPUCOST_DEVICES_URL", url)
        assert main(["run", "--source", "devices", "--device-tool", "neuron-monitor", *out]) == 0
    assert f"reading neuron-monitor at {url} every 0.1 s: 5 device(s) and partition(s)" in capsys.readouterr().err
    gpus = connect(tmp_path / "out").execute("SELECT DISTINCT gpu_uuid FROM idle_index ORDER BY 1").fetchall()
    assert gpus == [(f"inf-a/nd0-nc{c}",) for c in range(4)] or len(gpus) == 4
