"""The allocation basis's split of closed panes (docs/definitions.md, "Allocation basis"), on both entries: ``split``
of one pane (the row entry) and ``split_many`` of many (the batch entry), which must give the same records.

Why a batch entry of its own: a fleet whose scheduler reports allocations bills every pane on this basis too, and
one pane at a time (a record object per party, a hash and a split per pane) took more of the batch path than any
other operator. ``split_many`` takes each device's holds against its panes as arrays, the split in int64 where it
fits (``gpucost.streams.money.split_many``), and returns the records as columns.
"""

from __future__ import annotations

import math
from collections import defaultdict
from decimal import Decimal
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from gpucost.schemas.arrow import ARROW_SCHEMAS, wide_array
from gpucost.schemas.events import TENANT_FIELDS, Allocation
from gpucost.schemas.exact import ratios
from gpucost.schemas.records import UNALLOCATED_TENANT, AllocationRecord, computed, record_id, record_ids
from gpucost.streams.apportion import pane_cost_micro_usd
from gpucost.streams.money import split_in_order, split_many
from gpucost.streams.pane_totals import PaneColumns
from gpucost.streams.runs import runs
from gpucost.streams.tables import Tenant

__all__ = ["Hold", "UNALLOCATED", "party_order", "split", "split_many_panes"]

UNALLOCATED = Tenant.named(UNALLOCATED_TENANT)
#: the most (pane, hold) pairs compared at once: bounds the overlap matrix of a device with many holds
_PAIRS = 1 << 20


class Hold(NamedTuple):
    """One allocation as the table keeps it (``end_ns`` None: still held)."""

    start_ns: int
    end_ns: int | None
    num: int
    den: int
    sharing: str
    tenant: Tenant

    @classmethod
    def of(cls, a: Allocation) -> Hold:
        return cls(a.ts_ns, a.end_ts_ns, a.fraction_num, a.fraction_den, a.sharing, Tenant.of(a))

    def overlap_ns(self, start_ns: int, end_ns: int) -> int:
        """How long this hold covers of ``[start_ns, end_ns)``."""
        end = end_ns if self.end_ns is None else min(end_ns, self.end_ns)
        return max(0, end - max(start_ns, self.start_ns))


def party_order(tenant: Tenant) -> str:
    """A pane's parties in the order they are split in (ties of the leftover µ$ to the first): by key, which names
    one tenant (``Tenant.canonical``), so the order is the same on every path and in every process, whatever order
    the holds came in or set iteration gives."""
    return tenant.key


