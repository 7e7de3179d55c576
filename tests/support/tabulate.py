"""The auditor's row path run over a list of events, and its outputs tabulated as the batch reference tabulates its
own (tests/reference.py): idle panes, cost shares, kernel cost lines, MAE windows, efficiency rows and refused
events, keyed so that two runs compare as dicts."""

from __future__ import annotations

from gpucost.schemas.events import Event
from gpucost.schemas.records import (
    CostRecord,
    DeadLetter,
    EfficiencyRecord,
    IdleIndexRecord,
    KernelCostRecord,
    MaeRecord,
    Output,
)
from gpucost.streams.audit import Auditor
from gpucost.streams.settings import AuditSettings


def run(events: list[Event], s: AuditSettings) -> list[Output]:
    auditor = Auditor(s)
    out: list[Output] = []
    for ev in events:
        out += auditor.update(ev)
    return out + auditor.finish()


def tabulate(outs: list[Output]) -> dict[str, object]:
    def revised(r: IdleIndexRecord | CostRecord | KernelCostRecord) -> tuple[int, ...]:
        return (r.revision,) if r.revision else ()  # the reference publishes no revisions: its keys have none

    keys = [
        (r.gpu_uuid, r.pane_start_ns, getattr(r, "tenant_key", None), r.revision)
        for r in outs
        if isinstance(r, (IdleIndexRecord, CostRecord))
    ]
    assert len(keys) == len(set(keys)), "a (GPU, pane) was published twice in one revision"
    idle = {
        (r.gpu_uuid, r.pane_start_ns, *revised(r)): (
            r.node_id,
            r.gpu_model,
            r.idle_ms,
            r.covered_ms,
            r.idle_ms_72h,
            r.covered_ms_72h,
            r.idle_index_72h,
        )
        for r in outs
        if isinstance(r, IdleIndexRecord)
    }
    cost = {
        (r.gpu_uuid, r.pane_start_ns, r.tenant_key, *revised(r)): (
            r.cost_micro_usd,
            r.pane_cost_micro_usd,
            r.t_share,
            r.b_share,
            r.l_share,
            r.weight,
            r.busy_fraction,
            r.unpriced,
        )
        for r in outs
        if isinstance(r, CostRecord)
    }
    kernel = {
        (r.gpu_uuid, r.pane_start_ns, r.tenant_key, r.category, r.kernel, *revised(r)): (
            r.cost_micro_usd,
            r.tenant_cost_micro_usd,
            r.busy_ns,
            r.calls,
        )
        for r in outs
        if isinstance(r, KernelCostRecord)
    }
    mae = sorted(
        (r.node_id, r.pid, r.first_ts_ns, r.last_ts_ns, r.n, r.out_of_range, r.mae_bits)
        for r in outs
        if isinstance(r, MaeRecord)
    )
    efficiency = {
        (r.gpu_uuid, r.pane_start_ns, r.pid): (
            r.flops,
            r.efu,
            r.efu_source,
            r.bw_util,
            r.delta_bw,
            r.bw_source,
            r.diagnosis,
        )
        for r in outs
        if isinstance(r, EfficiencyRecord)
    }
    refused = {
        reason: sum(1 for r in outs if isinstance(r, DeadLetter) and r.reason == reason)
        for reason in ("late", "duplicate", "overlap")
    }
    return {"idle": idle, "cost": cost, "kernel": kernel, "mae": mae, "efficiency": efficiency, **refused}
