"""DuckDB views over the Parquet output: one per output kind (``idle_index``, ``mae``, ``cost``, ``health``,
``quota``, ``reclaim``, ``efficiency``, ``kernel_cost``, ``range_cost``, ``dlq``), the bill as first published and as
revised, the kernel lines and range paths as revised, and ``unit_cost`` over ``cost`` and ``efficiency``.

``views_sql(dir)`` is the SQL an analyst can paste into any DuckDB; ``connect(dir)`` opens
an in-memory DuckDB with exactly those views. A kind with no file yet gets an empty view
of the right columns and types, so queries work before the first record arrives.
"""

from __future__ import annotations

import os
import re
from decimal import Decimal
from functools import partial
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from gpucost.schemas.arrow import ARROW_SCHEMAS
from gpucost.schemas.partitions import share_sql
from gpucost.schemas.records import OUTPUT_KINDS
from gpucost.sinks.compact import RETIRED, STAGING
from gpucost.sinks.landlock import without_writes

__all__ = [
    "MIN_EFFECTIVE_TFLOP_HOURS",
    "QUERY_ATTEMPTS",
    "VIEW_NAMES",
    "confine",
    "straddled",
    "swaps",
    "views_sql",
    "connect",
    "query",
    "spend_sql",
    "sql_string",
    "unit_cost_sql",
    "view_records",
]

# dead letters without a valid event time sit under date=unknown, so their date stays text
_DATE_TYPE = {
    "idle_index": "DATE",
    "mae": "DATE",
    "cost": "DATE",
    "allocation": "DATE",
    "health": "DATE",
    "quota": "DATE",
    "reclaim": "DATE",
    "efficiency": "DATE",
    "kernel_cost": "DATE",
    "range_cost": "DATE",
    "dlq": "VARCHAR",
}


def _sql_type(t: pa.DataType) -> str:
    if pa.types.is_decimal(t):
        return f"DECIMAL({t.precision},{t.scale})"
    if pa.types.is_list(t):
        return f"{_sql_type(t.value_type)}[]"
    return {pa.int64(): "BIGINT", pa.float64(): "DOUBLE", pa.string(): "VARCHAR", pa.bool_(): "BOOLEAN"}[t]


def _view(out_dir: Path, kind: str) -> str:
    """``kind``'s view: its files, each column of this version's schema there (null in a file written before the
    column existed: the tenant's ``labels``), or no rows of the same columns while there is no file."""
    folder = out_dir.resolve() / kind
    cols = [f"CAST(NULL AS {_sql_type(f.type)}) AS {f.name}" for f in ARROW_SCHEMAS[kind]]
    cols.append(f"CAST(NULL AS {_DATE_TYPE[kind]}) AS date")
    empty = f"SELECT {', '.join(cols)} WHERE false"
    if not any(folder.glob("**/*.parquet")):
        return (
            f"-- {kind}: no file under {folder} yet; run this again once there is one\n"
            f"CREATE OR REPLACE VIEW {kind} AS {empty};"
        )
    glob = (folder / "**" / "*.parquet").as_posix().replace("'", "''")
    return (
        f"CREATE OR REPLACE VIEW {kind} AS SELECT * FROM read_parquet('{glob}', "
        f"hive_partitioning = true, hive_types = {{'date': {_DATE_TYPE[kind]}}}, union_by_name = true) "
        f"UNION ALL BY NAME {empty};"
    )


#: the least effective work a unit cost rests on, in effective TFLOP-hours (EFU × peak TFLOPS × hours): below it
#: ``usd_per_effective_tflop_hour`` is NULL (n/a), not a quotient of a few traced calls (0.08 effective TFLOP-hours
#: of an A100 gave $4,018 per TFLOP-hour); one is an H100 at its dense FP16 peak for 3.6 s, or a T4 at 10 % EFU
#: for 9 min (docs/definitions.md, "Unit cost")
MIN_EFFECTIVE_TFLOP_HOURS = Decimal(1)

