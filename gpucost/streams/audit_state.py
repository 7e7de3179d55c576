"""What stays of an auditor between runs and across restarts: its snapshot (``to_state``, ``from_state``), its
successor once a finite input ended, and the pruning that bounds its tables. A part of ``Auditor``
(``gpucost.streams.audit``), kept apart so that the routing of events there reads on its own.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any, Self

from gpucost.schemas.kernels import MAX_KERNEL_NS
from gpucost.streams.allocations import AllocationSplit
from gpucost.streams.efficiency import Efficiency
from gpucost.streams.health import HealthAudit
from gpucost.streams.idle_index import IdleIndex
from gpucost.streams.kernel_cost import KernelCost
from gpucost.streams.mae import Mae
from gpucost.streams.operator import CostSplit
from gpucost.streams.pane_totals import PaneColumns
from gpucost.streams.panes import GpuPanes
from gpucost.streams.revisions import Revisions
from gpucost.streams.settings import AuditSettings
from gpucost.streams.sla import SlaOperator
from gpucost.streams.tables import BindingTable, PriceTable

__all__ = ["AuditState"]


class AuditState:
    """What ``Auditor`` holds: every operator, built, snapshotted, handed on and pruned in one place."""

    def __init__(
        self, settings: AuditSettings, clock: Callable[[], int] | None = None, audit_key: bytes | None = None
    ) -> None:
        self.settings = settings
        self.clock = clock
        # signs the health records (docs/definitions.md, "Health audit": HMAC of their hash); None: unsigned
        self.audit_key = audit_key
        self.panes = GpuPanes(settings)
        self.idle = IdleIndex(settings)
        self.cost = CostSplit(settings)
        self.allocations = AllocationSplit(settings)
        # reads the allocation split's holds (a held GPU idle is a reclaim candidate), never writes them
        self.sla = SlaOperator(settings, self.allocations.table)
        self.health = HealthAudit(settings, audit_key)
        self.efficiency = Efficiency(settings)
        self.mae = Mae(settings)
        self.revisions = Revisions(settings)
        self.bindings = BindingTable()
        self.prices = PriceTable()
        # reads the tenants of kernels' processes in the bindings, never writes them
        self.kernels = KernelCost(settings, self.bindings)
        self.counts: Counter[str] = Counter()
        #: called with every pane as it closes and again each time a revision changes it, whichever path
        #: closed it (``close``, ``close_many``, ``_republish``): the one hook for a reader of closed panes (the
        #: weights fit), so that none can miss a revised pane by overriding one path
        self.on_closed: Callable[[PaneColumns], None] | None = None

    def successor(self) -> Self:
        """What stays of a key once its finite input ended (after ``finish``): a fresh auditor whose
        watermark of each GPU stands at the end of the last pane closed, so that later panes open as usual,
        and which keeps everything the same input sent again (a second ``produce`` of a file, signed messages
        copied back into the topic) is checked against (docs/definitions.md, "Re-sent input"): the revision log (samples
        and NUMA events), the bindings and prices (a binding or price of an instant already taken), and each
        process's addresses taken (``Mae.resume_after``). It is then a ``duplicate`` or ``late``, never billed or
        attributed again; a re-sent binding once met an empty table, was taken as new, and moved every logged
        pane of its process to its tenant, recomputed against no binding at all."""
        nxt = type(self)(self.settings, self.clock, self.audit_key)
        nxt.revisions = self.revisions  # what a late event, or the same input again, is checked against
        nxt.bindings, nxt.prices, nxt.allocations = self.bindings, self.prices, self.allocations
        nxt.kernels = self.kernels  # the kernels kept: one sent again is a duplicate, or late
        nxt.sla.allocations = nxt.allocations.table  # the holds it reads are the ones handed on
        nxt.mae.resume_after(self.mae)
        nxt.panes.resume_after(self.panes)
        nxt.health.resume_after(self.health)
        nxt.on_closed = self.on_closed
        return nxt

    def prune_gpu(self, gpu_uuid: str) -> None:
        """Drop what the GPU keeps for revisions (its log rows, its kernels, its ended holds) of panes beyond the
        horizon of its watermark."""
        watermark = self.panes.watermark(gpu_uuid)
        self.revisions.prune(gpu_uuid, watermark)
        if unbilled := self.kernels.log.prune(gpu_uuid, watermark):
            self.counts["unbilled_kernels"] += unbilled  # kernels of panes never billed (no GPU sample, or none open)
        self.prune_holds(gpu_uuid)

    def prune_holds(self, gpu_uuid: str) -> None:
        """Drop the GPU's holds that ended at or before its watermark less the revision horizon and a pane: after
        every sample it takes (``prune_gpu``) and every allocation, so that what it keeps does not depend on where a
        batch or a transport cut the input."""
        watermark = self.panes.watermark(gpu_uuid)
        horizon = self.settings.revision_horizon_ns + self.settings.pane_ns
        self.allocations.table.prune(gpu_uuid, None if watermark is None else watermark - horizon)

    def prune(self) -> None:
        """Drop the bindings no on-time event can reach any more (superseded before the oldest pane an
        event may still fall in), so that a long-lived key's state does not grow with every process
        its node ever ran."""
        floor = self.panes.earliest_on_time_ns()
        if floor is not None:
            # a revision looks bindings up too, and a kernel's tenant as of its start, up to an hour before its pane
            self.bindings.prune(floor - self.settings.revision_horizon_ns - MAX_KERNEL_NS)

    def to_state(self, idle: bool = True) -> dict[str, Any]:
        """JSON-serialisable snapshot, for a changelog or a checkpoint (``idle=False``: without the
        idle windows, which a changelog writes apart, only when they changed)."""
        return {
            "panes": self.panes.to_state(),
            **({"idle": self.idle.to_state()} if idle else {}),
            "mae": self.mae.to_state(),
            "sla": self.sla.to_state(),
            "health": self.health.to_state(),
            "bindings": self.bindings.to_state(),
            "revisions": self.revisions.to_state(),
            "prices": self.prices.to_state(),
            "allocations": self.allocations.to_state(),
            "kernels": self.kernels.to_state(),
            "counts": dict(self.counts),
        }

    @classmethod
    def from_state(
        cls,
        state: dict[str, Any],
        settings: AuditSettings,
        clock: Callable[[], int] | None = None,
        audit_key: bytes | None = None,
    ) -> Self:
        """The auditor ``to_state`` wrote, under ``settings`` (arguments in the order every operator's
        ``from_state`` takes them)."""
        auditor = cls(settings, clock, audit_key)
        if "allocations" in state:  # a state written before the allocation basis has no holds
            auditor.allocations = AllocationSplit.from_state(state["allocations"], settings)
        auditor.sla.allocations = auditor.allocations.table
        if "sla" in state:  # a state written before the SLA tiers starts its runs afresh
            auditor.sla = SlaOperator.from_state(state["sla"], settings, auditor.allocations.table)
        if "health" in state:  # a state written before the health audit starts its GPUs afresh
            auditor.health = HealthAudit.from_state(state["health"], settings, audit_key)
        auditor.panes = GpuPanes.from_state(state["panes"], settings)
        auditor.idle = IdleIndex.from_state(state["idle"], settings)
        auditor.mae = Mae.from_state(state["mae"], settings)
        auditor.bindings = BindingTable.from_state(state["bindings"], settings)
        auditor.kernels = KernelCost.from_state(state.get("kernels", {}), settings, auditor.bindings)
        if "revisions" in state:  # a state written before revisions (or with none) keeps nothing to revise
            auditor.revisions = Revisions.from_state(state["revisions"], settings)
        auditor.prices = PriceTable.from_state(state["prices"], settings)
        auditor.counts = Counter(state["counts"])
        return auditor
