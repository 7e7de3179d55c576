"""Which statements ``gpucost query`` runs: reads only, as DuckDB's own parser sees them.

DuckDB's parser names each statement's type (``duckdb.extract_statements``) and serializes a SELECT's whole
tree (``json_serialize_sql``): its CTEs, subqueries and table functions. The type alone is not enough:
``WITH c AS (COPY (…) TO 'f') SELECT 1`` parses as a SELECT and writes ``f``, and ``EXPLAIN ANALYZE COPY …``
as an EXPLAIN that runs its COPY. So every statement is walked:

- a SELECT's tree may hold only the query nodes that read (a select, a set operation, a CTE) and table
  functions that read (``READ_TABLE_FUNCTIONS``: not ``query()``, which runs a statement held in a string,
  nor the ones that change logging, profiling or the catalog);
- an EXPLAIN's and a PREPARE's own statement, which the Python API does not hand out, is found with
  DuckDB's tokenizer right after the keywords before it (``EXPLAIN [ANALYZE] [(options)]``,
  ``PREPARE name AS``), parsed again, and must be one statement that passes in turn; where it is not
  found, the statement is refused;
- EXECUTE runs a statement prepared in the same text (each query gets a connection of its own), which
  was walked with the rest before anything ran;
- everything else is refused: COPY, ATTACH, INSTALL and LOAD, SET and RESET, PRAGMA, CALL (CHECKPOINT
  parses as one), EXPORT, CREATE (a secret, a table), and MULTI, what a PIVOT without an ``IN`` list
  becomes (it creates an enum type first, and hides the statement that reads).

This layer says why a statement is refused. The layer that makes writing impossible when this one is
fooled is the kernel's (``landlock``): each layer is tested with the other switched off.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import duckdb

__all__ = ["READ_NODES", "READ_TABLE_FUNCTIONS", "read_only_problem"]

#: the query nodes of a SELECT's tree that only read (a COPY_QUERY_NODE, in a CTE, writes)
READ_NODES = frozenset({"SELECT_NODE", "SET_OPERATION_NODE", "CTE_NODE", "RECURSIVE_CTE_NODE"})

#: the table functions a query may call: files (where DuckDB's sandbox lets it read), series, JSON, the
#: catalog's and the settings' descriptions
READ_TABLE_FUNCTIONS = frozenset(
    {
        "read_parquet",
        "parquet_scan",
        "parquet_metadata",
        "parquet_file_metadata",
        "parquet_kv_metadata",
        "parquet_full_metadata",
        "parquet_schema",
        "parquet_page_index",
        "parquet_bloom_probe",
        "glob",
        "read_csv",
        "read_csv_auto",
        "sniff_csv",
        "read_json",
        "read_json_auto",
        "read_json_objects",
        "read_json_objects_auto",
        "read_ndjson",
        "read_ndjson_auto",
        "read_ndjson_objects",
        "read_text",
        "read_blob",
        "range",
        "generate_series",
        "unnest",
        "repeat",
        "repeat_row",
        "json_each",
        "json_tree",
        "summary",
        "query_table",
        "duckdb_columns",
        "duckdb_constraints",
        "duckdb_databases",
        "duckdb_dependencies",
        "duckdb_extensions",
        "duckdb_functions",
        "duckdb_indexes",
        "duckdb_keywords",
        "duckdb_memory",
        "duckdb_optimizers",
        "duckdb_schemas",
        "duckdb_sequences",
        "duckdb_settings",
        "duckdb_tables",
        "duckdb_temporary_files",
        "duckdb_types",
        "duckdb_variables",
        "duckdb_views",
        "pragma_version",
        "pragma_platform",
        "pragma_table_info",
        "pragma_show",
        "pragma_database_size",
        "pragma_storage_info",
        "pragma_collations",
        "pragma_user_agent",
        "pg_timezone_names",
        "icu_calendar_names",
    }
)

_ALLOWED = "SELECT, WITH, DESCRIBE, SUMMARIZE, SHOW, PIVOT … IN (…), and EXPLAIN or PREPARE of one"
_MULTI = "MULTI (a PIVOT with no IN list: name its values, ON col IN (…))"
_COMMENT = duckdb.token_type.comment


def read_only_problem(sql: str) -> str | None:
    """Why ``sql`` is not read-only (or cannot be parsed), in one line naming what was refused, or None."""
    try:
        if not duckdb.extract_statements(sql):
            return "the query holds no statement: write one, e.g. SELECT count(*) FROM cost"
        refused = _refused(sql, "")
    except duckdb.Error as exc:
        return f"the query does not parse: {exc}".replace("\n", " ")
    return (
        f"only reads run here ({_ALLOWED}), not {', '.join(dict.fromkeys(refused))}; pass --unsafe to run anything"
        if refused
        else None
    )


def _refused(sql: str, within: str) -> list[str]:
    """What ``sql``'s statements hold that is not a read, each followed by ``within`` (where it sits)."""
    refused: list[str] = []
    for statement in duckdb.extract_statements(sql):
        kind = statement.type
        if kind is duckdb.StatementType.SELECT:
            refused += [f"{what} in a SELECT{within}" for what in _select_refusals(statement.query)]
        elif kind in (duckdb.StatementType.EXPLAIN, duckdb.StatementType.PREPARE):
            prefix, inner = _held(statement.query)
            nested = duckdb.extract_statements(inner) if inner else []
            refused += (
                _refused(inner, f" in {prefix}{within}")
                if len(nested) == 1
                else [f"{kind.name} whose statement this check cannot find{within}"]
            )
        elif kind is not duckdb.StatementType.EXECUTE:
            refused.append((_MULTI if kind is duckdb.StatementType.MULTI else kind.name) + within)
    return refused