def split(
    gpu_uuid: str,
    node_id: str,
    gpu_model: str,
    start_ns: int,
    end_ns: int,
    covered_ms: int,
    usd_per_gpu_hour: Decimal | None,
    holds: list[Hold],
) -> list[AllocationRecord]:
    """The cost of the pane ``[start_ns, end_ns)`` with ``covered_ms`` of GPU samples (the usage split's own C) split
    by the holds covering it (docs/definitions.md, "Allocation basis"): tenant i's weight ``Σ fraction × held ns``
    over its holds, over one common denominator ``D`` (the fractions' least common multiple), the device's capacity
    ``D × pane ns``; ``unallocated`` holds the capacity no one held. An oversubscribed device (Σ held > capacity)
    splits by what is held, none unallocated."""
    cost = pane_cost_micro_usd(usd_per_gpu_hour, covered_ms, gpu_model)
    den = math.lcm(*(h.den for h in holds)) if holds else 1
    capacity = den * (end_ns - start_ns)
    by_tenant: dict[Tenant, list[Hold]] = defaultdict(list)
    for h in holds:
        by_tenant[h.tenant].append(h)
    tenants = sorted(by_tenant.items(), key=lambda item: party_order(item[0]))
    weights = [sum(h.num * (den // h.den) * h.overlap_ns(start_ns, end_ns) for h in hs) for _, hs in tenants]
    held = sum(weights)
    total = max(capacity, held)
    unallocated = total - held
    shares = split_in_order(cost, [unallocated, *weights], total)
    parties = [(UNALLOCATED, None, 0, unallocated), *((t, hs, len(hs), w) for (t, hs), w in zip(tenants, weights))]
    out = []
    for (tenant, hs, count, weight), micro_usd in zip(parties, shares):
        key = UNALLOCATED_TENANT if hs is None else tenant.key  # the pipeline's own party: its name, as ``idle``
        out.append(
            computed(
                AllocationRecord,
                record_id=record_id(gpu_uuid, start_ns, key, 0, "allocation"),
                gpu_uuid=gpu_uuid,
                node_id=node_id,
                gpu_model=gpu_model,
                pane_start_ns=start_ns,
                pane_end_ns=end_ns,
                tenant_key=key,
                **dict(zip(TENANT_FIELDS, tenant)),
                sharing=None if hs is None else ",".join(sorted({h.sharing for h in hs})),
                allocations=count,
                allocated_share=weight / total,
                allocated_fraction=weight / capacity,
                usd_per_gpu_hour=usd_per_gpu_hour,
                pane_cost_micro_usd=cost,
                cost_micro_usd=micro_usd,
                unpriced=usd_per_gpu_hour is None,
                revision=0,
                cost_basis="allocation",
                allocated_num=weight,
                capacity_num=capacity,
                covered_ms=covered_ms,
            )
        )
    return out


class _Parties(NamedTuple):
    """One device's parties of its billed panes, pane after pane: ``unallocated`` then its tenants by key."""

    pane: np.ndarray  # each party's pane (an index into the closing panes)
    tenant: list[Tenant]
    unallocated: np.ndarray  # bool: the pane's unallocated party
    holds: np.ndarray  # how many holds the party has
    weight: np.ndarray  # allocated_num (int64, or Python integers past 64 bits)
    sharing: list[str | None]
    capacity: np.ndarray  # the pane's D × pane ns, per party
    total: np.ndarray  # the pane's max(capacity, Σ held), per party


def split_many_panes(
    panes: PaneColumns, billed: np.ndarray, prices: list[Decimal | None], held: dict[str, list[Hold]]
) -> tuple[pa.Table, list[Decimal | None], np.ndarray]:
    """``split`` of each ``billed`` pane at once, its device's holds in ``held``: the allocation records as columns
    (pane after pane, as ``split`` gives them), their prices, and how many each pane has."""
    gpus = np.asarray(panes.gpu_uuid, object)
    starts, ends = np.asarray(panes.pane_start_ns, np.int64), np.asarray(panes.pane_end_ns, np.int64)
    chosen = np.flatnonzero(billed)
    by_gpu: dict[str, list[int]] = defaultdict(list)
    for j, gpu in zip(chosen.tolist(), gpus[chosen].tolist()):
        by_gpu[gpu].append(j)
    parts = [_device(np.array(js), starts, ends, held.get(gpu, [])) for gpu, js in by_gpu.items()]
    order = np.argsort(np.concatenate([p.pane for p in parts] or [np.zeros(0, np.int64)]), kind="stable")

    def joined(values: list[np.ndarray], dtype: type | None = None) -> np.ndarray:
        out = np.concatenate(values) if values else np.zeros(0, dtype or object)
        return out[order]

    pane_of = joined([p.pane for p in parts], np.int64)
    tenants = [t for p in parts for t in p.tenant]
    tenants = [tenants[i] for i in order.tolist()]
    sharing = [s for p in parts for s in p.sharing]
    sharing = [sharing[i] for i in order.tolist()]
    unallocated, count = joined([p.unallocated for p in parts], bool), joined([p.holds for p in parts], np.int64)
    weight, capacity, total = (joined([getattr(p, f) for p in parts]) for f in _WIDE)

    covered, models = np.asarray(panes.covered_ms, np.int64), list(panes.gpu_model)
    cost = np.zeros(len(gpus), object)
    for j in chosen.tolist():
        cost[j] = pane_cost_micro_usd(prices[j], int(covered[j]), models[j])
    denominators = np.ones(len(gpus), object)
    denominators[pane_of] = total
    micro_usd = split_many(cost, weight, denominators, pane_of)

    keys = [UNALLOCATED_TENANT if u else t.key for u, t in zip(unallocated.tolist(), tenants)]
    pane_list = pane_of.tolist()
    columns = {
        "record_id": record_ids(list(zip(gpus.tolist(), starts.tolist())), pane_list, keys, 0, "allocation"),
        "gpu_uuid": pa.array(gpus, pa.string()).take(pane_of),
        "node_id": pa.array(panes.node_id, pa.string()).take(pane_of),
        "gpu_model": pa.array(models, pa.string()).take(pane_of),
        "pane_start_ns": starts[pane_of],
        "pane_end_ns": ends[pane_of],
        "tenant_key": pa.array(keys, pa.string()),
        **{name: pa.array(list(values), pa.string()) for name, values in zip(TENANT_FIELDS, zip(*tenants))},
        "sharing": pa.array(sharing, pa.string()),
        "allocations": count,
        "allocated_share": ratios(weight, total),
        "allocated_fraction": ratios(weight, capacity),
        "usd_per_gpu_hour": pa.array(prices, ARROW_SCHEMAS["allocation"].field("usd_per_gpu_hour").type).take(pane_of),
        "pane_cost_micro_usd": cost[pane_of].astype(np.int64),
        "cost_micro_usd": micro_usd,
        "unpriced": np.array([price is None for price in prices], bool)[pane_of],
        "revision": np.zeros(len(pane_of), np.int64),
        "cost_basis": pa.array(["allocation"] * len(pane_of), pa.string()),
        "allocated_num": wide_array(weight),
        "capacity_num": wide_array(capacity),
        "covered_ms": covered[pane_of],
    }
    if not tenants:  # no party at all: the tenant columns are empty, not missing
        columns.update({name: pa.array([], pa.string()) for name in TENANT_FIELDS})
    schema = ARROW_SCHEMAS["allocation"]
    table = pa.table([columns[name] for name in schema.names], schema=schema)
    return table, [prices[j] for j in pane_list], np.bincount(pane_of, minlength=len(gpus))


_WIDE = ("weight", "capacity", "total")


def _device(panes: np.ndarray, starts: np.ndarray, ends: np.ndarray, holds: list[Hold]) -> _Parties:
    """One device's parties of ``panes`` (its billed panes, ascending) from its holds, as ``split`` finds them."""
    start, end = starts[panes], ends[panes]
    h_start = np.array([h.start_ns for h in holds], np.int64)
    h_end = np.array([np.iinfo(np.int64).max if h.end_ns is None else h.end_ns for h in holds], np.int64)
    h_num, h_den = np.array([h.num for h in holds], np.int64), np.array([h.den for h in holds], np.int64)
    distinct = sorted(set(h.tenant for h in holds), key=party_order)
    code = {t: i for i, t in enumerate(distinct)}
    h_tenant = np.array([code[h.tenant] for h in holds], np.int64)
    # each (pane, hold) that overlaps: the pane's rows first, its holds in order, a chunk of panes at a time
    at, which, overlap = [], [], []
    step = max(1, _PAIRS // max(1, len(holds)))
    for lo in range(0, len(panes) if holds else 0, step):
        s, e = start[lo : lo + step, None], end[lo : lo + step, None]
        ov = np.minimum(e, h_end[None, :]) - np.maximum(s, h_start[None, :])
        p, h = np.nonzero(ov > 0)
        at.append(p + lo)
        which.append(h)
        overlap.append(ov[p, h])
    pi = np.concatenate(at) if at else np.zeros(0, np.int64)
    hi = np.concatenate(which) if which else np.zeros(0, np.int64)
    ov = np.concatenate(overlap) if overlap else np.zeros(0, np.int64)
    den = np.ones(len(panes), np.int64)  # the common denominator D of the holds covering each pane
    first, _ = runs(pi)
    if len(pi):
        den[pi[first]] = np.lcm.reduceat(h_den[hi], first)
    span = end - start
    # Σ num × (D / den) × ns in int64 where its largest term and the capacity fit, else as Python integers
    big = len(pi) and int(h_num.max()) * int(den.max()) * int(span.max()) * max(1, len(holds)) >= 1 << 62
    wide = object if big or int(den.max()) * int(span.max()) >= 1 << 62 else np.int64
    term = h_num[hi].astype(wide) * (den[pi] // h_den[hi]).astype(wide) * ov.astype(wide)
    # the (pane, tenant) groups, by pane then tenant key
    group = pi * max(1, len(distinct)) + h_tenant[hi]
    by = np.argsort(group, kind="stable")
    g = group[by]
    g_first, g_end = runs(g)
    g_weight = np.add.reduceat(term[by], g_first) if len(g) else np.zeros(0, wide)
    g_count = g_end - g_first
    g_pane, g_tenant = g[g_first] // max(1, len(distinct)), g[g_first] % max(1, len(distinct))
    g_sharing = _sharing(np.array([h.sharing for h in holds], object)[hi[by]] if holds else [], g_first, g_end)
    capacity = den.astype(wide) * span.astype(wide)
    held_sum = np.zeros(len(panes), wide)
    np.add.at(held_sum, g_pane, g_weight)
    total = np.maximum(capacity, held_sum)
    # the parties: each pane's unallocated, then its groups (already by pane, then tenant key)
    size = np.bincount(g_pane, minlength=len(panes)) + 1
    at_unallocated = np.cumsum(size) - size
    n = int(size.sum())
    pane_idx = np.repeat(np.arange(len(panes)), size)
    is_unallocated = np.zeros(n, bool)
    is_unallocated[at_unallocated] = True
    at_group = np.flatnonzero(~is_unallocated)
    weight, count = np.zeros(n, wide), np.zeros(n, np.int64)
    weight[at_unallocated], weight[at_group] = total - held_sum, g_weight
    count[at_group] = g_count
    tenant = [UNALLOCATED] * n
    sharing: list[str | None] = [None] * n
    for i, t, s in zip(at_group.tolist(), g_tenant.tolist(), g_sharing):
        tenant[i], sharing[i] = distinct[t], s
    return _Parties(
        panes[pane_idx], tenant, is_unallocated, count, weight, sharing, capacity[pane_idx], total[pane_idx]
    )


def _sharing(values: np.ndarray | list[str], first: np.ndarray, end: np.ndarray) -> list[str]:
    """Each group's (``values[first:end]``) sharing modes, distinct and sorted, joined by commas (``split``'s
    ``sharing``)."""
    names: dict[tuple[str, ...], str] = {}
    out = []
    for lo, hi in zip(first.tolist(), end.tolist()):
        modes = tuple(sorted(set(values[lo:hi])))
        out.append(names.get(modes) or names.setdefault(modes, ",".join(modes)))
    return out
