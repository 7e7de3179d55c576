"""Kernel cost in the pipeline (docs/definitions.md, "Kernel cost in the pipeline"): each tenant's cost of a closed
pane, split over the kernels its processes ran on the GPU in that pane, and the rest kept as its ``no_kernel`` line.

A pane operator (``gpucost.streams.operator.PaneOperator``) over the kernels ``KernelLog`` keeps: at each close, and
again at each revision of the pane (``Auditor._republish``), the lines are computed afresh from the pane's kernels,
the bindings in force and the usage split's own figure for each tenant (``apportion``), so that they sum to it in
every revision; a revision publishes them as differences (``gpucost.streams.differences``).

The rule, per tenant of a pane: the pane's kernels of its processes (a process's tenant as of the kernel's start),
each cut to the pane, share the time they run in, an overlap split equally among the kernels running in it
(``busy_shares``; a copy or set takes no share: ``tenant_lines``); the tenant's µ$ is dealt by largest remainder over
``no_kernel``, weighing the pane's covered time none of them ran in (none, if they ran longer than the GPU samples
covered), then its lines by kernel name and category, weighing their shares of the time; ties go to the line listed
first.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any, NamedTuple

import numpy as np

from gpucost.schemas.blocks import Emitted
from gpucost.schemas.events import TENANT_FIELDS
from gpucost.schemas.kernels import KERNEL_CATEGORIES
from gpucost.schemas.records import KernelCostRecord, Output, RangeCostRecord, computed, record_id
from gpucost.streams.apportion import Weights, apportion
from gpucost.streams.kernel_log import Kernel, KernelLog, range_text
from gpucost.streams.kernel_split import busy_shares, split_tree, sums_by
from gpucost.streams.money import split_in_order
from gpucost.streams.operator import Closing, ClosingMany
from gpucost.streams.pane_totals import PaneTotals
from gpucost.streams.settings import AuditSettings
from gpucost.streams.tables import BindingTable, Tenant

__all__ = [
    "NO_KERNEL",
    "TRANSFERS",
    "KernelCost",
    "KernelRecord",
    "Line",
    "MAX_TENANT_PATHS",
    "Range",
    "line_id_key",
    "range_id_key",
    "TenantTime",
    "tenant_lines",
    "tenant_ranges",
    "tenant_time",
]

#: the line (its ``kernel`` and ``category``) of a tenant's covered time that none of its kernels ran in
NO_KERNEL = "no_kernel"
NS_PER_MS = 1_000_000
#: the categories that move bytes rather than run on the SMs: lines of their own, carrying no µ$
TRANSFERS = ("memcpy", "memset")

Line = tuple[str, str, int, int, int]  # kernel, category, calls, busy_ns, µ$
Range = tuple[tuple[str, ...], int, int, int]  # range path, calls, busy_ns, µ$
#: the most range paths a tenant's pane publishes, its costliest: a path's figures include its children's, so one left
#: out moves no money, and a run with paths named by step (``ProfilerStep#N``) or by input publishes a bounded output
MAX_TENANT_PATHS = 256
#: what the split publishes of a pane: the tenants' kernel lines and their range paths
KernelRecord = KernelCostRecord | RangeCostRecord


def line_id_key(tenant_key: str, category: str, kernel: str) -> str:
    """What a line's ``record_id`` hashes for its party: the tenant, the category and the kernel's name, as a JSON
    array (escaped: a name or a tenant field holding the separator cannot make two lines one id)."""
    return json.dumps([tenant_key, category, kernel], ensure_ascii=False)


class TenantTime(NamedTuple):
    """A tenant's kernels clipped to a pane (``start``, ``end``; ``transfer``: a copy or set), and its computing
    kernels' (at ``computing``) shares of the pane's time (``busy_shares``): what its lines and its range paths both
    read, found once."""

    start: np.ndarray
    end: np.ndarray
    transfer: np.ndarray
    computing: np.ndarray
    busy: int
    den: int
    shares: np.ndarray


def tenant_time(kernels: list[Kernel], pane_start_ns: int, pane_end_ns: int) -> TenantTime:
    """The ``TenantTime`` of one tenant's ``kernels`` in the pane ``[pane_start_ns, pane_end_ns)``."""
    start = np.array([max(k.start_ns, pane_start_ns) for k in kernels], np.int64)
    end = np.array([min(k.end_ns, pane_end_ns) for k in kernels], np.int64)
    transfer = np.array([KERNEL_CATEGORIES[k.category] in TRANSFERS for k in kernels], bool)
    computing = np.flatnonzero(~transfer)
    return TenantTime(start, end, transfer, computing, *busy_shares(start[computing], end[computing]))