#: the seed's unit cost, ``(C_total + C_opex) / TFLOPS_effective``, per GPU model, day and EFU source
#: (docs/definitions.md, "Efficiency: EFU, ΔBW, diagnosis"). Each pane's billed µ$ (revisions included) goes with its
#: GPU row's ``efu_source``: FLOPs counted and ``tensor_active`` measure different things (7e-5 against 0.17 on one
#: GPU), so one figure never mixes them; panes with no EFU (or no efficiency record) are the rows whose ``efu_source``
#: is NULL, with no unit cost
_UNIT_COST = """CREATE OR REPLACE VIEW unit_cost AS
WITH c AS (SELECT gpu_uuid, pane_start_ns, arg_max(gpu_model, revision) AS gpu_model, any_value(date) AS date,
                  sum(cost_micro_usd) AS cost_micro_usd, arg_max(covered_ms, revision) AS covered_ms
           FROM cost GROUP BY gpu_uuid, pane_start_ns),
e AS (SELECT gpu_uuid, pane_start_ns, gpu_model, date, efu_source, covered_ms,
             efu * peak_tops * covered_ms / 3.6e6 AS effective_tflop_hours
      FROM efficiency WHERE pid = 0),
p AS (SELECT coalesce(c.gpu_model, e.gpu_model) AS gpu_model, coalesce(c.date, e.date) AS date, e.efu_source,
             coalesce(c.cost_micro_usd, 0) AS cost_micro_usd, coalesce(e.covered_ms, c.covered_ms) AS covered_ms,
             e.effective_tflop_hours
      FROM c FULL JOIN e USING (gpu_uuid, pane_start_ns)),
g AS (SELECT gpu_model, date, efu_source, CAST(sum(cost_micro_usd) AS BIGINT) AS cost_micro_usd,
             sum(covered_ms * {share}) / 3.6e6 AS gpu_hours,
             coalesce(sum(effective_tflop_hours), 0) AS effective_tflop_hours
      FROM p GROUP BY ALL)
SELECT gpu_model, date, efu_source, cost_micro_usd, gpu_hours, CAST({opex} AS DOUBLE) * gpu_hours AS opex_usd,
       effective_tflop_hours,
       {unit} AS usd_per_effective_tflop_hour
FROM g;"""


def unit_cost_sql(source: str, cost_micro_usd: str, opex_usd: str, tflop_hours: str) -> str:
    """The SQL of a unit cost, USD per effective TFLOP-hour, from SQL expressions of its parts: NULL (n/a) with no
    EFU source or below ``MIN_EFFECTIVE_TFLOP_HOURS``. One rule for the view's days and the summary's totals."""
    return (
        f"CASE WHEN {source} IS NOT NULL AND {tflop_hours} >= {MIN_EFFECTIVE_TFLOP_HOURS} "
        f"THEN ({cost_micro_usd} / 1e6 + {opex_usd}) / {tflop_hours} END"
    )


#: late data as revisions (docs/definitions.md, "Late data become revisions"): the bill as first published (each
#: pane's revision 0), and as revised: per (GPU, pane, party) the sum of its differences as ``cost_micro_usd``, its
#: latest record's other values, and how many records it took (a party a late binding emptied stays, at 0 µ$ and
#: shares 0); each pane's latest idle record
_REVISED = """CREATE OR REPLACE VIEW cost_as_first_published AS SELECT * FROM cost WHERE revision = 0;
CREATE OR REPLACE VIEW cost_as_revised AS
SELECT c.* REPLACE (s.total AS cost_micro_usd), s.records
FROM cost c JOIN (SELECT gpu_uuid, pane_start_ns, tenant_key, sum(cost_micro_usd) AS total, max(revision) AS latest,
                         count(*) AS records FROM cost GROUP BY ALL) s
  ON c.gpu_uuid = s.gpu_uuid AND c.pane_start_ns = s.pane_start_ns AND c.tenant_key = s.tenant_key
 AND c.revision = s.latest;
CREATE OR REPLACE VIEW idle_index_as_revised AS
SELECT * FROM idle_index QUALIFY revision = max(revision) OVER (PARTITION BY gpu_uuid, pane_start_ns);"""

