"""JSON Lines into Arrow: a batch of event lines as one record batch of ``EVENT_SCHEMA``, Arrow's
reader doing the work where it reads a line as Python's ``json`` would, Python the rest."""

from __future__ import annotations

import io
import os
import re
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.json as pa_json

from gpucost.schemas.arrow import EVENT_SCHEMA
from gpucost.schemas.codec import decode_line
from gpucost.schemas.events import GpuSample, MemAccess, NumaEvent, ProcessSample
from gpucost.schemas.kernels import KernelActivity

__all__ = ["read_lines", "COLUMN_MODELS", "REFUSED_READS"]

#: the models the batch path reads as columns (``gpucost.streams.columnar``); the others go one by one
COLUMN_MODELS = (GpuSample, ProcessSample, NumaEvent, MemAccess)


def read_lines(lines: Sequence[bytes]) -> pa.RecordBatch:
    """One row of ``EVENT_SCHEMA`` per JSON line, in order, read by Arrow's JSON reader (in C).

    The reader takes a few things Python's ``json`` refuses (invalid UTF-8, nesting deeper than
    Python's recursion limit, two objects on one line), so such lines, and any line the reader
    refuses, are read by Python: a valid event of a hot kind as its wire values, anything else as
    an empty row, which the batch path decodes again from its line (the row path's dead letter).
    Lines the reader would refuse cost what the row path costs, never more: surrogate escapes go to
    Python unread, and the search for the lines a read refused stops after ``REFUSED_READS`` refusals.
    """
    joined = b"\n".join(lines)
    block: bytes | None  # the lines joined, when every one is plain
    if (
        joined.count(b"{") == len(lines)
        and b"[" not in joined
        and _BOM not in joined
        and _utf8(joined)
        and not _LONG_DIGITS.search(joined)
        and not _SURROGATE.search(joined)
    ):
        block, plain = joined, list(range(len(lines)))  # one object per line, nothing nested: every line is plain
    else:
        block, plain = (
            None,
            [
                i
                for i, line in enumerate(lines)
                if line.count(b"{") == 1
                and b"[" not in line
                and not line.startswith(_BOM)
                and _utf8(line)
                and not _LONG_DIGITS.search(line)
                and not _SURROGATE.search(line)
            ],
        )
    pieces = _parsed(lines, plain, block)
    if len(pieces) == 1 and len(pieces[0][0]) == len(lines):  # Arrow read every line, in order (a live poll)
        table = pieces[0][1]
    else:
        table = _with_the_others(lines, pieces)
    return table.combine_chunks().to_batches()[0]


def _with_the_others(lines: Sequence[bytes], pieces: list[tuple[list[int], pa.Table]]) -> pa.Table:
    """One row per line, in order: Arrow's rows where it read the line; the other lines as Python
    reads them, a valid event of a hot kind or a kernel (whose range path and grid are lists, which
    the reader is not given) as its wire values (so that its columns hold what the model holds, and
    ``gpucost.streams.columnar.revising_rows`` can tell whether it is on time), anything else as an
    empty row that ``Batch`` decodes again from the line."""
    taken = [i for idx, _ in pieces for i in idx]
    where = np.full(len(lines), -1, np.int64)
    where[taken] = np.arange(len(taken))
    wire: list[dict[str, Any]] = []
    for i in np.flatnonzero(where < 0).tolist():
        event = decode_line(lines[i])
        if isinstance(event, (*COLUMN_MODELS, KernelActivity)):
            where[i] = len(taken) + len(wire)
            wire.append(event.to_wire())
    where[where < 0] = len(taken) + len(wire)
    tables = [t for _, t in pieces] + [pa.Table.from_pylist(wire + [{"kind": ""}], schema=EVENT_SCHEMA)]
    return pa.concat_tables(tables, promote_options="permissive").take(pa.array(where))


_BOM = b"\xef\xbb\xbf"
#: a run of digits longer than Python's int conversion takes (4,300): Python's ``json`` refuses such a
#: line, Arrow's reader took it, so such lines go to the one-by-one decode, where Python's ``json`` decides
_LONG_DIGITS = re.compile(rb"[0-9]{4300}")
#: a UTF-16 surrogate escape (``\\ud800``): the reader refuses a lone one, and such lines would spend a batch's
#: refused reads; Python's ``json`` decides them unread (a pair, as in an emoji, is read there exactly)
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")
#: refused reads of one batch at most: enough to find a bad line or two by halving, after which the lines
#: not yet read go to Python's ``json`` (a refused read costs a fixed ~0.2 ms, the row path ~10 µs a line:
#: without a bound, a batch of bad lines cost two reads a line, 70 to 170 times a good line)
REFUSED_READS = 8
_CORES = os.cpu_count() or 1
_JSON_OPTIONS = pa_json.ParseOptions(explicit_schema=EVENT_SCHEMA, unexpected_field_behavior="ignore")


def _utf8(line: bytes) -> bool:
    try:
        line.decode()
    except UnicodeDecodeError:
        return False
    return True


def _parsed(lines: Sequence[bytes], idx: list[int], block: bytes | None) -> list[tuple[list[int], pa.Table]]:
    """The lines at ``idx`` as tables of one row per line, halving around the lines the reader refuses,
    coarsest halves first, until ``REFUSED_READS`` reads were refused; the lines left out go to Python
    (``block``: the lines at ``idx`` joined, when the caller has them)."""
    pieces, todo, refused = [], deque([(idx, block)]), 0
    while todo and refused < REFUSED_READS:
        idx, block = todo.popleft()
        if not idx:
            continue
        table = _read(
            block if block is not None else b"\n".join(lines[i] for i in idx), max(len(lines[i]) for i in idx)
        )
        if table is not None and table.num_rows == len(idx):
            pieces.append((idx, table))
            continue
        refused += 1
        if len(idx) > 1:
            half = len(idx) // 2
            todo += [(idx[:half], None), (idx[half:], None)]
    return pieces


def _read(block: bytes, longest: int) -> pa.Table | None:
    """Lines of JSON as one table, or None where the reader refuses them. In blocks, one per core, that
    Arrow parses side by side (twice as fast on two cores); a block must hold the longest line whole."""
    size = max(len(block) // _CORES + 1, longest + 1, 1 << 16)
    try:
        return pa_json.read_json(
            io.BytesIO(block),
            parse_options=_JSON_OPTIONS,
            read_options=pa_json.ReadOptions(use_threads=True, block_size=size),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
