"""Split one closed pane's cost among its tenants and idle (METRICS.md, steps 1–6)."""
from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

from schemas.exact import div_half_even, micro_usd_per_hour
from schemas.records import IDLE_TENANT, CostRecord, computed_from, record_id
from streams.money import split_in_order
from streams.panes import PaneTotals
from streams.tables import Tenant

__all__ = ["Weights", "apportion"]

MS_PER_HOUR = 3_600_000
FULL_UTIL_CP = 100 * 100  # 100 % in hundredths of a percent


class Weights:
    """α, β, γ as integers over one common denominator: the exact decimals configured."""

    def __init__(self, alpha: Decimal, beta: Decimal, gamma: Decimal) -> None:
        exact = [Fraction(alpha), Fraction(beta), Fraction(gamma)]
        self.denominator = math.lcm(*(f.denominator for f in exact))
        self.alpha, self.beta, self.gamma = (int(f * self.denominator) for f in exact)


def apportion(pane: PaneTotals, usd_per_gpu_hour: Decimal | None, weights: Weights) -> list[CostRecord]:
    """Cost records of one pane, idle first then tenants by key; they sum to the pane's cost.

    The busy fraction ``u`` sums the *process* samples' SM utilisation (it can pass 100 %
    when processes overlap, hence the ``min(1, ·)`` of METRICS.md step 4).

    All in integers: with component totals T, B, L (a zero total counted as 1, its
    component then being 0 for everyone), tenant i's weight is
    ``w_i = (α·t_i·B·L + β·b_i·T·L + γ·l_i·T·B) / (D·T·B·L)`` for α, β, γ over D, and every
    share is an integer over the pane's one denominator ``u_d · Σ_j W_j``.
    """
    if pane.covered_ms == 0 or pane.node_id is None or pane.gpu_model is None:
        return []
    unpriced = usd_per_gpu_hour is None
    rate = 0 if usd_per_gpu_hour is None else micro_usd_per_hour(usd_per_gpu_hour)
    cost = div_half_even(rate * pane.covered_ms, MS_PER_HOUR)

    tenants = sorted(pane.tenants.items())  # by tenant key
    sm_all = sum(t.sm for _, t in tenants)
    bw_all = sum(t.bw for _, t in tenants)
    numa_all = sum(t.numa for _, t in tenants)
    t_den, b_den, l_den = sm_all or 1, bw_all or 1, numa_all or 1
    scale = weights.denominator * t_den * b_den * l_den  # w_i = W[i] / scale
    big_w = [weights.alpha * t.sm * b_den * l_den + weights.beta * t.bw * t_den * l_den
             + weights.gamma * t.numa * t_den * b_den for _, t in tenants]
    w_all = sum(big_w)
    if w_all == 0:
        busy_n, busy_d = 0, 1
    elif sm_all >= FULL_UTIL_CP * pane.covered_ms:
        busy_n, busy_d = 1, 1
    else:
        busy_n, busy_d = sm_all, FULL_UTIL_CP * pane.covered_ms
    # idle first, then the tenants by key: the split's tie-break order
    if w_all:
        split = split_in_order(cost, [(busy_d - busy_n) * w_all, *(busy_n * w for w in big_w)], busy_d * w_all)
    else:
        split = split_in_order(cost, [1, *(0 for _ in big_w)], 1)
    gpu_uuid, node_id, gpu_model, start_ns, end_ns = (pane.gpu_uuid, pane.node_id, pane.gpu_model,
                                                      pane.pane_start_ns, pane.pane_end_ns)
    busy = busy_n / busy_d

    def record(key: str, tenant: Tenant, t: float, b: float, l_: float, weight: float, micro_usd: int) -> CostRecord:
        team, env, app, tier, sla, git_commit, ci_pipeline_id = tenant
        return computed_from(CostRecord, {  # in the model's field order
            "record_id": record_id(gpu_uuid, start_ns, key, 0), "gpu_uuid": gpu_uuid, "node_id": node_id,
            "gpu_model": gpu_model, "pane_start_ns": start_ns, "pane_end_ns": end_ns, "tenant_key": key,
            "team": team, "env": env, "app": app, "tier": tier, "sla": sla, "git_commit": git_commit,
            "ci_pipeline_id": ci_pipeline_id, "t_share": t, "b_share": b, "l_share": l_, "weight": weight,
            "busy_fraction": busy, "usd_per_gpu_hour": usd_per_gpu_hour, "pane_cost_micro_usd": cost,
            "cost_micro_usd": micro_usd, "unpriced": unpriced, "revision": 0})

    idle = Tenant(IDLE_TENANT, None, None, None, None, None, None)
    out = [record(IDLE_TENANT, idle, 0.0, 0.0, 0.0, 0.0, split[0])]
    # int / int is correctly rounded in Python: the same floats as the exact fractions give
    out += [record(k, t.tenant, t.sm / t_den, t.bw / b_den, t.numa / l_den, w / scale, micro_usd)
            for (k, t), w, micro_usd in zip(tenants, big_w, split[1:])]
    return out
