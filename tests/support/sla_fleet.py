"""The SLA tiers' scripted fleet: per GPU, per tenant pid, its SM % in each pane, as events (a price, the tenants'
bindings, a GPU sample a pane and each tenant's process samples), and the scripts that put idle runs just under and
just over each tier's duration."""

from __future__ import annotations

from decimal import Decimal

from gpucost.schemas.events import Event, GpuSample, Price, ProcessSample, TenantBinding

NS = 1_000_000_000
T0 = 1_767_571_200 * NS
P_S = 60
#: the tenants: pid → (team, sla)
TENANTS = {1: ("gold-team", "Gold"), 2: ("silver-team", "Silver"), 3: ("bronze-team", "Bronze")}


def fleet(scripts: dict[str, dict[int, list[float | None]]], gaps: dict[str, set[int]] | None = None) -> list[Event]:
    """Per GPU, per tenant pid, its SM % in each pane (None: absent). Every pane has a GPU sample, but for the
    panes of ``gaps``, which have no event of the GPU at all."""
    events: list[Event] = [Price(gpu_model="H100", ts_ns=T0 - NS, usd_per_gpu_hour=Decimal("2.5"))]
    for gpu in scripts:
        for pid, (team, sla) in TENANTS.items():
            events.append(
                TenantBinding(node_id=f"n-{gpu}", pid=pid, ts_ns=T0, team=team, env="prod", app="a", tier="P1", sla=sla)
            )
    panes = max(len(s) for per in scripts.values() for s in per.values())
    for p in range(panes):
        ts = T0 + p * P_S * NS + 7 * NS
        for gpu, per in scripts.items():
            if p in (gaps or {}).get(gpu, ()):
                continue
            events.append(
                GpuSample(
                    node_id=f"n-{gpu}",
                    gpu_uuid=gpu,
                    gpu_model="H100",
                    ts_ns=ts,
                    interval_s=60.0,
                    sm_util_pct=50.0,
                    mem_bw_util_pct=5.0,
                    mem_used_bytes=1,
                    mem_total_bytes=2,
                    power_w=300.0,
                    temp_c=50.0,
                )
            )
            for pid, utils in per.items():
                if p < len(utils) and utils[p] is not None:
                    # two samples, of 20 s and 40 s: the tenant's utilisation is their time-weighted mean
                    for shift, interval, util in ((1, 20.0, utils[p]), (31, 40.0, utils[p])):  # 30 s apart: no overlap
                        events.append(
                            ProcessSample(
                                node_id=f"n-{gpu}",
                                gpu_uuid=gpu,
                                pid=pid,
                                ts_ns=ts + shift * NS,
                                interval_s=interval,
                                sm_util_pct=util,
                                mem_bw_util_pct=1.0,
                                mem_used_bytes=1,
                            )
                        )
    return events


IDLE, BUSY = 1.0, 40.0  # 1 % is idle for Gold (< 5 %) and Silver (< 10 %), busy for Bronze (= 0 %)
SCRIPTS: dict[str, dict[int, list[float | None]]] = {
    # Gold idle 11 panes (660 s: just under 720 s), busy, then 12 (just over): one trigger
    "G0": {1: [IDLE] * 11 + [BUSY] + [IDLE] * 12 + [BUSY]},
    # Silver 2 panes (under 180 s), busy, 3 (at): one; Bronze at 0.01 % never idle, at 0 % idle at once
    "G1": {2: [IDLE, IDLE, BUSY, IDLE, IDLE, IDLE, IDLE], 3: [0.01] * 4 + [0.0] * 3},
    # the Gold tenant leaves mid-run (absent one pane) and comes back idle: the run starts again
    "G2": {1: [IDLE] * 8 + [None] + [IDLE] * 12, 2: [BUSY] * 21},
    # three tiers on one GPU, all idle
    "G3": {1: [0.0] * 13, 2: [0.0] * 13, 3: [0.0] * 13},
    # the GPU itself reports nothing for one pane (index 6) in the Gold tenant's idle run: the run starts again
    "G4": {1: [IDLE] * 6 + [None] + [IDLE] * 11},
}
GAPS = {"G4": {6}}
