"""The SLA tiers' candidates by allocation: the tenants holding a device in a closed pane (docs/definitions.md,
"SLA tiers"), read from the allocation basis's table of holds, never written.

A tenant that holds a GPU (a pod's GPU, a Slurm job) and runs nothing on it is the money a reclaim saves: it is
judged in every pane its holds cover whole, with its processes' ``sm`` there (0 without them). Its key is the
``Tenant.key`` a binding's tenant has, so a tenant that holds the GPU and runs on it is one candidate.

Two guards keep a reclaim off a GPU in use. A hold that covers only part of a pane (it began or ended inside it)
makes no candidate of it there: judged over the whole pane, a job released at 00:30:00.000000001 or admitted a
second before a pane's end would be idle for the whole of it. And usage under a key that holds nothing on the
device (``unattributed``, or a job's processes bound under other fields than its hold's: a ``GPUCOST_SLA`` in its
environment, a label its scheduler does not list) could be a holder's own: then no holder is judged on its
holds alone in that pane.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from typing import NamedTuple

from gpucost.streams.allocations import AllocationTable
from gpucost.streams.pane_totals import PaneColumns
from gpucost.streams.tables import Tenant

__all__ = ["Held", "held_by", "held_in", "held_only"]


class Held(NamedTuple):
    """A tenant holding the device in a pane: its hold's fields, and whether its holds cover all of the pane."""

    tenant: Tenant
    whole: bool


def held_by(table: AllocationTable | None, gpu_uuid: str, start_ns: int, end_ns: int) -> dict[str, Held]:
    """The tenants whose holds cover part of ``[start_ns, end_ns)`` of the device, by key: a tenant with several
    holds once (its first hold's fields, should two tenants' fields join to one key), ``whole`` where its holds
    together leave no instant of the pane uncovered."""
    if table is None:
        return {}
    tenants: dict[str, Tenant] = {}
    spans: dict[str, list[tuple[int, int]]] = {}
    for hold in table.holds(gpu_uuid, start_ns, end_ns):
        key = hold.tenant.key
        tenants.setdefault(key, hold.tenant)
        end = end_ns if hold.end_ns is None else min(end_ns, hold.end_ns)
        spans.setdefault(key, []).append((max(start_ns, hold.start_ns), end))
    return {key: Held(tenant, _covers(spans[key], start_ns, end_ns)) for key, tenant in tenants.items()}


def _covers(spans: list[tuple[int, int]], start_ns: int, end_ns: int) -> bool:
    reach = start_ns
    for start, end in sorted(spans):
        if start > reach:
            return False
        reach = max(reach, end)
    return reach >= end_ns


def held_only(held: dict[str, Held], busy: Iterable[str]) -> set[str]:
    """The holders a pane judges on their holds alone (those without a process sample there are among them): the
    ones whose holds cover the whole pane, unless a tenant busy in the pane (``busy``: keys with process samples
    and ``sm > 0``) holds nothing on the device, whose usage could be a holder's under other fields."""
    if any(key not in held for key in busy):
        return set()
    return {key for key, h in held.items() if h.whole}


def held_in(table: AllocationTable | None, panes: PaneColumns) -> dict[int, dict[str, Held]]:
    """``held_by`` of each pane of ``panes`` with holders, by pane index: a device without holds (most, in a fleet
    that sends no allocations) costs one lookup a pane. A device's panes between the same two of its holds' starts and
    ends (none strictly inside them) are covered whole by the same holds and met by no other: they share one
    ``held_by``, found once (a reading per pane was a tenth of a replay with allocations)."""
    held: dict[int, dict[str, Held]] = {}
    if table is None:
        return held
    found: dict[tuple[str, int], dict[str, Held]] = {}  # (device, index of the stretch between its cuts)
    cuts: dict[str, list[int]] = {}
    for j, (gpu, start, end) in enumerate(
        zip(panes.gpu_uuid.tolist(), panes.pane_start_ns.tolist(), panes.pane_end_ns.tolist())
    ):
        since = table.since(gpu)
        if since is None or since >= end:
            continue
        if (at := cuts.get(gpu)) is None:
            at = cuts[gpu] = sorted({t for h in table.held(gpu) for t in (h.start_ns, h.end_ns) if t is not None})
        stretch = bisect_right(at, start)
        if stretch == bisect_left(at, end):  # no start or end of a hold strictly inside the pane
            holders = found.get((gpu, stretch))
            if holders is None:
                holders = found[gpu, stretch] = held_by(table, gpu, start, end)
        else:
            holders = held_by(table, gpu, start, end)
        if holders:
            held[j] = holders
    return held