def tenant_lines(kernels: list[Kernel], names: list[str], time: TenantTime, covered_ns: int, cost: int) -> list[Line]:
    """One tenant's lines of a pane (the module's rule): ``no_kernel`` first, then by kernel name and category.
    Σ µ$ = ``cost``; the kernels' (and communication kernels') lines' ``busy_ns`` sum to the union of their
    intervals within the pane. A copy or set is a line of its calls and summed time in the pane, and no µ$: the
    copy engines run beside the SMs, and a pane's time with only a copy running is ``no_kernel``'s (as
    ``gpucost kernels`` lists transfers apart)."""
    start, end, transfer, computing, busy, den, shares = time
    line = [(names[k.name], KERNEL_CATEGORIES[k.category]) for k in kernels]
    keys = sorted(set(line))
    code = {key: i for i, key in enumerate(keys)}
    of = np.array([code[key] for key in line], np.int64)
    weights = sums_by(of[computing], shares, len(keys))  # a transfer's line weighs 0
    calls = np.bincount(of, weights=[k.first for k in kernels], minlength=len(keys)).astype(np.int64).tolist()
    copied = sums_by(of[transfer], (end - start)[transfer], len(keys))
    idle = max(covered_ns - busy, 0)
    money = split_in_order(cost, [idle * den, *weights], (idle + busy) * den)
    dealt = split_in_order(busy, weights, busy * den) if busy else [0] * len(keys)
    busy_ns = [d + c for d, c in zip(dealt, copied)]  # one of the two is 0 for each line
    return [(NO_KERNEL, NO_KERNEL, 0, idle, money[0])] + [
        (name, category, n, ns, usd) for (name, category), n, ns, usd in zip(keys, calls, busy_ns, money[1:])
    ]


def tenant_ranges(
    kernels: list[Kernel], paths: list[str | None], time: TenantTime, kernel_micro_usd: int
) -> list[Range]:
    """One tenant's range paths of a pane (docs/definitions.md, "Range cost in the pipeline"), none if none of its
    kernels carries a path: each path's calls (the kernels starting in the pane launched in it or in a range inside
    it; not copies or sets, which weigh nothing), busy ns and µ$. The tenant's kernels' busy time and
    ``kernel_micro_usd`` (its lines' µ$ but ``no_kernel``'s) are dealt down the tree of paths by the kernels' shares
    of the time (``split_tree``): each level from its parent's figures over its children and its own kernels, so
    that children sum to no more than their parent and the outermost ranges to no more than the root."""
    computing = [kernels[i] for i in time.computing.tolist()]
    if all(k.path < 0 for k in computing):
        return []
    busy, shares = time.busy, time.shares
    codes: dict[int, int] = {}
    of = np.array([codes.setdefault(k.path, len(codes)) for k in computing], np.int64)
    named = [() if code < 0 else tuple(json.loads(paths[code] or "[]")) for code in codes]
    tree = split_tree(busy, kernel_micro_usd, dict(zip(named, sums_by(of, shares, len(codes)))))
    calls: dict[tuple[str, ...], int] = {}
    for path, n in zip(named, np.bincount(of, weights=[k.first for k in computing], minlength=len(codes)).tolist()):
        for depth in range(1, len(path) + 1):
            calls[path[:depth]] = calls.get(path[:depth], 0) + int(n)
    # the costliest first, a parent before its children (it holds at least as much), ties by text
    kept = sorted((p for p in tree if p), key=lambda p: (-tree[p][1], -tree[p][0], len(p), range_text(p)))
    return [(path, calls.get(path, 0), *tree[path]) for path in sorted(kept[:MAX_TENANT_PATHS], key=range_text)]


def range_id_key(tenant_key: str, range_path: str) -> str:
    """What a range record's ``record_id`` hashes for its party: the tenant and the path's text, as a JSON array."""
    return json.dumps([tenant_key, range_path], ensure_ascii=False)


