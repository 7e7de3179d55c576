"""1. Embedded replay vs DuckDB batch: the same simulated events, stored as Parquet, both ways.

The embedded pipeline (decode, validate, operators, Parquet out) against DuckDB running the
SQL recomputation of the tests (tests/recompute.sql: idle index, cost split, MAE) over the
same files. Both produce every record; their counts are checked to agree, so both did the
same work.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import duckdb

from benchmarks.common import Result, timed
from gpucost.cli import main as gpucost
from gpucost.embedded import run_embedded
from producers.replay import input_files, read_batches
from streams.settings import AuditSettings
from tests.recompute import parquet_source, recompute_sql


def run(gpus: int, hours: float, interval_s: float) -> Result:
    work = Path(tempfile.mkdtemp(prefix="gpucost-bench-replay-"))
    try:
        events = work / "events"
        assert gpucost(["simulate", "--gpus", str(gpus), "--hours", str(hours), "--interval-s", str(interval_s),
                        "--format", "parquet", "--out", str(events)]) == 0
        files = input_files([events])
        settings = AuditSettings()
        embedded_s, stats = timed(lambda: run_embedded(read_batches(files), settings, work / "out"))
        n = stats.inputs  # type: ignore[attr-defined]
        con = duckdb.connect()
        sql_s, _ = timed(lambda: con.execute(recompute_sql(parquet_source(files), settings)))
        want = con.execute("SELECT (SELECT count(*) FROM want_idle), (SELECT count(*) FROM want_cost)").fetchone()
        got = (stats.rows["idle_index"], stats.rows["cost"])  # type: ignore[attr-defined]
        assert want == got, f"DuckDB and the pipeline disagree on the records: {want} vs {got}"
        ratio = (n / embedded_s) / (n / sql_s)
        return Result(
            "1. Embedded replay vs DuckDB batch", "embedded events/s ≥ DuckDB's (ratio ≥ 1.0)", ratio >= 1.0,
            [("input", f"{gpus} GPUs × {hours:g} h at {interval_s:g} s: {n:,} events in Parquet"),
             ("embedded pipeline", f"{embedded_s:.1f} s, {n / embedded_s:,.0f} events/s"),
             ("DuckDB, tests/recompute.sql", f"{sql_s:.1f} s, {n / sql_s:,.0f} events/s"),
             ("ratio (embedded / DuckDB)", f"{ratio:.3f}"),
             ("records", f"idle_index {got[0]:,}, cost {got[1]:,} (both sides)")],
            ["DuckDB runs the SQL as written for the tests, one thread (`SET threads = 1`: MAE windows follow "
             "arrival order), with every record of METRICS.md except the largest-remainder split, which it "
             "leaves as exact shares."])
    finally:
        shutil.rmtree(work, ignore_errors=True)
