"""The audit of a whole Arrow batch at once: the row path's outputs and state, column by column.

Why: one pydantic object and a dozen dict operations per event held the row path
(``Auditor.ingest``) near 60 k events/s. Here the kinds that make up a fleet's traffic (GPU
and process samples, NUMA events, memory accesses) are validated and rounded with numpy over
the batch, then handed to each operator's batch entry: ``GpuPanes.judge_many``/``add_many``
(watermarks, late rows, duplicates, overlaps, pane sums), ``Mae.update_many``,
``BindingTable.lookup_many``, ``Auditor.close_many``. This module cuts the input into batches the
batch path may take whole (``revising_rows``: a row that may revise a closed pane goes through the
row path, between the batches); ``gpucost.streams.batch`` runs each: decoding once, the rows the
vectorised checks do not clear (decoded one by one, so a rejection names the same reason), dead
letters, the tenant join, and merging every output back into arrival order: a binding covers only
the rows that arrive after it, a price only the closes after it. ``tests/test_columnar.py`` holds both
paths to the same outputs, in the same order, and the same state, over random batches with every kind of bad input;
``tests/test_operator_entries.py`` holds each operator's batch entry to its row entry.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gpucost.schemas.arrow import EVENT_SCHEMA, wire_rows
from gpucost.schemas.blocks import Outputs
from gpucost.schemas.ipc import conform
from gpucost.streams.batch import KIND_CODES, Batch
from gpucost.streams.json_lines import read_lines
from gpucost.streams.pane_rules import NUMA, last_pane_ns, pane_closed, pane_start_ns
from gpucost.streams.row_path import RowPath
from gpucost.streams.runs import runs
from gpucost.streams.scope import Scope

__all__ = ["ingest_arrow", "ingest_batch", "ingest_lines", "revising_rows"]

#: a kernel, an allocation, a binding, and a row of no kind, to ``revising_rows``
_KERNEL, _ALLOCATION, _BINDING, _NO_KIND = 124, 125, 126, 127
#: each kind's code in ``revising_rows`` (another kind: -1)
_REVISING_CODES = {
    **KIND_CODES,
    "kernel_activity": _KERNEL,
    "tenant_binding": _BINDING,
    "allocation": _ALLOCATION,
    "": _NO_KIND,
}
_NONE_TS = np.iinfo(np.int64).min // 2  # no time yet (halved: the lateness is taken off it)
#: a batch with more rows that may revise than this, and fewer than ``ROWS_PER_CUT`` rows per such row, goes row by
#: row (a replay of a shuffled file): its stretches between cuts would each cost the batch path's fixed ~0.5 ms for a
#: few rows the row path takes in ~40 µs each. A large batch with the odd late kernel or allocation is cut instead
#: (a replay's 65,536-row batches of a profiled fleet hold about a hundred, and went row by row, 90x slower)
MANY_REVISING = 64
ROWS_PER_CUT = 16
#: batches of fewer JSON lines than this go event by event: the batch path's fixed cost (Arrow's JSON reader with
#: the whole event schema, then the columns) is about 1 ms, and the row path's about 9 µs a line, against the
#: batch path's 3 to 4 µs (a live worker's poll of one GPU is a line or two; BENCHMARKS.md, benchmark 3)
FEW_LINES = 128
#: a key's batch is cut where its lines or columns would pass this many bytes: an Arrow string or list column holds
#: at most 2 GiB, and a batch combined past that comes back as several (a poll may bring a key 200 messages of
#: up to 64 MiB each)
COMBINE_BYTES = 1 << 30


def ingest_batch(auditor: RowPath, batch: pa.RecordBatch, source: Callable[[int], str]) -> Outputs:
    """``auditor.ingest`` of every row of ``batch`` (``EVENT_SCHEMA``: a Parquet file's), in order; row ``i`` is
    labelled ``source(i)``.

    A batch whose columns are not typed as ``EVENT_SCHEMA`` says goes row by row.
    """
    if any(f.name in EVENT_SCHEMA.names and f.type != EVENT_SCHEMA.field(f.name).type for f in batch.schema):
        return [out for i, row in enumerate(wire_rows(batch)) for out in auditor.ingest(row, source(i))]
    return _in_segments(auditor, batch, source)


def ingest_lines(
    auditor: RowPath, lines: Sequence[bytes], source: Callable[[int], str], scope: Scope | None = None
) -> Outputs:
    """``auditor.ingest`` of each JSON line, in order, through the batch path (the columns read by
    ``gpucost.streams.json_lines.read_lines``; a line it could not read is decoded again where it
    stands: the same dead letter as the row path). Fewer than ``FEW_LINES`` lines take the row path."""
    if len(lines) < FEW_LINES or not lines:
        return [out for i, line in enumerate(lines) for out in auditor.ingest(line, source(i), scope)]
    out: Outputs = []
    for lo, hi in _groups([len(line) for line in lines]):
        out += _in_segments(auditor, read_lines(lines[lo:hi]), _from(source, lo), lines[lo:hi], scope)
    return out


def ingest_arrow(
    auditor: RowPath, batches: Sequence[pa.RecordBatch], source: Callable[[int], str], scope: Scope | None = None
) -> Outputs:
    """``auditor.ingest`` of the rows of Arrow messages (``gpucost.schemas.ipc``), in order, row ``i`` of them all
    labelled ``source(i)``: as one ``EVENT_SCHEMA`` batch through the batch path, or, under ``FEW_LINES`` rows
    (a live poll's message of a row or two, where the batch path's fixed cost is some milliseconds), one by
    one as the wire objects the rows stand for."""
    if sum(b.num_rows for b in batches) < FEW_LINES:
        rows = (row for b in batches for row in wire_rows(b))
        return [out for i, row in enumerate(rows) for out in auditor.ingest(row, source(i), scope)]
    out: Outputs = []
    done = 0
    for lo, hi in _groups([b.nbytes for b in batches]):
        group = pa.Table.from_batches([conform(b) for b in batches[lo:hi]], EVENT_SCHEMA).combine_chunks()
        for whole in group.to_batches():  # one, unless its rows are none
            out += _in_segments(auditor, whole, _from(source, done), None, scope)
            done += whole.num_rows
    return out


def _groups(sizes: Sequence[int]) -> list[tuple[int, int]]:
    """Consecutive runs ``[lo, hi)`` of items whose sizes sum to at most ``COMBINE_BYTES`` (an item over it alone)."""
    runs: list[tuple[int, int]] = []
    lo, total = 0, 0
    for i, size in enumerate(sizes):
        if i > lo and total + size > COMBINE_BYTES:
            runs.append((lo, i))
            lo, total = i, 0
        total += size
    return [*runs, (lo, len(sizes))] if sizes else runs


def _from(source: Callable[[int], str], offset: int) -> Callable[[int], str]:
    """``source`` of the rows from ``offset`` on, numbered from 0."""
    return source if offset == 0 else lambda i: source(offset + i)


def _in_segments(
    auditor: RowPath,
    batch: pa.RecordBatch,
    source: Callable[[int], str],
    lines: Sequence[bytes] | None = None,
    scope: Scope | None = None,
) -> Outputs:
    """The batch, cut at each row that may revise a closed pane (``revising_rows``): those rows go through the
    row path, the stretches between them through the batch path. A revision happens at its row, between
    the closes before it and those after, which one pass over the batch's columns could not keep in order;
    late data are rare, so the cuts are few. A batch dense with such rows (``MANY_REVISING``, ``ROWS_PER_CUT``) goes row
    by row."""
    cuts = revising_rows(auditor, batch)
    if not cuts:
        return Batch(auditor, batch, source, lines, scope).run()

    row_by_row = len(cuts) > MANY_REVISING and len(cuts) * ROWS_PER_CUT > batch.num_rows
    row = _row_inputs(batch, lines, range(batch.num_rows) if row_by_row else cuts)
    if row_by_row:
        return [out for i in range(batch.num_rows) for out in auditor.ingest(row(i), source(i), scope)]
    out: Outputs = []
    lo = 0
    for cut in [*cuts, batch.num_rows]:
        if cut > lo:
            out += Batch(
                auditor,
                batch.slice(lo, cut - lo),
                lambda i, lo=lo: source(lo + i),  # type: ignore[misc]
                None if lines is None else lines[lo:cut],
                scope,
            ).run()
        if cut < batch.num_rows:
            out += auditor.ingest(row(cut), source(cut), scope)
        lo = cut + 1
    return out


def _row_inputs(
    batch: pa.RecordBatch, lines: Sequence[bytes] | None, wanted: Sequence[int]
) -> Callable[[int], bytes | dict[str, Any]]:
    """Row ``i`` of ``wanted`` (the only rows asked for) as the row path takes it: its JSON line, or (Arrow or
    Parquet rows) its wire object, all converted at once (``wire_rows``): a batch of many revising rows goes row by
    row."""
    if lines is not None:
        return lines.__getitem__
    return dict(zip(wanted, wire_rows(batch, wanted))).__getitem__


def revising_rows(auditor: RowPath, batch: pa.RecordBatch) -> list[int]:
    """The rows that may revise a closed pane, or whose verdict depends on where they stand among the closes: a GPU
    sample, process sample or NUMA event whose pane ends at or before its GPU's watermark; a kernel over a pane's
    boundary whose start's pane does (a kernel moves no watermark; one of a single pane, late or on time at its
    row, the batch path takes in its place: ``gpucost.streams.batch_kernels``); a binding older than the largest
    watermark (or than the revision horizon and a pane before it, where it may be late), each taken against
    watermarks that count every earlier row of the batch (so at or above the true ones: no row that does revise
    is missed); an allocation whose pane of change (``_allocations``) does, or whose verdict may depend on what
    its device drops within the batch; and rows of no readable kind (``read_lines`` leaves a line it could not
    read as columns empty: it may be an allocation too), which the batch path decodes one by one. A row the model
    refuses (a kernel with no start or no GPU) is refused wherever it stands."""
    n = batch.num_rows
    kinds = pc.dictionary_encode(batch.column("kind")) if "kind" in batch.schema.names else None
    if kinds is None or "ts_ns" not in batch.schema.names or "gpu_uuid" not in batch.schema.names:
        return []
    codes = np.array(
        [_REVISING_CODES.get(k, -1) for k in kinds.dictionary.to_pylist()] + [_NO_KIND],
        np.int8,
    )
    code = codes[np.asarray(pc.fill_null(kinds.indices, len(codes) - 1).to_numpy(zero_copy_only=False))]
    has_ts, ts = _times(batch, "ts_ns")
    has_start, start = _times(batch, "start_ns")
    has_end, end = _times(batch, "end_ns")
    gpus = pc.dictionary_encode(batch.column("gpu_uuid"))
    gpu = np.asarray(pc.fill_null(gpus.indices, -1).to_numpy(zero_copy_only=False), np.int64)
    keyed = (code <= NUMA) & (code >= 0) & has_ts & (gpu >= 0)
    settings = auditor.settings
    lateness, pane_ns = settings.lateness_ns, settings.pane_ns
    # the kernels over a pane's boundary (a kernel without an end is refused by its model wherever it stands)
    kernel = (code == _KERNEL) & has_start & has_end & (gpu >= 0)
    kernel &= last_pane_ns(start, end, pane_ns) != pane_start_ns(start, pane_ns)
    names = gpus.dictionary.to_pylist()
    held, changes_ns, cut = _allocations(auditor, batch, (code == _ALLOCATION) & has_ts & (gpu >= 0), gpu, names, ts)
    latest = auditor.panes.latest_ns()
    late = np.zeros(n, bool)
    at = np.flatnonzero(keyed | kernel | held)
    at = at[np.argsort(gpu[at], kind="stable")]  # by GPU, then in arrival order: one slice per GPU
    when = np.where(keyed, ts, np.where(kernel, start, changes_ns))
    firsts, lasts = runs(gpu[at])
    for lo, hi in zip(firsts.tolist(), lasts.tolist()):
        mine = at[lo:hi]
        known = latest.get(names[gpu[mine[0]]], _NONE_TS)  # late by the GPUs forgotten alone: late on both paths
        # the GPU's largest time as each row comes, its own included: a kernel or an allocation moves none, so it
        # counts as no time
        high = np.maximum.accumulate(np.maximum(np.where(keyed[mine], ts[mine], _NONE_TS), known))
        late[mine] = pane_closed(when[mine], high, pane_ns, lateness)
    moved = np.maximum.accumulate(np.where(keyed, ts, _NONE_TS)) if n else np.zeros(0, np.int64)
    largest = np.maximum(moved, max(latest.values(), default=_NONE_TS))
    horizon = settings.revision_horizon_ns + pane_ns  # older than this, a binding may be late (``Auditor._binding``)
    binding = (code == _BINDING) & has_ts & ((ts < largest - lateness) | (ts < largest - horizon))
    return np.flatnonzero(late | binding | cut | (code == _NO_KIND)).tolist()


def _allocations(
    auditor: RowPath, batch: pa.RecordBatch, held: np.ndarray, gpu: np.ndarray, names: list[str], ts: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Of the allocation rows ``held`` (an allocation with a time and a device): those the batch path may take
    before the batch's samples if their pane of change is open at their row (the first pane whose split they may
    change: the end's, for the end of a hold its device keeps open, else the start's: ``AllocationTable.
    changes_from``, as the table stands before the batch), with that time; and those it cuts whatever their time,
    because their verdict could depend on what their device drops as the batch's samples move its watermark
    (``AllocationTable.prune``, which the batch path runs once at its end): an id the device keeps as ended or as a
    tombstone, one seen earlier in the batch, or any allocation of a device that the batch's allocations might
    take to ``out_of_range``. Allocations are rare (a scheduler's grants), so this loops over them."""
    rows = np.flatnonzero(held)
    changes_ns, cut = ts.copy(), np.zeros(batch.num_rows, bool)
    if not len(rows) or "allocation_id" not in batch.schema.names:
        return np.zeros(batch.num_rows, bool), changes_ns, held.copy()
    ids = batch.column("allocation_id").take(pa.array(rows)).to_pylist()
    has_end, end = _times(batch, "end_ts_ns")
    dens = batch.column("fraction_den") if "fraction_den" in batch.schema.names else None
    # a denominator below 1 is refused by the model; as 1 here, not as lcm's 0, which would pass every bound
    den = (
        [1] * len(rows) if dens is None else [max(d, 1) for d in pc.fill_null(dens.take(pa.array(rows)), 1).to_pylist()]
    )
    table = auditor.allocations.table
    seen: set[tuple[int, str | None]] = set()
    by_gpu: dict[int, list[int]] = {}
    for r, ident in zip(rows.tolist(), ids):
        state = None if ident is None else table.state_of(names[gpu[r]], ident)
        if (int(gpu[r]), ident) in seen or state == "ended":
            cut[r] = True
        elif state == "open" and has_end[r]:
            changes_ns[r] = end[r]
        seen.add((int(gpu[r]), ident))
        by_gpu.setdefault(int(gpu[r]), []).append(r)
    for g, mine in by_gpu.items():
        if not table.has_room(names[g], len(mine), math.lcm(*(den[k] for k in np.searchsorted(rows, mine)))):
            cut[mine] = True
    return held & ~cut, changes_ns, cut


def _times(batch: pa.RecordBatch, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Which rows hold the time column ``name``, and its values (0 where they do not)."""
    if name not in batch.schema.names:
        return np.zeros(batch.num_rows, bool), np.zeros(batch.num_rows, np.int64)
    col = batch.column(name)
    has = np.asarray(pc.is_valid(col).to_numpy(zero_copy_only=False), bool)
    return has, np.asarray(pc.fill_null(col, 0).to_numpy(zero_copy_only=False), np.int64)
