"""4. Analyst query latency: cost per team per day over 30 days × 1,000 GPUs of cost records,
in the sink's Parquet layout (cost/date=YYYY-MM-DD/part-NNNNN.parquet, zstd), with three
choices of row groups and order,
through the same DuckDB views `gpucost query` uses.

One day of records is generated with the sink's schema (one idle record and one to three tenant
records per GPU per minute), then written once per date: the same volume and layout as 30
distinct days, at a thirtieth of the generation time.

The Kafka sink writes a file per kind and date at each flush, so the same records are also
queried as it leaves them before compaction (one file per 2-minute flush), and again after
``gpucost.sinks.compact`` has merged them, which is timed too.
"""

from __future__ import annotations

import datetime as dt
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import duckdb
import pyarrow.parquet as pq

from benchmarks.common import Result
from gpucost.schemas.arrow import ARROW_SCHEMAS
from gpucost.sinks.compact import compact
from gpucost.sinks.views import connect

QUERY = "SELECT date, team, sum(cost_micro_usd) AS micro_usd FROM cost GROUP BY ALL ORDER BY ALL"
NS = 1_000_000_000
T0 = 1_736_121_600 * NS


def one_day(con: duckdb.DuckDBPyConnection, gpus: int, path: Path, row_group: int, sort: str) -> int:
    teams = "['search', 'ads', 'vision', 'nlp', 'platform', 'research']"
    con.execute(f"""
        CREATE OR REPLACE TABLE day AS
        WITH panes AS (
            SELECT g, m, {T0} + m * {60 * NS} AS pane_start_ns, (1 + hash(g, m // 37) % 3)::BIGINT AS tenants,
                   (100000 + hash(g, m) % 50000)::BIGINT AS c
            FROM range({gpus}) r(g), range(1440) s(m)),
        parties AS (SELECT p.*, t FROM panes p, range(0, 4) u(t) WHERE t <= tenants)
        SELECT md5(concat(g, ':', m, ':', t)) AS record_id, printf('GPU-%06d', g) AS gpu_uuid,
               printf('node-%04d', g // 8) AS node_id, 'NVIDIA H100 80GB HBM3' AS gpu_model,
               pane_start_ns, pane_start_ns + {60 * NS} AS pane_end_ns,
               CASE WHEN t = 0 THEN 'idle'
                    ELSE {teams}[(1 + hash(g // 8, t) % 6)::BIGINT] || ':prod:app:online:Gold::' END
                 AS tenant_key,
               CASE WHEN t = 0 THEN 'idle' ELSE {teams}[(1 + hash(g // 8, t) % 6)::BIGINT] END AS team,
               CASE WHEN t = 0 THEN NULL ELSE 'prod' END AS env, CASE WHEN t = 0 THEN NULL ELSE 'app' END AS app,
               CASE WHEN t = 0 THEN NULL ELSE 'online' END AS tier, CASE WHEN t = 0 THEN NULL ELSE 'Gold' END AS sla,
               NULL::VARCHAR AS git_commit, NULL::VARCHAR AS ci_pipeline_id, NULL::VARCHAR AS labels,
               0.3 AS t_share, 0.3 AS b_share, 0.0 AS l_share, 0.27 AS weight, 0.5 AS busy_fraction,
               3.99::DECIMAL(18,6) AS usd_per_gpu_hour, c AS pane_cost_micro_usd,
               CASE WHEN t = 0 THEN c // 2 ELSE c // (2 * tenants) END AS cost_micro_usd,
               false AS unpriced, 0 AS revision,
               (CASE WHEN t = 0 THEN 0 ELSE 3000000 END)::DECIMAL(38,0) AS t_num,
               (CASE WHEN t = 0 THEN 0 ELSE 2000000 END)::DECIMAL(38,0) AS b_num, 0::DECIMAL(38,0) AS l_num,
               (3000000 * tenants)::DECIMAL(38,0) AS busy_num, 60000 AS covered_ms
        FROM parties ORDER BY {sort}""")
    columns = ", ".join(ARROW_SCHEMAS["cost"].names)
    con.execute(
        f"COPY (SELECT {columns} FROM day) TO '{path}' (FORMAT PARQUET, COMPRESSION zstd, ROW_GROUP_SIZE {row_group})"
    )
    return con.execute("SELECT count(*) FROM day").fetchone()[0]


