"""One batch's columns through the audit: decoded and validated with numpy, handed to each operator's batch
entry, dead letters for the rows the checks refuse, and every output merged back into arrival order
(``gpucost.streams.columnar`` cuts the input into such batches and says why the batch path exists).
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gpucost.schemas.arrow import wire_rows
from gpucost.schemas.blocks import ClosedPanes, Outputs
from gpucost.schemas.codec import Rejected, decode_line, raw_text
from gpucost.schemas.events import (
    Allocation,
    EbpfTrace,
    Event,
    GpuSample,
    MemAccess,
    NumaEvent,
    Price,
    ProcessSample,
    TenantBinding,
)
from gpucost.schemas.kernels import KernelActivity
from gpucost.schemas.records import Output
from gpucost.streams.addresses import DUPLICATE
from gpucost.streams.batch_columns import column, hot_columns, measures, valid_rows
from gpucost.streams.batch_kernels import plan_kernels
from gpucost.streams.json_lines import COLUMN_MODELS
from gpucost.streams.pane_rules import GPU, KINDS, NUMA, PROC, TRACE, numa_sum
from gpucost.streams.pane_totals import PaneColumns, PaneRows
from gpucost.streams.row_path import RowPath
from gpucost.streams.runs import runs
from gpucost.streams.scope import Scope, decode_in_scope
from gpucost.streams.tables import UNATTRIBUTED, Tenant

__all__ = ["Batch", "FEW_CLOSES", "KIND_CODES", "MEM"]


MEM = len(KINDS)  # the codes of the kinds GpuPanes counts (``KINDS``), and this one
KIND_CODES = {name: code for code, name in enumerate((*KINDS, "mem_access"))}
_PID_SPAN = 1 << 32
#: fewer closing panes than this in a batch are closed one by one, as records; more, as blocks of columns
#: (a live worker's poll closes a pane or two per GPU; closing one as a block costs 0.45 ms, one by one 20 µs)
FEW_CLOSES = 16


class Batch:
    """One batch's columns as numpy arrays, and the outputs it yields, each tagged with its row."""

    def __init__(
        self,
        auditor: RowPath,
        batch: pa.RecordBatch,
        source: Callable[[int], str],
        lines: Sequence[bytes] | None = None,
        scope: Scope | None = None,
    ) -> None:
        self.a, self.batch, self.source, self.lines, self.scope = auditor, batch, source, lines, scope
        self.n = batch.num_rows
        self.out: list[tuple[int, int, Output | ClosedPanes]] = []
        self.table_events: list[tuple[int, Event]] = []
        self.tenants: list[Tenant] = []
        self.kernels: list[tuple[int, KernelActivity]] = []  # the valid kernels, by row (``batch_kernels``)

    def _col(self, name: str) -> pa.Array:
        return column(self.batch, name)

    def _inputs(self, idx: np.ndarray | list[int]) -> Sequence[bytes | dict[str, Any]]:
        """The inputs as the row path takes them: the JSON lines, or the Arrow or Parquet rows as wire objects."""
        if self.lines is not None:
            return [self.lines[i] for i in idx]
        return wire_rows(self.batch, list(idx))

    def _raw(self, i: int) -> bytes | None:
        """What a dead letter of a valid event keeps: the line as it came (a Parquet row: re-encoded)."""
        return None if self.lines is None else self.lines[i]

    def emit(self, row: int, outputs: Sequence[Output | ClosedPanes], first: bool = False) -> None:
        """``outputs`` at ``row``, after those placed there before, or (``first``) before every other output of it."""
        base = len(self.out) - (1 << 62 if first else 0)
        self.out.extend([(row, base + k, o) for k, o in enumerate(outputs)])

    def _count(self, kind: str, n: int) -> None:
        if n:
            self.a.counts[kind] += n

    def _letters(self, idx: np.ndarray, letter: Callable[[int, Any], Output]) -> None:
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
        starts, ends = runs(process[order])
        return {
            (self.node_names[self.node[rows[order[a]]]], int(self.pid[rows[order[a]]])): order[a:b]
            for a, b in zip(starts.tolist(), ends.tolist())
        }

    # --- the batch ---------------------------------------------------------------------------

    def run(self) -> Outputs:
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
        kind_codes = np.array([KIND_CODES.get(k, -1) for k in kinds.dictionary.to_pylist()] + [-1], dtype=np.int8)
        self.code = kind_codes[
            np.asarray(pc.fill_null(kinds.indices, len(kind_codes) - 1).to_numpy(zero_copy_only=False))
        ]
        columns, idents = hot_columns(self.batch)
        (self.gpu, self.gpu_names), (self.node, self.node_names), (self.model, self.model_names) = (
            idents["gpu_uuid"],
            idents["node_id"],
            idents["gpu_model"],
        )
        self.ts, pid = columns["ts_ns"][0], columns["pid"][0]
        self.pid = np.where(self.code == GPU, -1, pid)  # the duplicate key's pid of a GPU sample
        self.address = columns["address"][0]
        valid = {model: valid_rows(model, columns, self.n) for model in COLUMN_MODELS}

        m = measures((self.code == GPU) & valid[GpuSample], (self.code == PROC) & valid[ProcessSample], columns)
        self.interval_ms, self.sm_cp, self.bw_cp, self.power_mw = m.interval_ms, m.sm_cp, m.bw_cp, m.power_mw
        self.tensor_cp, self.dram_cp, self.fatal, self.warning, self.estimated = m[4:]
        self.flops: dict[int, int] = {}  # each blas trace's flops_64b, by row
        self._gpu_code: dict[str, int] | None = None  # gpu_names' codes, once a trace names a GPU
        # the models' cross-field validators: _Sample._interval_not_zero, GpuSample._used_within_total
        used, total = columns["mem_used_bytes"][0], columns["mem_total_bytes"][0]
        gpu_row = valid[GpuSample] & (self.interval_ms > 0) & (used <= total)
        self.ok = np.select(
            [self.code == GPU, self.code == PROC, self.code == NUMA, self.code == MEM],
            [gpu_row, valid[ProcessSample] & (self.interval_ms > 0), valid[NumaEvent], valid[MemAccess]],
            False,
        )
        hops, weight = columns["hops"][0], columns["latency_weight"][0]
        self.numa_w = np.where(self.code == NUMA, numa_sum(hops, weight), 0)

        slow = np.flatnonzero(~self.ok)
        for i, row in zip(slow.tolist(), self._inputs(slow)):
            event = decode_in_scope(row, self.scope)
            if isinstance(event, Rejected):
                self.emit(i, [self.a.reject(event, raw_text(row), self.source(i))])
            elif isinstance(event, COLUMN_MODELS):
                # the checks above refused a row the model takes: take it as the model reads it
                self.ok[i] = True
                if isinstance(event, (GpuSample, ProcessSample)):
                    self.interval_ms[i], self.sm_cp[i], self.bw_cp[i] = (
                        event.interval_ms,
                        event.sm_util_cp,
                        event.mem_bw_util_cp,
                    )
                if isinstance(event, GpuSample):
                    self.power_mw[i] = event.power_mw
                    self.tensor_cp[i], self.dram_cp[i], self.fatal[i], self.warning[i] = (
                        -1 if v is None else v
                        for v in (event.tensor_active_cp, event.dram_active_cp, event.fault_fatal, event.fault_warning)
                    )
                    self.estimated[i] = int(bool(event.power_estimated))
            elif isinstance(event, EbpfTrace):  # always here: the packed struct is decoded row by row
                self._trace(i, event)
            elif isinstance(event, KernelActivity):
                self.kernels.append((i, event))  # on time or late at its row: ``_panes`` tells
            elif isinstance(event, Allocation):
                # on time at its row (``revising_rows`` cut the batch at any other), so before the batch's samples
                # too: it changes the split of its panes before any closes; holds are dropped at the end (prune_gpu)
                self.emit(i, self.a.update(event, self._raw(i), self.source(i)))
            else:
                self.table_events.append((i, event))
        if self.scope is not None:
            self._scoped()

    def _trace(self, i: int, event: EbpfTrace) -> None:
        """Row ``i`` is this trace: a GPU-keyed row that ``GpuPanes`` judges late but that moves no watermark."""
        if self._gpu_code is None:
            self._gpu_code = {name: code for code, name in enumerate(self.gpu_names)}
        code = self._gpu_code.get(event.gpu_uuid)
        if code is None:
            code = self._gpu_code[event.gpu_uuid] = len(self.gpu_names)
            self.gpu_names.append(event.gpu_uuid)
        for name in ("code", "gpu", "ts", "pid"):  # columns read from Arrow without a copy are read-only
            if not getattr(self, name).flags.writeable:
                setattr(self, name, getattr(self, name).copy())
        self.ok[i], self.code[i], self.gpu[i], self.ts[i], self.pid[i] = True, TRACE, code, event.ts_ns, event.pid
        if event.trace_source == "blas":
            self.flops[i] = event.flops_64b

    def _scoped(self) -> None:
        """Rows of the hot kinds taken so far that their message may not carry (``gpucost.streams.scope``): dead
        letters, the reason given by ``Scope.check`` itself (rows decoded one by one were checked there)."""
        assert self.scope is not None
        wrong = self.scope.refused_many(
            self.code <= NUMA, self.code == MEM, self.gpu, self.gpu_names, self.node, self.node_names, self.pid
        )
        wrong &= self.ok
        self._letters(np.flatnonzero(wrong), self._scope_letter)
        self.ok &= ~wrong

    def _scope_letter(self, i: int, event: Event) -> Output:
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
        if not len(rows):
            return
        mae = self.a.mae
        bins = mae.bins_of(self.address[rows])
        for key, members in self._processes(rows).items():
            codes, latest = mae.taken.verdicts_many(key, self.ts[rows[members]], self.address[rows[members]])
            if codes.any():  # sent again, or too far back to tell (``gpucost.streams.addresses``)
                why: dict[int, tuple[int, int]] = dict(
                    zip(rows[members].tolist(), zip(codes.tolist(), latest.tolist()))
                )

                def letter(i: int, e: Any, why: dict[int, tuple[int, int]] = why) -> Output:
                    reason = "duplicate" if why[i][0] == DUPLICATE else "late"
                    return self.a.address_letter(e, self._raw(i), self.source(i), reason, why[i][1])

                self._letters(rows[members[codes > 0]], letter)
                members = members[codes == 0]
            self._count("mem_access", len(members))
            for at, record in mae.take_many(key, self.ts[rows[members]], bins[members]):
                self.emit(int(rows[members[at]]), [record])

    # --- panes -----------------------------------------------------------------------------------

    def _panes(self) -> None:
        """The GPU-keyed rows through ``GpuPanes``' batch entry: its verdicts become dead letters, the
        accepted rows' tenants are joined (bindings applied in arrival order), then every close."""
        a = self.a
        rows = np.flatnonzero(self.ok & (self.code <= TRACE))
        rows = rows[np.argsort(self.gpu[rows], kind="stable")]  # by GPU, then in arrival order
        starts, ends = runs(self.gpu[rows])
        pane_rows = PaneRows(
            rows,
            [self.gpu_names[c] for c in self.gpu[rows][starts].tolist()],
            starts,
            ends,
            self.code[rows],
            self.pid[rows],
            self.ts[rows],
            self.interval_ms[rows],
            self.sm_cp[rows],
            self.bw_cp[rows],
            self.power_mw[rows],
            self.tensor_cp[rows],
            self.dram_cp[rows],
            self.fatal[rows],
            self.warning[rows],
            self.estimated[rows],
            self.numa_w[rows],
            self.node[rows],
            self.node_names,
            self.model[rows],
            self.model_names,
            {p: self.flops[i] for p, i in enumerate(rows.tolist()) if i in self.flops},
        )
        verdicts = a.panes.judge_many(pane_rows)
        late_at = np.flatnonzero(verdicts.late)
        watermark = dict(zip(rows[late_at].tolist(), a.panes.watermarks_before(verdicts, late_at)))
        self._letters(rows[late_at], lambda i, e: a.late_letter(e, self._raw(i), self.source(i), watermark[i]))
        self._letters(rows[verdicts.duplicate], lambda i, e: a.duplicate_letter(e, self._raw(i), self.source(i)))
        self._letters(rows[verdicts.overlap], lambda i, e: a.overlap_letter(e, self._raw(i), self.source(i)))
        accepted = verdicts.accepted
        for code, kind in enumerate(KINDS):
            self._count(kind, int(np.count_nonzero(accepted & (pane_rows.kind == code))))
        tenant_rows = np.sort(rows[accepted & np.isin(pane_rows.kind, (PROC, NUMA))])
        tenant_of = np.full(self.n, -1, np.int64)
        tenant_of[tenant_rows] = self._tenants(tenant_rows)
        keyed = self.ok & (self.code >= 0) & (self.code <= NUMA)
        kernels = plan_kernels(a, self.kernels, pane_rows, verdicts, keyed, self.gpu, self.gpu_names)
        for i, kernel in kernels.on_time:  # before the closes
            self.emit(i, a.update(kernel, self._raw(i), self.source(i)))
        self._apply_in_order(*a.panes.add_many(pane_rows, verdicts, tenant_of[rows], self.tenants), kernels.rows())
        a.revisions.take_many(pane_rows, accepted)  # with revisions off too: bindings re-attribute open panes
        for row, step, at_ns in kernels.in_order():  # the late kernels and the settles, where the row path has them
            if isinstance(step, str):  # a late kernel dead-lettered left nothing pending, as the row path checks
                if step in a.kernel_revisions_pending():
                    self.emit(row, a.settle_kernels((step,)), first=True)
            else:
                self.emit(row, a.late_kernel(step, self._raw(row), self.source(row), at_ns))
        moved = accepted & (pane_rows.kind <= NUMA)  # as the row path, after each sample it takes: a trace moves none
        for name, lo, hi in zip(pane_rows.names, starts.tolist(), ends.tolist()):
            if moved[lo:hi].any():
                a.prune_gpu(name)

    def _tenants(self, rows: np.ndarray) -> np.ndarray:
        """The tenant (an index into ``self.tenants``) of each row, as of its time, among the bindings before the
        batch and the batch's own, which it applies first, in arrival order: a binding covers the samples of
        its time whenever they came (the row path re-attributes those that came first), and none of the
        batch's reaches a closed pane or is late (``revising_rows`` cut the batch at any that might)."""
        a = self.a
        rest: list[tuple[int, Event]] = []
        for i, event in self.table_events:
            if isinstance(event, TenantBinding):
                self.emit(i, a.update(event, self._raw(i), self.source(i)))
            else:
                rest.append((i, event))
        self.table_events = rest
        index: dict[Tenant, int] = {UNATTRIBUTED: 0}
        out = np.zeros(len(rows), np.int64)
        for key, members in self._processes(rows).items():
            tenants, at = a.bindings.lookup_many(*key, self.ts[rows[members]])
            if tenants:
                ids = np.array([index.setdefault(t, len(index)) for t in tenants], np.int64)
                out[members] = np.where(at >= 0, ids[at], 0)
        self.tenants = sorted(index, key=index.__getitem__)
        return out

    def _apply_in_order(self, at_rows: np.ndarray, closing: PaneColumns, placed: Sequence[int] = ()) -> None:
        """Closes and prices in arrival order: a price reaches only the closes after it.

        Each pane takes the price in
        force at its closing row; then every pane closes in one ``Auditor.close_many``, whose
        records come as blocks cut at each price and wherever another output of the batch lies
        between two closes or will be (``placed``: the late kernels' and the settles' rows; a close at a row with
        another output, a GPU's settled revisions, after it), so that expanding each block where it stands gives the
        row path's order.
        """
        prices = []
        for i, event in self.table_events:
            if isinstance(event, Price):
                prices.append((i, event))
            else:
                self.emit(i, self.a.update(event, self._raw(i), self.source(i)))
        others = np.unique(np.array([*(row for row, _, _ in self.out), *placed], np.int64))
        order = np.lexsort((closing.pane_start_ns, at_rows))  # by closing row, a row's panes oldest first
        rows, closing = at_rows[order], closing.take(order)
        price_rows = np.array([i for i, _ in prices], np.int64)
        # a close at a row with another output comes after it (a GPU's pending panes, settled before its sample)
        run = np.searchsorted(price_rows, rows) * (len(others) + 1) + np.searchsorted(others, rows, "right")
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
