"""Peak memory of reading a Kineto trace, before and after the streaming reader (issue 38), as bytes per kernel.

``python -m benchmarks.kineto_memory --kernels 200000 800000`` writes one generated trace per size (each kernel
with its ``cuda_runtime`` launch, a ``user_annotation`` per 100 kernels, a flow pair per kernel, µs with ns
digits relative to ``baseTimeNanoseconds``), then, each in a fresh process, reads it with

- ``before``: the reader of ``--before`` (default ``main``), taken with ``git show`` and loaded as a module;
- ``after``: this checkout's ``gpucost.producers.kineto``;

and, with ``--report``, also builds the report (``kernel_report``: the split), with that revision's
``gpucost/kernels.py``. Memory is tracemalloc's peak of Python allocations (numpy's included) during the call;
bytes per kernel is the slope between the two sizes, so the interpreter and the imports fall out. A JSON line
per run, then one per reader with the slope and the projected peak for a 1 GiB trace of the same shape.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASE_NS = 1_711_964_646_000_000_000
GIB = 1 << 30
NAME = "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, float, float>>"


def write_trace(path: Path, kernels: int, seed: int = 0) -> None:
    rng, ts_us = random.Random(seed), 0
    with path.open("w") as f:
        f.write('{"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H200"}], "traceEvents": [\n')
        for n in range(kernels):
            if n % 100 == 0:
                f.write(
                    f'{{"ph": "X", "cat": "user_annotation", "name": "step#{n // 100}", "pid": 1, "tid": 1, '
                    f'"ts": {ts_us}, "dur": 5000}},\n'
                )
            stream = 7 + n % 4
            f.write(
                f'{{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, '
                f'"ts": {ts_us + 1}, "dur": 3, "args": {{"External id": {n}, "correlation": {n}}}}},\n'
                f'{{"ph": "s", "id": {n}, "pid": 1, "tid": 1, "ts": {ts_us + 1}, "cat": "ac2g", "name": "ac2g"}},\n'
                f'{{"ph": "X", "cat": "kernel", "name": "{NAME}{n % 50}", "pid": 0, "tid": {stream}, '
                f'"ts": {ts_us + 5}.{rng.randrange(1000):03d}, '
                f'"dur": {rng.randrange(1, 40)}.{rng.randrange(1000):03d}, '
                f'"args": {{"External id": {n}, "device": 0, "stream": {stream}, "correlation": {n}, '
                f'"grid": [80, 1, 1], "block": [256, 1, 1], "registers per thread": 32}}}},\n'
                f'{{"ph": "f", "id": {n}, "pid": 0, "tid": {stream}, "ts": {ts_us + 5}, "cat": "ac2g", '
                f'"name": "ac2g", "bp": "e"}},\n'
            )
            ts_us += rng.randrange(1, 20)
        f.write(f'{{"ph": "M", "name": "end", "pid": 0, "tid": 0}}\n], "baseTimeNanoseconds": {BASE_NS}}}\n')


def _module(name: str, source: str, tmp: Path):
    path = tmp / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _measure(which: str, rev: str, trace: Path, report: bool) -> dict:
    """One reading in this process: tracemalloc's peak and the time of ``read_kineto`` (and the report)."""
    if which == "before":
        tmp = Path(tempfile.mkdtemp())
        git = ["git", "-C", str(ROOT), "show"]
        reader = _module(
            "kineto_before", subprocess.check_output([*git, f"{rev}:gpucost/producers/kineto.py"], text=True), tmp
        )
        kernels_src = subprocess.check_output([*git, f"{rev}:gpucost/kernels.py"], text=True)
        kernels_mod = _module("kernels_before", kernels_src, tmp) if report else None
    else:
        from gpucost import kernels as kernels_mod
        from gpucost.producers import kineto as reader
    tracemalloc.start()
    start = time.perf_counter()
    trace_out = reader.read_kineto(trace)
    read_s, read_peak = time.perf_counter() - start, tracemalloc.get_traced_memory()[1]
    n = len(trace_out.kernels)
    out = {"reader": which, "kernels": n, "read_s": round(read_s, 2), "read_peak_bytes": read_peak}
    if report:
        tracemalloc.reset_peak()
        start = time.perf_counter()
        busy = kernels_mod.kernel_report(trace_out.kernels, trace_out.ranges, {}, 2_500_000)["devices"][0]["busy_ns"]
        out |= {"report_s": round(time.perf_counter() - start, 2), "busy_ns": busy}
        out["report_peak_bytes"] = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--kernels", type=int, nargs=2, default=[200_000, 800_000])
    p.add_argument("--before", default="main", help="the revision whose reader is 'before'")
    p.add_argument("--readers", default="before,after")
    p.add_argument("--report", action="store_true", help="also build the report (the split) and measure it")
    p.add_argument("--measure", nargs=2, metavar=("READER", "FILE"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.measure:
        print(json.dumps(_measure(args.measure[0], args.before, Path(args.measure[1]), args.report)), flush=True)
        return
    runs: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        sizes = {}
        for n in args.kernels:
            path = Path(tmp) / f"trace-{n}.json"
            write_trace(path, n)
            sizes[n] = path.stat().st_size
            print(json.dumps({"kernels": n, "file_bytes": sizes[n], "file_bytes_per_kernel": round(sizes[n] / n)}))
            for which in args.readers.split(","):
                cmd = [sys.executable, "-m", "benchmarks.kineto_memory", "--before", args.before]
                cmd += ["--measure", which, str(path)] + (["--report"] if args.report else [])
                line = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT).stdout
                run = json.loads(line) | {"file_bytes": sizes[n]}
                print(json.dumps(run), flush=True)
                runs.setdefault(which, []).append(run)
    for which, (small, large) in runs.items():
        for phase in ("read", "report") if args.report else ("read",):
            slope = (large[f"{phase}_peak_bytes"] - small[f"{phase}_peak_bytes"]) / (
                large["kernels"] - small["kernels"]
            )
            per_file_byte = large["kernels"] / large["file_bytes"]
            at_gib = large[f"{phase}_peak_bytes"] + slope * (GIB * per_file_byte - large["kernels"])
            summary = {"reader": which, "phase": phase, "bytes_per_kernel": round(slope, 1)}
            summary |= {
                "kernels_in_1_gib": round(GIB * per_file_byte),
                "projected_peak_1_gib_mib": round(at_gib / 2**20),
            }
            print(json.dumps(summary))


if __name__ == "__main__":
    main()
