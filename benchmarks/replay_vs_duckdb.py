"""1. Embedded replay vs DuckDB batch: the same simulated events, stored as Parquet, both ways.

The embedded pipeline (decode, validate, operators, Parquet out) against DuckDB running the
SQL recomputation of the tests (tests/recompute.sql: idle index, cost split, MAE) over the
same files. Both produce every record; their counts are checked to agree, so both did the
same work.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
from collections.abc import Iterable
from pathlib import Path

from benchmarks.common import Result, embedded_and_duckdb, timed
from gpucost.cli import main as gpucost
from gpucost.embedded import run_embedded
from gpucost.producers.replay import input_files, read_batches, read_inputs
from gpucost.streams.settings import AuditSettings

RUNS = 3


def _runs(seconds: Iterable[float]) -> str:
    return ", ".join(f"{s:.2f}" for s in seconds) + " s"


def run(gpus: int, hours: float, interval_s: float) -> Result:
    work = Path(tempfile.mkdtemp(prefix="gpucost-bench-replay-"))
    try:
        inputs = {}
        for form in ("parquet", "jsonl"):  # the same seeded fleet, stored both ways
            # without late bindings: the same input as earlier rounds' figures, and one record per (GPU, pane,
            # party) to count against DuckDB's (revisions' state is benchmark 7)
            assert (
                gpucost(
                    [
                        "simulate",
                        "--gpus",
                        str(gpus),
                        "--hours",
                        str(hours),
                        "--interval-s",
                        str(interval_s),
                        "--late-binding-fraction",
                        "0",
                        "--format",
                        form,
                        "--out",
                        str(work / form),
                    ]
                )
                == 0
            )
            inputs[form] = input_files([work / form])
        settings = AuditSettings()
        files = inputs["parquet"]
        embedded, sql, con = embedded_and_duckdb(files, settings, work, RUNS)  # medians of the two sides, below
        embedded_s, stats = statistics.median(s for s, _ in embedded), embedded[0][1]
        sql_s = statistics.median(sql)
        row_s, row_stats = timed(lambda: run_embedded(read_inputs(files), settings, work / "out-rows"))
        jsonl_s, jsonl_stats = timed(lambda: run_embedded(read_batches(inputs["jsonl"]), settings, work / "out-jsonl"))
        n = stats.inputs  # type: ignore[attr-defined]
        want = con.execute("SELECT (SELECT count(*) FROM want_idle), (SELECT count(*) FROM want_cost)").fetchone()
        for run_stats in [*(st for _, st in embedded), row_stats, jsonl_stats]:
            got = (run_stats.rows["idle_index"], run_stats.rows["cost"])  # type: ignore[attr-defined]
            assert want == got, f"DuckDB and the pipeline disagree on the records: {want} vs {got}"
            assert run_stats.inputs == n  # type: ignore[attr-defined]
        ratio = (n / embedded_s) / (n / sql_s)
        return Result(
            "1. Embedded replay vs DuckDB batch",
            "embedded events/s ≥ DuckDB's (ratio ≥ 1.0)",
            ratio >= 1.0,
            [
                (
                    "input",
                    f"{gpus} GPUs × {hours:g} h at {interval_s:g} s: {n:,} events in Parquet (and the same in "
                    "JSON Lines)",
                ),
                (
                    "embedded pipeline, Parquet (batch path)",
                    f"{embedded_s:.2f} s, {n / embedded_s:,.0f} events/s (median of {_runs(s for s, _ in embedded)})",
                ),
                ("… the same, event by event (row path, as before)", f"{row_s:.1f} s, {n / row_s:,.0f} events/s"),
                ("embedded pipeline, JSON Lines (batch path)", f"{jsonl_s:.1f} s, {n / jsonl_s:,.0f} events/s"),
                (
                    "DuckDB, tests/recompute.sql over the Parquet",
                    f"{sql_s:.2f} s, {n / sql_s:,.0f} events/s (median of {_runs(sql)})",
                ),
                ("ratio (embedded Parquet / DuckDB)", f"{ratio:.3f}"),
                ("records", f"idle_index {want[0]:,}, cost {want[1]:,} (every run and DuckDB)"),
            ],
            [
                "DuckDB runs the SQL as written for the tests, one thread (`SET threads = 1`: MAE windows follow "
                "arrival order), with every record docs/definitions.md defines except the largest-remainder split, "
                "which it "
                "leaves as exact shares.",
                "Every embedded run writes its Parquet output (zstd, fsync), as `gpucost replay` does.",
            ],
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
