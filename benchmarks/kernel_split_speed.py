"""The report step of ``gpucost kernels`` (the split: busy shares, range and operator paths, the path tree) against
the split of another revision, on the same read trace in one process, alternated (issue 38).

``python -m benchmarks.kernel_split_speed --kernels 100000 400000 --before REV`` writes the generated trace of
``benchmarks.kineto_memory`` per size (a ``user_annotation`` of 5 ms begun every 100 kernels, so the ranges open
at a launch overlap), reads it once, then times ``kernel_report`` twice with ``REV``'s
``gpucost/streams/kernel_split.py`` (taken with ``git show``) and twice with this checkout's, and checks that both
give the same report. A JSON line per run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.kineto_memory import ROOT, write_trace
from gpucost import kernels
from gpucost.producers.kineto import read_kineto
from gpucost.streams import kernel_split


def _split_of(rev: str, tmp: Path):  # noqa: ANN202 (a module)
    path = tmp / "kernel_split_before.py"
    path.write_text(
        subprocess.check_output(["git", "-C", str(ROOT), "show", f"{rev}:gpucost/streams/kernel_split.py"], text=True)
    )
    spec = importlib.util.spec_from_file_location("kernel_split_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["kernel_split_before"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--kernels", type=int, nargs="+", default=[100_000, 400_000])
    p.add_argument("--before", default="main", help="the revision whose split is 'before'")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        splits = {"before": _split_of(args.before, Path(tmp)), "after": kernel_split}
        for n in args.kernels:
            trace = Path(tmp) / f"trace-{n}.json"
            write_trace(trace, n)
            read = read_kineto(trace)
            reports = {}
            for which in ("before", "after", "before", "after"):
                kernels.range_paths, kernels.split_tree = splits[which].range_paths, splits[which].split_tree
                start = time.perf_counter()
                reports[which] = kernels.kernel_report(read.kernels, read.ranges, {}, 2_500_000)
                print(json.dumps({"kernels": n, "split": which, "seconds": round(time.perf_counter() - start, 2)}))
            assert reports["before"] == reports["after"], "the two splits disagree"
            print(json.dumps({"kernels": n, "reports_equal": True}), flush=True)


if __name__ == "__main__":
    main()
