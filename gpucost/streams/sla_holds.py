"""The SLA tiers' candidates by allocation: the tenants holding a device in a closed pane (docs/definitions.md,
"SLA tiers"), read from the allocation basis's table of holds, never written.

A tenant that holds a GPU (a pod's GPU, a Slurm job) and runs nothing on it is the money a reclaim saves: it is
judged in every pane its holds cover part of, with its processes' ``sm`` there (0 without them). Its key is the
``Tenant.key`` a binding's tenant has, so a tenant that holds the GPU and runs on it is one candidate.
"""

from __future__ import annotations

from gpucost.streams.allocations import AllocationTable
from gpucost.streams.pane_totals import PaneColumns
from gpucost.streams.tables import Tenant

__all__ = ["held_by", "held_in"]


def held_by(table: AllocationTable | None, gpu_uuid: str, start_ns: int, end_ns: int) -> dict[str, Tenant]:
    """The tenants whose holds cover part of ``[start_ns, end_ns)`` of the device, by key: a tenant with several
    holds once (its first hold's fields, should two tenants' fields join to one key)."""
    held: dict[str, Tenant] = {}
    if table is None:
        return held
    for hold in table.holds(gpu_uuid, start_ns, end_ns):
        held.setdefault(hold.tenant.key, hold.tenant)
    return held


def held_in(table: AllocationTable | None, panes: PaneColumns) -> dict[tuple[int, str], Tenant]:
    """``held_by`` of each pane of ``panes``, as (pane index, tenant key) → tenant: a device without holds (most, in
    a fleet that sends no allocations) costs one lookup a pane."""
    held: dict[tuple[int, str], Tenant] = {}
    if table is None:
        return held
    for j, (gpu, start, end) in enumerate(
        zip(panes.gpu_uuid.tolist(), panes.pane_start_ns.tolist(), panes.pane_end_ns.tolist())
    ):
        since = table.since(gpu)
        if since is None or since >= end:
            continue
        for key, tenant in held_by(table, gpu, start, end).items():
            held[(j, key)] = tenant
    return held
