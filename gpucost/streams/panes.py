"""Per-GPU panes and watermarks: running totals per (GPU, pane), closed in event time.

A GPU's watermark is the largest ``ts_ns`` seen for it minus the allowed lateness; pane
``[s, e)`` closes once the watermark reaches ``e``. An event whose pane has closed is late.

``GpuPanes`` is an event operator (``gpucost.streams.operator.EventOperator``): its row entry is here
(``is_late``, ``admit``, ``take``, ``advance``: one event) and its
batch entry in ``gpucost.streams.pane_batch`` (``judge_many`` then ``add_many``: a batch's rows as
columns), over the same state; the rules both apply are in ``gpucost.streams.pane_rules``.
"""

from __future__ import annotations

from collections.abc import Container
from typing import Any

from gpucost.schemas.events import EbpfTrace, GpuSample, NumaEvent, ProcessSample
from gpucost.streams.pane_batch import PaneBatch
from gpucost.streams.pane_rules import (
    first_model,
    first_name,
    gpu_sums,
    jump,
    numa_sum,
    overlaps,
    pane_closed,
    pane_start_ns,
    process_sums,
    still_pending,
)
from gpucost.streams.pane_totals import PaneTotals
from gpucost.streams.settings import AuditSettings
from gpucost.streams.tables import UNATTRIBUTED, Tenant

__all__ = ["GpuPanes"]


