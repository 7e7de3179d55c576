"""The audit of a whole Arrow batch at once: the row path's outputs and state, column by column.

Why: one pydantic object and a dozen dict operations per event held the row path
(``Auditor.ingest``) near 60 k events/s. Here the kinds that make up a fleet's traffic (GPU
and process samples, NUMA events, memory accesses) are validated, rounded, watermarked,
de-duplicated and summed per pane with numpy over the batch. The row path's own code still
does what is rare or per pane, in arrival order: bindings, prices and eBPF traces; rows the
vectorised checks do not clear (decoded one by one, so a rejection names the same reason);
every dead letter; and the close of each pane (idle index, cost split).

The arrival-order rules hold exactly: a GPU's watermark before a row is the running maximum
of the rows before it; a row is late if its pane ended at least the lateness before that;
the first of equal keys in an open pane wins; a pane closes at the first row that lifts the
watermark past its end; a binding covers only the rows that arrive after it, a price only
the closes after it. ``tests/test_columnar.py`` holds both paths to the same outputs, in the
same order, and the same state, over random batches with every kind of bad input.
"""
from __future__ import annotations

import gc
import io
import os
import re
from collections import Counter
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from gpucost.schemas.arrow import EVENT_SCHEMA
from gpucost.schemas.blocks import ClosedPanes, Outputs
from gpucost.schemas.bounds import field_bounds
from gpucost.schemas.codec import Rejected, decode_line, present_fields, raw_text
from gpucost.schemas.events import Event, GpuSample, MemAccess, NumaEvent, Price, ProcessSample, TenantBinding
from gpucost.schemas.exact import round_float
from gpucost.schemas.records import DeadLetter, Output
from gpucost.streams.mae import Mae
from gpucost.streams.panes import GpuPanes, PaneColumns, PaneTotals, jump, objects, overlaps
from gpucost.streams.scope import Scope, decode_in_scope
from gpucost.streams.settings import AuditSettings
from gpucost.streams.tables import UNATTRIBUTED, BindingTable, Tenant


class RowPath(Protocol):
    """What the batch path asks of the row path (``gpucost.streams.audit.Auditor``), named here so that
    this module does not import it (audit calls this one): the operators whose state both paths keep,
    and the row entries used for what is rare in a batch (tables, dead letters, closing panes)."""

    settings: AuditSettings
    clock: Callable[[], int] | None
    counts: Counter[str]
    panes: GpuPanes
    mae: Mae
    bindings: BindingTable

    def update(self, event: Event, raw: str | bytes | None = None, source: str = "") -> list[Output]: ...

    def reject(self, why: Rejected, raw: str, source: str) -> DeadLetter: ...

    def future_letter(self, event: Event, raw: str | bytes | None, source: str, now: int) -> DeadLetter: ...

    def late_letter(self, event: Any, raw: str | bytes | None, source: str, watermark: int | None) -> DeadLetter: ...

    def duplicate_letter(self, event: Any, raw: str | bytes | None, source: str) -> DeadLetter: ...

    def overlap_letter(self, event: Any, raw: str | bytes | None, source: str) -> DeadLetter: ...

    def close(self, panes: list[PaneTotals], prices: list[Decimal | None] | None = None) -> list[Output]: ...

    def prices_now(self, gpu_models: np.ndarray, pane_starts_ns: np.ndarray) -> list[Decimal | None]: ...

    def close_many(self, panes: PaneColumns, prices: list[Decimal | None],
                   cuts: Sequence[int] = ()) -> list[ClosedPanes | None]: ...

__all__ = ["ingest_batch", "ingest_lines", "exact_round"]

GPU, PROC, NUMA, MEM = 0, 1, 2, 3
_KINDS = {"gpu_sample": GPU, "process_sample": PROC, "numa_event": NUMA, "mem_access": MEM}
_KIND_NAMES = list(_KINDS)
_HOT = (GpuSample, ProcessSample, NumaEvent, MemAccess)  # the models of those kinds
_HOT_FIELDS = sorted({name for model in _HOT for name in model.model_fields} - {"kind"})
_NONE = np.iinfo(np.int64).min  # "no watermark yet"
_PID_SPAN = 1 << 32
#: fewer closing panes than this in a batch are closed one by one, as records; more, as blocks of columns
#: (a live worker's poll closes a pane or two per GPU; closing one as a block costs 0.45 ms, one by one 20 µs)
FEW_CLOSES = 16
#: batches of fewer JSON lines than this go event by event: the batch path's fixed cost (Arrow's JSON reader with
#: the whole event schema, then the columns) is about 1 ms, and the row path's about 9 µs a line, against the
#: batch path's 3 to 4 µs (a live worker's poll of one GPU is a line or two; BENCHMARKS.md, benchmark 3)
FEW_LINES = 128


def ingest_batch(auditor: RowPath, batch: pa.RecordBatch, source: Callable[[int], str]) -> "Outputs":
    """``auditor.ingest`` of every row of ``batch`` (``EVENT_SCHEMA``), in order; row ``i`` is labelled ``source(i)``.

    A batch whose columns are not typed as ``EVENT_SCHEMA`` says goes row by row.
    """
    if any(f.name in EVENT_SCHEMA.names and f.type != EVENT_SCHEMA.field(f.name).type for f in batch.schema):
        return [out for i, row in enumerate(batch.to_pylist()) for out in auditor.ingest(present_fields(row), source(i))]
    return _Batch(auditor, batch, source).run()


