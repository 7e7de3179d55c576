"""Reading a large Nsight Systems export: ``gpucost kernels`` and ``gpucost trace-events`` over the shared saxpy
export enlarged by copies of its kernels and runtime calls, each in its own process: seconds and peak RSS.

``python -m benchmarks.nsys_export --copies 40000`` (200,005 kernels and 3.8 M runtime API rows, 173 MiB): the
runtime table holds every CUDA call of the job, many times its kernels, which is what the reader must not hold in
Python. Each copy is the export's rows shifted by a second, their correlation ids by 1,000.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DATA = Path(os.environ.get("GPUCOST_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
SHARED = DATA / "profiler-traces" / "pipit-nsys"
EXPORT = SHARED / "saxpy-mpi-cuda_nsys_perlmutter0.sqlite"


def enlarge(path: Path, copies: int) -> int:
    """The shared export at ``path`` with ``copies`` more of its kernels and runtime rows; returns the kernels."""
    shutil.copyfile(EXPORT, path)
    con = sqlite3.connect(path)
    con.execute(
        "CREATE TEMP TABLE seq AS WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < ?) "
        "SELECT i FROM s",
        (copies,),
    )
    shifted = {
        "start": "start + i * 1000000000",
        "end": "end + i * 1000000000",
        "correlationId": "correlationId + i * 1000",
    }
    for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME"):
        columns = [r[1] for r in con.execute(f"PRAGMA table_info({table})")]
        values = ", ".join(shifted.get(c, c) for c in columns)
        con.execute(f"INSERT INTO {table} SELECT {values} FROM {table}, seq")
    con.commit()
    (kernels,) = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
    con.close()
    return kernels


def _run(args: list[str]) -> dict:
    """One command in a process of its own: its seconds and its own peak RSS (``wait4``'s, not the largest child's)."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "gpucost.cli", *args], stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    if status:
        raise SystemExit(f"gpucost {args[0]} failed ({status})")
    return {
        "command": args[0],
        "seconds": round(time.perf_counter() - start, 2),
        "peak_rss_mib": usage.ru_maxrss // 1024,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--copies", type=int, default=40_000)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "big.sqlite"
        kernels = enlarge(path, args.copies)
        print(json.dumps({"file_mib": path.stat().st_size >> 20, "kernels": kernels}))
        print(json.dumps(_run(["kernels", str(path)])))
        print(json.dumps(_run(["trace-events", str(path), "--node-id", "n", "--out", str(Path(tmp) / "k.jsonl")])))


if __name__ == "__main__":
    main()
