"""Per-GPU panes and watermarks: running totals per (GPU, pane), closed in event time.

A GPU's watermark is the largest ``ts_ns`` seen for it minus the allowed lateness; pane
``[s, e)`` closes once the watermark reaches ``e``. An event whose pane has closed is late.
"""
from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpucost.schemas.events import GpuSample, NumaEvent, ProcessSample
from gpucost.streams.settings import AuditSettings
from gpucost.streams.tables import Tenant

__all__ = ["pane_start_ns", "overlaps", "jump", "TenantTotals", "PaneTotals", "PaneColumns", "GpuPanes", "objects"]


def pane_start_ns(ts_ns: int, pane_ns: int) -> int:
    """Start of the epoch-aligned pane holding ``ts_ns``."""
    return ts_ns - ts_ns % pane_ns


def overlaps(gap_ns: Any, interval_ms: Any) -> Any:
    """Whether a sample ``gap_ns`` from an accepted one of its device lies closer than three quarters of
    its own interval (METRICS.md: one sampler per device): a second sampler's, which would bill the
    device's time twice. Exact in integers: 4·gap < 3·interval; of ints, or elementwise of int64 arrays."""
    return 4 * gap_ns < 3_000_000 * interval_ms


@dataclass
class TenantTotals:
    tenant: Tenant
    sm: int = 0  # Σ sm_util (1/100 %) · interval_ms over the tenant's process samples
    bw: int = 0  # Σ mem_bw_util (1/100 %) · interval_ms
    numa: int = 0  # Σ hops · latency_weight over the tenant's NUMA events


@dataclass
class PaneTotals:
    gpu_uuid: str
    pane_start_ns: int
    pane_end_ns: int
    node_id: str | None = None  # from GPU samples; None when the pane has none
    gpu_model: str | None = None
    covered_ms: int = 0
    idle_ms: int = 0
    tenant_events: int = 0
    tenants: dict[str, TenantTotals] = field(default_factory=dict)
    #: the sorted ``ts_ns`` of every event counted in this pane, by (kind, pid) (pid -1 for GPU samples):
    #: a second event at one of them is a duplicate, a sample near one an overlap. Bounded: only open
    #: panes are kept.
    seen: dict[tuple[str, int], list[int]] = field(default_factory=dict)
    seen_count: int = field(default=0, compare=False)
    #: ``seen`` as ``to_state`` wrote it, and its size then: ``seen`` only grows, so an unchanged size is an
    #: unchanged set (a live worker writes every open pane at every poll; most have not changed since). The
    #: default, of no size, is never handed out: its list is shared.
    _seen_state: tuple[int, list[Any]] = field(default=(-1, []), init=False, repr=False, compare=False)

    def holds(self, kind: str, pid: int, ts_ns: int) -> bool:
        times = self.seen.get((kind, pid), ())
        at = bisect_left(times, ts_ns)
        return at < len(times) and times[at] == ts_ns

    def nearest_gap(self, kind: str, pid: int, ts_ns: int) -> int | None:
        """How far ``ts_ns`` lies from the nearest counted time of (kind, pid) here (None: none yet)."""
        times = self.seen.get((kind, pid), ())
        at = bisect_left(times, ts_ns)
        near = [abs(times[k] - ts_ns) for k in (at - 1, at) if 0 <= k < len(times)]
        return min(near) if near else None

    def remember(self, kind: str, pid: int, ts_ns: int) -> None:
        insort(self.seen.setdefault((kind, pid), []), ts_ns)
        self.seen_count += 1

    def tenant(self, tenant: Tenant, key: str | None = None) -> TenantTotals:
        """The tenant's totals in this pane (``key``: its key, when the caller has it already)."""
        key = tenant.key if key is None else key
        totals = self.tenants.get(key)
        if totals is None:
            totals = self.tenants[key] = TenantTotals(tenant)
        return totals

    def to_state(self) -> list[Any]:
        """The ``seen`` keys as ``[kind, pid, [gaps…]]``: each source's times as gaps from the pane's
        start, then from each other. A live worker writes the open panes at every poll, and a
        sample a second spelled out in full nanoseconds was most of a GPU's state."""
        tenants = [[list(t.tenant), t.sm, t.bw, t.numa] for t in self.tenants.values()]
        if self._seen_state[0] != self.seen_count:
            self._seen_state = self.seen_count, [[kind, pid, [b - a for a, b in zip([self.pane_start_ns, *ts], ts)]]
                                                 for (kind, pid), ts in sorted(self.seen.items())]
        seen = self._seen_state[1]
        return [self.gpu_uuid, self.pane_start_ns, self.pane_end_ns, self.node_id, self.gpu_model,
                self.covered_ms, self.idle_ms, self.tenant_events, tenants, seen]

    @classmethod
    def from_state(cls, s: list[Any]) -> "PaneTotals":
        pane = cls(*s[:8])
        for tenant, sm, bw, numa in s[8]:
            t = Tenant(*tenant)
            pane.tenants[t.key] = TenantTotals(t, sm, bw, numa)
        for kind, pid, when in s[9]:
            if isinstance(when, int):  # a state written before the gaps: one (kind, pid, ts_ns) each
                pane.remember(kind, pid, when)
                continue
            ts = pane.pane_start_ns
            for gap in when:
                ts += gap
                pane.remember(kind, pid, ts)
        return pane


