"""What ``GpuPanes`` takes and hands out: the totals it keeps per (GPU, pane) and hands, as objects or
as columns, to the operators that close them (idle index, cost split); its batch entry's rows, and
what it decides of them."""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa

from gpucost.streams.runs import Levels
from gpucost.streams.tables import Tenant

__all__ = [
    "TenantTotals",
    "PaneTotals",
    "EFFICIENCY_SUMS",
    "HEALTH_SUMS",
    "PaneColumns",
    "PaneRows",
    "Verdicts",
    "objects",
    "nearest_gap",
]


def nearest_gap(times: list[int], ts_ns: int) -> int | None:
    """How far ``ts_ns`` lies from the nearest of the sorted ``times`` (None: there are none)."""
    at = bisect_left(times, ts_ns)
    near = [abs(times[k] - ts_ns) for k in (at - 1, at) if 0 <= k < len(times)]
    return min(near) if near else None


@dataclass
class TenantTotals:
    tenant: Tenant
    sm: int = 0  # Σ sm_util (1/100 %) · interval_ms over the tenant's process samples
    bw: int = 0  # Σ mem_bw_util (1/100 %) · interval_ms
    numa: int = 0  # Σ hops · latency_weight over the tenant's NUMA events
    samples: int = 0  # the tenant's process samples (an SLA idle run needs the tenant present, even at 0 %)


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
    energy_uj: int = 0  # Σ power_mw · interval_ms over the GPU samples (mW · ms = µJ): the health audit's
    busy_cp_ms: int = 0  # Σ sm_util_cp · interval_ms over the GPU samples
    placed: int = 0  # process samples of a tenant other than ``unattributed``: the pane is allocated
    #: the efficiency operator's sums over the GPU samples (docs/definitions.md, "Efficiency: EFU, ΔBW, diagnosis"):
    #: Σ mem_bw_util_cp · ms,
    #: and Σ tensor_active_cp · ms, Σ dram_active_cp · ms with the ms of the samples that carry each
    bw_cp_ms: int = 0
    tensor_cp_ms: int = 0
    tensor_ms: int = 0
    dram_cp_ms: int = 0
    dram_ms: int = 0
    #: the health audit's sums (``HEALTH_SUMS``): GPU samples reporting fault fields, Σ fault_fatal, Σ fault_warning
    fault_samples: int = 0
    fault_fatal: int = 0
    fault_warning: int = 0
    power_estimated_ms: int = 0  # and the ms of its GPU samples whose power is the platform table's TDP
    #: Σ flops_64b of the pane's ``blas`` traces, by pid (launch traces count threads, not FLOPs: never here)
    flops: dict[int, int] = field(default_factory=dict)
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
        return nearest_gap(self.seen.get((kind, pid), []), ts_ns)

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
        tenants = [[list(t.tenant), t.sm, t.bw, t.numa, t.samples] for t in self.tenants.values()]
        if self._seen_state[0] != self.seen_count:
            self._seen_state = (
                self.seen_count,
                [
                    [kind, pid, [b - a for a, b in zip([self.pane_start_ns, *ts], ts)]]
                    for (kind, pid), ts in sorted(self.seen.items())
                ],
            )
        seen = self._seen_state[1]
        return [
            self.gpu_uuid,
            self.pane_start_ns,
            self.pane_end_ns,
            self.node_id,
            self.gpu_model,
            self.covered_ms,
            self.idle_ms,
            self.tenant_events,
            tenants,
            seen,
            self.energy_uj,
            self.busy_cp_ms,
            self.placed,
            *(getattr(self, f) for f in EFFICIENCY_SUMS),
            sorted(self.flops.items()),
            # only a pane whose samples reported faults or estimated power: every other pane's state stays as it was
            *([[getattr(self, f) for f in HEALTH_SUMS]] if self.fault_samples or self.power_estimated_ms else []),
        ]

    @classmethod
    def from_state(cls, s: list[Any]) -> PaneTotals:
        pane = cls(*s[:8])
        if len(s) > 10:  # a state written before the health audit has none of these
            pane.energy_uj, pane.busy_cp_ms, pane.placed = s[10:13]
        if len(s) > 13:  # nor one written before the efficiency operator these
            for name, value in zip(EFFICIENCY_SUMS, s[13:18]):
                setattr(pane, name, value)
            pane.flops = {pid: flops for pid, flops in s[18]}
        if len(s) > 19:  # a pane whose samples reported faults or estimated power (a state before the latter: 3)
            for name, value in zip(HEALTH_SUMS, s[19]):
                setattr(pane, name, value)
        for tenant, *sums in s[8]:  # a state written before the SLA tiers has no sample count
            t = Tenant.restored(tenant)
            pane.tenants[t.key] = TenantTotals(t, *sums)
        for kind, pid, when in s[9]:
            if isinstance(when, int):  # a state written before the gaps: one (kind, pid, ts_ns) each
                pane.remember(kind, pid, when)
                continue
            ts = pane.pane_start_ns
            for gap in when:
                ts += gap
                pane.remember(kind, pid, ts)
        return pane


