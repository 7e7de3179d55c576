"""A batch's event columns as numpy arrays, for ``gpucost.streams.batch``: each field of the hot kinds (GPU and
process samples, NUMA events, memory accesses) read from Arrow as the event schema holds it (text as codes into
the batch's distinct values, numbers as they are, each with where it is present), and the rows each model's
declared bounds hold for. The checks are read from the models (``gpucost.schemas.bounds``), never written here.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gpucost.schemas.arrow import EVENT_SCHEMA
from gpucost.schemas.bounds import field_bounds
from gpucost.schemas.events import Event
from gpucost.schemas.exact import exact_round
from gpucost.streams.json_lines import COLUMN_MODELS

__all__ = ["Columns", "Measures", "column", "hot_columns", "measures", "valid_rows"]

#: a field's values and where they are present, by field name
Columns = dict[str, tuple[np.ndarray, np.ndarray]]
_HOT_FIELDS = sorted({name for model in COLUMN_MODELS for name in model.model_fields} - {"kind"})


def column(batch: pa.RecordBatch, name: str) -> pa.Array:
    """The batch's column ``name``, or nulls of the event schema's type where the batch has none."""
    if name in batch.schema.names:
        return batch.column(name)
    return pa.nulls(batch.num_rows, EVENT_SCHEMA.field(name).type)


def _ints(col: pa.Array, dtype: type = np.int64) -> tuple[np.ndarray, np.ndarray]:
    present = np.asarray(pc.is_valid(col).to_numpy(zero_copy_only=False), dtype=bool)
    return np.asarray(pc.fill_null(col, 0).to_numpy(zero_copy_only=False), dtype=dtype), present


def _floats(col: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """NaN where null, so every range check fails for it."""
    present = np.asarray(pc.is_valid(col).to_numpy(zero_copy_only=False), dtype=bool)
    return np.asarray(pc.fill_null(col, float("nan")).to_numpy(zero_copy_only=False), dtype=np.float64), present


def _ident(col: pa.Array) -> tuple[np.ndarray, list[str], np.ndarray]:
    """Codes into the batch's distinct values (-1 for null), the values, and each row's value's length."""
    encoded = pc.dictionary_encode(col)
    codes = np.asarray(pc.fill_null(encoded.indices, -1).to_numpy(zero_copy_only=False), dtype=np.int64)
    length = np.append(pc.utf8_length(encoded.dictionary).to_numpy(), 0)  # of each distinct value; null: 0
    return codes, encoded.dictionary.to_pylist(), length[codes]


def hot_columns(batch: pa.RecordBatch) -> tuple[Columns, dict[str, tuple[np.ndarray, list[str]]]]:
    """Every field of the hot kinds, loaded as its column of the event schema holds it; text fields also as
    (codes, distinct values), their ``Columns`` entry being each value's length (which the bounds check)."""
    columns: Columns = {}
    idents: dict[str, tuple[np.ndarray, list[str]]] = {}
    for name in _HOT_FIELDS:
        arrow = EVENT_SCHEMA.field(name).type
        if pa.types.is_string(arrow):
            codes, values, length = _ident(column(batch, name))
            idents[name], columns[name] = (codes, values), (length, codes >= 0)
        elif pa.types.is_floating(arrow):
            columns[name] = _floats(column(batch, name))
        elif pa.types.is_boolean(arrow):  # a flag as 0 or 1
            columns[name] = _ints(pc.cast(column(batch, name), pa.int64()))
        else:
            columns[name] = _ints(column(batch, name), np.uint64 if pa.types.is_unsigned_integer(arrow) else np.int64)
    return columns, idents


def valid_rows(model: type[Event], columns: Columns, n: int) -> np.ndarray:
    """Rows whose every field of ``model`` is within the bounds the model declares (present, if the field is
    required)."""
    ok = np.ones(n, dtype=bool)
    for name in model.model_fields:
        if name != "kind":
            ok &= field_bounds(model, name).holds(*columns[name])
    return ok


class Measures(NamedTuple):
    """The samples' figures as their models keep them: integers (ms, hundredths of a percent, mW), on every row;
    0 on a row that is no valid sample, -1 where a GPU sample does not report a figure it may leave out."""

    interval_ms: np.ndarray
    sm_cp: np.ndarray
    bw_cp: np.ndarray
    power_mw: np.ndarray
    tensor_cp: np.ndarray
    dram_cp: np.ndarray
    fatal: np.ndarray
    warning: np.ndarray
    estimated: np.ndarray  # 1: a GPU sample's power is the platform table's TDP


def measures(gpu: np.ndarray, proc: np.ndarray, columns: Columns) -> Measures:
    """The figures of the valid GPU samples (rows ``gpu``) and process samples (``proc``), rounded as the models
    round them (``exact_round``)."""
    n = len(gpu)

    def zeros() -> np.ndarray:
        return np.zeros(n, np.int64)

    def unset() -> np.ndarray:
        return np.full(n, -1, np.int64)

    m = Measures(zeros(), zeros(), zeros(), zeros(), unset(), unset(), unset(), unset(), zeros())
    sample = gpu | proc
    if sample.any():
        for out, name, scale in (
            (m.interval_ms, "interval_s", 1000),
            (m.sm_cp, "sm_util_pct", 100),
            (m.bw_cp, "mem_bw_util_pct", 100),
        ):
            out[sample] = exact_round(columns[name][0][sample], scale)
    if gpu.any():
        m.power_mw[gpu] = exact_round(columns["power_w"][0][gpu], 1000)
        for out, name in ((m.tensor_cp, "tensor_active_pct"), (m.dram_cp, "dram_active_pct")):
            measured = gpu & columns[name][1]
            out[measured] = exact_round(columns[name][0][measured], 100)
        for out, name in ((m.fatal, "fault_fatal"), (m.warning, "fault_warning")):
            reported = gpu & columns[name][1]
            out[reported] = columns[name][0][reported]
        m.estimated[gpu] = np.where(columns["power_estimated"][1][gpu], columns["power_estimated"][0][gpu], 0)
    return m