def _held(text: str) -> tuple[str, str]:
    """The keywords of an EXPLAIN or a PREPARE before the statement it holds (``EXPLAIN ANALYZE``), and that
    statement's text ("" where it does not stand where the grammar puts it)."""
    spans = duckdb.tokenize(text)
    ends = [start for start, _ in spans[1:]] + [len(text)]
    words = [(start, text[start:end].strip()) for (start, kind), end in zip(spans, ends) if kind != _COMMENT]
    if not words:
        return "", ""
    head = words[0][1].upper()
    at = 1
    if head == "PREPARE":
        at = 3 if len(words) > 2 and words[2][1].upper() == "AS" else len(words)
    elif at < len(words) and words[at][1].upper() in ("ANALYZE", "ANALYSE"):
        head, at = "EXPLAIN ANALYZE", 2
    if head.startswith("EXPLAIN") and at < len(words) and words[at][1].startswith("("):
        depth = 0
        start = at
        for at in range(start, len(words)):  # the options, to their closing parenthesis
            depth += words[at][1].count("(") - words[at][1].count(")")
            if depth <= 0:
                break
        at += 1
    return head, (text[words[at][0] :] if at < len(words) else "")


def _select_refusals(text: str) -> list[str]:
    """The query nodes and table functions of a SELECT's tree that are not reads."""
    with duckdb.connect() as con:
        tree = json.loads(con.execute("SELECT json_serialize_sql(?)", [text]).fetchone()[0])
    if tree.get("error"):
        return [f"what this check cannot read ({tree.get('error_message')})"]
    refused = []
    for node in _nodes(tree):
        kind = node.get("type")
        if isinstance(kind, str) and kind.endswith("_NODE") and kind not in READ_NODES:
            refused.append(kind.removesuffix("_NODE").removesuffix("_QUERY"))
        elif kind == "TABLE_FUNCTION":
            name = (node.get("function") or {}).get("function_name")
            if name not in READ_TABLE_FUNCTIONS:
                refused.append(f"table function {name}()")
    return refused


def _nodes(tree: Any) -> Iterator[dict[str, Any]]:
    """Every object in a serialized tree, at any depth."""
    if isinstance(tree, dict):
        yield tree
        for value in tree.values():
            yield from _nodes(value)
    elif isinstance(tree, list):
        for value in tree:
            yield from _nodes(value)
