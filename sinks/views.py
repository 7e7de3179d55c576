"""DuckDB views over the Parquet output: ``idle_index``, ``mae``, ``cost``, ``dlq``.

``views_sql(dir)`` is the SQL an analyst can paste into any DuckDB; ``connect(dir)`` opens
an in-memory DuckDB with the views defined (empty, correctly typed views for kinds that
have no file yet).
"""
from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa

from schemas.arrow import ARROW_SCHEMAS

__all__ = ["views_sql", "connect"]

# dead letters without a valid event time sit under date=unknown, so their date stays text
_DATE_TYPE = {"idle_index": "DATE", "mae": "DATE", "cost": "DATE", "dlq": "VARCHAR"}


def _glob(out_dir: Path, kind: str) -> str:
    return (out_dir.resolve() / kind / "**" / "*.parquet").as_posix().replace("'", "''")


def _view(out_dir: Path, kind: str) -> str:
    return (f"CREATE OR REPLACE VIEW {kind} AS SELECT * FROM read_parquet('{_glob(out_dir, kind)}', "
            f"hive_partitioning = true, hive_types = {{'date': {_DATE_TYPE[kind]}}});")


def views_sql(out_dir: Path) -> str:
    return "\n".join(_view(out_dir, kind) for kind in ARROW_SCHEMAS) + "\n"


def connect(out_dir: Path) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    for kind, schema in ARROW_SCHEMAS.items():
        if any((out_dir / kind).glob("**/*.parquet")):
            con.execute(_view(out_dir, kind))
        else:
            date_type = pa.date32() if _DATE_TYPE[kind] == "DATE" else pa.string()
            empty = schema.append(pa.field("date", date_type)).empty_table()
            con.register(f"_empty_{kind}", empty)
            con.execute(f"CREATE OR REPLACE VIEW {kind} AS SELECT * FROM _empty_{kind}")
    return con