@dataclass
class PaneColumns:
    """Closing panes as columns, and their tenants' totals as rows sorted by pane, then tenant key:
    what the batch path closes without a ``PaneTotals`` per pane. Names and tenants are ``object``
    arrays, as are the tenants' totals, Python integers: a pane's cost split multiplies them past
    64 bits."""

    gpu_uuid: np.ndarray
    pane_start_ns: np.ndarray
    pane_end_ns: np.ndarray
    node_id: np.ndarray  # None where the pane had no GPU sample
    gpu_model: np.ndarray
    covered_ms: np.ndarray
    idle_ms: np.ndarray
    tenant_events: np.ndarray
    t_pane: np.ndarray  # the pane of each tenant row
    t_key: np.ndarray
    t_tenant: np.ndarray
    t_sm: np.ndarray
    t_bw: np.ndarray
    t_numa: np.ndarray

    def __len__(self) -> int:
        return len(self.gpu_uuid)

    @classmethod
    def of(cls, panes: list[PaneTotals]) -> "PaneColumns":
        tenants = [(j, key, t) for j, p in enumerate(panes) for key, t in sorted(p.tenants.items())]
        ints = [np.array([getattr(p, f) for p in panes], np.int64)
                for f in ("pane_start_ns", "pane_end_ns", "covered_ms", "idle_ms", "tenant_events")]
        return cls(objects(p.gpu_uuid for p in panes), ints[0], ints[1], objects(p.node_id for p in panes),
                   objects(p.gpu_model for p in panes), *ints[2:], np.array([j for j, _, _ in tenants], np.int64),
                   objects(k for _, k, _ in tenants), objects(t.tenant for _, _, t in tenants),
                   *(objects(getattr(t, f) for _, _, t in tenants) for f in ("sm", "bw", "numa")))

    @classmethod
    def concat(cls, parts: list["PaneColumns"]) -> "PaneColumns":
        offsets = np.cumsum([0] + [len(p) for p in parts]).tolist()
        return cls(**{f: np.concatenate([getattr(p, f) + o if f == "t_pane" else getattr(p, f)
                                         for p, o in zip(parts, offsets)]) for f in cls.__dataclass_fields__})

    def totals(self) -> list[PaneTotals]:
        """Each pane as a ``PaneTotals`` (its ``seen`` keys left empty: it is closing)."""
        panes = [PaneTotals(*values) for values in zip(
            self.gpu_uuid.tolist(), self.pane_start_ns.tolist(), self.pane_end_ns.tolist(), self.node_id.tolist(),
            self.gpu_model.tolist(), self.covered_ms.tolist(), self.idle_ms.tolist(), self.tenant_events.tolist())]
        for j, key, tenant, sm, bw, numa in zip(self.t_pane.tolist(), self.t_key.tolist(), self.t_tenant.tolist(),
                                                self.t_sm.tolist(), self.t_bw.tolist(), self.t_numa.tolist()):
            panes[j].tenants[key] = TenantTotals(tenant, sm, bw, numa)
        return panes

    def take(self, idx: np.ndarray) -> "PaneColumns":
        """The panes at ``idx``, in that order, with their tenant rows."""
        lo = np.searchsorted(self.t_pane, idx, "left")
        count = np.searchsorted(self.t_pane, idx, "right") - lo
        rows = np.repeat(lo - np.cumsum(count) + count, count) + np.arange(int(count.sum()))
        return PaneColumns(**{f: (np.repeat(np.arange(len(idx)), count) if f == "t_pane" else
                                  getattr(self, f)[rows if f.startswith("t_") else idx])
                              for f in self.__dataclass_fields__})