def ingest_lines(auditor: RowPath, lines: Sequence[bytes], source: Callable[[int], str],
                 scope: Scope | None = None) -> "Outputs":
    """``auditor.ingest`` of each JSON line, in order, through the batch path: Arrow's JSON reader
    (in C, typed by ``EVENT_SCHEMA``) fills the columns.

    The reader takes a few things Python's ``json`` refuses (invalid UTF-8, nesting deeper than
    Python's recursion limit, two objects on one line), so such lines, and any line the reader
    refuses, are decoded one by one, where they stand: the same dead letter as the row path.
    Fewer than ``FEW_LINES`` lines take the row path itself.
    """
    if len(lines) < FEW_LINES or not lines:
        return [out for i, line in enumerate(lines) for out in auditor.ingest(line, source(i), scope)]
    block = b"\n".join(lines)
    if block.count(b"{") == len(lines) and b"[" not in block and _BOM not in block and _utf8(block) \
            and not _LONG_DIGITS.search(block):
        plain = list(range(len(lines)))  # one object per line, nothing nested: every line is plain
    else:
        block, plain = None, [i for i, line in enumerate(lines) if line.count(b"{") == 1 and b"[" not in line
                              and not line.startswith(_BOM) and _utf8(line) and not _LONG_DIGITS.search(line)]
    pieces = _parsed(lines, plain, block)
    if len(pieces) == 1 and len(pieces[0][0]) == len(lines):  # Arrow read every line, in order (a live poll)
        table = pieces[0][1]
    else:
        table = _with_the_others(lines, pieces)
    return _Batch(auditor, table.combine_chunks().to_batches()[0], source, lines, scope).run()


def _with_the_others(lines: Sequence[bytes], pieces: list[tuple[list[int], pa.Table]]) -> pa.Table:
    """One row per line, in order: Arrow's rows where it read the line; the other lines as Python
    reads them, a valid event of a hot kind as its wire values (so that its columns hold what the
    model holds), anything else as an empty row that ``_Batch`` decodes again from the line."""
    taken = [i for idx, _ in pieces for i in idx]
    where = np.full(len(lines), -1, np.int64)
    where[taken] = np.arange(len(taken))
    wire = []
    for i in np.flatnonzero(where < 0).tolist():
        event = decode_line(lines[i])
        if isinstance(event, _HOT):
            where[i] = len(taken) + len(wire)
            wire.append(event.to_wire())
    where[where < 0] = len(taken) + len(wire)
    tables = [t for _, t in pieces] + [pa.Table.from_pylist(wire + [{"kind": ""}], schema=EVENT_SCHEMA)]
    return pa.concat_tables(tables, promote_options="permissive").take(pa.array(where))


_BOM = b"\xef\xbb\xbf"
#: a run of digits longer than Python's int conversion takes (4,300): Python's ``json`` refuses such a
#: line, Arrow's reader took it, so such lines go to the one-by-one decode, where Python's ``json`` decides
_LONG_DIGITS = re.compile(rb"[0-9]{4300}")
_CORES = os.cpu_count() or 1
_JSON_OPTIONS = pa_json.ParseOptions(explicit_schema=EVENT_SCHEMA, unexpected_field_behavior="ignore")


def _utf8(line: bytes) -> bool:
    try:
        line.decode()
    except UnicodeDecodeError:
        return False
    return True


