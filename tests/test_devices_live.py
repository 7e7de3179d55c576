"""Live mode against stand-in executables (tests/stand_ins/) that print the real captures."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from gpucost.cli import main
from gpucost.producers.accelerators.detect import parse
from gpucost.producers.accelerators.live import run_tool

STAND_INS = Path(__file__).parent / "stand_ins"


@pytest.fixture
def on_path(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """Only the stand-ins and this Python (their interpreter) on PATH: no real vendor tool is found."""
    monkeypatch.setenv("PATH", f"{STAND_INS}{os.pathsep}{Path(sys.executable).parent}")
    return monkeypatch


@pytest.mark.parametrize(
    ("fmt", "capture"),
    [
        ("amd-smi-text", "amd-instinct/amd-smi_monitor-ptumv_8gpu.txt"),
        ("rocm-smi", "amd-instinct/rocm-smi_telegraf_mi100_rocm602.json"),
        ("hl-smi", "intel-gaudi/hl-smi_2x_hl-225_1.17.1_oc-logs.txt"),
        ("tpu-info", "google-tpu/tpu-info_v6e_static_readme-0.14.2.txt"),
        ("neuron-ls", "aws-neuron/neuron-ls_show-all-procs_trn2n.48xlarge.txt"),
    ],
)
def test_live_equals_replay(on_path: pytest.MonkeyPatch, shared_data: Path, fmt: str, capture: str) -> None:
    path = shared_data / "accelerators" / capture
    on_path.setenv("STAND_IN_CAPTURE", str(path))
    live = run_tool(fmt)
    assert not live.dead_letters and live.samples
    assert live.samples == parse(path.read_text(encoding="utf-8"))[1].samples


def test_missing_slow_and_failing_tools_are_reasons(on_path: pytest.MonkeyPatch, shared_data: Path) -> None:
    assert "not installed" in next(iter(run_tool("xbutil").dead_letters))
    assert "no live command" in next(iter(run_tool("dcgm-exporter").dead_letters))  # the dcgm source reads it
    assert "no URL to read (give --url" in next(iter(run_tool("amd-exporter").dead_letters))
    on_path.setenv("STAND_IN_CAPTURE", str(shared_data / "accelerators" / "amd-instinct" / "amd-smi_process.txt"))
    on_path.setenv("STAND_IN_SLEEP_S", "5")
    assert "no answer within 0.5 s" in next(iter(run_tool("amd-smi-text", timeout_s=0.5).dead_letters))
    on_path.setenv("STAND_IN_SLEEP_S", "0")
    on_path.setenv("STAND_IN_EXIT", "3")
    failed = run_tool("amd-smi-text")
    assert not failed.samples and "exit status 3" in next(iter(failed.dead_letters))


def test_cli_live(on_path: pytest.MonkeyPatch, shared_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    on_path.setenv(
        "STAND_IN_CAPTURE", str(shared_data / "accelerators" / "intel-gaudi" / "hl-smi_2x_hl-225_1.17.1_oc-logs.txt")
    )
    assert main(["devices", "--live", "hl-smi"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["device_id"], r["power_w"]) for r in rows] == [
        ("0000:4d:00.0", 95),
        ("0000:b4:00.0", 85),
    ]  # lines 13, 16
    assert main(["devices"]) == 2
    assert "name a FILE or --live NAME" in capsys.readouterr().err
