"""CSV that a spreadsheet opens as data: every CSV gpucost writes puts its text cells through ``text_cells``.

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

The rule is one SQL expression, which DuckDB evaluates for both writers: in the ``COPY`` of an export, at
DuckDB's speed (a FOCUS month has millions of rows), and over the text cells of rows already in Python.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Iterator, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any, TextIO

import duckdb

from gpucost.sinks.views import sql_string

__all__ = ["copy_csv", "text_cells", "write_rows"]

#: C0 controls but tab, line feed and carriage return, and DEL: a regular expression, as SQL text
_CONTROLS = r"'[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]'"
#: a first character a spreadsheet takes for a formula's (OWASP's list), or the quote itself, as SQL text
_FORMULA = r"'^([=+\-@\t\r''])'"
#: DuckDB's numeric types: their columns are written as they are
_NUMERIC = re.compile(r"^(U?(TINYINT|SMALLINT|INTEGER|BIGINT|HUGEINT)|FLOAT|DOUBLE|DECIMAL\(\d+,\d+\)|BOOLEAN)$")
#: rows taken at a time by ``write_rows``: one query for all their text cells
_CHUNK = 10_000


def text_cells(column: str) -> str:
    """The SQL expression of the text ``column`` as a spreadsheet should get it: controls replaced with U+FFFD,
    then a ``'`` before a first character that starts a formula (or is a ``'``)."""
    return f"regexp_replace(regexp_replace({column}, {_CONTROLS}, '\ufffd', 'g'), {_FORMULA}, '''\\1')"


def copy_csv(con: duckdb.DuckDBPyConnection, sql: str, dest: Path) -> int:
    """``sql``'s rows written by DuckDB to ``dest`` as CSV with a header, every column that is not a number
    through ``text_cells`` and quoted; the number of rows. DuckDB writes the numbers as it always does."""
    columns = [(_ident(name), kind) for name, kind, *_ in con.execute(f"DESCRIBE {sql}").fetchall()]
    texts = [name for name, kind in columns if not _NUMERIC.match(kind)]
    select = ", ".join(f"{text_cells(f'CAST({n} AS VARCHAR)')} AS {n}" if n in texts else n for n, _ in columns)
    quoted = f", FORCE_QUOTE ({', '.join(texts)})" if texts else ""
    (rows,) = con.execute(
        f"COPY (SELECT {select} FROM ({sql})) TO {sql_string(str(dest))} (FORMAT CSV, HEADER{quoted})"
    ).fetchone()  # type: ignore[misc]
    return int(rows)


def write_rows(stream: TextIO, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """``columns`` and ``rows`` (Python values, as DuckDB returns them) as CSV on ``stream``: a number as
    it is, NULL as nothing, anything else a text cell through ``text_cells``, quoted. The header is quoted
    where it needs to be only (``gpucost query … | head -1`` shows a column's name as it is)."""
    con = duckdb.connect()
    stream.write(",".join(_quote(t, always=False) for t in _texts(con, [str(c) for c in columns])) + "\r\n")
    pending = iter(rows)
    while chunk := list(itertools.islice(pending, _CHUNK)):
        texts = _texts(con, [str(v) for row in chunk for v in row if not _number_or_null(v)])
        stream.writelines(",".join(_cell(v, texts) for v in row) + "\r\n" for row in chunk)


def _texts(con: duckdb.DuckDBPyConnection, values: list[str]) -> Iterator[str]:
    """``values`` through ``text_cells``, in their order (an unnested list keeps it)."""
    cells = con.execute(f"SELECT {text_cells('t')} FROM unnest(?::VARCHAR[]) AS u(t)", [values]).fetchall()
    return (cell for (cell,) in cells)


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