#: the efficiency operator's sums a pane keeps (``PaneTotals``, ``PaneColumns``: one integer each)
EFFICIENCY_SUMS = ("bw_cp_ms", "tensor_cp_ms", "tensor_ms", "dram_cp_ms", "dram_ms")
#: the health audit's sums a pane keeps beyond energy and busy (``PaneTotals``, ``PaneColumns``: one integer each)
HEALTH_SUMS = ("fault_samples", "fault_fatal", "fault_warning", "power_estimated_ms")


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
    energy_uj: np.ndarray
    busy_cp_ms: np.ndarray
    placed: np.ndarray
    bw_cp_ms: np.ndarray
    tensor_cp_ms: np.ndarray
    tensor_ms: np.ndarray
    dram_cp_ms: np.ndarray
    dram_ms: np.ndarray
    fault_samples: np.ndarray
    fault_fatal: np.ndarray
    fault_warning: np.ndarray
    power_estimated_ms: np.ndarray
    t_pane: np.ndarray  # the pane of each tenant row
    t_key: np.ndarray
    t_tenant: np.ndarray
    t_sm: np.ndarray
    t_bw: np.ndarray
    t_numa: np.ndarray
    t_samples: np.ndarray
    f_pane: np.ndarray  # the pane of each (pane, pid) with blas traces, sorted by pane then pid
    f_pid: np.ndarray
    f_flops: np.ndarray  # Python integers (a sum of u64 can pass 64 bits)

    def __len__(self) -> int:
        return len(self.gpu_uuid)

    @cached_property
    def distinct_tenants(self) -> tuple[np.ndarray, list[Tenant]]:
        """Each tenant row's tenant as its index among the distinct ones, and those, in order of their first
        row: the few tenants whose columns the cost split and the SLA operator take per row from there."""
        distinct: dict[Tenant, int] = {}
        codes = np.array([distinct.setdefault(t, len(distinct)) for t in self.t_tenant.tolist()], np.int64)
        return codes, list(distinct)

    @cached_property
    def gpus(self) -> tuple[np.ndarray, list[str]]:
        """Each pane's GPU as its index among the distinct ones, and those, in order of their first pane: how
        the idle index, the health audit and the SLA operator group panes by GPU (Arrow's hash, not a sort of
        strings)."""
        encoded = pa.array(self.gpu_uuid, pa.string()).dictionary_encode()
        return encoded.indices.to_numpy().astype(np.int64), encoded.dictionary.to_pylist()

    @classmethod
    def of(cls, panes: list[PaneTotals]) -> PaneColumns:
        tenants = [(j, key, t) for j, p in enumerate(panes) for key, t in sorted(p.tenants.items())]
        ints = [
            np.array([getattr(p, f) for p in panes], np.int64)
            for f in (
                "pane_start_ns",
                "pane_end_ns",
                "covered_ms",
                "idle_ms",
                "tenant_events",
                "energy_uj",
                "busy_cp_ms",
                "placed",
                *EFFICIENCY_SUMS,
                *HEALTH_SUMS,
            )
        ]
        flops = [(j, pid, n) for j, p in enumerate(panes) for pid, n in sorted(p.flops.items())]
        # the columns as one starred list: mypy gives a starred argument every parameter after it, so it would
        # count the columns after ``*ints[2:]`` as too many
        return cls(
            *[
                objects(p.gpu_uuid for p in panes),
                ints[0],
                ints[1],
                objects(p.node_id for p in panes),
                objects(p.gpu_model for p in panes),
                *ints[2:],
                np.array([j for j, _, _ in tenants], np.int64),
                objects(k for _, k, _ in tenants),
                objects(t.tenant for _, _, t in tenants),
                *(objects(getattr(t, f) for _, _, t in tenants) for f in ("sm", "bw", "numa")),
                np.array([t.samples for _, _, t in tenants], np.int64),
                np.array([j for j, _, _ in flops], np.int64),
                np.array([pid for _, pid, _ in flops], np.int64),
                objects(n for _, _, n in flops),
            ]
        )

    @classmethod
    def concat(cls, parts: list[PaneColumns]) -> PaneColumns:
        offsets = np.cumsum([0] + [len(p) for p in parts]).tolist()
        return cls(
            **{
                f: np.concatenate(
                    [getattr(p, f) + o if f in ("t_pane", "f_pane") else getattr(p, f) for p, o in zip(parts, offsets)]
                )
                for f in cls.__dataclass_fields__
            }
        )

    def totals(self) -> list[PaneTotals]:
        """Each pane as a ``PaneTotals`` (its ``seen`` keys left empty: it is closing)."""
        # the keywords as one dict: mypy gives ``*values[:8]`` (a tuple of unknown length) every parameter, so
        # it would read energy_uj, busy_cp_ms and placed as given twice
        panes = [
            PaneTotals(
                *values[:8],
                **{
                    "energy_uj": values[8],
                    "busy_cp_ms": values[9],
                    "placed": values[10],
                    **dict(zip(EFFICIENCY_SUMS + HEALTH_SUMS, values[11:])),
                },
            )
            for values in zip(
                self.gpu_uuid.tolist(),
                self.pane_start_ns.tolist(),
                self.pane_end_ns.tolist(),
                self.node_id.tolist(),
                self.gpu_model.tolist(),
                self.covered_ms.tolist(),
                self.idle_ms.tolist(),
                self.tenant_events.tolist(),
                self.energy_uj.tolist(),
                self.busy_cp_ms.tolist(),
                self.placed.tolist(),
                *(getattr(self, f).tolist() for f in EFFICIENCY_SUMS + HEALTH_SUMS),
            )
        ]
        for j, key, tenant, sm, bw, numa, samples in zip(
            self.t_pane.tolist(),
            self.t_key.tolist(),
            self.t_tenant.tolist(),
            self.t_sm.tolist(),
            self.t_bw.tolist(),
            self.t_numa.tolist(),
            self.t_samples.tolist(),
        ):
            panes[j].tenants[key] = TenantTotals(tenant, sm, bw, numa, samples)
        for j, pid, flops in zip(self.f_pane.tolist(), self.f_pid.tolist(), self.f_flops.tolist()):
            panes[j].flops[pid] = flops
        return panes

    def take(self, idx: np.ndarray) -> PaneColumns:
        """The panes at ``idx``, in that order, with their tenant rows and FLOPs rows."""
        out = {}
        for prefix in ("t_", "f_"):
            of = getattr(self, prefix + "pane")
            lo = np.searchsorted(of, idx, "left")
            count = np.searchsorted(of, idx, "right") - lo
            rows = np.repeat(lo - np.cumsum(count) + count, count) + np.arange(int(count.sum()))
            out.update(
                {
                    f: np.repeat(np.arange(len(idx)), count) if f == prefix + "pane" else getattr(self, f)[rows]
                    for f in self.__dataclass_fields__
                    if f.startswith(prefix)
                }
            )
        return PaneColumns(**{f: out[f] if f in out else getattr(self, f)[idx] for f in self.__dataclass_fields__})