#: where a kernel line's or range path's money went, per team, over the as-revised rows that ``{where}`` keeps: µ$, busy
#: ns, calls (and µ$ per call of a kernel), and the panes where it has any (not those a revision emptied). One rule for
#: the views ``kernel_spend`` / ``range_spend`` (every row) and the HTML report's tables (the dates asked for).
SPEND = {
    "kernel": """SELECT team, category, kernel, sum(cost_micro_usd)::BIGINT AS cost_micro_usd,
       sum(busy_ns)::BIGINT AS busy_ns, sum(calls)::BIGINT AS calls,
       sum(cost_micro_usd) / nullif(sum(calls), 0) AS micro_usd_per_call,
       {panes}
FROM kernel_cost_as_revised {where} GROUP BY ALL""",
    "range": """SELECT team, range_path, any_value(range_name) AS range_name, any_value(depth) AS depth,
       sum(cost_micro_usd)::BIGINT AS cost_micro_usd, sum(busy_ns)::BIGINT AS busy_ns, sum(calls)::BIGINT AS calls,
       {panes}
FROM range_cost_as_revised {where} GROUP BY team, range_path""",
}
_PANES_WITH_ANY = (
    "count(DISTINCT (gpu_uuid, pane_start_ns)) FILTER (WHERE calls > 0 OR busy_ns > 0 OR cost_micro_usd <> 0) AS panes"
)


def spend_sql(kind: str, where: str = "") -> str:
    """``SPEND[kind]`` over the rows ``where`` keeps (a ``WHERE`` clause, or nothing for every row)."""
    return SPEND[kind].format(panes=_PANES_WITH_ANY, where=where)


#: the kernel cost lines (docs/definitions.md, "Kernel cost in the pipeline") as revised, as ``cost_as_revised`` is:
#: per line the sum of its differences as ``cost_micro_usd`` and its latest record's other values (``busy_ns`` and
#: ``calls`` are a line's figures, not differences: summed over revisions they would count a revised pane twice), and
#: the same of the range paths (docs/definitions.md, "Range cost in the pipeline"), ``range_cost_as_revised``; with
#: ``kernel_spend`` and ``range_spend`` over every pane (``SPEND``)
_KERNELS = """CREATE OR REPLACE VIEW kernel_cost_as_revised AS
SELECT k.* REPLACE (s.total AS cost_micro_usd)
FROM kernel_cost k JOIN (SELECT gpu_uuid, pane_start_ns, tenant_key, category, kernel, sum(cost_micro_usd) AS total,
                                max(revision) AS latest FROM kernel_cost GROUP BY ALL) s
  USING (gpu_uuid, pane_start_ns, tenant_key, category, kernel)
WHERE k.revision = s.latest;
CREATE OR REPLACE VIEW kernel_spend AS
{kernel_spend};
CREATE OR REPLACE VIEW range_cost_as_revised AS
SELECT r.* REPLACE (s.total AS cost_micro_usd)
FROM range_cost r JOIN (SELECT gpu_uuid, pane_start_ns, tenant_key, range_path, sum(cost_micro_usd) AS total,
                               max(revision) AS latest FROM range_cost GROUP BY ALL) s
  USING (gpu_uuid, pane_start_ns, tenant_key, range_path)
WHERE r.revision = s.latest;
CREATE OR REPLACE VIEW range_spend AS
{range_spend};"""