def objects(values: Iterable[Any]) -> np.ndarray:
    """An ``object`` array of the values, tuples kept whole (``np.array`` would make them a dimension)."""
    return np.fromiter(values, object)


def _first(current: str | None, value: str) -> str:
    # order-independent choice if a GPU ever reported two names within one pane
    return value if current is None or value < current else current


def jump(max_ts: int | None, pending: int | None, ts_ns: int, max_jump_ns: int) -> tuple[int | None, int | None]:
    """A GPU's largest ``ts_ns`` and pending jump after it takes an accepted event at ``ts_ns``.

    One bad clock reading must not close every pane up to it (an hour-early sample once made the
    next 1,428 events of its GPU late). So an event more than ``max_jump_ns`` ahead of the largest is
    counted in its pane but only held, as the pending jump; a second such event confirms it: the
    largest becomes the nearer of the two, and the further stays pending if it is still a jump from
    there. A pending jump the largest has caught up with is dropped."""
    if max_ts is not None and ts_ns > max_ts + max_jump_ns:
        if pending is None:
            return max_ts, ts_ns
        near, far = sorted((pending, ts_ns))
        if far - near > max_jump_ns:
            return near, far
        return far, None
    max_ts = ts_ns if max_ts is None else max(max_ts, ts_ns)
    return max_ts, None if pending is None or pending <= max_ts else pending