def objects(values: Iterable[Any]) -> np.ndarray:
    """An ``object`` array of the values, tuples kept whole (``np.array`` would make them a dimension)."""
    return np.fromiter(values, object)


@dataclass
class PaneRows:
    """The batch entry's input: a batch's valid GPU-keyed rows as columns, grouped by GPU (GPU ``j`` of
    ``names`` holds rows ``starts[j]`` to ``ends[j]``), each GPU's rows in arrival order."""

    row: np.ndarray  # each row's position in its batch: the arrival order across GPUs
    names: list[str]
    starts: np.ndarray
    ends: np.ndarray
    kind: np.ndarray  # code into KINDS
    pid: np.ndarray  # -1 for a GPU sample (its duplicate key's pid)
    ts_ns: np.ndarray
    interval_ms: np.ndarray  # 0 for a NUMA event
    sm_cp: np.ndarray
    bw_cp: np.ndarray
    power_mw: np.ndarray  # a GPU sample's power, else 0
    tensor_cp: np.ndarray  # a GPU sample's tensor_active_cp, else -1 (not measured)
    dram_cp: np.ndarray  # a GPU sample's dram_active_cp, else -1
    fault_fatal: np.ndarray  # a GPU sample's fault_fatal, else -1 (not reported)
    fault_warning: np.ndarray  # a GPU sample's fault_warning, else -1
    power_estimated: np.ndarray  # 1 where a GPU sample's power is the platform table's TDP, else 0
    numa: np.ndarray  # a NUMA event's hops · latency_weight, else 0
    node: np.ndarray  # code into node_names (-1: none)
    node_names: list[str]
    model: np.ndarray  # code into model_names (-1: none)
    model_names: list[str]
    flops: dict[int, int]  # by position here, each ``blas`` trace's flops_64b (launch traces: absent)

    @cached_property
    def group(self) -> np.ndarray:
        """Each row's GPU, as its index in ``names`` (both halves of the batch entry read it)."""
        return np.repeat(np.arange(len(self.starts)), self.ends - self.starts)


@dataclass
class Verdicts:
    """What ``GpuPanes.judge_many`` decided of each row of a ``PaneRows``, and the running watermarks that
    ``add_many`` closes panes by."""

    late: np.ndarray
    duplicate: np.ndarray
    overlap: np.ndarray
    before: np.ndarray  # each row's GPU's largest ts_ns before it (the int64 minimum: none)
    levels: Levels
    upto: np.ndarray  # the running maximum up to each row, as a key: GPU · width + level
    high: np.ndarray  # that maximum as a time
    pending: dict[int, int | None]  # by GPU index, the pending jump after the batch where there may be one

    @property
    def accepted(self) -> np.ndarray:
        accepted: np.ndarray = ~(self.late | self.duplicate | self.overlap)  # numpy's stubs: `|` of ndarrays is Any
        return accepted