#: the two bases (docs/definitions.md, "Allocation basis"): both tables' records with ``cost_basis`` as a column;
#: each record once per label its tenant carries (``label_key``, ``label_value``: docs/definitions.md, "Labels"), so
#: that a sum by one key is a bill (records without that key left out); and
#: per (GPU, pane, tenant) of the panes on the allocation basis what was held against what was used, each summed
#: over its revisions: ``reserved_idle`` is held and not used (what a reclaim saves), ``borrowed`` used beyond
#: what was held (a time-sliced neighbour's slack)
_BASES = """CREATE OR REPLACE VIEW cost_by_basis AS
SELECT 'usage' AS cost_basis, gpu_uuid, node_id, gpu_model, pane_start_ns, pane_end_ns, tenant_key, team, env, app,
       tier, sla, labels, usd_per_gpu_hour, pane_cost_micro_usd, cost_micro_usd, revision, date FROM cost
UNION ALL
SELECT cost_basis, gpu_uuid, node_id, gpu_model, pane_start_ns, pane_end_ns, tenant_key, team, env, app,
       tier, sla, labels, usd_per_gpu_hour, pane_cost_micro_usd, cost_micro_usd, revision, date FROM allocation;
CREATE OR REPLACE VIEW cost_by_label AS
SELECT b.cost_basis, b.gpu_uuid, b.node_id, b.gpu_model, b.pane_start_ns, b.tenant_key, b.team,
       l.key AS label_key, l.value ->> '$' AS label_value, b.cost_micro_usd, b.revision, b.date
FROM cost_by_basis b, json_each(b.labels) l;
CREATE OR REPLACE VIEW allocation_gap AS
WITH panes AS (SELECT DISTINCT gpu_uuid, pane_start_ns FROM allocation),
held AS (SELECT gpu_uuid, pane_start_ns, tenant_key, any_value(team) AS team, any_value(node_id) AS node_id,
                any_value(gpu_model) AS gpu_model, sum(cost_micro_usd) AS allocated_micro_usd
         FROM allocation GROUP BY ALL),
used AS (SELECT gpu_uuid, pane_start_ns, tenant_key, any_value(team) AS team, any_value(node_id) AS node_id,
                any_value(gpu_model) AS gpu_model, sum(cost_micro_usd) AS used_micro_usd
         FROM cost JOIN panes USING (gpu_uuid, pane_start_ns) GROUP BY ALL)
SELECT gpu_uuid, coalesce(h.node_id, u.node_id) AS node_id, coalesce(h.gpu_model, u.gpu_model) AS gpu_model,
       pane_start_ns, tenant_key, coalesce(h.team, u.team) AS team,
       coalesce(allocated_micro_usd, 0)::BIGINT AS allocated_micro_usd,
       coalesce(used_micro_usd, 0)::BIGINT AS used_micro_usd,
       greatest(coalesce(allocated_micro_usd, 0) - coalesce(used_micro_usd, 0), 0)::BIGINT AS reserved_idle_micro_usd,
       greatest(coalesce(used_micro_usd, 0) - coalesce(allocated_micro_usd, 0), 0)::BIGINT AS borrowed_micro_usd
FROM held h FULL OUTER JOIN used u USING (gpu_uuid, pane_start_ns, tenant_key)
WHERE coalesce(h.team, u.team) NOT IN ('idle', 'unallocated', 'unattributed');"""


#: every view ``views_sql`` creates, by name: one per record kind, then the derived ones (what ``gpucost query``
#: says it can read)
VIEW_NAMES: tuple[str, ...] = (
    *ARROW_SCHEMAS,
    *re.findall(r"CREATE OR REPLACE VIEW (\w+)", _REVISED + _KERNELS + _BASES + _UNIT_COST),
)


def views_sql(out_dir: Path, opex_usd_per_gpu_hour: Decimal = Decimal(0)) -> str:
    """Every kind's view, the revised bill's (``cost_as_first_published``, ``cost_as_revised``,
    ``idle_index_as_revised``), the kernel lines' (``kernel_cost_as_revised``, ``kernel_spend``), the range
    paths' (``range_cost_as_revised``, ``range_spend``), the two bases'
    and the labels' (``cost_by_basis``, ``cost_by_label``, ``allocation_gap``) and ``unit_cost`` at the opex rate
    given (USD per GPU-hour)."""
    views = [_view(out_dir, kind) for kind in ARROW_SCHEMAS]
    return (
        "\n".join(
            [
                *views,
                _REVISED,
                _KERNELS.format(kernel_spend=spend_sql("kernel"), range_spend=spend_sql("range")),
                _BASES,
                _UNIT_COST.format(
                    opex=Decimal(opex_usd_per_gpu_hour),
                    unit=unit_cost_sql("efu_source", "cost_micro_usd", "opex_usd", "effective_tflop_hours"),
                    share="{} / {}".format(*share_sql("gpu_model")),
                ),
            ]
        )
        + "\n"
    )


def connect(out_dir: Path, opex_usd_per_gpu_hour: Decimal = Decimal(0)) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute(views_sql(out_dir, opex_usd_per_gpu_hour))
    return con


