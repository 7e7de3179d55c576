"""Replay of a generated Kineto trace by ``gpucost kernels``, peak RSS and time, against HTA on the same file.

``python -m benchmarks.kernel_replay --mib 1024`` writes a trace of about that size (kernels on 4
streams of one device, each with its ``cuda_runtime`` launch and a ``user_annotation`` per 100 kernels), then
runs each reader in its own process and prints one JSON line per reader: seconds, peak RSS (MiB), busy ns.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BASE_NS = 1_711_964_646_000_000_000


def write_trace(path: Path, mib: int, seed: int = 0) -> int:
    """About ``mib`` MiB of trace; returns the number of kernels written."""
    rng, target, n, ts_us = random.Random(seed), mib << 20, 0, 0
    name = "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, float, float>>"
    with path.open("w") as f:
        f.write(f'{{"baseTimeNanoseconds": {BASE_NS}, "traceEvents": [\n')
        while f.tell() < target:
            if n % 100 == 0:
                f.write(
                    json.dumps(
                        {
                            "ph": "X",
                            "cat": "user_annotation",
                            "name": f"step#{n // 100}",
                            "pid": 1,
                            "tid": 1,
                            "ts": ts_us,
                            "dur": 5000,
                        }
                    )
                    + ",\n"
                )
            stream = 7 + n % 4
            f.write(
                json.dumps(
                    {
                        "ph": "X",
                        "cat": "cuda_runtime",
                        "name": "cudaLaunchKernel",
                        "pid": 1,
                        "tid": 1,
                        "ts": ts_us + 1,
                        "dur": 3,
                        "args": {"correlation": n},
                    }
                )
                + ",\n"
            )
            f.write(
                f'{{"ph": "X", "cat": "kernel", "name": "{name}{n % 50}", "pid": 0, "tid": {stream}, '
                f'"ts": {ts_us + 5}.{rng.randrange(1000):03d}, '
                f'"dur": {rng.randrange(1, 40)}.{rng.randrange(1000):03d}, '
                f'"args": {{"device": 0, "stream": {stream}, "correlation": {n}}}}},\n'
            )
            n, ts_us = n + 1, ts_us + rng.randrange(1, 20)
        f.write('{"ph": "M", "name": "end", "pid": 0, "tid": 0}\n]}\n')
    return n


def _gpucost(path: str) -> int:
    from gpucost.kernels import kernel_report
    from gpucost.trace_files import read_trace

    kernels, ranges, operators, models, _ = read_trace(Path(path))
    return kernel_report(kernels, ranges, models, 2_500_000, operators)["devices"][0]["busy_ns"]


def _hta(path: str) -> int:
    import logging
    import os

    os.environ["HTA_DISABLE_NS_ROUNDING"] = "1"  # read the times as written, not shrunk to whole µs
    logging.disable(logging.CRITICAL)
    from hta.trace_analysis import TraceAnalysis
    from hta.utils.utils import merge_kernel_intervals

    trace = TraceAnalysis(trace_dir=str(Path(path).parent), include_last_profiler_step=True).t
    sym = trace.symbol_table.get_sym_table()
    df = next(iter(trace.get_all_traces().values()))
    merged = merge_kernel_intervals(df[(df["stream"] >= 0) & (df["cat"].map(lambda c: sym[c]) == "kernel")].copy())
    return int(float((merged.end - merged.ts).sum()) * 1000)


def _measure(reader: str, path: str) -> None:
    start = time.perf_counter()
    busy = {"gpucost": _gpucost, "hta": _hta}[reader](path)
    print(
        json.dumps(
            {
                "reader": reader,
                "seconds": round(time.perf_counter() - start, 2),
                "busy_ns": busy,
                "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
            }
        )
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--mib", type=int, default=1024)
    p.add_argument("--readers", default="gpucost,hta")
    p.add_argument("--measure", nargs=2, metavar=("READER", "FILE"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.measure:
        _measure(*args.measure)
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rank-0.json"
        kernels = write_trace(path, args.mib)
        print(json.dumps({"file_mib": path.stat().st_size >> 20, "kernels": kernels}))
        for reader in args.readers.split(","):
            subprocess.run(
                [sys.executable, "-m", "benchmarks.kernel_replay", "--measure", reader, str(path)], check=False
            )


if __name__ == "__main__":
    main()
