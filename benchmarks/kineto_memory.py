"""Peak memory of reading a Kineto trace, before and after the streaming reader (issue 38), as bytes per kernel.

``python -m benchmarks.kineto_memory --kernels 200000 800000`` writes one generated trace per size (each kernel
with its ``cuda_runtime`` launch, a ``user_annotation`` per 100 kernels, a flow pair per kernel, µs with ns
digits relative to ``baseTimeNanoseconds``), then, each in a fresh process, reads it with

- ``before``: the reader of ``--before`` (default ``main``): that revision's whole ``gpucost`` package, taken
  with ``git archive`` into a folder of its own;
- ``after``: this checkout's ``gpucost.producers.kineto``;

and, with ``--report``, also builds the report (``kernel_report``: the split), with the same revision's
``gpucost/kernels.py``. Memory is tracemalloc's peak of Python allocations (numpy's included) during the call;
bytes per kernel is the slope between the two sizes, so the interpreter and the imports fall out. A JSON line
per run, then one per reader with the slope and the projected peak for a 1 GiB trace of the same shape.
"""

from __future__ import annotations

import argparse
import json
import os
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


def _measure(which: str, trace: Path, report: bool) -> dict:
    """One reading in this process, with the ``gpucost`` its ``PYTHONPATH`` gives (``main`` sets it to the
    revision's tree): tracemalloc's peak and the time of ``read_kineto`` (and the report)."""
    from gpucost import kernels as kernels_mod
    from gpucost.producers import kineto as reader

    tracemalloc.start()
    start = time.perf_counter()
    trace_out = reader.read_kineto(trace)
    read_s, read_peak = time.perf_counter() - start, tracemalloc.get_traced_memory()[1]
    n = len(trace_out.kernels)
    out = {"reader": which, "kernels": n, "read_s": round(read_s, 2), "read_peak_bytes": read_peak}
    out["package"] = str(Path(kernels_mod.__file__).parent)
    if report:
        tracemalloc.reset_peak()
        start = time.perf_counter()
        busy = kernels_mod.kernel_report(trace_out.kernels, trace_out.ranges, {}, 2_500_000)["devices"][0]["busy_ns"]
        out |= {"report_s": round(time.perf_counter() - start, 2), "busy_ns": busy}
        out["report_peak_bytes"] = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return out


def package_tree(rev: str, tmp: Path) -> Path:
    """The revision's whole ``gpucost`` package in a folder of its own (``git archive``): its reader and report
    run with the rest of their own code, not this checkout's (a module taken alone imports this checkout's)."""
    tree = tmp / "before"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "gpucost"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    return tree


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--kernels", type=int, nargs=2, default=[200_000, 800_000])
    p.add_argument("--before", default="main", help="the revision whose reader is 'before'")
    p.add_argument("--readers", default="before,after")
    p.add_argument("--report", action="store_true", help="also build the report (the split) and measure it")
    p.add_argument("--measure", nargs=2, metavar=("READER", "FILE"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.measure:
        print(json.dumps(_measure(args.measure[0], Path(args.measure[1]), args.report)), flush=True)
        return
    runs: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"after": ROOT}
        if "before" in args.readers.split(","):
            trees["before"] = package_tree(args.before, Path(tmp))
        sizes = {}
        for n in args.kernels:
            path = Path(tmp) / f"trace-{n}.json"
            write_trace(path, n)
            sizes[n] = path.stat().st_size
            print(json.dumps({"kernels": n, "file_bytes": sizes[n], "file_bytes_per_kernel": round(sizes[n] / n)}))
            for which in args.readers.split(","):
                cmd = [sys.executable, str(Path(__file__).resolve()), "--measure", which, str(path)]
                cmd += ["--report"] if args.report else []
                env = os.environ | {"PYTHONPATH": str(trees[which])}
                line = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=trees[which], env=env).stdout
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
