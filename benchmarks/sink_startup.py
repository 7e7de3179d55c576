"""10. The sink's start-up and memory against the output already written.

A sink starts by reading what the sinks before it may have written and not committed
(``gpucost.kafka.sink.resume``): the files its journal lists, whose records' natural keys it keeps
to drop them if they are read again. Before the journal it read the keys of every record on disk,
so its start-up time and memory grew with all the output (a month of 1,000 GPUs is about 130 M
cost records). Here the output is G GPUs' cost records over D days, in the sink's layout after
compaction (a file per day; the days' records differ only in their ids and times), with the last
flush's small file listed in the journal; each side
runs in a fresh process, which reports its seconds and how much its resident memory grew.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb

from benchmarks.common import Result, rss_bytes
from benchmarks.query_latency import NS, one_day

ROOT = Path(__file__).resolve().parent.parent
FLUSH_ROWS = 2 * 60  # a 2-minute flush of 1 GPU's panes, times the GPUs: the journal's one file


def output(out: Path, gpus: int, days: int) -> int:
    """``days`` days of ``gpus`` GPUs' cost records under ``out`` (each day's with record ids and times of
    its own), and a journal listing the last flush's file; the records written."""
    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false")
    rows = one_day(con, gpus, out / "first.parquet", 1024 * 1024, "pane_start_ns, gpu_uuid")  # leaves table day
    (out / "first.parquet").unlink()
    for d in range(days):
        folder = out / "cost" / f"date={(dt.date(2025, 1, 6) + dt.timedelta(days=d)).isoformat()}"
        folder.mkdir(parents=True)
        shift = d * 86_400 * NS
        con.execute(
            f"COPY (SELECT * REPLACE (md5(concat(record_id, ':{d}')) AS record_id, pane_start_ns + {shift} "
            f"AS pane_start_ns, pane_end_ns + {shift} AS pane_end_ns) FROM day) TO "
            f"'{folder}/part-00000.parquet' (FORMAT PARQUET, COMPRESSION zstd)"
        )
    last = sorted((out / "cost").glob("date=*"))[-1]
    con.execute(
        f"COPY (SELECT * REPLACE (md5(concat(record_id, ':flush')) AS record_id) FROM "
        f"read_parquet('{last}/part-00000.parquet') LIMIT {FLUSH_ROWS * gpus}) TO "
        f"'{last}/part-00001.parquet' (FORMAT PARQUET, COMPRESSION zstd)"
    )
    entry = {"file": (last / "part-00001.parquet").relative_to(out).as_posix(), "upto": {"gpucost.cost:0": 1}}
    (out / ".sink-journal").write_text(json.dumps(entry) + "\n")
    return rows * days + FLUSH_ROWS * gpus


def child(out: Path, side: str) -> dict[str, float]:
    """One side's start-up over ``out``: seconds, resident memory growth, keys held."""
    from gpucost.kafka.sink import resume, written_keys

    before = rss_bytes()
    start = time.perf_counter()
    if side == "journal":
        keys = resume(out, dict).seen
    else:  # every key on disk, as the sink did before its journal
        keys = written_keys(out, sorted(out.glob("*/date=*/part-*.parquet")))
    took = time.perf_counter() - start
    return {"s": took, "rss": rss_bytes() - before, "keys": sum(map(len, keys.values()))}


def _measure(out: Path, side: str) -> dict[str, float]:
    code = (
        f"import json, pathlib; from benchmarks.sink_startup import child; "
        f"print(json.dumps(child(pathlib.Path({str(out)!r}), {side!r})))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.splitlines()[-1])


def run(gpus: int, days: tuple[int, ...]) -> Result:
    rows: list[tuple[str, str]] = []
    sides: dict[tuple[int, str], dict[str, float]] = {}
    for d in days:
        out = Path(tempfile.mkdtemp(prefix="gpucost-bench-sink-"))
        try:
            records = output(out, gpus, d)
            for side in ("journal", "every key"):
                sides[d, side] = m = _measure(out, side)
                rows.append(
                    (
                        f"{gpus:,} GPUs × {d} day{'s' if d > 1 else ''} ({records:,} cost records), {side}",
                        f"{m['s']:.3f} s, {m['rss'] / 2**20:,.1f} MiB more resident, {m['keys']:,.0f} keys",
                    )
                )
        finally:
            shutil.rmtree(out, ignore_errors=True)
    lo, hi = days[0], days[-1]
    grew = {side: sides[hi, side]["rss"] - sides[lo, side]["rss"] for side in ("journal", "every key")}
    per_record = grew["every key"] / (sides[hi, "every key"]["keys"] - sides[lo, "every key"]["keys"])
    rows.append(
        (
            f"memory from {lo} to {hi} days",
            f"journal: {grew['journal'] / 2**20:+,.1f} MiB; every key (before): "
            f"{grew['every key'] / 2**20:+,.1f} MiB, {per_record:,.0f} bytes a record",
        )
    )
    bounded = abs(grew["journal"]) < 8 * 2**20 and sides[hi, "journal"]["s"] < 2 * sides[lo, "journal"]["s"] + 0.05
    return Result(
        "10. Sink start-up and memory against the output written",
        "start-up time and memory follow the journal (the last flush), not the output on disk",
        bounded,
        rows,
        [
            "Each side runs in a fresh process; resident memory (RSS) is read before and after, so Python's allocator "
            "makes it err high.",
            "The journal's side also lists every partition folder's files (compaction's count) and removes hidden "
            "temporaries: work that follows the files, not the records; the output is compacted to a file a day.",
        ],
    )
