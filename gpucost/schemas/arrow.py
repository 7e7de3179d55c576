"""Arrow schemas of the output records, derived from the pydantic models' declared types.

Derived from declarations (never from data), so each field is written down once, in
``gpucost.schemas.records``; every Parquet file of a kind has exactly this schema.
"""

from __future__ import annotations

import json
import types
from collections.abc import Sequence
from decimal import Decimal
from functools import cache
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import numpy as np
import pyarrow as pa
from pydantic import BaseModel

from gpucost.schemas.codec import JSON_TEXT_FIELDS, present_fields
from gpucost.schemas.events import EVENT_MODELS, EbpfTrace, Event
from gpucost.schemas.records import OUTPUT_KINDS, Wide

__all__ = [
    "WIDE_TYPE",
    "wide_array",
    "arrow_schema",
    "ARROW_SCHEMAS",
    "to_table",
    "EVENT_SCHEMA",
    "events_table",
    "wire_rows",
]

PRICE_TYPE = pa.decimal128(18, 6)
WIDE_TYPE = pa.decimal128(38, 0)  # an integer field marked ``Wide``


def wide_array(values: np.ndarray) -> pa.Array:
    """Integers (Python's, in an object array, or int64) as a ``Wide`` column: through int64 where they all
    fit (Arrow converts Python integers to decimals one by one, six times slower), else one by one."""
    try:
        return pa.array(values.astype(np.int64)).cast(WIDE_TYPE)
    except OverflowError:  # a value past 64 bits (a pane's weights can pass them)
        return pa.array(values, WIDE_TYPE)


_SCALARS: dict[type, pa.DataType] = {
    int: pa.int64(),
    float: pa.float64(),
    str: pa.string(),
    bool: pa.bool_(),
    Decimal: PRICE_TYPE,
}


def _arrow_field(name: str, annotation: object) -> pa.Field:
    nullable = False
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        nullable = len(args) < len(get_args(annotation))
        (annotation,) = args
    if get_origin(annotation) is Annotated:  # constraints (ge, lt, …) do not change the storage type
        annotation = get_args(annotation)[0]
    if get_origin(annotation) is Literal and all(isinstance(a, str) for a in get_args(annotation)):
        annotation = str  # one of some words (an SLA, an origin): text
    if get_origin(annotation) is list and get_args(annotation)[0] in _SCALARS:
        return pa.field(name, pa.list_(_SCALARS[get_args(annotation)[0]]), nullable=nullable)
    if get_origin(annotation) is tuple:  # a triple of integers (a kernel's grid), names (its range path): a list column
        (item,) = {get_args(a)[0] if get_origin(a) is Annotated else a for a in get_args(annotation) if a is not ...}
        return pa.field(name, pa.list_(_SCALARS[item]), nullable=nullable)
    if annotation not in _SCALARS:
        raise TypeError(f"field {name}: no Arrow type declared for {annotation!r}")
    return pa.field(name, _SCALARS[annotation], nullable=nullable)


@cache
def arrow_schema(model: type[BaseModel]) -> pa.Schema:
    return pa.schema(
        [
            pa.field(n, WIDE_TYPE, nullable=False) if Wide in f.metadata else _arrow_field(n, f.annotation)
            for n, f in model.model_fields.items()
        ]
    )


ARROW_SCHEMAS: dict[str, pa.Schema] = {k: arrow_schema(m) for k, m in OUTPUT_KINDS.items()}


def to_table(kind: str, records: list[BaseModel]) -> pa.Table:
    # from the records' field dicts: a getattr per value cost 40 % of writing a file, this a third of that
    return pa.Table.from_pylist([r.__dict__ for r in records], schema=ARROW_SCHEMAS[kind])


def _event_schema() -> pa.Schema:
    """Every wire field of every input kind, nullable (a row holds one event), ``kind`` first.

    Derived from the event models like the output schemas. Exceptions, by what the wire
    carries: ``kind`` is text, ``address`` is unsigned 64-bit,
    ``ebpf_trace`` travels as its ``trace_hex`` (and ``trace_source``), and ``labels`` (a JSON object of
    strings on the wire) as the object's JSON text, read back into the object before validation
    (``gpucost.schemas.codec.JSON_TEXT_FIELDS``).
    """
    fields: dict[str, pa.Field] = {"kind": pa.field("kind", pa.string(), nullable=False)}
    for model in EVENT_MODELS.values():
        if model is EbpfTrace:
            fields.setdefault("trace_hex", pa.field("trace_hex", pa.string()))
            fields.setdefault("trace_source", pa.field("trace_source", pa.string()))
            continue
        for name, info in model.model_fields.items():
            if name in fields or name == "kind":
                continue
            if name == "address":
                fields[name] = pa.field(name, pa.uint64())
            else:
                fields[name] = _arrow_field(name, info.annotation).with_nullable(True)
    return pa.schema(list(fields.values()))


EVENT_SCHEMA = _event_schema()


def events_table(events: list[Event]) -> pa.Table:
    """Events as rows of ``EVENT_SCHEMA`` (the wire values: what a JSON Lines file holds, a JSON object as its
    canonical JSON text)."""
    rows = [e.to_wire() if isinstance(e, EbpfTrace) else e.model_dump(exclude_none=True) for e in events]
    for row in rows:
        for name in JSON_TEXT_FIELDS:
            if isinstance(row.get(name), dict):
                row[name] = json.dumps(row[name], sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return pa.Table.from_pylist(rows, schema=EVENT_SCHEMA)


def wire_rows(batch: pa.RecordBatch, rows: Sequence[int] | None = None) -> list[dict[str, Any]]:
    """The rows ``rows`` of a batch of events (all: None) as the wire objects they stand for (``present_fields``),
    converted in one pass over the columns that hold a value: one row at a time over the ~80 columns of
    ``EVENT_SCHEMA`` costs ~100 µs a row, a batch of events of a few kinds one tenth of that."""
    narrow = batch.select([i for i, col in enumerate(batch.columns) if col.null_count < len(col)])
    if not narrow.num_columns:  # no value at all (Arrow keeps no row count without a column)
        return [{} for _ in range(batch.num_rows if rows is None else len(rows))]
    if rows is not None:
        narrow = narrow.take(pa.array(rows, pa.int64()))
    return [present_fields(row) for row in narrow.to_pylist()]
