"""The benchmark harness still runs (small inputs); its figures are for BENCHMARKS.md, not assertions."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from benchmarks.run import main

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


def test_quick_benchmarks_run_and_agree_with_duckdb(tmp_path: Path) -> None:
    out = tmp_path / "BENCHMARKS.md"
    # benchmark 1 fails loudly if DuckDB and the pipeline disagree on the number of records
    assert main(["--quick", "--only", "1", "3", "4", "6", "10", "--out", str(out)]) == 0
    text = out.read_text()
    for title in (
        "1. Embedded replay vs DuckDB batch",
        "3. State memory per GPU",
        "4. Query latency",
        "6. HTML report over a month of a fleet",
        "10. Sink start-up and memory against the output written",
    ):
        assert f"### {title}" in text
    assert "Machine: " in text and "Command: `python -m benchmarks.run --quick --only 1 3 4 6 10`" in text


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_the_gpu_shaped_program_waits_for_its_emulated_device(tmp_path: Path) -> None:
    """Benchmark 5's GPU-shaped program takes the longer of its launching and its kernels: a step of
    big kernels lasts as long as they do, whatever its launches cost; a step of tiny ones, as its
    launches, so that only a launch-bound program can show what a probe on the launch path costs."""
    from benchmarks.probe_harness import build

    lib = build([ROOT / "tests" / "c" / "fake_libcuda.c"], "libcuda.so.1", "-shared", "-fPIC")
    exe = build([ROOT / "benchmarks" / "c" / "gpu_shaped.c"], "gpu_shaped", "-ldl")

    def seconds(steps: int, launches: int, kernel_us: int) -> float:
        start = time.perf_counter()
        subprocess.run(
            [str(exe), str(lib), "8", str(steps), str(launches), str(kernel_us)], check=True, capture_output=True
        )
        return time.perf_counter() - start

    device_s = 10 * 50 * 400 / 1e6  # 0.2 s of kernels
    assert device_s <= seconds(10, 50, 400) < device_s + 1.0
    # a thousand times as many launches of no device time: the launches alone, far under the 0.2 s
    assert seconds(10, 50_000, 0) < device_s + 1.0
    assert subprocess.run([str(exe), str(lib)], capture_output=True).returncode == 2  # its usage, not a crash


def test_the_quick_soak_ends_with_the_records_of_the_recomputation(tmp_path: Path) -> None:
    """Benchmark 12 on two GPUs, killed once: its records checks hold (its memory figures are for the page)."""
    out = tmp_path / "BENCHMARKS.md"
    assert main(["--quick", "--only", "12", "--out", str(out)]) == 0
    text = out.read_text()
    assert "| cost parties off the recomputation | 0 |" in text and "| idle panes off the recomputation | 0 |" in text
    assert "killed 1 times" in text
