"""Split one closed pane's cost among its tenants and idle (METRICS.md, steps 1–6)."""
from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

from schemas.exact import micro_usd_per_hour, round_half_even
from schemas.records import IDLE_TENANT, CostRecord, record_id
from streams.money import largest_remainder
from streams.panes import PaneTotals
from streams.tables import Tenant

__all__ = ["Weights", "apportion"]

MS_PER_HOUR = 3_600_000
FULL_UTIL_CP = 100 * 100  # 100 % in hundredths of a percent


class Weights:
    """α, β, γ as exact rationals of the decimals configured."""

    def __init__(self, alpha: Decimal, beta: Decimal, gamma: Decimal) -> None:
        self.alpha, self.beta, self.gamma = Fraction(alpha), Fraction(beta), Fraction(gamma)


def _ratio(part: int, whole: int) -> Fraction:
    return Fraction(part, whole) if whole else Fraction(0)


def apportion(pane: PaneTotals, usd_per_gpu_hour: Decimal | None, weights: Weights) -> list[CostRecord]:
    """Cost records of one pane, idle first then tenants by key; they sum to the pane's cost.

    The busy fraction ``u`` sums the *process* samples' SM utilisation (it can pass 100 %
    when processes overlap, hence the ``min(1, ·)`` of METRICS.md step 4).
    """
    if pane.covered_ms == 0 or pane.node_id is None or pane.gpu_model is None:
        return []
    unpriced = usd_per_gpu_hour is None
    rate = 0 if usd_per_gpu_hour is None else micro_usd_per_hour(usd_per_gpu_hour)
    cost = round_half_even(Fraction(rate * pane.covered_ms, MS_PER_HOUR))

    tenants = sorted(pane.tenants.values(), key=lambda t: t.tenant.key)
    sm_all = sum(t.sm for t in tenants)
    bw_all = sum(t.bw for t in tenants)
    numa_all = sum(t.numa for t in tenants)
    parts = {t.tenant.key: (_ratio(t.sm, sm_all), _ratio(t.bw, bw_all), _ratio(t.numa, numa_all))
             for t in tenants}
    w = {k: weights.alpha * ts + weights.beta * bs + weights.gamma * ls for k, (ts, bs, ls) in parts.items()}
    w_all = sum(w.values(), Fraction(0))
    busy = min(Fraction(1), Fraction(sm_all, FULL_UTIL_CP * pane.covered_ms)) if w_all else Fraction(0)

    shares = {IDLE_TENANT: 1 - busy}
    shares.update({k: busy * wk / w_all if w_all else Fraction(0) for k, wk in w.items()})
    split = largest_remainder(cost, shares, first=IDLE_TENANT)

    def record(key: str, tenant: Tenant, t: Fraction, b: Fraction, l_: Fraction, weight: Fraction) -> CostRecord:
        return CostRecord.model_construct(
            record_id=record_id(pane.gpu_uuid, pane.pane_start_ns, key, 0),
            gpu_uuid=pane.gpu_uuid, node_id=pane.node_id, gpu_model=pane.gpu_model,
            pane_start_ns=pane.pane_start_ns, pane_end_ns=pane.pane_end_ns, tenant_key=key,
            team=tenant.team, env=tenant.env, app=tenant.app, tier=tenant.tier, sla=tenant.sla,
            git_commit=tenant.git_commit, ci_pipeline_id=tenant.ci_pipeline_id,
            t_share=float(t), b_share=float(b), l_share=float(l_), weight=float(weight),
            busy_fraction=float(busy), usd_per_gpu_hour=usd_per_gpu_hour,
            pane_cost_micro_usd=cost, cost_micro_usd=split[key], unpriced=unpriced, revision=0)

    zero = Fraction(0)
    idle = Tenant(IDLE_TENANT, None, None, None, None, None, None)
    out = [record(IDLE_TENANT, idle, zero, zero, zero, zero)]
    out += [record(t.tenant.key, t.tenant, *parts[t.tenant.key], w[t.tenant.key]) for t in tenants]
    return out
