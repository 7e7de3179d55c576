"""The SQL recomputation (recompute.sql) over JSON Lines or Parquet event files, with its settings."""

from __future__ import annotations

import json
from pathlib import Path

from gpucost.streams.settings import AuditSettings

__all__ = ["json_source", "parquet_source", "recompute_sql"]

SQL = Path(__file__).with_name("recompute.sql")
# the exact types every path reads the decimal fields with, so SQL rounds the numbers the pipeline rounds
_EXACT = {
    "interval_s": "DECIMAL(18,6)",
    "sm_util_pct": "DECIMAL(9,4)",
    "mem_bw_util_pct": "DECIMAL(9,4)",
    "usd_per_gpu_hour": "DECIMAL(18,6)",
    "tensor_active_pct": "DECIMAL(9,4)",
    "dram_active_pct": "DECIMAL(9,4)",
}


def _files(files: list[Path]) -> str:
    return json.dumps([str(f) for f in files]).replace('"', "'")


def json_source(files: list[Path]) -> str:
    columns = {
        "kind": "VARCHAR",
        "node_id": "VARCHAR",
        "gpu_uuid": "VARCHAR",
        "gpu_model": "VARCHAR",
        "ts_ns": "BIGINT",
        "pid": "BIGINT",
        "hops": "BIGINT",
        "latency_weight": "BIGINT",
        "address": "UBIGINT",
        "team": "VARCHAR",
        "env": "VARCHAR",
        "app": "VARCHAR",
        "tier": "VARCHAR",
        "sla": "VARCHAR",
        "git_commit": "VARCHAR",
        "ci_pipeline_id": "VARCHAR",
        "trace_hex": "VARCHAR",
        "trace_source": "VARCHAR",
        **_EXACT,
    }
    spec = ", ".join(f"{name}: '{kind}'" for name, kind in columns.items())
    return f"read_json({_files(files)}, format = 'newline_delimited', columns = {{{spec}}})"


def parquet_source(files: list[Path]) -> str:
    casts = ", ".join(f"CAST({name} AS {kind}) AS {name}" for name, kind in _EXACT.items())
    return f"(SELECT * REPLACE ({casts}) FROM read_parquet({_files(files)}))"


def recompute_sql(source: str, s: AuditSettings) -> str:
    params = {
        "source": source,
        "pane_ns": s.pane_ns,
        "window_ns": s.window_ns,
        "alpha": s.alpha,
        "beta": s.beta,
        "gamma": s.gamma,
        "mae_window": s.mae_window,
        "compute_bound_efu": s.compute_bound_efu,
        "memory_bound_bw": s.memory_bound_bw,
        "peaks": ", ".join(f"('{key}', {tops})" for key, tops in s.peak_tops.items()),
    }
    sql = SQL.read_text()
    for name, value in params.items():
        sql = sql.replace("{" + name + "}", str(value))
    return sql


#: the pipeline's bill as revised (``cost_as_revised``), less the parties a late binding emptied: what a run with every
#: event on time publishes, to hold against ``want_cost`` (a party the recomputation has not must be such an empty one)
REVISED_COST = """CREATE OR REPLACE TEMP VIEW revised_cost AS
SELECT g.* FROM cost_as_revised g
WHERE EXISTS (SELECT 1 FROM want_cost w WHERE (w.gpu_uuid, w.pane_start_ns, w.tenant_key)
                                             = (g.gpu_uuid, g.pane_start_ns, g.tenant_key))
   OR NOT (g.revision > 0 AND g.cost_micro_usd = 0 AND g.t_num = 0 AND g.b_num = 0 AND g.l_num = 0)"""