def confine(con: duckdb.DuckDBPyConnection, out_dir: Path) -> duckdb.DuckDBPyConnection:
    """``con`` reading files under ``out_dir`` only, spilling nowhere (no ``temp_directory``: DuckDB's
    default is ``.tmp`` in the working directory), its configuration locked: a query cannot read
    ``/etc/passwd``, attach a database, install an extension or widen its own access (what ``gpucost
    query`` hands an analyst's SQL to). Writes inside ``out_dir`` stay possible here: ``query``'s
    ``read_only`` is what refuses them."""
    folder = f"{out_dir.resolve().as_posix()}/".replace("'", "''")
    con.execute(f"SET allowed_directories = ['{folder}']")
    con.execute("SET temp_directory = ''")
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
    return con


#: a query that a compaction's swap fails (sinks/compact.py) is run again, up to this many times in all
QUERY_ATTEMPTS = 3


def _names(folder: Path) -> list[str]:
    try:
        return os.listdir(folder)
    except OSError:
        return []


def swaps(out_dir: Path) -> frozenset[str]:
    """What tells compactions apart: each swap retires the old folder under a name of its own, and the
    folders being compacted now are staged (``STAGING/KIND/date=D``) from before their swap until
    after it. A query may have read across a swap if this changed while it ran, or if it began while a
    folder was staged (``straddled``): its swap may have fallen at any moment in between."""
    staged = {
        f"{STAGING}/{kind}/{name}" for kind in _names(out_dir / STAGING) for name in _names(out_dir / STAGING / kind)
    }
    return frozenset(_names(out_dir / RETIRED)) | staged


def straddled(out_dir: Path, before: frozenset[str]) -> bool:
    """Whether a query that began when ``swaps`` said ``before`` may have read across a swap."""
    return swaps(out_dir) != before or any(name.startswith(f"{STAGING}/") for name in before)


def sql_string(text: str) -> str:
    """``text`` as an SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def view_records(out_dir: Path, kind: str, clause: str = "") -> list[Any]:
    """The records of ``kind``'s view under ``out_dir`` (``clause``: what follows ``FROM kind``), as its model's
    objects: what the commands that act on published records read back."""
    columns, rows = query(out_dir, f"SELECT * EXCLUDE (date) FROM {kind} {clause}")
    model = OUTPUT_KINDS[kind]
    return [model.model_validate(dict(zip(columns, row))) for row in rows]


def query(
    out_dir: Path,
    sql: str,
    confined: bool = True,
    attempts: int = QUERY_ATTEMPTS,
    opex_usd_per_gpu_hour: Decimal = Decimal(0),
    read_only: bool = False,
) -> tuple[list[str], list[tuple[Any, ...]]]:
    """The columns and rows of ``sql`` over the views of ``out_dir`` (``confined`` to its files; ``read_only``:
    each attempt on a thread whose file writes the kernel refuses, ``landlock.without_writes``).

    A sink compacts while it runs, and a query whose listing straddles a folder's swap fails
    (never reads part of the rows: sinks/compact.py): with "No such file" for a file merged away,
    or with an unreadable footer for a name read at the size it had before the swap. The next
    listing finds the merged files, so such a query is run again, up to ``attempts`` times; an
    error with no swap during the query is raised.
    """
    once = partial(_run, out_dir, sql, confined, opex_usd_per_gpu_hour)
    for attempt in range(1, attempts + 1):
        before = swaps(out_dir)
        try:
            return without_writes(once) if read_only else once()
        except duckdb.Error as exc:
            gone = isinstance(exc, duckdb.IOException) and "No such file" in str(exc)
            if attempt == attempts or not (gone or straddled(out_dir, before)):
                raise
    raise AssertionError("attempts must be at least 1")


def _run(
    out_dir: Path, sql: str, confined: bool, opex_usd_per_gpu_hour: Decimal
) -> tuple[list[str], list[tuple[Any, ...]]]:
    """One attempt of ``query``: the connection is opened here, on the thread that runs the query."""
    con = connect(out_dir, opex_usd_per_gpu_hour)
    res = (confine(con, out_dir) if confined else con).execute(sql)
    if res is None:  # no statement: nothing to describe or fetch
        return [], []
    return [d[0] for d in res.description] if res.description else [], res.fetchall()
