"""The report step of ``gpucost kernels`` (the split: busy shares, range and operator paths, the path tree) against
the report step of another revision, on the same trace, alternated (issue 38).

``python -m benchmarks.kernel_split_speed --kernels 100000 400000 --before REV`` writes the generated trace of
``benchmarks.kineto_memory`` per size (a ``user_annotation`` of 5 ms begun every 100 kernels, so the ranges open
at a launch overlap), then times ``kernel_report`` with ``REV``'s whole ``gpucost`` package (``git archive``) and
with this checkout's, each in a process of its own that reads the trace first (not timed), in the order before,
after, before, after; and checks that both give the same report (a digest of the figures both revisions have). A
JSON line per run. Whole packages, because the split's functions change their signatures between revisions.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: the report's figures of every revision since the split was first measured (later ones add sections)
FIGURES = ("device", "gpu_model", "busy_ns", "window_ns", "cost_micro_usd", "launch_gaps", "kernels", "ranges")


def _measure(trace: Path) -> dict:
    """One report step in this process, with the ``gpucost`` its ``PYTHONPATH`` gives."""
    from gpucost import kernels
    from gpucost.producers.kineto import read_kineto

    read = read_kineto(trace)
    start = time.perf_counter()
    report = kernels.kernel_report(read.kernels, read.ranges, {}, 2_500_000)
    seconds = time.perf_counter() - start
    figures = [{k: d[k] for k in FIGURES} for d in report["devices"]]
    digest = hashlib.sha256(json.dumps(figures, sort_keys=True).encode()).hexdigest()[:16]
    return {"seconds": round(seconds, 2), "report": digest, "package": str(Path(kernels.__file__).parent)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--kernels", type=int, nargs="+", default=[100_000, 400_000])
    p.add_argument("--before", default="main", help="the revision whose report step is 'before'")
    p.add_argument("--measure", metavar="FILE", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.measure:
        print(json.dumps(_measure(Path(args.measure))), flush=True)
        return
    from benchmarks.kineto_memory import ROOT, package_tree, write_trace

    with tempfile.TemporaryDirectory() as tmp:
        trees = {"before": package_tree(args.before, Path(tmp)), "after": ROOT}
        for n in args.kernels:
            trace = Path(tmp) / f"trace-{n}.json"
            write_trace(trace, n)
            digests = set()
            for which in ("before", "after", "before", "after"):
                cmd = [sys.executable, str(Path(__file__).resolve()), "--measure", str(trace)]
                env = os.environ | {"PYTHONPATH": str(trees[which])}
                out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=trees[which], env=env)
                run = json.loads(out.stdout)
                digests.add(run.pop("report"))
                print(json.dumps({"kernels": n, "split": which} | run), flush=True)
            assert len(digests) == 1, "the two report steps disagree"
            print(json.dumps({"kernels": n, "reports_equal": True}), flush=True)


if __name__ == "__main__":
    main()