class GpuPanes(PaneBatch):
    """Open panes of every GPU, and the per-GPU event-time watermark that closes them."""

    def __init__(self, settings: AuditSettings) -> None:
        self.pane_ns = settings.pane_ns
        self.lateness_ns = settings.lateness_ns
        self.idle_threshold_cp = settings.idle_threshold_cp
        self.max_jump_ns = settings.max_jump_ns
        self._max_ts: dict[str, int] = {}
        self._pending: dict[str, int] = {}  # each GPU's pending jump (``jump``)
        self._open: dict[str, dict[int, PaneTotals]] = {}
        #: the largest ``max_ts`` of the GPUs forgotten (``forget``): every GPU not known here starts from it
        self._forgotten: int | None = None

    def watermark(self, gpu_uuid: str) -> int | None:
        max_ts = self._max_ts.get(gpu_uuid, self._forgotten)
        return None if max_ts is None else max_ts - self.lateness_ns

    def before_forgotten(self, pane_end_ns: int) -> bool:
        """Whether a pane ending at ``pane_end_ns`` was closed for the GPUs forgotten (``forget``): of any GPU,
        such a pane is never revised, since a GPU forgotten and back holds nothing to check an event
        against, and the pane may have been billed."""
        return self._forgotten is not None and pane_end_ns <= self._forgotten - self.lateness_ns

    def is_late(self, gpu_uuid: str, ts_ns: int) -> bool:
        max_ts = self._max_ts.get(gpu_uuid, self._forgotten)
        return max_ts is not None and pane_closed(ts_ns, max_ts, self.pane_ns, self.lateness_ns)

    def _pane(self, gpu_uuid: str, ts_ns: int) -> PaneTotals:
        start = pane_start_ns(ts_ns, self.pane_ns)
        panes = self._open.setdefault(gpu_uuid, {})
        pane = panes.get(start)
        if pane is None:
            pane = panes[start] = PaneTotals(gpu_uuid, start, start + self.pane_ns)
        return pane

    def admit(self, e: GpuSample | ProcessSample | NumaEvent | EbpfTrace) -> str | None:
        """Why an on-time event is refused, changing nothing: ``duplicate`` (its key and ``ts_ns`` were counted
        already: a ``blas`` trace's too, whose FLOPs would count twice; a ``launch`` trace sums nothing and is
        never one) or ``overlap`` (a sample within three quarters of its interval of a counted one of its
        device; traces never: a process makes many calls a nanosecond apart); None if ``take`` may take it."""
        if isinstance(e, EbpfTrace) and e.trace_source != "blas":
            return None
        pid = -1 if isinstance(e, GpuSample) else e.pid
        pane = self._open.get(e.gpu_uuid, {}).get(pane_start_ns(e.ts_ns, self.pane_ns))
        if pane is not None:
            if pane.holds(e.kind, pid, e.ts_ns):
                return "duplicate"
            if isinstance(e, (GpuSample, ProcessSample)):
                gap = pane.nearest_gap(e.kind, pid, e.ts_ns)
                if gap is not None and overlaps(gap, e.interval_ms):
                    return "overlap"
        return None

    def take(self, e: GpuSample | ProcessSample | NumaEvent | EbpfTrace, tenant: Tenant = UNATTRIBUTED) -> None:
        """The row entry: an on-time event ``admit`` let in joins its pane (opened if need be), remembered
        there for the duplicate and overlap checks; a process sample's and a NUMA event's sums go to
        ``tenant`` (the auditor's lookup among the bindings). None closes here: ``advance`` moves the watermark."""
        if isinstance(e, GpuSample):
            self._gpu_sample(e)
        elif isinstance(e, ProcessSample):
            self._process_sample(e, tenant)
        elif isinstance(e, NumaEvent):
            self._numa_event(e, tenant)
        elif e.trace_source == "blas":  # a launch trace counts threads, which no figure reads: nothing to keep
            pane = self._pane(e.gpu_uuid, e.ts_ns)
            pane.remember(e.kind, e.pid, e.ts_ns)
            pane.flops[e.pid] = pane.flops.get(e.pid, 0) + e.flops_64b

    def _gpu_sample(self, s: GpuSample) -> None:
        pane = self._pane(s.gpu_uuid, s.ts_ns)
        pane.remember(s.kind, -1, s.ts_ns)
        pane.node_id = first_name(pane.node_id, s.node_id)
        pane.gpu_model = first_model(pane.gpu_model, s.gpu_model)
        covered, idle, busy, energy = gpu_sums(s.interval_ms, s.sm_util_cp, s.power_mw, self.idle_threshold_cp)
        pane.covered_ms += covered
        pane.idle_ms += idle
        pane.energy_uj += energy
        pane.busy_cp_ms += busy
        pane.bw_cp_ms += s.mem_bw_util_cp * s.interval_ms
        if s.tensor_active_pct is not None:  # the field first: most GPUs have none, and its cp is a cached property
            pane.tensor_cp_ms += s.tensor_active_cp * s.interval_ms  # type: ignore[operator]
            pane.tensor_ms += s.interval_ms
        if s.dram_active_pct is not None:
            pane.dram_cp_ms += s.dram_active_cp * s.interval_ms  # type: ignore[operator]
            pane.dram_ms += s.interval_ms
        if s.fault_fatal is not None or s.fault_warning is not None:  # the faults the producer found new in it
            pane.fault_samples += 1
            pane.fault_fatal += s.fault_fatal or 0
            pane.fault_warning += s.fault_warning or 0
        if s.power_estimated:
            pane.power_estimated_ms += s.interval_ms

    def _process_sample(self, s: ProcessSample, tenant: Tenant) -> None:
        pane = self._pane(s.gpu_uuid, s.ts_ns)
        pane.remember(s.kind, s.pid, s.ts_ns)
        pane.tenant_events += 1
        pane.placed += tenant != UNATTRIBUTED
        totals = pane.tenant(tenant)
        totals.samples += 1
        sm, bw = process_sums(s.interval_ms, s.sm_util_cp, s.mem_bw_util_cp)
        totals.sm += sm
        totals.bw += bw

    def _numa_event(self, e: NumaEvent, tenant: Tenant) -> None:
        pane = self._pane(e.gpu_uuid, e.ts_ns)
        pane.remember(e.kind, e.pid, e.ts_ns)
        pane.tenant_events += 1
        pane.tenant(tenant).numa += numa_sum(e.hops, e.latency_weight)

    def latest_ns(self) -> dict[str, int]:
        """Each GPU's largest ``ts_ns`` taken, a pending jump included: no watermark here is past it less
        the lateness, whatever the GPU's next events (a bound for ``gpucost.streams.columnar``'s cuts)."""
        return {gpu: max(ts, self._pending.get(gpu, ts)) for gpu, ts in self._max_ts.items()}

    def is_open(self, gpu_uuid: str, pane_start_ns: int) -> bool:
        return pane_start_ns in self._open.get(gpu_uuid, {})

    def retenant(self, recomputed: PaneTotals) -> None:
        """An open pane's tenants as ``recomputed`` has them (a binding arrived after samples it covers:
        ``gpucost.streams.revisions``); its GPU sums and counted times stay."""
        pane = self._open[recomputed.gpu_uuid][recomputed.pane_start_ns]
        pane.tenants, pane.placed = recomputed.tenants, recomputed.placed

    def advance(self, gpu_uuid: str, ts_ns: int) -> list[PaneTotals]:
        """Take ``ts_ns`` into the GPU's watermark (``jump``); return the panes that closed, oldest first."""
        before = self._max_ts.get(gpu_uuid, self._forgotten)
        max_ts, pending = jump(before, self._pending.get(gpu_uuid), ts_ns, self.max_jump_ns)
        assert max_ts is not None
        self._set_max_ts(gpu_uuid, max_ts, pending)
        if before is not None and max_ts <= before:
            return []
        wm = max_ts - self.lateness_ns
        panes = self._open.get(gpu_uuid, {})
        closed = sorted(s for s, p in panes.items() if p.pane_end_ns <= wm)
        return [panes.pop(s) for s in closed]

    def resume_after(self, finished: GpuPanes) -> None:
        """Watermarks that make every pane ``finished`` closed late: each GPU's at the end of its last
        pane (its largest ``ts_ns``'s pane)."""
        for gpu, max_ts in finished._max_ts.items():
            last = max(max_ts, finished._pending.get(gpu, max_ts))
            self._max_ts[gpu] = pane_start_ns(last, self.pane_ns) + self.pane_ns + self.lateness_ns
        self._forgotten = finished._forgotten

    def open_totals(self) -> list[PaneTotals]:
        """The open panes themselves, by GPU then start, as held now: not as ``to_state`` writes them, which may
        be from a cache (``PaneTotals`` keeps its ``seen`` as last written while it has not grown). For a reader
        that must see what is held, such as a check that a restored state holds what the live one does."""
        return [self._open[g][s] for g in sorted(self._open) for s in sorted(self._open[g])]

    def open_count(self) -> int:
        """Panes open (counted, not yet billed), over every GPU."""
        return sum(map(len, list(self._open.values())))  # list(): one step, should another thread ask

    def largest_watermark(self) -> int | None:
        """The largest watermark of any GPU here (None: no GPU yet)."""
        return max(self._max_ts.values()) - self.lateness_ns if self._max_ts else None

    def smallest_watermark(self) -> int | None:
        """The smallest watermark of any GPU here (None: no GPU, or every one forgotten): what holds back the
        time up to which no record of these GPUs can be revised (``gpucost.kafka.closing``)."""
        return min(self._max_ts.values()) - self.lateness_ns if self._max_ts else None

    def close_silent(
        self, watermark_ns: int, idle_timeout_ns: int, only: Container[str | tuple[str, int]] | None = None
    ) -> list[PaneTotals]:
        """The open panes whose end lies ``idle_timeout_ns`` or more behind ``watermark_ns`` (another GPU's:
        this one has gone silent), closed, each GPU's oldest first (of the GPUs in ``only``, if given). Each
        such GPU's watermark moves to the end of its last pane closed, so that an event for one of them is late."""
        out = []
        for gpu in sorted(self._open):
            if only is not None and gpu not in only:
                continue
            panes = self._open[gpu]
            closing = sorted(start for start, p in panes.items() if p.pane_end_ns + idle_timeout_ns <= watermark_ns)
            if closing:
                out += [panes.pop(start) for start in closing]
                # from the GPUs' floor if it has no largest of its own (it sent only traces), never back
                known = self._max_ts.get(gpu, self._forgotten)
                top = max(0 if known is None else known, out[-1].pane_end_ns + self.lateness_ns)
                self._max_ts[gpu] = top
                if still_pending(top, self._pending.get(gpu)) is None:
                    self._pending.pop(gpu, None)
                if not panes:
                    del self._open[gpu]
        return out

    def forget(self, watermark_ns: int, only: Container[str | tuple[str, int]] | None = None) -> list[str]:
        """Drop the GPUs without an open pane whose watermark is at or before ``watermark_ns`` (of those in
        ``only``, if given): gone from the fleet (``Auditor.close_silent``). Their largest ``max_ts`` becomes
        the floor every GPU not known here starts from, so that any event of a pane they had billed is late,
        never billed twice, while one GPU's ``max_ts`` is all that is kept however many GPUs come and go.
        Returns them."""
        tops = {
            gpu: max(max_ts, self._pending.get(gpu, max_ts))
            for gpu, max_ts in self._max_ts.items()
            if gpu not in self._open and (only is None or gpu in only)
        }
        gone = sorted(gpu for gpu, top in tops.items() if top - self.lateness_ns <= watermark_ns)
        for gpu in gone:
            del self._max_ts[gpu]
            self._pending.pop(gpu, None)
            self._forgotten = tops[gpu] if self._forgotten is None else max(self._forgotten, tops[gpu])
        return gone

    def earliest_on_time_ns(self) -> int | None:
        """The earliest time an event that is not late may carry, over every GPU (None: no GPU yet)."""
        if not self._max_ts:
            return None
        return min(max_ts - self.lateness_ns for max_ts in self._max_ts.values()) - self.pane_ns

    def close_all(self) -> list[PaneTotals]:
        """End of a finite input: every open pane closes, in (GPU, pane) order."""
        out = [self._open[g].pop(s) for g in sorted(self._open) for s in sorted(self._open[g])]
        self._open.clear()
        return out

    def to_state(self) -> dict[str, Any]:
        return {
            "max_ts": self._max_ts,
            **({"pending": self._pending} if self._pending else {}),
            **({"forgotten": self._forgotten} if self._forgotten is not None else {}),
            "open": [p.to_state() for panes in self._open.values() for p in panes.values()],
        }

    @classmethod
    def from_state(cls, state: dict[str, Any], settings: AuditSettings) -> GpuPanes:
        panes = cls(settings)
        panes._max_ts = dict(state["max_ts"])
        panes._pending = dict(state.get("pending", {}))
        panes._forgotten = state.get("forgotten")
        for s in state["open"]:
            pane = PaneTotals.from_state(s)
            panes._open.setdefault(pane.gpu_uuid, {})[pane.pane_start_ns] = pane
        return panes
