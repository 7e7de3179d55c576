"""Late data become revisions (docs/definitions.md, "Late data become revisions"): what the audit keeps of each GPU's
panes for the revision horizon ``R``, from which a pane is recomputed (what is then published of it:
``gpucost.streams.differences``).

Why a log of rows, not the pane sums: a late binding moves a process's samples from one tenant to another,
and only the samples say which (a binding can start mid-pane). So every accepted GPU sample, process sample
and NUMA event of a pane that is open, or closed within ``R`` of its GPU's watermark, is kept here as one row
of integers (``LOG``; 41 bytes, against the ~1 KB of the JSON event), and a pane is recomputed from its rows
and the bindings in force: that is "a recomputation over all events in event-time order" by construction, and
what duplicate and overlap checks of a late event need. Beyond ``R`` rows are dropped, so the state per GPU
is bounded by ``R`` and the sampling rate (BENCHMARKS.md gives the bytes).

``Revisions`` is an event operator (``gpucost.streams.operator.EventOperator``): its row entry (``admit``, then
``take``) and batch entry (``take_many``) keep the same log; the rest is
read when a late event or a late binding arrives, which is rare, so it goes one event at a time.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from decimal import Decimal
from itertools import takewhile
from operator import itemgetter
from typing import Any

import numpy as np

from gpucost.schemas.events import GpuSample, NumaEvent, ProcessSample, six_places
from gpucost.streams.pane_rules import (
    GPU,
    KINDS,
    NUMA,
    PROC,
    energy_uj,
    gpu_sums,
    model_order,
    numa_sum,
    overlaps,
    process_sums,
)
from gpucost.streams.pane_totals import PaneRows, PaneTotals, TenantTotals, nearest_gap
from gpucost.streams.settings import AuditSettings
from gpucost.streams.tables import UNATTRIBUTED, BindingTable

__all__ = ["LOG", "Held", "Revisions"]

#: one accepted GPU-keyed event as the log keeps it: its pane's start, time, kind (``panes.KINDS``), pid (-1
#: for a GPU sample), node and model (indices into the GPU's names), and the integers the pane sums; ``extra``
#: is a NUMA event's hops · latency_weight and a GPU sample's energy, power_mw · interval_ms (µJ; the weights
#: fit reads a revised pane's power)
LOG = np.dtype(
    [
        ("pane", "<i8"),
        ("ts", "<i8"),
        ("kind", "i1"),
        ("pid", "<i8"),
        ("node", "<i4"),
        ("model", "<i4"),
        ("interval", "<i8"),
        ("sm", "<i4"),
        ("bw", "<i4"),
        ("extra", "<i8"),
    ],
    align=False,
)


#: the most chunks a GPU's log keeps after a prune before it joins them: a prune looks at every chunk
MAX_CHUNKS = 16


@dataclass
class Held:
    """A closed pane within the horizon: the price it was billed at (fixed at its first publication: prices
    do not revise) and its revision number (None: never published, having had no GPU sample)."""

    price: Decimal | None = None
    revision: int | None = None


class _GpuLog:
    """One GPU's rows: numpy chunks (one per batch), rows of the row entry pending, and the names they index."""

    __slots__ = ("names", "index", "chunks", "pending", "oldest")

    def __init__(self) -> None:
        self.names: list[str] = []
        self.index: dict[str, int] = {}
        self.chunks: list[np.ndarray] = []
        self.pending: list[tuple[int, ...]] = []
        self.oldest: int | None = None  # the earliest pane start of any row: pruning does nothing until it is passed

    def took(self, pane_start_ns: int) -> None:
        if self.oldest is None or pane_start_ns < self.oldest:
            self.oldest = pane_start_ns

    def name(self, value: str | None) -> int:
        if value is None:
            return -1
        at = self.index.get(value)
        if at is None:
            at = self.index[value] = len(self.names)
            self.names.append(value)
        return at

    def rows(self) -> np.ndarray:
        """Every row, as one array (the chunks and pending rows joined, once)."""
        if self.pending:
            self.chunks.append(np.array(self.pending, LOG))
            self.pending = []
        if len(self.chunks) != 1:
            self.chunks = [np.concatenate(self.chunks) if self.chunks else np.zeros(0, LOG)]
        return self.chunks[0]

    def prune(self, floor_ns: int) -> None:
        """Drop the rows of panes starting before ``floor_ns``, copying only the chunks that hold any; the rest keep
        their order (a prune once joined the whole horizon of rows at each pane a GPU closed: a tenth of a replay)."""
        if self.pending:
            self.chunks.append(np.array(self.pending, LOG))
            self.pending = []
        kept: list[np.ndarray] = []
        for chunk in self.chunks:
            if len(chunk) and chunk["pane"].min() < floor_ns:
                chunk = chunk[chunk["pane"] >= floor_ns]
            if len(chunk):
                kept.append(chunk)
        if len(kept) > MAX_CHUNKS:  # the row entry adds a chunk of its pending rows at every prune: joined now and then
            kept = [np.concatenate(kept)]
        self.chunks = kept
        self.oldest = min((int(c["pane"].min()) for c in kept), default=None)

    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.chunks) + len(self.pending) * LOG.itemsize


