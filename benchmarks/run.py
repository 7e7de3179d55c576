"""Run every benchmark and write BENCHMARKS.md: `python -m benchmarks.run [--quick] [--only N ...]`.

Sizes are chosen to finish in about ten minutes on two cores; --quick runs smaller inputs for
a smoke test. Each ratio is measured side by side in the same run, never against a number
from another day.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
from pathlib import Path

from benchmarks import (
    kafka_vs_raw,
    output_heavy,
    peers,
    producer_overhead,
    query_latency,
    rebalance,
    replay_vs_duckdb,
    report_build,
    revision_state,
    sink_startup,
    soak,
    state_memory,
)
from benchmarks.common import Result, machine

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("GPUCOST_SHARED_DATA", ROOT.parent / "shared" / "data"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small inputs: a smoke test, not figures to publish")
    p.add_argument("--only", type=int, nargs="+", choices=range(1, 13), help="run only these benchmarks")
    p.add_argument("--out", type=Path, default=ROOT / "BENCHMARKS.md", help="where to write the results")
    args = p.parse_args(argv)
    q = args.quick
    runs = {
        1: lambda: replay_vs_duckdb.run(gpus=4 if q else 32, hours=6 if q else 72, interval_s=10),
        2: lambda: kafka_vs_raw.run(gpus=2 if q else 8, hours=4 if q else 24, interval_s=10),
        3: lambda: state_memory.run(sizes=(10, 30) if q else (50, 250)),
        4: lambda: query_latency.run(
            gpus=50 if q else 1000, days=3 if q else 30, repeat=3 if q else 5, flushes=48 if q else 720
        ),
        5: lambda: producer_overhead.run(SHARED_DATA),
        6: lambda: report_build.run(gpus=20 if q else 1000, days=2 if q else 30),
        7: lambda: revision_state.run(horizons_h=(1,) if q else (6, 24), intervals_s=(10,) if q else (1, 10)),
        8: lambda: output_heavy.run(SHARED_DATA),
        9: lambda: rebalance.run(
            sizes=(16, 64) if q else (64, 256, 1024),
            rebalance_gpus=16 if q else 256,
            gpus=2 if q else 32,
            hours=2 if q else 24,
        ),
        10: lambda: sink_startup.run(gpus=20 if q else 100, days=(1, 3) if q else (1, 10)),
        11: lambda: peers.run(gpus=2 if q else 32, hours=2 if q else 24, runs=1 if q else 3),
        12: lambda: soak.run(
            gpus=2 if q else 8, days=7, kills=1 if q else 3, delay_s=0.5 if q else 0.2, compact_min_files=8 if q else 64
        ),
    }
    results: list[Result] = []
    for n in args.only or sorted(runs):
        print(f"benchmark {n} …", file=sys.stderr, flush=True)
        results.append(runs[n]())
        print(results[-1].markdown(), file=sys.stderr)
    command = (
        "python -m benchmarks.run"
        + (" --quick" if q else "")
        + (f" --only {' '.join(map(str, args.only))}" if args.only else "")
    )
    body = [
        f"Machine: {machine()}.",
        f"Date: {dt.date.today().isoformat()}.",
        f"Command: `{command}` (`make bench`).",
        "",
    ] + [r.markdown() for r in results]
    args.out.write_text("# Benchmark results\n\n" + "\n".join(body))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
