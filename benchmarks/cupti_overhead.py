"""Overhead of the CUPTI collector on a PyTorch job (issue 38's target: ≤ 2 % on a kernel-heavy job). Needs a GPU.

The job (``--job``) runs ``--matmuls`` matmuls of ``--size``² per step, each inside an NVTX range, and prints
the seconds of its timed loop (after warm-up, between two synchronisations) and when it started and ended.
Many small matmuls (the defaults) are launch-bound, the worst case for per-record cost; few large ones
(``--size 4096 --matmuls 4``) are a kernel-heavy job. The benchmark runs it N times without and N times
under ``gpucost collect-kernels``, interleaved so that clock and thermal drift fall on both sides, and
prints one JSON object: medians, the overhead ratio of the timed loops and of the whole processes, the
process's seconds before the job starts (imports, CUPTI's start-up) and after it ends (the final flush and
conversion of what CUPTI still holds, interpreter exit), and the collector's counts.

    python benchmarks/cupti_overhead.py --repetitions 5 --steps 300 --matmuls 40 --size 256   # worst case
    python benchmarks/cupti_overhead.py --repetitions 5 --steps 100 --matmuls 4 --size 4096   # kernel-heavy
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def job(steps: int, matmuls: int, size: int) -> None:
    began = time.time()
    import torch  # noqa: PLC0415 — only the job needs torch

    a = torch.randn(size, size, device="cuda")
    b = torch.randn(size, size, device="cuda")

    def step() -> None:
        torch.cuda.nvtx.range_push("step")
        for i in range(matmuls):
            torch.cuda.nvtx.range_push(f"mm{i % 4}")
            a.copy_(torch.tanh(a @ b) * 0.5)
            torch.cuda.nvtx.range_pop()
        torch.cuda.nvtx.range_pop()

    for _ in range(max(steps // 10, 5)):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    print(json.dumps({"loop_s": time.perf_counter() - t0, "began": began, "ended": time.time()}), flush=True)


def _run(argv: list[str]) -> tuple[float, float, float, float, str]:
    """The job's loop seconds, the process's seconds, those before the job began and after it ended."""
    t0 = time.time()
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    t1 = time.time()
    out = json.loads([ln for ln in done.stdout.splitlines() if ln.startswith('{"loop_s"')][-1])
    return out["loop_s"], t1 - t0, out["began"] - t0, t1 - out["ended"], done.stderr


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--job", action="store_true", help="run the job itself (used by the benchmark)")
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--matmuls", type=int, default=40)
    parser.add_argument("--size", type=int, default=256)
    args = parser.parse_args()
    shape = ["--steps", str(args.steps), "--matmuls", str(args.matmuls), "--size", str(args.size)]
    if args.job:
        job(args.steps, args.matmuls, args.size)
        return 0
    plain = [sys.executable, __file__, "--job", *shape]
    base: list[tuple[float, ...]] = []
    traced: list[tuple[float, ...]] = []
    counts: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "k.jsonl")
        under = [sys.executable, "-m", "gpucost.cli", "collect-kernels", "--out", out, "--", *plain]
        for _ in range(args.repetitions):
            base.append(_run(plain)[:4])
            *times, err = _run(under)
            traced.append(tuple(times))
            counts = json.loads(err.strip().splitlines()[-1])["collect_kernels"]
        lines = len(Path(out).read_text(encoding="utf-8").splitlines())
    med = {
        name: [statistics.median(x[i] for x in runs) for i in range(4)]
        for name, runs in (("base", base), ("traced", traced))
    }
    print(
        json.dumps(
            {
                "benchmark": "cupti_overhead",
                "repetitions": args.repetitions,
                "steps": args.steps,
                "matmuls": args.matmuls,
                "size": args.size,
                "loop_s": {"base": med["base"][0], "traced": med["traced"][0]},
                "process_s": {"base": med["base"][1], "traced": med["traced"][1]},
                "before_job_s": {"base": med["base"][2], "traced": med["traced"][2]},
                "after_job_s": {"base": med["base"][3], "traced": med["traced"][3]},
                "overhead_ratio_loop": med["traced"][0] / med["base"][0] - 1,
                "overhead_ratio_process": med["traced"][1] / med["base"][1] - 1,
                "all_loop_s": {"base": [x[0] for x in base], "traced": [x[0] for x in traced]},
                "lines_written_last_run": lines,
                "collector_last_run": counts,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
