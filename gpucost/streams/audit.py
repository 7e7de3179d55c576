"""The whole audit as one pure operator: events in, records out, in event time.

Every transport (the embedded run, ``gpucost.embedded``; the Kafka worker, ``gpucost.kafka.worker``, one
auditor per message key) drives this same class, so they cannot disagree. No I/O, no clock: the only inputs are the
events and the settings.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa

from gpucost.schemas.blocks import ClosedPanes, Outputs
from gpucost.schemas.codec import Rejected, raw_text
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
from gpucost.streams.audit_state import AuditState
from gpucost.streams.columnar import ingest_arrow, ingest_batch, ingest_lines
from gpucost.streams.late_data import LateData
from gpucost.streams.operator import Closing, ClosingMany, EventOperator, PaneOperator
from gpucost.streams.pane_totals import PaneColumns, PaneTotals
from gpucost.streams.scope import Scope, decode_in_scope

__all__ = ["Auditor"]


class Auditor(LateData, AuditState):
    """Routes each event to the operator that owns it and collects what closes.

    ``counts`` tallies accepted events by kind, each dead-letter reason, ``unbilled``
    (process samples and NUMA events in a pane without any GPU sample, so with no covered
    time to bill) and ``unpriced_panes``.

    ``clock`` (epoch ns) is the only use of processing time, and only to refuse: an event
    more than ``max_future_s`` ahead of it is dead-lettered (``future_timestamp``), since
    accepting it would move its GPU's watermark past every true event. Without a clock
    (the pure tests) there is no such check.

    ``ebpf_trace`` events are judged late like the GPU-keyed kinds but move no watermark; a ``blas``
    trace's FLOPs join its pane for the efficiency records.

    Late data within the revision horizon revise closed panes (``gpucost.streams.revisions``): the event is
    taken (counted under its kind and ``revised_by_late``), the pane recomputed, and the records that changed
    published as differences with the pane's next revision number. A binding re-attributes the samples it
    covers in open panes as well as closed ones, so a process's tenant is its binding as of each sample's
    time, whatever order they arrive in. An allocation does the same to the allocation basis's records.
    """

    @property
    def pane_operators(self) -> list[PaneOperator]:
        """The operators on closed panes (``gpucost.streams.operator``), in the order their records of a pane
        are published: both close paths walk this one list."""
        return [self.cost, self.allocations, self.kernels, self.sla, self.efficiency, self.health]

    @property
    def event_operators(self) -> list[EventOperator[Any]]:
        """The operators on events (``gpucost.streams.operator``), each owning the events of its kinds: the
        panes, the MAE windows, the revision log, the bindings, the prices, the allocations and the kernels."""
        return [
            self.panes,
            self.mae,
            self.revisions,
            self.bindings,
            self.prices,
            self.allocations.table,
            self.kernels.log,
        ]

    def update(self, event: Event, raw: str | bytes | None = None, source: str = "") -> list[Output]:
        """Take one valid event; ``raw``/``source`` only label its dead letter if it has one."""
        if ahead := self._from_future(event, raw, source):
            return ahead
        if isinstance(event, (GpuSample, ProcessSample, NumaEvent)):
            return self._gpu_keyed(event, raw, source)
        if isinstance(event, KernelActivity):
            return self._kernel(event, raw, source, self.panes.watermark(event.gpu_uuid))
        if isinstance(event, EbpfTrace):
            if self.panes.is_late(event.gpu_uuid, event.ts_ns):
                return [self.late_letter(event, raw, source, self.panes.watermark(event.gpu_uuid))]
            if self.panes.admit(event) is not None:
                return [self.duplicate_letter(event, raw, source)]
            self.panes.take(event)
        if isinstance(event, MemAccess):
            if (why := self.mae.admit(event)) is not None:
                latest = self.mae.taken.latest((event.node_id, event.pid))
                return [self.address_letter(event, raw, source, why, latest)]
            self.counts[event.kind] += 1
            rec = self.mae.take(event)
            return [rec] if rec is not None else []
        if isinstance(event, TenantBinding):
            return self._binding(event, raw, source)
        if isinstance(event, Allocation):
            return self._allocation(event, raw, source)
        elif isinstance(event, Price):
            if self.prices.admit(event) is not None:
                return [
                    self._dead(
                        "duplicate",
                        event,
                        raw,
                        source,
                        f"a price of {event.gpu_model} at ts_ns {event.ts_ns} was already taken; "
                        "send a correction with a later ts_ns",
                    )
                ]
            self.prices.take(event)
        elif not isinstance(event, EbpfTrace):
            raise TypeError(f"not an event: {event!r}")
        self.counts[event.kind] += 1
        return []

    def late_kernel(
        self, event: KernelActivity, raw: str | bytes | None, source: str, watermark_ns: int | None
    ) -> list[Output]:
        """``update`` of a kernel whose pane had closed at its row, which the batch path takes after its batch's
        closes (``gpucost.streams.batch_kernels``): judged by ``watermark_ns``, its GPU's watermark at its row,
        since the state's has moved on with the batch."""
        return self._from_future(event, raw, source) or self._kernel(event, raw, source, watermark_ns)

    def _from_future(self, event: Event, raw: str | bytes | None, source: str) -> list[Output]:
        """The dead letter of an event too far ahead of the clock (none without a clock)."""
        if self.clock is not None and event.ts_ns > (now := self.clock()) + self.settings.max_future_ns:
            return [self.future_letter(event, raw, source, now)]
        return []

    def ingest(self, line: str | bytes | dict[str, Any], source: str, scope: Scope | None = None) -> list[Output]:
        """Take one raw line: a dead letter if it is not a valid event, or not one ``scope`` lets its
        message carry; else as ``update``."""
        decoded = decode_in_scope(line, scope)
        if isinstance(decoded, Rejected):
            return [self.reject(decoded, raw_text(line), source)]
        # a dead letter of a valid event keeps the line as it came; a Parquet row, re-encoded
        return self.update(decoded, None if isinstance(line, dict) else line, source)

    def ingest_batch(self, batch: pa.RecordBatch, source: Callable[[int], str]) -> Outputs:
        """``ingest`` of every row of an Arrow batch of ``EVENT_SCHEMA`` (row ``i`` labelled ``source(i)``):
        the same outputs and state, an order of magnitude faster (``gpucost.streams.columnar``). Closed
        panes' records come as blocks of columns; ``gpucost.schemas.blocks.expand`` makes them records."""
        return ingest_batch(self, batch, source)

    def ingest_arrow(
        self, batches: Sequence[pa.RecordBatch], source: Callable[[int], str], scope: Scope | None = None
    ) -> Outputs:
        """``ingest`` of each row of Arrow messages' batches (row ``i`` of them all labelled ``source(i)``)."""
        return ingest_arrow(self, batches, source, scope)

    def ingest_lines(self, lines: Sequence[bytes], source: Callable[[int], str], scope: Scope | None = None) -> Outputs:
        """``ingest`` of each JSON line (line ``i`` labelled ``source(i)``), through the batch path."""
        return ingest_lines(self, lines, source, scope)

    def _gpu_keyed(
        self, event: GpuSample | ProcessSample | NumaEvent, raw: str | bytes | None, source: str
    ) -> list[Output]:
        """A sample or NUMA event of a GPU, after its panes that late kernels left pending are republished."""
        settled = self.settle_kernels((event.gpu_uuid,)) if self.kernels.log.is_pending(event.gpu_uuid) else []
        return settled + self._sample(event, raw, source)

    def _sample(
        self, event: GpuSample | ProcessSample | NumaEvent, raw: str | bytes | None, source: str
    ) -> list[Output]:
        gpu = event.gpu_uuid
        if self.panes.is_late(gpu, event.ts_ns):
            if self.revisable(event.ts_ns, self.panes.watermark(gpu)):
                return self._revise(event, raw, source)
            return [self.late_letter(event, raw, source, self.panes.watermark(gpu))]
        refused = self.panes.admit(event)
        if refused == "duplicate":
            return [self.duplicate_letter(event, raw, source)]
        if refused == "overlap":
            return [self.overlap_letter(event, raw, source)]  # type: ignore[arg-type]  # never of a NUMA event
        self.counts[event.kind] += 1
        if isinstance(event, GpuSample):
            self.panes.take(event)
        else:
            self.panes.take(event, self.bindings.lookup(event.node_id, event.pid, event.ts_ns))
        self.revisions.take(event)  # with revisions off too: a late binding re-attributes open panes' samples
        out = self.close(self.panes.advance(gpu, event.ts_ns))
        self.prune_gpu(gpu)
        return out

    def close_silent(
        self, watermark_ns: int, only: Container[str | tuple[str, int]] | None = None, forget: bool = True
    ) -> list[Output]:
        """The records of panes that ``settings.idle_timeout_s`` of event time has passed by: a GPU that went
        silent (taken off the fleet, its node down) while ``watermark_ns``, the largest of its partition
        (Kafka) or run (embedded), moved on; of the GPUs in ``only``, if given (those the caller has not
        heard from for a while). Without this its last panes would stay open, unbilled, until an end of
        input that may never come. The same for the MAE windows of processes gone silent (``(node_id, pid)``
        in ``only``), against the later of ``watermark_ns`` and the last address of any open window: each
        partial window is published as at an end of input. A GPU silent for longer than the idle window loses
        its window (``IdleIndex.expire``); one silent for the idle window or the revision horizon, whichever is
        longer, past the timeout is forgotten (``GpuPanes.forget``; unless ``forget`` is false: a finite replay of
        one file after another, whose later files start back in time), so that the state does not grow
        with every GPU the fleet ever had. docs/definitions.md ("Readings of the contract") exempts this rule from
        cross-path equality: it
        depends on what shares the partition."""
        timeout = self.settings.idle_timeout_ns
        # the pending panes of the GPUs silent in event time too (as the Kafka worker asks only such a key): kernels
        # move no watermark, so a GPU whose kernels are replayed after its samples is not settled at every look
        out = self.settle_kernels(
            [
                gpu
                for gpu in self.kernels.log.pending_gpus()
                if (only is None or gpu in only)
                and (w := self.panes.watermark(gpu)) is not None
                and w + timeout < watermark_ns
            ]
        )
        closed = self.panes.close_silent(watermark_ns, timeout, only)
        if closed:
            self.counts["silent_closes"] += len(closed)
            out += self.close(closed)
            for gpu in {p.gpu_uuid for p in closed}:
                self.prune_gpu(gpu)
        out += self.health.close_silent(watermark_ns, timeout, only)
        if windows := self.mae.close_silent(max([watermark_ns, *self.mae.latest_ns().values()]), timeout, only):
            self.counts["mae_silent_closes"] += len(windows)
            out += windows
        self.idle.expire(watermark_ns, only)
        if not forget:
            return out
        floor = watermark_ns - timeout - max(self.settings.window_ns, self.settings.revision_horizon_ns)
        forgotten = self.panes.forget(floor, only)
        self.mae.forget(floor, only)
        unbilled = 0
        for gpu in forgotten:
            self.revisions.drop(gpu)
            unbilled += self.kernels.log.drop(gpu)
            self.sla.drop(gpu)
            self.allocations.table.drop(gpu)
        if forgotten:
            self.counts["forgotten_gpus"] += len(forgotten)
        # kernels of a GPU that never sent a sample (a collector's wrong gpu_uuid), as far back as a GPU is forgotten:
        # a live run never ends, and they would be kept for ever
        unbilled += self.kernels.log.unsampled(self.panes.latest_ns(), floor, only)
        if unbilled:
            self.counts["unbilled_kernels"] += unbilled
        return out

    def latest_ns(self) -> int | None:
        """The largest event time here that a silent close is measured against: the largest watermark of a
        GPU, or, where there is none (a process's addresses alone: a Kafka key of ``mem_access``), the last
        address of an open MAE window."""
        watermark, addresses = self.panes.largest_watermark(), self.mae.latest_ns().values()
        return max([*([] if watermark is None else [watermark]), *addresses], default=None)

    def heard_ns(self) -> dict[str | tuple[str, int], int]:
        """Each GPU's largest event time taken (of a GPU without samples, its kernels' latest start) and each open MAE
        window's last address, by GPU id or (node, pid):
        what a transport watches, on its own clock, to tell a GPU or process gone silent (``close_silent``'s
        ``only``) from one whose events are only behind."""
        heard: dict[str | tuple[str, int], int] = {}
        heard.update(self.panes.latest_ns())
        heard.update(self.mae.latest_ns())
        # a GPU of which only kernels came (its samples may still come, or never): heard as its kernels' latest start
        heard.update(self.kernels.log.latest_starts(self._kernels_only()))
        return heard

    # --- what a transport reads of the state, so that none reaches into the operators --------------

    def largest_watermark(self) -> int | None:
        """The largest watermark of any GPU here (None: none yet)."""
        return self.panes.largest_watermark()

    def smallest_watermark(self) -> int | None:
        """The smallest watermark of any GPU here (None: none yet)."""
        return self.panes.smallest_watermark()

    def holds_unsampled_kernels(self) -> bool:
        """Whether kernels of a GPU that never sent a sample are kept here: a Kafka key of such a GPU has no
        watermark, and its silent close (``gpucost.streams.silence.close_partition``) is what drops them."""
        return bool(self._kernels_only())

    def _kernels_only(self) -> list[str]:
        """The GPUs whose kernels are kept here and which never sent a sample."""
        sampled = self.panes.latest_ns()
        return [gpu for gpu in self.kernels.log.gpus() if gpu not in sampled]

    def kernel_revisions_pending(self) -> frozenset[str]:
        """The GPUs with panes late kernels left pending (``settle_kernels``): the batch path republishes them at
        such a GPU's next sample that decodes, before its outputs, as the row path does (``batch_kernels``)."""
        return self.kernels.log.pending_gpus()

    def open_panes(self) -> int:
        """Panes counted and not yet billed, over every GPU."""
        return self.panes.open_count()

    @property
    def idle_changes(self) -> int:
        """How many times the idle windows changed (a pane rolled in, a window expired): a transport writes
        them, most of a GPU's state, again only when this moved (``to_state(idle=False)``, ``idle_state``)."""
        return self.idle.rolls

    def idle_state(self) -> dict[str, Any]:
        """The idle windows' snapshot, which ``to_state(idle=False)`` leaves out."""
        return self.idle.to_state()

    def finish(self) -> list[Output]:
        """End of a finite input: republish the panes late kernels left pending, then close every pane, every
        health window and every MAE window."""
        settled = self.settle_kernels()
        out = settled + self.close(self.panes.close_all()) + self.health.finish() + list(self.mae.finish())
        # of GPUs that sent no sample (a collector's wrong gpu_uuid), then of panes never billed: counted once
        if unbilled := self.kernels.log.unsampled(self.panes.latest_ns()) + self.kernels.log.unbilled():
            self.counts["unbilled_kernels"] += unbilled
        return out

    def close(self, panes: list[PaneTotals], prices: list[Decimal | None] | None = None) -> list[Output]:
        """The records of closed panes, at ``prices`` (one per pane) or else the prices in force now: each
        pane's idle index, its cost split, then the health records of the windows it closes."""
        out: list[Output] = []
        if panes and self.on_closed is not None:
            self.on_closed(PaneColumns.of(panes))
        for i, pane in enumerate(panes):
            idle = self.idle.on_close(pane)
            if idle is None:
                self.counts["unbilled"] += pane.tenant_events
                self.revisions.hold(pane.gpu_uuid, pane.pane_start_ns, None, False)
                continue
            out.append(idle)
            assert pane.gpu_model is not None
            price = self.prices.lookup(pane.gpu_model, pane.pane_start_ns) if prices is None else prices[i]
            self.revisions.hold(pane.gpu_uuid, pane.pane_start_ns, price, True)
            if price is None:
                self.counts["unpriced_panes"] += 1
            closing = Closing(pane, price, idle)
            for operator in self.pane_operators:
                out.extend(operator.on_close(closing))
        return out

    def prices_now(self, gpu_models: np.ndarray, pane_starts_ns: np.ndarray) -> list[Decimal | None]:
        """The price in force now for each GPU model as of its pane's start, as ``close`` looks it
        up (None for a pane without GPU samples, which is not billed)."""
        return self.prices.lookup_many(gpu_models, pane_starts_ns).tolist()  # type: ignore[no-any-return]

    def close_many(
        self, panes: PaneColumns, prices: list[Decimal | None], cuts: Sequence[int] = ()
    ) -> list[ClosedPanes | None]:
        """``close`` of many panes at once, at the prices ``prices_now`` gave when each would have
        closed: the records of the panes between two ``cuts`` as one block of columns (None if
        none of them had GPU samples). Each GPU's panes must come in ascending order."""
        if len(panes) and self.on_closed is not None:
            self.on_closed(panes)
        # numpy compares an object column with None elementwise; its stubs accept no None
        billed = np.not_equal(panes.node_id, None) & np.not_equal(panes.gpu_model, None)  # type: ignore[call-overload]
        for events in panes.tenant_events[~billed].tolist():
            self.counts["unbilled"] += events
        if self.revisions.enabled:
            self.revisions.hold_many(
                panes.gpu_uuid.tolist(),
                panes.pane_start_ns.tolist(),
                [price if ok else None for price, ok in zip(prices, billed.tolist())],
                billed.tolist(),
            )
        bounds = np.concatenate([[0], np.cumsum(billed)])[[0, *cuts, len(panes)]].tolist()
        if not billed.all():
            panes = panes.take(np.flatnonzero(billed))
            prices = [price for price, ok in zip(prices, billed.tolist()) if ok]
        if unpriced := sum(price is None for price in prices):
            self.counts["unpriced_panes"] += unpriced
        if not len(panes):
            return [None] * (len(bounds) - 1)
        closing = ClosingMany(panes, prices, self.idle.close_many(panes))
        block = ClosedPanes(closing.idle, tuple(operator.close_many(closing) for operator in self.pane_operators))
        return [block.slice(lo, hi) if hi > lo else None for lo, hi in zip(bounds, bounds[1:])]