def _parsed(lines: Sequence[bytes], idx: list[int], block: bytes | None = None) -> list[tuple[list[int], pa.Table]]:
    """The lines at ``idx`` as tables of one row per line, halving around the lines the reader refuses
    (``block``: those lines joined, when the caller has them)."""
    if not idx:
        return []
    if block is None:
        block = b"\n".join(lines[i] for i in idx)
    try:
        # in blocks, one per core, that Arrow parses side by side (twice as fast on two cores); a block
        # must hold the longest line whole
        size = max(len(block) // _CORES + 1, max(len(lines[i]) for i in idx) + 1, 1 << 16)
        table = pa_json.read_json(io.BytesIO(block), parse_options=_JSON_OPTIONS,
                                  read_options=pa_json.ReadOptions(use_threads=True, block_size=size))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        table = None
    if table is not None and table.num_rows == len(idx):
        return [(idx, table)]
    if len(idx) == 1:
        return []
    half = len(idx) // 2
    return _parsed(lines, idx[:half]) + _parsed(lines, idx[half:])


def exact_round(values: np.ndarray, scale: int) -> np.ndarray:
    """``gpucost.schemas.exact.round_scaled`` of each float, vectorised.

    ``values · scale`` in binary is within 1e-6 of the decimal the float stands for (values
    here are at most 3.6e6 once scaled), so away from a half the nearest integer is the
    answer; values that land near a half are few and distinct, and take the exact path.
    """
    scaled = values * scale
    out = np.rint(scaled)
    unsure = np.abs(scaled - np.floor(scaled) - 0.5) < 1e-5
    if unsure.any():
        distinct, where = np.unique(values[unsure], return_inverse=True)
        out[unsure] = np.array([round_float(float(v), scale) for v in distinct], dtype=np.float64)[where]
    return out.astype(np.int64)


def _who(gpu: Any, code: Any, pid: Any) -> Any:
    """(GPU, kind, pid) in one integer, of ints or of int64 arrays: 2 bits of kind, 33 of pid + 1, and the
    GPU's index above (a batch holds far fewer than the 2^28 GPUs that would overflow)."""
    return (gpu << 35) | (code << 33) | (pid + 1)


def _runs(*keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each run of equal keys starts and ends, in arrays sorted by those keys."""
    n = len(keys[0])
    change = np.zeros(max(n - 1, 0), bool)
    for k in keys:
        change |= k[1:] != k[:-1]
    starts = np.flatnonzero(np.r_[True, change])[:n]
    return starts, np.r_[starts[1:], n][:len(starts)].astype(np.int64)


class _Batch:
    """One batch's columns as numpy arrays, and the outputs it yields, each tagged with its row."""

    def __init__(self, auditor: RowPath, batch: pa.RecordBatch, source: Callable[[int], str],
                 lines: Sequence[bytes] | None = None, scope: Scope | None = None) -> None:
        self.a, self.batch, self.source, self.lines, self.scope = auditor, batch, source, lines, scope
        self.n = batch.num_rows
        self.out: list[tuple[int, int, Output | ClosedPanes]] = []
        self.table_events: list[tuple[int, Event]] = []
        self.tenants: list[Tenant] = []

    # --- columns -------------------------------------------------------------------------------

    def _col(self, name: str) -> pa.Array:
        if name in self.batch.schema.names:
            return self.batch.column(name)
        return pa.nulls(self.n, EVENT_SCHEMA.field(name).type)

    def _ints(self, name: str, dtype: type = np.int64) -> tuple[np.ndarray, np.ndarray]:
        col = self._col(name)
        present = np.asarray(pc.is_valid(col).to_numpy(zero_copy_only=False), dtype=bool)
        return np.asarray(pc.fill_null(col, 0).to_numpy(zero_copy_only=False), dtype=dtype), present

    def _floats(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """NaN where null, so every range check below fails for it."""
        col = self._col(name)
        present = np.asarray(pc.is_valid(col).to_numpy(zero_copy_only=False), dtype=bool)
        return np.asarray(pc.fill_null(col, float("nan")).to_numpy(zero_copy_only=False), dtype=np.float64), present

    def _ident(self, name: str) -> tuple[np.ndarray, list[str], np.ndarray]:
        """Codes into the batch's distinct values (-1 for null), the values, and each row's value's length."""
        col = self._col(name)
        encoded = pc.dictionary_encode(col)
        codes = np.asarray(pc.fill_null(encoded.indices, -1).to_numpy(zero_copy_only=False), dtype=np.int64)
        length = np.append(pc.utf8_length(encoded.dictionary).to_numpy(), 0)  # of each distinct value; null: 0
        return codes, encoded.dictionary.to_pylist(), length[codes]

    def _valid(self, model: type[Event], columns: dict[str, tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
        """Rows whose every field of ``model`` is within the bounds the model declares (present, if the
        field is required): the checks are read from the model (``gpucost.schemas.bounds``), never written here."""
        ok = np.ones(self.n, dtype=bool)
        for name in model.model_fields:
            if name != "kind":
                ok &= field_bounds(model, name).holds(*columns[name])
        return ok

    def _inputs(self, idx: np.ndarray | list[int]) -> list[bytes | dict[str, Any]]:
        """The inputs as the row path takes them: the JSON lines, or the Parquet rows as wire objects."""
        if self.lines is not None:
            return [self.lines[i] for i in idx]
        return [present_fields(r) for r in self.batch.take(pa.array(idx, pa.int64())).to_pylist()]

    def _raw(self, i: int) -> bytes | None:
        """What a dead letter of a valid event keeps: the line as it came (a Parquet row: re-encoded)."""
        return None if self.lines is None else self.lines[i]

    def emit(self, row: int, outputs: "Sequence[Output | ClosedPanes]") -> None:
        base = len(self.out)
        self.out.extend([(row, base + k, o) for k, o in enumerate(outputs)])

    def _count(self, kind: str, n: int) -> None:
        if n:
            self.a.counts[kind] += n

    def _letters(self, idx: np.ndarray, letter: "Callable[[int, Any], Output]") -> None:
        """Dead letters of rows the checks took in (late, duplicate, ahead of the clock), one by one."""
        for i, row in zip(idx.tolist(), self._inputs(idx)):
            event = decode_line(row)
            if isinstance(event, Rejected):  # cannot happen unless the checks above drift from the models
                self.emit(i, [self.a.reject(event, raw_text(row), self.source(i))])
            else:
                self.emit(i, [letter(i, event)])

    def _processes(self, rows: np.ndarray) -> dict[tuple[str, int], np.ndarray]:
        """``rows`` by process ``(node_id, pid)``: each process's positions in ``rows``, in arrival order."""
        process = self.node[rows] * _PID_SPAN + self.pid[rows]
        order = np.argsort(process, kind="stable")
        starts, ends = _runs(process[order])
        return {(self.node_names[self.node[rows[order[a]]]], int(self.pid[rows[order[a]]])): order[a:b]
                for a, b in zip(starts.tolist(), ends.tolist())}

    # --- the batch ---------------------------------------------------------------------------

    def run(self) -> "Outputs":
        # without the cyclic collector: a batch allocates millions of objects (integers of the cost
        # split, tuples), none in a cycle, and its full passes over them cost 5 % of a replay
        collecting = gc.isenabled()
        gc.disable()
        try:
            if self.n:
                self._decode()
                self._future()
                self._mae()
                self._panes()
        finally:
            if collecting:
                gc.enable()
        self.out.sort(key=lambda t: (t[0], t[1]))
        return [o for _, _, o in self.out]

    def _decode(self) -> None:
        """Vectorised validation of the hot kinds; every other row decoded one by one."""
        kinds = pc.dictionary_encode(self._col("kind"))
        kind_codes = np.array([_KINDS.get(k, -1) for k in kinds.dictionary.to_pylist()] + [-1], dtype=np.int8)
        self.code = kind_codes[np.asarray(pc.fill_null(kinds.indices, len(kind_codes) - 1).to_numpy(
            zero_copy_only=False))]
        # every field of the hot kinds, loaded as its column of the event schema holds it: text as codes
        # into the batch's distinct values (their lengths checked), numbers as they are
        columns: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        idents: dict[str, tuple[np.ndarray, list[str]]] = {}
        for name in _HOT_FIELDS:
            arrow = EVENT_SCHEMA.field(name).type
            if pa.types.is_string(arrow):
                codes, values, length = self._ident(name)
                idents[name], columns[name] = (codes, values), (length, codes >= 0)
            elif pa.types.is_floating(arrow):
                columns[name] = self._floats(name)
            else:
                columns[name] = self._ints(name, np.uint64 if pa.types.is_unsigned_integer(arrow) else np.int64)
        (self.gpu, self.gpu_names), (self.node, self.node_names), (self.model, self.model_names) = (
            idents["gpu_uuid"], idents["node_id"], idents["gpu_model"])
        self.ts, pid = columns["ts_ns"][0], columns["pid"][0]
        self.pid = np.where(self.code == GPU, -1, pid)  # the duplicate key's pid of a GPU sample
        self.address = columns["address"][0]
        valid = {model: self._valid(model, columns) for model in _HOT}

        sample = ((self.code == GPU) & valid[GpuSample]) | ((self.code == PROC) & valid[ProcessSample])
        self.interval_ms = np.zeros(self.n, np.int64)
        self.sm_cp = np.zeros(self.n, np.int64)
        self.bw_cp = np.zeros(self.n, np.int64)
        if sample.any():
            for out, name, scale in ((self.interval_ms, "interval_s", 1000), (self.sm_cp, "sm_util_pct", 100),
                                     (self.bw_cp, "mem_bw_util_pct", 100)):
                out[sample] = exact_round(columns[name][0][sample], scale)
        # the models' cross-field validators: _Sample._interval_not_zero, GpuSample._used_within_total
        used, total = columns["mem_used_bytes"][0], columns["mem_total_bytes"][0]
        gpu_row = valid[GpuSample] & (self.interval_ms > 0) & (used <= total)
        self.ok = np.select([self.code == GPU, self.code == PROC, self.code == NUMA, self.code == MEM],
                            [gpu_row, valid[ProcessSample] & (self.interval_ms > 0), valid[NumaEvent],
                             valid[MemAccess]], False)
        hops, weight = columns["hops"][0], columns["latency_weight"][0]
        self.numa_w = np.where(self.code == NUMA, hops * weight, 0)

        slow = np.flatnonzero(~self.ok)
        for i, row in zip(slow.tolist(), self._inputs(slow)):
            event = decode_in_scope(row, self.scope)
            if isinstance(event, Rejected):
                self.emit(i, [self.a.reject(event, raw_text(row), self.source(i))])
            elif isinstance(event, _HOT):
                # the checks above refused a row the model takes: take it as the model reads it
                self.ok[i] = True
                if isinstance(event, (GpuSample, ProcessSample)):
                    self.interval_ms[i], self.sm_cp[i], self.bw_cp[i] = (
                        event.interval_ms, event.sm_util_cp, event.mem_bw_util_cp)
            else:
                self.table_events.append((i, event))
        if self.scope is not None:
            self._scoped()

    def _scoped(self) -> None:
        """Rows of the hot kinds taken so far that their message may not carry (``gpucost.streams.scope``): dead
        letters, the reason given by ``Scope.check`` itself (rows decoded one by one were checked there)."""
        assert self.scope is not None
        key, nodes = self.scope.key, self.scope.nodes
        wrong = np.zeros(self.n, bool)
        if key is not None:
            gpu_is_key = np.array([name == key for name in self.gpu_names] + [False])[self.gpu]
            wrong |= (self.code <= NUMA) & ~gpu_is_key
            node_of_key, _, pid_of_key = key.rpartition("/")
            node_is = np.array([name == node_of_key for name in self.node_names] + [False])[self.node]
            pid_is = self.pid == (int(pid_of_key) if pid_of_key.isdigit() and len(pid_of_key) <= 10 else -2)
            wrong |= (self.code == MEM) & ~(node_is & pid_is)
        if nodes is not None:
            wrong |= ~np.array([name in nodes for name in self.node_names] + [False])[self.node]
        wrong &= self.ok
        self._letters(np.flatnonzero(wrong), self._scope_letter)
        self.ok &= ~wrong

    def _scope_letter(self, i: int, event: Event) -> "Output":
        assert self.scope is not None
        why = self.scope.check(event)
        assert why is not None, "the vectorised scope check drifted from Scope.check"
        return self.a.reject(why, raw_text(self._inputs([i])[0]), self.source(i))

    def _future(self) -> None:
        """Rows too far ahead of the clock, read once per batch (the row path reads it per event: a
        batch takes milliseconds, and the clock only ever refuses)."""
        if self.a.clock is None:
            return
        now = self.a.clock()
        ahead = np.flatnonzero(self.ok & (self.ts > now + self.a.settings.max_future_ns))
        self._letters(ahead, lambda i, e: self.a.future_letter(e, self._raw(i), self.source(i), now))
        self.ok[ahead] = False

    # --- memory-access entropy ------------------------------------------------------------------

    def _mae(self) -> None:
        rows = np.flatnonzero(self.ok & (self.code == MEM))
        self._count("mem_access", len(rows))
        if not len(rows):
            return
        bins = self.a.mae.bins_of(self.address[rows])
        for key, members in self._processes(rows).items():
            for at, record in self.a.mae.update_many(key, self.ts[rows[members]], bins[members]):
                self.emit(int(rows[members[at]]), [record])

    # --- panes -----------------------------------------------------------------------------------

    def _panes(self) -> None:
        """Watermarks, late rows, duplicates and pane sums of the GPU-keyed rows; then every close."""
        a, s = self.a, self.a.settings
        pane_ns, lateness_ns = s.pane_ns, s.lateness_ns
        rows = np.flatnonzero(self.ok & (self.code <= NUMA))
        rows = rows[np.argsort(self.gpu[rows], kind="stable")]  # by GPU, then in arrival order
        gpu = self.gpu[rows]
        starts, ends = _runs(gpu)
        names = [self.gpu_names[c] for c in gpu[starts].tolist()]
        group = np.repeat(np.arange(len(starts)), ends - starts)
        ts = self.ts[rows]

        # each GPU's running maximum ts_ns from where the state left it, in one accumulate over levels
        # offset by group, so that no maximum crosses from one GPU into the next. A time's level is
        # its distance above the batch's earliest, plus 1 (0: no watermark yet); where a batch spans
        # so long that levels and GPUs do not fit 64 bits together, its rank among the distinct times
        max0 = np.array([a.panes.max_ts(name) or _NONE for name in names], np.int64)
        # a GPU's largest may become a pending jump of the state (``jump``): a time the levels must hold too
        pending0 = {j: a.panes.pending(name) for j, name in enumerate(names) if a.panes.pending(name) is not None}
        known = np.concatenate([ts, max0[max0 != _NONE], np.array(list(pending0.values()), np.int64)])
        first, last = (int(known.min()), int(known.max())) if len(known) else (0, 0)
        if (last - first + 2) * (len(starts) + 1) < 1 << 62:
            width = last - first + 2

            def level(t: np.ndarray) -> np.ndarray:  # the lowest level at or above t: `width` if above all
                return np.clip(t - (first - 1), 1, width)

            def time_of(level: np.ndarray) -> np.ndarray:
                return level + (first - 1)
        else:
            distinct = np.unique(known)
            width = len(distinct) + 1

            def level(t: np.ndarray) -> np.ndarray:
                return np.searchsorted(distinct, t) + 1

            def time_of(level: np.ndarray) -> np.ndarray:
                return distinct[level - 1]
        key0 = np.arange(len(starts)) * width + np.where(max0 == _NONE, 0, level(max0))
        pane = ts - ts % pane_ns

        def running(effective: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            """Each row's running maximum key over ``effective`` (``upto``; ``_NONE``: moves nothing), that
            maximum as a time (``high``), and the maximum before the row (``before``)."""
            upto = np.maximum(np.maximum.accumulate(group * width + np.where(effective == _NONE, 0, level(effective))),
                              key0[group]) if len(rows) else np.zeros(0, np.int64)
            at_level = upto - group * width
            high = np.where(at_level > 0, time_of(np.maximum(at_level, 1)), _NONE)  # max up to and including each row
            before = np.empty_like(high)
            before[1:] = high[:-1]
            before[starts] = max0
            return upto, high, before

        def watermarks(moves: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[int, int | None]]:
            """``running`` over the rows that ``moves``, with the jump rule (``gpucost.streams.panes.jump``), and each
            GPU's pending jump after the batch where it may have one. Only a GPU with a row further than
            ``max_jump_ns`` ahead of the maximum before it, or a pending jump in the state, can differ from the
            plain running maximum: those few go row by row, in arrival order."""
            effective = np.where(moves, ts, _NONE)
            upto, high, before = running(effective)
            ahead = moves & (before != _NONE) & (ts > before + s.max_jump_ns)
            pending: dict[int, int | None] = {}
            for j in sorted(set(group[ahead].tolist()) | set(pending0)):
                top, held = (None if max0[j] == _NONE else int(max0[j])), pending0.get(j)
                for p in range(int(starts[j]), int(ends[j])):
                    t = int(ts[p])
                    if moves[p] and (top is None or pane[p] + pane_ns + lateness_ns > top):  # on time
                        top, held = jump(top, held, t, s.max_jump_ns)
                    effective[p] = _NONE if top is None else top
                pending[j] = held
            if pending:
                upto, high, before = running(effective)
            return upto, high, before, pending

        # a refused row moves no watermark. A late row cannot (it lies below it); a duplicate or an overlap
        # can (it may lie above, or confirm a jump), so the watermarks are taken again without the refused
        # rows until they agree: each round settles at least the next row in arrival order, and a batch
        # where no refused row lies above the maximum before it takes one
        moves = np.ones(len(rows), bool)
        while True:
            upto, high, before, pending = watermarks(moves)
            late = pane + pane_ns + lateness_ns <= before
            dup, overlap = self._refusals(rows, group, pane, late, names, starts, ends)
            settled = ~(dup | overlap)
            if np.array_equal(settled, moves) or moves.all() and not (~settled & (ts > before)).any():
                break
            moves = settled
        accepted = ~late & ~dup & ~overlap
        late_at = np.flatnonzero(late)
        watermark = dict(zip(rows[late_at].tolist(), (before[late_at] - lateness_ns).tolist()))
        self._letters(rows[late_at], lambda i, e: a.late_letter(e, self._raw(i), self.source(i), watermark[i]))
        self._letters(rows[dup], lambda i, e: a.duplicate_letter(e, self._raw(i), self.source(i)))
        self._letters(rows[overlap], lambda i, e: a.overlap_letter(e, self._raw(i), self.source(i)))
        for code, kind in enumerate(_KIND_NAMES[:MEM]):
            self._count(kind, int(np.count_nonzero(accepted & (self.code[rows] == code))))

        tenant_rows = np.sort(rows[accepted & (self.code[rows] != GPU)])
        tenant_of = np.full(self.n, -1, np.int64)
        tenant_of[tenant_rows] = self._tenants(tenant_rows)

        def close_rows(group_of: np.ndarray, start: np.ndarray) -> list[int]:
            """For panes of these GPUs and starts, the row whose watermark first reaches the pane's end plus
            the lateness (the row that closes it), or -1 if none does."""
            target = group_of * width + level(start + pane_ns + lateness_ns)
            k = np.searchsorted(upto, target)
            return np.where(k < ends[group_of], rows[np.minimum(k, len(rows) - 1)], -1).tolist()

        at_rows, closing = self._sum_panes(rows[accepted], group[accepted], pane[accepted], names, tenant_of,
                                           close_rows)
        for j, name in enumerate(names):
            a.panes.set_max_ts(name, int(high[ends[j] - 1]), pending.get(j))
        self._apply_in_order(at_rows, closing)

    def _refusals(self, rows: np.ndarray, group: np.ndarray, pane: np.ndarray, late: np.ndarray,
                  names: list[str], starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The on-time rows refused as duplicates (their (GPU, kind, pid, ts_ns) an earlier on-time row, or an
        open pane of the state, holds) and as overlaps (``gpucost.streams.panes.overlaps``).

        An overlap depends on which earlier samples were taken, so it is decided in arrival order; but only
        where it can occur: a (GPU, kind, pid, pane) with two distinct times closer than three quarters of
        the larger of their intervals (no pair of neighbours that close, no pair at all), or one the state
        holds counted times of. Those few go one by one, as the row path does (``_in_order``)."""
        dup = np.zeros(len(rows), bool)
        overlap = np.zeros(len(rows), bool)
        on_time = np.flatnonzero(~late)
        who = _who(group[on_time], self.code[rows[on_time]].astype(np.int64), self.pid[rows[on_time]])
        ts = self.ts[rows[on_time]]
        order = np.lexsort((ts, who))  # stable: equal keys stay in arrival order
        who, ts, where = who[order], ts[order], on_time[order]
        same = who[1:] == who[:-1]
        dup[where[1:][same & (ts[1:] == ts[:-1])]] = True
        # neighbouring distinct times, each with the largest interval of the rows at it
        firsts, _ = _runs(who, ts)
        interval = np.maximum.reduceat(self.interval_ms[rows[where]], firsts) if len(firsts) else np.zeros(0, np.int64)
        w, t, in_pane = who[firsts], ts[firsts], pane[where[firsts]]
        near = ((w[1:] == w[:-1]) & (in_pane[1:] == in_pane[:-1]) & overlaps(t[1:] - t[:-1], np.maximum(
            interval[1:], interval[:-1])) & (self.code[rows[where[firsts[1:]]]] != NUMA))
        suspect: set[tuple[int, int]] = set(zip(w[1:][near].tolist(), in_pane[1:][near].tolist()))
        for j, name in enumerate(names):
            for start, open_pane in self.a.panes.open_panes(name).items():
                span = slice(int(starts[j]), int(ends[j]))
                for p in (np.flatnonzero((pane[span] == start) & ~late[span]) + starts[j]).tolist():
                    i = int(rows[p])
                    kind, pid = _KIND_NAMES[self.code[i]], int(self.pid[i])
                    if self.code[i] != NUMA and (kind, pid) in open_pane.seen:
                        suspect.add((_who(j, int(self.code[i]), pid), start))
                    elif open_pane.holds(kind, pid, int(self.ts[i])):
                        dup[p] = True
        if suspect:
            key = [(w, int(pane[p])) for w, p in zip(who.tolist(), where.tolist())]
            members: dict[tuple[int, int], list[int]] = {}
            for k, p in zip(key, where.tolist()):
                if k in suspect:
                    members.setdefault(k, []).append(p)
            for (w, start), positions in members.items():
                self._in_order(sorted(positions), names[w >> 35], start, rows, dup, overlap)
        return dup, overlap

    def _in_order(self, positions: list[int], gpu: str, start: int, rows: np.ndarray, dup: np.ndarray,
                  overlap: np.ndarray) -> None:
        """Duplicates and overlaps of one (GPU, kind, pid, pane)'s on-time rows, in arrival order, as
        ``GpuPanes.admit`` decides them."""
        i = int(rows[positions[0]])
        held = self.a.panes.open_panes(gpu).get(start)
        probe = PaneTotals(gpu, start, start)
        if held is not None:
            key = (_KIND_NAMES[self.code[i]], int(self.pid[i]))
            probe.seen[key] = list(held.seen.get(key, ()))
        for p in positions:
            i = int(rows[p])
            kind, pid, ts = _KIND_NAMES[self.code[i]], int(self.pid[i]), int(self.ts[i])
            gap = probe.nearest_gap(kind, pid, ts)
            dup[p], overlap[p] = gap == 0, gap is not None and gap > 0 and overlaps(gap, int(self.interval_ms[i]))
            if gap != 0 and not overlap[p]:
                probe.remember(kind, pid, ts)

    def _tenants(self, rows: np.ndarray) -> np.ndarray:
        """The tenant (an index into ``self.tenants``) of each row, as of its time, among the bindings
        that arrived before it; applies the batch's bindings, in arrival order, on the way."""
        a = self.a
        index: dict[Tenant, int] = {UNATTRIBUTED: 0}
        out = np.zeros(len(rows), np.int64)
        groups = self._processes(rows)
        done = dict.fromkeys(groups, 0)

        def resolve(key: tuple[str, int], before_row: int) -> None:
            members = groups[key]
            stop = int(np.searchsorted(rows[members], before_row))
            part = members[done[key]:stop]
            if len(part):
                tenants, at = a.bindings.lookup_many(*key, self.ts[rows[part]])
                if tenants:
                    ids = np.array([index.setdefault(t, len(index)) for t in tenants], np.int64)
                    out[part] = np.where(at >= 0, ids[at], 0)
            done[key] = stop

        rest = []
        for i, event in self.table_events:
            if not isinstance(event, TenantBinding):
                rest.append((i, event))
                continue
            if (event.node_id, event.pid) in groups:
                resolve((event.node_id, event.pid), i)
            self.emit(i, a.update(event, self._raw(i), self.source(i)))
        self.table_events = rest
        for key in groups:
            resolve(key, self.n)
        self.tenants = sorted(index, key=index.__getitem__)
        return out

    def _sum_panes(self, rows: np.ndarray, group: np.ndarray, pane: np.ndarray, names: list[str],
                   tenant_of: np.ndarray, close_rows: Callable[[np.ndarray, np.ndarray], list[int]]
                   ) -> tuple[np.ndarray, PaneColumns]:
        """The accepted ``rows`` summed into their panes' state; returns the panes that close, and the
        row that closes each."""
        a, s = self.a, self.a.settings
        order = np.lexsort((pane, group))  # by GPU, pane, then arrival
        rows, group, pane = rows[order], group[order], pane[order]
        firsts, lasts = _runs(group, pane)
        code = self.code[rows]
        is_gpu = code == GPU
        interval = self.interval_ms[rows]

        def per_pane(values: np.ndarray, reduce: np.ufunc = np.add) -> list[int]:
            return reduce.reduceat(values, firsts).tolist() if len(rows) else []

        covered = per_pane(np.where(is_gpu, interval, 0))
        idle = per_pane(np.where(is_gpu & (self.sm_cp[rows] < s.idle_threshold_cp), interval, 0))
        gpu_rows = per_pane(is_gpu.astype(np.int64))

        # (pane, tenant) sums of the process samples and NUMA events, in order of first arrival
        t_at = np.flatnonzero(~is_gpu)
        seg = np.repeat(np.arange(len(firsts)), lasts - firsts)[t_at]
        tenant = tenant_of[rows[t_at]]
        t_order = np.lexsort((tenant, seg))
        t_at, seg, tenant = t_at[t_order], seg[t_order], tenant[t_order]
        t_firsts, _ = _runs(seg, tenant)
        t_rows = rows[t_at]
        t_pane, t_who = seg[t_firsts], tenant[t_firsts]
        t_sums = [np.zeros(0, np.int64)] * 3
        t_first = np.zeros(0, np.int64)
        if len(t_at):
            is_proc = code[t_at] == PROC
            t_sums = [np.add.reduceat(v, t_firsts) for v in (
                np.where(is_proc, self.sm_cp[t_rows] * interval[t_at], 0),
                np.where(is_proc, self.bw_cp[t_rows] * interval[t_at], 0),
                np.where(is_proc, 0, self.numa_w[t_rows]))]
            t_first = np.minimum.reduceat(t_rows, t_firsts)

        # the smallest node and model name of each pane's GPU samples (a GPU that reports two names
        # in one pane gets the same one whatever the order), by rank among the batch's names
        node_by_rank, model_by_rank = sorted(self.node_names), sorted(self.model_names)
        big = max(len(node_by_rank), len(model_by_rank))
        # rank of each batch name, and `big` at index -1 (no name)
        node_rank, model_rank = (np.array([*np.argsort(np.argsort(np.array(v, dtype=object))).tolist(), big])
                                 for v in (self.node_names, self.model_names))
        node_min = per_pane(np.where(is_gpu, node_rank[self.node[rows]], big), np.minimum)
        model_min = per_pane(np.where(is_gpu, model_rank[self.model[rows]], big), np.minimum)
        group_k, starts_k = group[firsts], pane[firsts]  # each pane's GPU and start
        at_rows = np.array(close_rows(group_k, starts_k) if len(rows) else [], np.int64)
        keys = [t.key for t in self.tenants]
        tenant_events = lasts - firsts - np.array(gpu_rows, np.int64)

        # a pane the state holds open, or that stays open, goes through its PaneTotals; the others,
        # new panes that close within the batch (nearly all of a replay's), straight to columns
        slow = at_rows < 0
        by_gpu = np.searchsorted(group_k, np.arange(len(names) + 1))  # each GPU's panes, in start order
        untouched: dict[str, list[int]] = {}  # open panes of the state that took no row here
        for j, name in enumerate(names):
            held = list(a.panes.open_panes(name))
            if held:  # a few panes: found by bisection among the GPU's panes here, which are in start order
                here, wanted = starts_k[by_gpu[j]:by_gpu[j + 1]], np.array(held, np.int64)
                at = np.searchsorted(here, wanted)
                hit = at < len(here)
                hit[hit] = here[at[hit]] == wanted[hit]
                slow[by_gpu[j] + at[hit]] = True
                untouched[name] = [start for start, found in zip(held, hit.tolist()) if not found]
        fast = np.flatnonzero(~slow)
        by_tenant: dict[int, list[tuple[int, int, int, int, int]]] = {}
        for k in np.flatnonzero(slow[t_pane]).tolist():
            by_tenant.setdefault(int(t_pane[k]), []).append(
                (int(t_first[k]), int(t_who[k]), *(int(v[k]) for v in t_sums)))  # type: ignore[arg-type]

        closes: list[tuple[int, PaneTotals]] = []
        pane_ns = s.pane_ns
        for k in np.flatnonzero(slow).tolist():
            first, last, j, start = int(firsts[k]), int(lasts[k]), int(group_k[k]), int(starts_k[k])
            name = names[j]
            kept = a.panes.open_panes(name)
            totals = kept.pop(start, None) or PaneTotals(name, start, start + pane_ns)
            if gpu_rows[k]:
                node, model = node_by_rank[node_min[k]], model_by_rank[model_min[k]]
                totals.node_id = node if totals.node_id is None else min(node, totals.node_id)
                totals.gpu_model = model if totals.gpu_model is None else min(model, totals.gpu_model)
            totals.covered_ms += covered[k]
            totals.idle_ms += idle[k]
            totals.tenant_events += int(tenant_events[k])
            for _, tn, sm, bw, numa in sorted(by_tenant.get(k, ())):
                t = totals.tenant(self.tenants[tn], keys[tn])
                t.sm += sm
                t.bw += bw
                t.numa += numa
            at = int(at_rows[k])
            if at >= 0:
                closes.append((at, totals))
                continue
            members = rows[first:last]
            for kind, pid, ts in zip([_KIND_NAMES[c] for c in code[first:last].tolist()], self.pid[members].tolist(),
                                     self.ts[members].tolist()):
                totals.remember(kind, pid, ts)
            a.panes.keep_open(totals)
        for j, name in enumerate(names):  # open panes of the state that took no row here may close too
            idle_panes = untouched.get(name, [])
            for start, at in zip(idle_panes, close_rows(np.full(len(idle_panes), j), np.array(idle_panes, np.int64))):
                if at >= 0:
                    closes.append((at, a.panes.open_panes(name).pop(start)))

        position = np.full(len(firsts), -1, np.int64)
        position[fast] = np.arange(len(fast))
        tenant_rows = np.flatnonzero(~slow[t_pane])
        key_rank = np.argsort(np.argsort(np.array(keys, dtype=object))) if keys else np.zeros(0, np.int64)
        tenant_rows = tenant_rows[np.lexsort((key_rank[t_who[tenant_rows]], position[t_pane[tenant_rows]]))]
        who = t_who[tenant_rows]
        no_name = [None] * (big + 1)  # a rank of `big`: the pane had no GPU sample
        columns = PaneColumns(
            objects(names)[group_k[fast]], starts_k[fast], starts_k[fast] + pane_ns,
            objects(node_by_rank + no_name)[np.array(node_min, np.int64)[fast]],
            objects(model_by_rank + no_name)[np.array(model_min, np.int64)[fast]],
            np.array(covered, np.int64)[fast], np.array(idle, np.int64)[fast], tenant_events[fast],
            position[t_pane[tenant_rows]], objects(keys)[who], objects(self.tenants)[who],
            *(v[tenant_rows].astype(object) for v in t_sums))
        return (np.concatenate([at_rows[fast], np.array([at for at, _ in closes], np.int64)]),
                PaneColumns.concat([columns, PaneColumns.of([totals for _, totals in closes])]))

    def _apply_in_order(self, at_rows: np.ndarray, closing: PaneColumns) -> None:
        """Closes and prices in arrival order: a price reaches only the closes after it.

        eBPF traces change nothing a close reads, so they go first. Each pane takes the price in
        force at its closing row; then every pane closes in one ``Auditor.close_many``, whose
        records come as blocks cut at each price and wherever another output of the batch lies
        between two closes, so that expanding each block where it stands gives the row path's order.
        """
        prices = []
        for i, event in self.table_events:
            if isinstance(event, Price):
                prices.append((i, event))
            else:
                self.emit(i, self.a.update(event, self._raw(i), self.source(i)))
        others = np.unique(np.array([row for row, _, _ in self.out], np.int64))
        order = np.lexsort((closing.pane_start_ns, at_rows))  # by closing row, a row's panes oldest first
        rows, closing = at_rows[order], closing.take(order)
        price_rows = np.array([i for i, _ in prices], np.int64)
        run = np.searchsorted(price_rows, rows) * (len(others) + 1) + np.searchsorted(others, rows)
        cuts = (np.flatnonzero(np.diff(run)) + 1).tolist()
        bounds = list(zip([0, *cuts], [*cuts, len(rows)])) if len(rows) else []
        in_force: list[Decimal | None] = []
        applied = 0

        def apply_prices(upto: int) -> None:
            """The prices before ``upto`` that are not applied yet."""
            nonlocal applied
            for i, price in prices[applied:upto]:
                self.emit(i, self.a.update(price, self._raw(i), self.source(i)))
            applied = max(applied, upto)

        for lo, hi in bounds:
            apply_prices(int(np.searchsorted(price_rows, rows[lo])))
            in_force += self.a.prices_now(closing.gpu_model[lo:hi], closing.pane_start_ns[lo:hi])
        apply_prices(len(prices))
        if len(rows) < FEW_CLOSES:  # a block's fixed cost (about 0.3 ms) is more than a few closes one by one
            for row, pane, price in zip(rows.tolist(), closing.totals(), in_force):
                self.emit(row, self.a.close([pane], [price]))
        elif bounds:
            for (lo, _), block in zip(bounds, self.a.close_many(closing, in_force, cuts)):
                if block is not None:
                    self.emit(int(rows[lo]), [block])
