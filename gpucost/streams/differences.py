"""The records a revision publishes (docs/definitions.md, "Late data become revisions"): a recomputed pane's
cost records as differences from what was published before, so that summing a party's records over every
revision gives its current amount, and a party left with nothing gets a closing record. Apart from
``gpucost.streams.revisions``, which keeps what a pane is recomputed from: this is what is published of it.
Both bases go through it: the usage split's ``CostRecord`` and the allocation split's ``AllocationRecord``; and so do
the lines of the kernel cost split (``KernelCostRecord``), a party of which is a tenant's kernel name and category,
with its range paths (``RangeCostRecord``), a party of which is a tenant's path.
"""

from __future__ import annotations

from typing import Any, TypeVar

from gpucost.schemas.records import (
    IDLE_TENANT,
    UNALLOCATED_TENANT,
    AllocationRecord,
    CostRecord,
    KernelCostRecord,
    RangeCostRecord,
    record_id,
)
from gpucost.streams.kernel_cost import NO_KERNEL, KernelRecord, line_id_key, range_id_key

__all__ = ["differences"]

Split = TypeVar("Split", CostRecord, AllocationRecord, KernelRecord)
Party = CostRecord | AllocationRecord | KernelCostRecord | RangeCostRecord

#: per record type: the party's own figures, which a closing record zeroes, and the pane's, which it takes from the
#: pane's new records (the rest keeps the party's last values: who it was)
_PARTY: dict[type, dict[str, Any]] = {
    CostRecord: {"t_share": 0.0, "b_share": 0.0, "l_share": 0.0, "weight": 0.0, "t_num": 0, "b_num": 0, "l_num": 0},
    AllocationRecord: {"allocated_share": 0.0, "allocated_fraction": 0.0, "allocated_num": 0, "allocations": 0},
    KernelCostRecord: {"calls": 0, "busy_ns": 0},
    RangeCostRecord: {"calls": 0, "busy_ns": 0},
}
_PANE: dict[type, tuple[str, ...]] = {
    CostRecord: ("busy_fraction", "pane_cost_micro_usd", "usd_per_gpu_hour", "unpriced", "busy_num", "covered_ms"),
    AllocationRecord: ("pane_cost_micro_usd", "usd_per_gpu_hour", "unpriced", "capacity_num", "covered_ms"),
    KernelCostRecord: ("covered_ns", "usd_per_gpu_hour", "unpriced"),
    RangeCostRecord: ("covered_ns", "usd_per_gpu_hour", "unpriced"),
}
_OWN_PARTIES = (IDLE_TENANT, UNALLOCATED_TENANT)


def differences(old: list[Split], new: list[Split], revision: int) -> list[Split]:
    """The records a recomputation publishes: one for every party whose record changed in any value or that
    is new, its ``cost_micro_usd`` the difference from its previous total, its other fields the new values;
    a closing record of −(its total), its own figures 0, for a party left with nothing. Empty if nothing changed.
    ``old`` and ``new`` are one pane's records of one basis, ``old`` empty if it was never published."""
    before = {_party(r): r for r in old}
    after = {_party(r): r for r in new}
    out = []
    for key, r in after.items():
        was = before.get(key)
        values = r.model_dump(exclude={"record_id", "revision"})
        if was is not None and was.model_dump(exclude={"record_id", "revision"}) == values:
            continue
        out.append(
            r.model_copy(
                update={
                    "record_id": record_id(r.gpu_uuid, r.pane_start_ns, _id_key(r), revision, _basis(r)),
                    "revision": revision,
                    "cost_micro_usd": r.cost_micro_usd - (0 if was is None else was.cost_micro_usd),
                }
            )
        )
    if not out and before.keys() <= after.keys():
        return []
    pane = new[0] if new else None
    tenant_costs = {r.tenant_key: r.tenant_cost_micro_usd for r in new if isinstance(r, KernelCostRecord)}
    kernel_costs: dict[str, int] = {}  # each tenant's kernel lines' µ$ now, what its range paths are dealt from
    for r in new:
        if isinstance(r, KernelCostRecord) and r.category != NO_KERNEL:
            kernel_costs[r.tenant_key] = kernel_costs.get(r.tenant_key, 0) + r.cost_micro_usd
    for key, was in before.items():
        if key in after:
            continue
        closing = {
            "record_id": record_id(was.gpu_uuid, was.pane_start_ns, _id_key(was), revision, _basis(was)),
            "revision": revision,
            "cost_micro_usd": -was.cost_micro_usd,
            **_PARTY[type(was)],
        }
        if pane is not None:
            closing.update({f: getattr(pane, f) for f in _PANE[type(was)]})
        if isinstance(was, KernelCostRecord):  # its tenant's µ$ now: 0 where the tenant ran no kernel left here
            closing["tenant_cost_micro_usd"] = tenant_costs.get(was.tenant_key, 0)
        if isinstance(was, RangeCostRecord):
            closing["tenant_kernel_cost_micro_usd"] = kernel_costs.get(was.tenant_key, 0)
        out.append(was.model_copy(update=closing))
    return sorted(out, key=_order)


def _party(record: Party) -> tuple[str, ...]:
    if isinstance(record, KernelCostRecord):
        return (record.tenant_key, record.category, record.kernel)
    if isinstance(record, RangeCostRecord):
        return (record.tenant_key, "", record.range_path)  # "": no category, so never a kernel line's key
    return (record.tenant_key,)


def _id_key(record: Party) -> str:
    if isinstance(record, KernelCostRecord):
        return line_id_key(record.tenant_key, record.category, record.kernel)
    if isinstance(record, RangeCostRecord):
        return range_id_key(record.tenant_key, record.range_path)
    return record.tenant_key


def _order(record: Party) -> tuple[Any, ...]:
    """The order a close publishes a pane's records in: the pipeline's own parties first, then tenants by key; a
    tenant's kernel lines ``no_kernel`` first, then by kernel name and category (``tenant_lines``), then its range
    paths by their text (``tenant_ranges``)."""
    if isinstance(record, KernelCostRecord):
        return (record.tenant_key, int(record.category != NO_KERNEL), record.kernel, record.category)
    if isinstance(record, RangeCostRecord):
        return (record.tenant_key, 2, record.range_path, "")
    return (record.tenant_key not in _OWN_PARTIES, record.tenant_key)


def _basis(record: Party) -> str:
    if isinstance(record, KernelCostRecord):
        return "kernel"
    if isinstance(record, RangeCostRecord):
        return "range"
    return record.cost_basis if isinstance(record, AllocationRecord) else "usage"
