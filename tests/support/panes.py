"""Closed panes built by hand, for tests of one operator at a time."""

from __future__ import annotations

from decimal import Decimal

from gpucost.schemas.records import IdleIndexRecord
from gpucost.streams.operator import Closing
from gpucost.streams.pane_totals import PaneTotals, TenantTotals
from gpucost.streams.tables import Tenant

PANE_NS = 60 * 1_000_000_000


def pane_of(covered_ms: int, tenants: dict[str, tuple[int, int, int]], gpu_uuid: str = "GPU-0") -> PaneTotals:
    """A pane of ``gpu_uuid`` starting at 0 with ``covered_ms`` of GPU samples and, per tenant key (its team),
    the sums ``(Σ sm_util_cp · ms, Σ mem_bw_util_cp · ms, Σ hops · latency_weight)`` of one process sample."""
    return PaneTotals(
        gpu_uuid=gpu_uuid,
        pane_start_ns=0,
        pane_end_ns=PANE_NS,
        node_id="node-0",
        gpu_model="H100",
        covered_ms=covered_ms,
        tenants={k: TenantTotals(Tenant.named(k), sm, bw, numa, 1) for k, (sm, bw, numa) in tenants.items()},
    )


def closing(pane: PaneTotals, price: Decimal | None = None, idle_ms_72h: int = 0, covered_ms_72h: int = 1) -> Closing:
    """``pane`` as a pane operator's row entry takes it, at ``price``, with the given 72 h sums."""
    assert pane.node_id is not None and pane.gpu_model is not None
    idle = IdleIndexRecord(
        gpu_uuid=pane.gpu_uuid,
        node_id=pane.node_id,
        gpu_model=pane.gpu_model,
        pane_start_ns=pane.pane_start_ns,
        pane_end_ns=pane.pane_end_ns,
        idle_ms=pane.idle_ms,
        covered_ms=pane.covered_ms,
        idle_ms_72h=idle_ms_72h,
        covered_ms_72h=covered_ms_72h,
        idle_index_72h=idle_ms_72h / covered_ms_72h,
        revision=0,
    )
    return Closing(pane, price, idle)