def _put(held: dict[int, Held], start: int, value: Held) -> Held:
    """Keep ``value`` as the pane of ``start`` in ``held``, whose keys stay ascending so that a prune drops a prefix:
    panes close in order, so a pane before the last (a closed pane met first by a late event) is rare, and re-sorts."""
    out_of_order = bool(held) and start not in held and start < next(reversed(held))
    held[start] = value
    if out_of_order:
        ordered = sorted(held.items())
        held.clear()
        held.update(ordered)
    return value


class Revisions:
    """The log of every GPU's open and recently closed panes, and the closed panes ``Held``."""

    def __init__(self, settings: AuditSettings) -> None:
        self.horizon_ns = settings.revision_horizon_ns
        self.pane_ns = settings.pane_ns
        self.idle_threshold_cp = settings.idle_threshold_cp
        self._logs: dict[str, _GpuLog] = {}
        #: each GPU's closed panes within the horizon, by start in ascending order (``_put``)
        self._held: dict[str, dict[int, Held]] = {}

    @property
    def enabled(self) -> bool:
        return self.horizon_ns > 0

    def reaches(self, pane_end_ns: int, watermark_ns: int | None) -> bool:
        """Whether a closed pane ending at ``pane_end_ns`` is within the horizon of its GPU's watermark."""
        return self.enabled and watermark_ns is not None and watermark_ns - pane_end_ns <= self.horizon_ns

    # --- the log: a row entry and a batch entry ------------------------------------------------------

    def take(self, e: GpuSample | ProcessSample | NumaEvent) -> None:
        """The row entry: an accepted event joins its pane's rows."""
        log = self._logs.setdefault(e.gpu_uuid, _GpuLog())
        pane = e.ts_ns - e.ts_ns % self.pane_ns
        if isinstance(e, GpuSample):
            row = (
                pane,
                e.ts_ns,
                GPU,
                -1,
                log.name(e.node_id),
                log.name(e.gpu_model),
                e.interval_ms,
                e.sm_util_cp,
                e.mem_bw_util_cp,
                energy_uj(e.power_mw, e.interval_ms),
            )
        elif isinstance(e, ProcessSample):
            row = (
                pane,
                e.ts_ns,
                PROC,
                e.pid,
                log.name(e.node_id),
                -1,
                e.interval_ms,
                e.sm_util_cp,
                e.mem_bw_util_cp,
                0,
            )
        else:
            row = (pane, e.ts_ns, NUMA, e.pid, log.name(e.node_id), -1, 0, 0, 0, numa_sum(e.hops, e.latency_weight))
        log.pending.append(row)
        log.took(pane)

    def take_many(self, rows: PaneRows, accepted: np.ndarray) -> None:
        """The batch entry: a batch's accepted GPU samples, process samples and NUMA events join their panes' rows."""
        keep = accepted & (rows.kind <= NUMA)
        for j, name in enumerate(rows.names):
            at = np.flatnonzero(keep[rows.starts[j] : rows.ends[j]]) + rows.starts[j]
            if not len(at):
                continue
            log = self._logs.setdefault(name, _GpuLog())
            # the names the rows use, registered in the order the row entry meets them (node, then model)
            span = len(rows.node_names)
            model = np.where((rows.kind[at] == GPU) & (rows.model[at] >= 0), rows.model[at], -1)  # a GPU sample's alone
            seen = np.column_stack([rows.node[at], np.where(model >= 0, model + span, -1)]).ravel()
            used, first = np.unique(seen[seen >= 0], return_index=True)
            codes = np.full(span + len(rows.model_names) + 1, -1, np.int32)  # by batch code; -1 (none) last
            for code in used[np.argsort(first)].tolist():
                codes[code] = log.name(rows.node_names[code] if code < span else rows.model_names[code - span])
            node_codes, model_codes = codes[:span].tolist() + [-1], codes[span:-1].tolist() + [-1]
            node_codes, model_codes = np.array(node_codes, np.int32), np.array(model_codes, np.int32)
            chunk = np.zeros(len(at), LOG)
            ts = rows.ts_ns[at]
            chunk["pane"], chunk["ts"] = ts - ts % self.pane_ns, ts
            chunk["kind"], chunk["pid"] = rows.kind[at], rows.pid[at]
            chunk["node"], chunk["model"] = node_codes[rows.node[at]], model_codes[model]
            energy = energy_uj(rows.power_mw[at].astype(np.int64), rows.interval_ms[at])
            chunk["interval"], chunk["sm"], chunk["bw"], chunk["extra"] = (
                rows.interval_ms[at],
                rows.sm_cp[at],
                rows.bw_cp[at],
                rows.numa[at] + energy,
            )
            if log.pending:
                log.rows()
            log.chunks.append(chunk)
            log.took(int(chunk["pane"].min()))

    def hold(self, gpu_uuid: str, pane_start_ns: int, price: Decimal | None, billed: bool) -> None:
        """A pane closed: billed at ``price`` (revision 0), or, with no GPU sample, not yet published."""
        self.hold_many([gpu_uuid], [pane_start_ns], [price], [billed])

    def hold_many(
        self, gpu_uuids: list[str], pane_starts_ns: list[int], prices: list[Decimal | None], billed: list[bool]
    ) -> None:
        """The batch entry: ``hold`` of each closed pane."""
        if not self.enabled:
            return
        held_of = self._held
        for gpu, start, price, ok in zip(gpu_uuids, pane_starts_ns, prices, billed):
            held = held_of.get(gpu)
            if held is None:
                held = held_of[gpu] = {}
            _put(held, start, Held(price, 0) if ok else Held())

    def held(self, gpu_uuid: str, pane_start_ns: int) -> Held:
        """The closed pane's record (a closed pane that had no event at all gets one now)."""
        held = self._held.setdefault(gpu_uuid, {})
        found = held.get(pane_start_ns)
        if found is None:
            found = _put(held, pane_start_ns, Held())
        return found

    def published(self, gpu_uuid: str, after_ns: int) -> list[int]:
        """The starts of the GPU's closed panes within the horizon that were published and end after ``after_ns``,
        ascending: the panes a late allocation of that time may revise."""
        held = self._held.get(gpu_uuid, {})
        return sorted(s for s, h in held.items() if h.revision is not None and s + self.pane_ns > after_ns)

    def prune(self, gpu_uuid: str, watermark_ns: int | None) -> None:
        """Forget the GPU's panes that ended more than the horizon before its watermark."""
        if watermark_ns is None:
            return
        floor = watermark_ns - self.horizon_ns - self.pane_ns  # a pane starting before this ended beyond R
        held = self._held.get(gpu_uuid)
        if held and next(iter(held)) < floor:  # by start (``_put``): those to drop come first
            for start in list(takewhile(lambda start: start < floor, held)):
                del held[start]
        log = self._logs.get(gpu_uuid)
        if log is not None and log.oldest is not None and log.oldest < floor:
            log.prune(floor)

    def drop(self, gpu_uuid: str) -> None:
        """Forget a GPU gone from the fleet (``GpuPanes.forget``): no event of it revises any more."""
        self._logs.pop(gpu_uuid, None)
        self._held.pop(gpu_uuid, None)

    # --- what a late event meets -------------------------------------------------------------------

    def _pane_rows(self, gpu_uuid: str, pane_start_ns: int) -> tuple[np.ndarray, list[str]]:
        log = self._logs.get(gpu_uuid)
        if log is None:
            return np.zeros(0, LOG), []
        rows = log.rows()
        return rows[rows["pane"] == pane_start_ns], log.names

    def admit(self, e: GpuSample | ProcessSample | NumaEvent) -> str | None:
        """``duplicate`` or ``overlap`` for a late event against its closed pane's rows, as ``GpuPanes.admit``
        judges an on-time one against an open pane; None if it is taken."""
        rows, _ = self._pane_rows(e.gpu_uuid, e.ts_ns - e.ts_ns % self.pane_ns)
        pid = -1 if isinstance(e, GpuSample) else e.pid
        same = rows[(rows["kind"] == KINDS.index(e.kind)) & (rows["pid"] == pid)]
        gap = nearest_gap(sorted(same["ts"].tolist()), e.ts_ns)
        if gap == 0:
            return "duplicate"
        if gap is not None and not isinstance(e, NumaEvent) and overlaps(gap, e.interval_ms):
            return "overlap"
        return None

    def touched_by(self, node_id: str, pid: int, ts_ns: int) -> list[tuple[str, int]]:
        """(GPU, pane start) of every logged pane with a row of process ``(node_id, pid)`` at or after
        ``ts_ns``: the panes a binding of that time may re-attribute, by GPU then pane (whatever order the GPUs
        came in: the records they revise come in this order)."""
        out = []
        for gpu, log in sorted(self._logs.items()):
            node = log.index.get(node_id)
            if node is None:
                continue
            rows = log.rows()
            hit = rows[(rows["node"] == node) & (rows["pid"] == pid) & (rows["kind"] != GPU) & (rows["ts"] >= ts_ns)]
            out += [(gpu, int(s)) for s in np.unique(hit["pane"]).tolist()]
        return out

    def gpus_of(self, node_id: str) -> list[str]:
        """The GPUs whose log has ever held a row of node ``node_id`` (until the GPU is forgotten): whose
        watermarks say how far a binding of that node lies behind."""
        return [gpu for gpu, log in self._logs.items() if node_id in log.index]

    def totals(self, gpu_uuid: str, pane_start_ns: int, bindings: BindingTable) -> PaneTotals:
        """The pane recomputed from its rows, each process row's tenant as of its time among ``bindings``:
        the sums the idle index, the cost split and the weights fit read (not the other health or efficiency sums,
        which do not revise)."""
        rows, names = self._pane_rows(gpu_uuid, pane_start_ns)
        pane = PaneTotals(gpu_uuid, pane_start_ns, pane_start_ns + self.pane_ns)
        gpu = rows[rows["kind"] == GPU]
        if len(gpu):
            pane.node_id = min(names[n] for n in set(gpu["node"].tolist()))
            pane.gpu_model = min((names[m] for m in set(gpu["model"].tolist())), key=model_order)
            covered, idle, busy, _ = gpu_sums(
                gpu["interval"].astype(object), gpu["sm"].astype(object), 0, self.idle_threshold_cp
            )  # energy: logged as each row's ``extra``
            pane.covered_ms, pane.idle_ms, pane.busy_cp_ms = int(covered.sum()), int(idle.sum()), int(busy.sum())
            pane.energy_uj = int(gpu["extra"].astype(object).sum())
        tenant_rows = rows[rows["kind"] != GPU]
        pane.tenant_events = len(tenant_rows)
        sums: dict[str, TenantTotals] = {}
        for kind, pid, node, ts, interval, sm, bw, numa in zip(
            *(tenant_rows[f].tolist() for f in ("kind", "pid", "node", "ts", "interval", "sm", "bw", "extra"))
        ):
            tenant = bindings.lookup(names[node], pid, ts)
            t = sums.get(tenant.key)
            if t is None:
                t = sums[tenant.key] = TenantTotals(tenant)
            if kind == PROC:
                sm_ms, bw_ms = process_sums(interval, sm, bw)
                t.sm += sm_ms
                t.bw += bw_ms
                t.samples += 1
                pane.placed += tenant != UNATTRIBUTED
            else:
                t.numa += numa
        pane.tenants = dict(sorted(sums.items()))
        return pane

    # --- state ----------------------------------------------------------------------------------

    def nbytes(self, gpu_uuid: str) -> int:
        """The log's bytes for one GPU (the benchmark's figure; ``Held`` adds a few dozen per pane)."""
        log = self._logs.get(gpu_uuid)
        return 0 if log is None else log.nbytes()

    def to_state(self) -> dict[str, Any]:
        return {
            "logs": {
                g: [log.names, base64.b64encode(log.rows().tobytes()).decode()] for g, log in sorted(self._logs.items())
            },
            "held": {
                g: [[s, None if h.price is None else str(h.price), h.revision] for s, h in sorted(held.items())]
                for g, held in sorted(self._held.items())
            },
        }

    @classmethod
    def from_state(cls, state: dict[str, Any], settings: AuditSettings) -> Revisions:
        revisions = cls(settings)
        for gpu, (names, data) in state["logs"].items():
            log = revisions._logs[gpu] = _GpuLog()
            for name in names:
                log.name(name)
            log.chunks = [np.frombuffer(base64.b64decode(data), LOG).copy()]
            if len(log.chunks[0]):
                log.oldest = int(log.chunks[0]["pane"].min())
        revisions._held = {
            g: {
                s: Held(None if p is None else six_places(Decimal(p)), r) for s, p, r in sorted(held, key=itemgetter(0))
            }
            for g, held in state["held"].items()
        }
        return revisions
