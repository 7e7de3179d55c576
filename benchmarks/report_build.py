"""6. The HTML report over a month of a 1,000-GPU fleet: the time to build it and the size of the page.

A month of cost records (benchmark 4's day, one idle record and one to three tenant records per
GPU per minute) and of idle-index records (one per GPU per minute), each day at its own times, in
the sink's layout; then ``gpucost.report_html.build_report`` over them, which aggregates in DuckDB
(per hour, per GPU-day) and ships only what the plots draw.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import duckdb

from benchmarks.common import Result
from benchmarks.query_latency import NS, T0, one_day
from gpucost.report_html import build_report
from gpucost.schemas.arrow import ARROW_SCHEMAS

DAY_NS = 86_400 * NS


def _month(out: Path, gpus: int, days: int) -> int:
    """``days`` days of cost and idle-index records under ``out``; the number of cost records."""
    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false")
    (out / "seed").mkdir()
    rows = one_day(con, gpus, out / "seed" / "day.parquet", 1024 * 1024, "pane_start_ns, gpu_uuid")
    idle = ", ".join(ARROW_SCHEMAS["idle_index"].names)
    for d in range(days):
        date = time.strftime("%Y-%m-%d", time.gmtime((T0 + d * DAY_NS) // NS))
        for kind in ("cost", "idle_index"):
            (out / kind / f"date={date}").mkdir(parents=True)
        shift = f"pane_start_ns + {d * DAY_NS} AS pane_start_ns, pane_end_ns + {d * DAY_NS} AS pane_end_ns"
        con.execute(
            f"COPY (SELECT * REPLACE ({shift}) FROM day) TO '{out}/cost/date={date}/part-00000.parquet' "
            "(FORMAT PARQUET, COMPRESSION zstd)"
        )
        con.execute(f"""COPY (SELECT {idle} FROM (
            SELECT printf('GPU-%06d', g) AS gpu_uuid, printf('node-%04d', g // 8) AS node_id,
                   'NVIDIA H100 80GB HBM3' AS gpu_model, {T0 + d * DAY_NS} + m * {60 * NS} AS pane_start_ns,
                   {T0 + d * DAY_NS} + (m + 1) * {60 * NS} AS pane_end_ns, (hash(g, m, {d}) % 60001)::BIGINT AS idle_ms,
                   60000::BIGINT AS covered_ms, 0::BIGINT AS idle_ms_72h, 0::BIGINT AS covered_ms_72h,
                   (hash(g, {d}) % 1000) / 1000.0 AS idle_index_72h, 0::BIGINT AS revision
            FROM range({gpus}) r(g), range(1440) s(m)))
            TO '{out}/idle_index/date={date}/part-00000.parquet' (FORMAT PARQUET, COMPRESSION zstd)""")
    shutil.rmtree(out / "seed")
    return rows * days


def run(gpus: int = 1000, days: int = 30) -> Result:
    out = Path(tempfile.mkdtemp(prefix="gpucost-bench-report-"))
    try:
        records = _month(out, gpus, days)
        start = time.perf_counter()
        page = build_report(out)
        took = time.perf_counter() - start
    finally:
        shutil.rmtree(out, ignore_errors=True)
    size = len(page.encode())
    return Result(
        "6. HTML report over a month of a fleet",
        "built in under 60 s, a page under 20 MB, for 30 days × 1,000 GPUs",
        took < 60 and size < 20e6,
        [
            (
                "records behind it",
                f"{records:,} cost and {gpus * 1440 * days:,} idle-index records ({gpus:,} GPUs, {days} days)",
            ),
            ("build (DuckDB aggregates, figures, HTML)", f"{took:.1f} s"),
            ("page", f"{size / 1e6:.1f} MB (Plotly's inline script is 4.6 MB of it)"),
        ],
        ["The other views are empty here; the cost plots (per hour) and the GPU × day heatmap are the large ones."],
    )