class KernelCost:
    """The kernel cost split: a pane operator over ``log``, reading the tenant of each kernel's process in
    ``bindings`` (the auditor's table, handed in as the SLA tiers are handed the allocations)."""

    def __init__(self, settings: AuditSettings, bindings: BindingTable | None = None) -> None:
        self.weights = Weights(settings.alpha, settings.beta, settings.gamma)
        self.log = KernelLog(settings)
        self.bindings = BindingTable() if bindings is None else bindings

    def records(
        self, pane: PaneTotals, usd_per_gpu_hour: Decimal | None, published: bool = False
    ) -> list[KernelRecord]:
        """The pane's lines and range paths at revision 0 (none for a pane without kernels or GPU samples): tenants
        by key, each one's lines then its paths; ``published``: of the kernels it had when last published
        (``KernelLog.kernels``)."""
        kernels, names, paths = self.log.kernels(pane.gpu_uuid, pane.pane_start_ns, published)
        if not kernels or not pane.covered_ms or pane.node_id is None or pane.gpu_model is None:
            return []
        costs = {r.tenant_key: r.cost_micro_usd for r in apportion(pane, usd_per_gpu_hour, self.weights)}
        by_tenant: dict[str, tuple[Tenant, list[Kernel]]] = {}
        for k in kernels:
            tenant = self.bindings.lookup(names[k.node], k.pid, k.start_ns)
            by_tenant.setdefault(tenant.key, (tenant, []))[1].append(k)
        covered_ns = pane.covered_ms * NS_PER_MS
        self.log.mark_billed(pane.gpu_uuid, pane.pane_start_ns)  # its lines are published now, or were (``_before``)
        out: list[KernelRecord] = []
        for key, (tenant, mine) in sorted(by_tenant.items()):
            cost = costs.get(key, 0)
            time = tenant_time(mine, pane.pane_start_ns, pane.pane_end_ns)
            lines = tenant_lines(mine, names, time, covered_ns, cost)
            party = {
                "gpu_uuid": pane.gpu_uuid,
                "node_id": pane.node_id,
                "gpu_model": pane.gpu_model,
                "pane_start_ns": pane.pane_start_ns,
                "pane_end_ns": pane.pane_end_ns,
                "tenant_key": key,
                **dict(zip(TENANT_FIELDS, tenant)),
            }  # the fields of every record of the tenant's pane, after its id
            for kernel, category, calls, busy_ns, micro_usd in lines:
                out.append(
                    computed(
                        KernelCostRecord,
                        record_id=record_id(
                            pane.gpu_uuid, pane.pane_start_ns, line_id_key(key, category, kernel), 0, "kernel"
                        ),
                        **party,
                        kernel=kernel,
                        category=category,
                        calls=calls,
                        busy_ns=busy_ns,
                        covered_ns=covered_ns,
                        usd_per_gpu_hour=usd_per_gpu_hour,
                        tenant_cost_micro_usd=cost,
                        cost_micro_usd=micro_usd,
                        unpriced=usd_per_gpu_hour is None,
                        revision=0,
                    )
                )
            kernel_micro_usd = cost - lines[0][4]
            for path, calls, busy_ns, micro_usd in tenant_ranges(mine, paths, time, kernel_micro_usd):
                text = range_text(path)
                out.append(
                    computed(
                        RangeCostRecord,
                        record_id=record_id(pane.gpu_uuid, pane.pane_start_ns, range_id_key(key, text), 0, "range"),
                        **party,
                        range_path=text,
                        range_name=path[-1],
                        depth=len(path),
                        calls=calls,
                        busy_ns=busy_ns,
                        covered_ns=covered_ns,
                        usd_per_gpu_hour=usd_per_gpu_hour,
                        tenant_kernel_cost_micro_usd=kernel_micro_usd,
                        cost_micro_usd=micro_usd,
                        unpriced=usd_per_gpu_hour is None,
                        revision=0,
                    )
                )
        return out

    def on_close(self, closing: Closing) -> list[Output]:
        return list(self.records(closing.pane, closing.price))

    def close_many(self, closing: ClosingMany) -> Emitted:
        """``on_close`` of each pane with kernels, its records tagged with it: a pane without any costs one lookup."""
        panes = closing.panes
        with_kernels = [j for j in range(len(panes)) if self.log.has(panes.gpu_uuid[j], int(panes.pane_start_ns[j]))]
        tagged: list[tuple[int, Output]] = []
        if with_kernels:
            totals = panes.take(np.array(with_kernels, np.int64)).totals()
            for j, pane in zip(with_kernels, totals):
                tagged += [(j, r) for r in self.records(pane, closing.prices[j])]
        return Emitted(tagged=tagged)

    def to_state(self) -> dict[str, Any]:
        return self.log.to_state()

    @classmethod
    def from_state(
        cls, state: dict[str, Any], settings: AuditSettings, bindings: BindingTable | None = None
    ) -> KernelCost:
        split = cls(settings, bindings)
        split.log = KernelLog.from_state(state, settings)
        return split
