"""DuckDB views over the Parquet output: one per output kind (``idle_index``, ``mae``, ``cost``, ``health``,
``quota``, ``reclaim``, ``dlq``).

``views_sql(dir)`` is the SQL an analyst can paste into any DuckDB; ``connect(dir)`` opens
an in-memory DuckDB with exactly those views. A kind with no file yet gets an empty view
of the right columns and types, so queries work before the first record arrives.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from gpucost.schemas.arrow import ARROW_SCHEMAS
from gpucost.schemas.records import OUTPUT_KINDS

__all__ = ["READ_ONLY_STATEMENTS", "QUERY_ATTEMPTS", "confine", "views_sql", "connect", "query", "read_only_problem",
           "sql_string", "view_records"]

# dead letters without a valid event time sit under date=unknown, so their date stays text
_DATE_TYPE = {"idle_index": "DATE", "mae": "DATE", "cost": "DATE", "health": "DATE", "quota": "DATE", "reclaim": "DATE",
              "dlq": "VARCHAR"}


def _sql_type(t: pa.DataType) -> str:
    if pa.types.is_decimal(t):
        return f"DECIMAL({t.precision},{t.scale})"
    if pa.types.is_list(t):
        return f"{_sql_type(t.value_type)}[]"
    return {pa.int64(): "BIGINT", pa.float64(): "DOUBLE", pa.string(): "VARCHAR", pa.bool_(): "BOOLEAN"}[t]


def _view(out_dir: Path, kind: str) -> str:
    folder = out_dir.resolve() / kind
    if not any(folder.glob("**/*.parquet")):
        cols = [f"CAST(NULL AS {_sql_type(f.type)}) AS {f.name}" for f in ARROW_SCHEMAS[kind]]
        cols.append(f"CAST(NULL AS {_DATE_TYPE[kind]}) AS date")
        return (f"-- {kind}: no file under {folder} yet; run this again once there is one\n"
                f"CREATE OR REPLACE VIEW {kind} AS SELECT {', '.join(cols)} WHERE false;")
    glob = (folder / "**" / "*.parquet").as_posix().replace("'", "''")
    return (f"CREATE OR REPLACE VIEW {kind} AS SELECT * FROM read_parquet('{glob}', "
            f"hive_partitioning = true, hive_types = {{'date': {_DATE_TYPE[kind]}}});")


def views_sql(out_dir: Path) -> str:
    return "\n".join(_view(out_dir, kind) for kind in ARROW_SCHEMAS) + "\n"


def connect(out_dir: Path) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute(views_sql(out_dir))
    return con


def confine(con: duckdb.DuckDBPyConnection, out_dir: Path) -> duckdb.DuckDBPyConnection:
    """``con`` reading files under ``out_dir`` only, its configuration locked: a query cannot read
    ``/etc/passwd``, attach a database, install an extension or widen its own access (what ``gpucost
    query`` hands an analyst's SQL to)."""
    folder = f"{out_dir.resolve().as_posix()}/".replace("'", "''")
    con.execute(f"SET allowed_directories = ['{folder}']")
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
    return con


#: a query that lists a file a compaction then swaps away fails with "No such file": it is run again
QUERY_ATTEMPTS = 3


def sql_string(text: str) -> str:
    """``text`` as an SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def view_records(out_dir: Path, kind: str, clause: str = "") -> list[Any]:
    """The records of ``kind``'s view under ``out_dir`` (``clause``: what follows ``FROM kind``), as its model's
    objects: what the commands that act on published records read back."""
    columns, rows = query(out_dir, f"SELECT * EXCLUDE (date) FROM {kind} {clause}")
    model = OUTPUT_KINDS[kind]
    return [model.model_validate(dict(zip(columns, row))) for row in rows]


def query(out_dir: Path, sql: str, confined: bool = True,
          attempts: int = QUERY_ATTEMPTS) -> tuple[list[str], list[tuple[Any, ...]]]:
    """The columns and rows of ``sql`` over the views of ``out_dir`` (``confined`` to its files).

    A sink compacts while it runs: the views list the files, and a file merged away between the
    listing and the read fails with "No such file". Its rows are in the merged file, which the
    next listing finds, so the query is run again, up to ``attempts`` times; any other error is raised.
    """
    for attempt in range(1, attempts + 1):
        try:
            con = connect(out_dir)
            res = (confine(con, out_dir) if confined else con).execute(sql)
            return [d[0] for d in res.description] if res.description else [], res.fetchall()
        except duckdb.IOException as exc:
            if attempt == attempts or "No such file" not in str(exc):
                raise
    raise AssertionError("attempts must be at least 1")


#: what a sandboxed query may be: reading only (COPY … TO would still write under the output directory)
READ_ONLY_STATEMENTS = frozenset({duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN})


def read_only_problem(sql: str) -> str | None:
    """Why ``sql`` is not a read-only query (or cannot be parsed), or None."""
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        return f"the query does not parse: {exc}".replace("\n", " ")
    kinds = sorted({s.type.name for s in statements if s.type not in READ_ONLY_STATEMENTS})
    return (f"only SELECT and EXPLAIN may run here, not {', '.join(kinds)}; pass --unsafe to run anything"
            if kinds else None)