def _days(out: Path, days: int, day: Path) -> None:
    """The files of ``day`` (a folder) as each of ``days`` dates."""
    for d in range(days):
        shutil.copytree(day, out / "cost" / f"date={(dt.date(2025, 1, 6) + dt.timedelta(days=d)).isoformat()}")


def _query(out: Path, repeat: int) -> float:
    """Median seconds of the query, after a warm-up: the OS page cache holds the files, as on a busy analyst box."""
    views = connect(out)
    views.execute("SET enable_progress_bar = false")
    views.execute(QUERY).fetchall()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        views.execute(QUERY).fetchall()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def layout(gpus: int, days: int, row_group: int, sort: str, repeat: int) -> tuple[int, float, int]:
    """(rows, median query seconds, bytes on disk) for one layout."""
    out = Path(tempfile.mkdtemp(prefix="gpucost-bench-query-"))
    try:
        con = duckdb.connect()
        con.execute("SET enable_progress_bar = false")
        (out / "day").mkdir()
        rows = one_day(con, gpus, out / "day" / "part-00000.parquet", row_group, sort)
        _days(out, days, out / "day")
        size = (out / "day" / "part-00000.parquet").stat().st_size * days
        shutil.rmtree(out / "day")
        return rows * days, _query(out, repeat), size
    finally:
        shutil.rmtree(out, ignore_errors=True)


def sink_files(gpus: int, days: int, flushes: int, repeat: int) -> tuple[int, float, float, int, float]:
    """The sink's files before compaction, ``flushes`` a day: (files, query seconds before, compaction
    seconds, files after, query seconds after)."""
    out = Path(tempfile.mkdtemp(prefix="gpucost-bench-query-"))
    try:
        con = duckdb.connect()
        con.execute("SET enable_progress_bar = false")
        one_day(con, gpus, out / "day.parquet", 1024 * 1024, "pane_start_ns, gpu_uuid")
        day = pq.read_table(out / "day.parquet")  # in arrival order, cut where the flushes fall
        (out / "day").mkdir()
        for i in range(flushes):
            lo, hi = i * day.num_rows // flushes, (i + 1) * day.num_rows // flushes
            pq.write_table(day.slice(lo, hi - lo), out / "day" / f"part-{i:05d}.parquet", compression="zstd")
        _days(out, days, out / "day")
        shutil.rmtree(out / "day")
        before = _query(out, repeat)
        start = time.perf_counter()
        stats = compact(out)
        took = time.perf_counter() - start
        return stats.files_merged, before, took, len(list(out.glob("cost/*/*.parquet"))), _query(out, repeat)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def run(gpus: int = 1000, days: int = 30, repeat: int = 5, flushes: int = 720) -> Result:
    rows_out = []
    best = None
    for label, row_group, sort in [
        ("128 Ki-row groups, in arrival order (the sink's first layout)", 128 * 1024, "pane_start_ns, gpu_uuid"),
        ("1 Mi-row groups, in arrival order (the sink's layout now)", 1024 * 1024, "pane_start_ns, gpu_uuid"),
        ("1 Mi-row groups, sorted by team", 1024 * 1024, "team, pane_start_ns"),
    ]:
        rows, seconds, size = layout(gpus, days, row_group, sort, repeat)
        rows_out.append((label, f"{seconds * 1000:,.0f} ms median of {repeat} ({rows:,} rows, {size / 2**30:.2f} GiB)"))
        best = seconds if best is None else min(best, seconds)
    assert best is not None
    files, before, took, after_files, after = sink_files(gpus, days, flushes, repeat)
    rows_out += [
        (
            f"as the Kafka sink flushes them, one file every {24 * 60 // flushes} min, before compaction",
            f"{before * 1000:,.0f} ms median of {repeat} ({files:,} files)",
        ),
        (
            "the same after `gpucost.sinks.compact` merged them (what the sink and `gpucost compact` do)",
            f"{after * 1000:,.0f} ms median of {repeat} ({after_files:,} files; the compaction took {took:,.1f} s)",
        ),
    ]
    return Result(
        "4. Query latency",
        f"cost per team per day over {days} days × {gpus:,} GPUs in < 1 s, in the "
        "best layout and in the sink's once compacted",
        best < 1.0 and after < 1.0,
        rows_out,
        [f"Query: `{QUERY}`, through the views of `gpucost query`."],
    )
