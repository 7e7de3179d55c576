"""CSV that a spreadsheet opens as data: every CSV gpucost writes passes its text cells through ``text_cells``.

Why: team, env, app, GPU model and node names come from input, and finance opens the exports in a
spreadsheet, which runs a cell beginning with ``=``, ``+``, ``-`` or ``@`` (or a tab or carriage return
before one) as a formula: ``=HYPERLINK(…)`` sends the sheet's data away, ``=cmd|…`` starts a program. As
OWASP's CSV-injection guidance says, such a text cell is written with a single quote before it, which a
spreadsheet takes as "this is text", and every text cell is quoted, so a spreadsheet set for another
separator (``;``) cannot cut one into a cell that starts a formula. A text cell already beginning with a
quote gets one more, so the rule is reversible: remove one leading quote from a text cell that has one
and the name is back exactly as the Parquet holds it.

Control characters other than tab, line feed and carriage return (NUL among them) are written as U+FFFD
(the replacement character): a NUL cuts a cell short in many readers and none of them is visible, so
dropping them would make two different names read the same, and escaping them (``\\x00``) would need
every backslash in every name escaped as well. The Parquet keeps every name byte for byte.

Numbers are never rewritten: only text cells (a DuckDB column of any type that is not a number, a
Python value that is not an ``int``, ``float`` or ``Decimal``) are, so a credit of ``-12.5`` stays the
number ``-12.5`` in its numeric column, for the spreadsheet's sums and for the FOCUS validator's checks.
"""
from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Iterator, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any, TextIO

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from gpucost.sinks.views import sql_string

__all__ = ["copy_csv", "text_cells", "write_rows"]

#: a cell a spreadsheet would run as a formula (OWASP's list), or one that already begins with the quote
_FORMULA = r"^[=+\-@\t\r']"
#: C0 controls but tab, line feed and carriage return, and DEL
_CONTROLS = r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]"
#: DuckDB's numeric types: their columns are written as they are
_NUMERIC = re.compile(r"^(U?(TINYINT|SMALLINT|INTEGER|BIGINT|HUGEINT)|FLOAT|DOUBLE|DECIMAL\(\d+,\d+\)|BOOLEAN)$")
#: rows taken at a time by ``write_rows``: one call of ``text_cells`` for all their text cells
_CHUNK = 10_000


def text_cells(cells: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """``cells`` (strings) as a spreadsheet should get them: controls replaced, formulas prefixed with ``'``."""
    kept = pc.replace_substring_regex(cells, _CONTROLS, "\ufffd")
    return pc.if_else(pc.match_substring_regex(kept, _FORMULA), pc.binary_join_element_wise("'", kept, ""), kept)


def copy_csv(con: duckdb.DuckDBPyConnection, sql: str, dest: Path) -> int:
    """``sql``'s rows written by DuckDB to ``dest`` as CSV with a header, every column that is not a number
    through ``text_cells`` and quoted; the number of rows. DuckDB writes the numbers as it always does."""
    con.create_function("gpucost_text_cells", text_cells, ["VARCHAR"], "VARCHAR",  # type: ignore[arg-type]
                        type="arrow")
    columns = [(name, kind) for name, kind, *_ in con.execute(f"DESCRIBE {sql}").fetchall()]
    texts = [name for name, kind in columns if not _NUMERIC.match(kind)]
    select = ", ".join(f"gpucost_text_cells(CAST({_ident(n)} AS VARCHAR)) AS {_ident(n)}" if n in texts
                       else _ident(n) for n, _ in columns)
    quoted = f", FORCE_QUOTE ({', '.join(map(_ident, texts))})" if texts else ""
    (rows,) = con.execute(f"COPY (SELECT {select} FROM ({sql})) TO {sql_string(str(dest))} "
                          f"(FORMAT CSV, HEADER{quoted})").fetchone()  # type: ignore[misc]
    return int(rows)


def write_rows(stream: TextIO, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """``columns`` and ``rows`` (Python values, as DuckDB returns them) as CSV on ``stream``: a number as
    it is, NULL as nothing, anything else a text cell through ``text_cells``, quoted. The header is quoted
    where it needs to be only (``gpucost query … | head -1`` shows a column's name as it is)."""
    stream.write(",".join(_quote(t, always=False) for t in _texts([str(c) for c in columns])) + "\r\n")
    pending = iter(rows)
    while chunk := list(itertools.islice(pending, _CHUNK)):
        texts = _texts([str(v) for row in chunk for v in row if not _number_or_null(v)])
        stream.writelines(",".join(_cell(v, texts) for v in row) + "\r\n" for row in chunk)


def _texts(values: list[str]) -> Iterator[str]:
    return iter(text_cells(pa.array(values, pa.string())).to_pylist())


def _number_or_null(value: object) -> bool:
    return value is None or isinstance(value, (int, float, Decimal))


def _cell(value: object, texts: Iterator[str]) -> str:
    """One cell of ``write_rows``: ``texts`` holds the rewritten text cells, in the order they come."""
    if value is None:
        return ""
    if isinstance(value, Decimal):
        return format(value, "f")  # 0.000000000001, not 1E-12
    if isinstance(value, (int, float)):
        return str(value)
    return _quote(next(texts), always=True)


def _quote(text: str, always: bool) -> str:
    if always or text[:1] == "'" or any(c in text for c in ',;"\r\n\t'):
        return '"' + text.replace('"', '""') + '"'
    return text


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