class GpuPanes:
    """Open panes of every GPU, and the per-GPU event-time watermark that closes them."""

    def __init__(self, settings: AuditSettings) -> None:
        self.pane_ns = settings.pane_ns
        self.lateness_ns = settings.lateness_ns
        self.idle_threshold_cp = settings.idle_threshold_cp
        self.max_jump_ns = settings.max_jump_ns
        self._max_ts: dict[str, int] = {}
        self._pending: dict[str, int] = {}  # each GPU's pending jump (``jump``)
        self._open: dict[str, dict[int, PaneTotals]] = {}

    def watermark(self, gpu_uuid: str) -> int | None:
        max_ts = self._max_ts.get(gpu_uuid)
        return None if max_ts is None else max_ts - self.lateness_ns

    def max_ts(self, gpu_uuid: str) -> int | None:
        return self._max_ts.get(gpu_uuid)

    def pending(self, gpu_uuid: str) -> int | None:
        return self._pending.get(gpu_uuid)

    def set_max_ts(self, gpu_uuid: str, ts_ns: int, pending: int | None) -> None:
        self._max_ts[gpu_uuid] = ts_ns
        if pending is None:
            self._pending.pop(gpu_uuid, None)
        else:
            self._pending[gpu_uuid] = pending

    def open_panes(self, gpu_uuid: str) -> dict[int, PaneTotals]:
        """The GPU's open panes by start (a batch operator takes them out as they close)."""
        return self._open.get(gpu_uuid, {})

    def keep_open(self, pane: PaneTotals) -> None:
        self._open.setdefault(pane.gpu_uuid, {})[pane.pane_start_ns] = pane

    def is_late(self, gpu_uuid: str, ts_ns: int) -> bool:
        wm = self.watermark(gpu_uuid)
        return wm is not None and pane_start_ns(ts_ns, self.pane_ns) + self.pane_ns <= wm

    def _pane(self, gpu_uuid: str, ts_ns: int) -> PaneTotals:
        start = pane_start_ns(ts_ns, self.pane_ns)
        panes = self._open.setdefault(gpu_uuid, {})
        pane = panes.get(start)
        if pane is None:
            pane = panes[start] = PaneTotals(gpu_uuid, start, start + self.pane_ns)
        return pane

    def admit(self, e: GpuSample | ProcessSample | NumaEvent) -> str | None:
        """Why an on-time event is refused: ``duplicate`` (its key and ``ts_ns`` were counted already) or
        ``overlap`` (a sample within three quarters of its interval of a counted one of its device); None,
        and it is remembered, if it is taken."""
        pid = -1 if isinstance(e, GpuSample) else e.pid
        pane = self._open.get(e.gpu_uuid, {}).get(pane_start_ns(e.ts_ns, self.pane_ns))
        if pane is not None:
            if pane.holds(e.kind, pid, e.ts_ns):
                return "duplicate"
            if not isinstance(e, NumaEvent):
                gap = pane.nearest_gap(e.kind, pid, e.ts_ns)
                if gap is not None and overlaps(gap, e.interval_ms):
                    return "overlap"
        self._pane(e.gpu_uuid, e.ts_ns).remember(e.kind, pid, e.ts_ns)
        return None

    def add_gpu_sample(self, s: GpuSample) -> None:
        pane = self._pane(s.gpu_uuid, s.ts_ns)
        pane.node_id = _first(pane.node_id, s.node_id)
        pane.gpu_model = _first(pane.gpu_model, s.gpu_model)
        pane.covered_ms += s.interval_ms
        if s.sm_util_cp < self.idle_threshold_cp:
            pane.idle_ms += s.interval_ms

    def add_process_sample(self, s: ProcessSample, tenant: Tenant) -> None:
        pane = self._pane(s.gpu_uuid, s.ts_ns)
        pane.tenant_events += 1
        totals = pane.tenant(tenant)
        totals.sm += s.sm_util_cp * s.interval_ms
        totals.bw += s.mem_bw_util_cp * s.interval_ms

    def add_numa_event(self, e: NumaEvent, tenant: Tenant) -> None:
        pane = self._pane(e.gpu_uuid, e.ts_ns)
        pane.tenant_events += 1
        pane.tenant(tenant).numa += e.hops * e.latency_weight

    def advance(self, gpu_uuid: str, ts_ns: int) -> list[PaneTotals]:
        """Take ``ts_ns`` into the GPU's watermark (``jump``); return the panes that closed, oldest first."""
        before = self._max_ts.get(gpu_uuid)
        max_ts, pending = jump(before, self._pending.get(gpu_uuid), ts_ns, self.max_jump_ns)
        assert max_ts is not None
        self.set_max_ts(gpu_uuid, max_ts, pending)
        if before is not None and max_ts <= before:
            return []
        wm = max_ts - self.lateness_ns
        panes = self._open.get(gpu_uuid, {})
        closed = sorted(s for s, p in panes.items() if p.pane_end_ns <= wm)
        return [panes.pop(s) for s in closed]

    def resume_after(self, finished: "GpuPanes") -> None:
        """Watermarks that make every pane ``finished`` closed late: each GPU's at the end of its last
        pane (its largest ``ts_ns``'s pane)."""
        for gpu, max_ts in finished._max_ts.items():
            last = max(max_ts, finished._pending.get(gpu, max_ts))
            self._max_ts[gpu] = pane_start_ns(last, self.pane_ns) + self.pane_ns + self.lateness_ns

    def open_count(self) -> int:
        """Panes open (counted, not yet billed), over every GPU."""
        return sum(map(len, list(self._open.values())))  # list(): one step, should another thread ask

    def largest_watermark(self) -> int | None:
        """The largest watermark of any GPU here (None: no GPU yet)."""
        return max(self._max_ts.values()) - self.lateness_ns if self._max_ts else None

    def close_silent(self, watermark_ns: int, idle_timeout_ns: int) -> list[PaneTotals]:
        """The open panes whose end lies ``idle_timeout_ns`` or more behind ``watermark_ns`` (another GPU's:
        this one has gone silent), closed, each GPU's oldest first. Each such GPU's watermark moves to
        the end of its last pane closed, so that an event for one of them is late."""
        out = []
        for gpu in sorted(self._open):
            panes = self._open[gpu]
            closing = sorted(start for start, p in panes.items() if p.pane_end_ns + idle_timeout_ns <= watermark_ns)
            if closing:
                out += [panes.pop(start) for start in closing]
                self._max_ts[gpu] = max(self._max_ts.get(gpu, 0), out[-1].pane_end_ns + self.lateness_ns)
                if not panes:
                    del self._open[gpu]
        return out

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
        return {"max_ts": self._max_ts, **({"pending": self._pending} if self._pending else {}),
                "open": [p.to_state() for panes in self._open.values() for p in panes.values()]}

    @classmethod
    def from_state(cls, state: dict[str, Any], settings: AuditSettings) -> "GpuPanes":
        panes = cls(settings)
        panes._max_ts = dict(state["max_ts"])
        panes._pending = dict(state.get("pending", {}))
        for s in state["open"]:
            pane = PaneTotals.from_state(s)
            panes._open.setdefault(pane.gpu_uuid, {})[pane.pane_start_ns] = pane
        return panes
