"""Split one closed pane's cost among its tenants and idle (docs/definitions.md, "Cost split", steps 1–7)."""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction
from functools import lru_cache
from typing import Any

import numpy as np
import pyarrow as pa

from gpucost.schemas.arrow import ARROW_SCHEMAS, wide_array
from gpucost.schemas.events import TENANT_FIELDS
from gpucost.schemas.exact import div_half_even, micro_usd_per_hour, ratios
from gpucost.schemas.partitions import device_share
from gpucost.schemas.records import IDLE_TENANT, CostRecord, computed_from, record_id, record_ids
from gpucost.streams.money import split_in_order, split_many
from gpucost.streams.pane_totals import PaneColumns, PaneTotals
from gpucost.streams.tables import Tenant

__all__ = ["Weights", "apportion", "apportion_many", "pane_cost_micro_usd", "tenant_weights"]

MS_PER_HOUR = 3_600_000
FULL_UTIL_CP = 100 * 100  # 100 % in hundredths of a percent


class Weights:
    """α, β, γ as integers over one common denominator: the exact decimals configured."""

    def __init__(self, alpha: Decimal, beta: Decimal, gamma: Decimal) -> None:
        exact = [Fraction(alpha), Fraction(beta), Fraction(gamma)]
        self.denominator = math.lcm(*(f.denominator for f in exact))
        self.alpha, self.beta, self.gamma = (int(f * self.denominator) for f in exact)


def pane_cost_micro_usd(usd_per_gpu_hour: Decimal | None, covered_ms: int, gpu_model: str) -> int:
    """A pane's cost C in µ$ (docs/definitions.md, "Cost split", step 2): the price × the device's share
    (``gpucost.schemas.partitions``: 1 but for a partition) × its covered time, rounded half to even once; 0
    unpriced. Every basis splits this one figure."""
    return _pane_cost(usd_per_gpu_hour, int(covered_ms), gpu_model)


@lru_cache(maxsize=1 << 14)
def _pane_cost(usd_per_gpu_hour: Decimal | None, covered_ms: int, gpu_model: str) -> int:
    """``pane_cost_micro_usd``, remembered for the latest arguments: a fleet's panes share few prices, models and
    covered times, and each pane asks once per basis (278,321 times in a 72 h replay of 32 GPUs). Equal prices give
    equal µ$ whatever their digits; ``covered_ms`` is a Python int here, so an answer is never a numpy one."""
    rate = 0 if usd_per_gpu_hour is None else micro_usd_per_hour(usd_per_gpu_hour)
    share = device_share(gpu_model)[1]
    return div_half_even(rate * share.numerator * covered_ms, share.denominator * MS_PER_HOUR)


def apportion(pane: PaneTotals, usd_per_gpu_hour: Decimal | None, weights: Weights) -> list[CostRecord]:
    """Cost records of one pane, idle first then tenants by key; they sum to the pane's cost.

    The busy fraction ``u`` sums the *process* samples' SM utilisation (it can pass 100 %
    when processes overlap, hence the ``min(1, ·)`` of docs/definitions.md, "Cost split", step 4).

    All in integers: with component totals T, B, L (a zero total counted as 1, its
    component then being 0 for everyone), tenant i's weight is
    ``w_i = (α·t_i·B·L + β·b_i·T·L + γ·l_i·T·B) / (D·T·B·L)`` for α, β, γ over D, and every
    share is an integer over the pane's one denominator ``u_d · Σ_j W_j``.
    """
    if pane.covered_ms == 0 or pane.node_id is None or pane.gpu_model is None:
        return []
    unpriced = usd_per_gpu_hour is None
    cost = pane_cost_micro_usd(usd_per_gpu_hour, pane.covered_ms, pane.gpu_model)

    tenants = sorted(pane.tenants.items())  # by tenant key
    sm_all = sum(t.sm for _, t in tenants)
    t_den, b_den, l_den = _denominators(pane)
    scale = weights.denominator * t_den * b_den * l_den  # w_i = W[i] / scale
    big_w = tenant_weights(pane, weights)
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
    gpu_uuid, node_id, gpu_model, start_ns, end_ns = (
        pane.gpu_uuid,
        pane.node_id,
        pane.gpu_model,
        pane.pane_start_ns,
        pane.pane_end_ns,
    )
    busy = busy_n / busy_d

    def record(
        key: str,
        tenant: Tenant,
        t: float,
        b: float,
        l_: float,
        weight: float,
        micro_usd: int,
        sums: tuple[int, int, int],
    ) -> CostRecord:
        return computed_from(
            CostRecord,
            {  # in the model's field order
                "record_id": record_id(gpu_uuid, start_ns, key, 0),
                "gpu_uuid": gpu_uuid,
                "node_id": node_id,
                "gpu_model": gpu_model,
                "pane_start_ns": start_ns,
                "pane_end_ns": end_ns,
                "tenant_key": key,
                **dict(zip(TENANT_FIELDS, tenant)),
                "t_share": t,
                "b_share": b,
                "l_share": l_,
                "weight": weight,
                "busy_fraction": busy,
                "usd_per_gpu_hour": usd_per_gpu_hour,
                "pane_cost_micro_usd": cost,
                "cost_micro_usd": micro_usd,
                "unpriced": unpriced,
                "revision": 0,
                "t_num": sums[0],
                "b_num": sums[1],
                "l_num": sums[2],
                "busy_num": sm_all,
                "covered_ms": pane.covered_ms,
            },
        )

    idle = Tenant.named(IDLE_TENANT)
    out = [record(IDLE_TENANT, idle, 0.0, 0.0, 0.0, 0.0, split[0], (0, 0, 0))]
    # int / int is correctly rounded in Python: the same floats as the exact fractions give
    out += [
        record(k, t.tenant, t.sm / t_den, t.bw / b_den, t.numa / l_den, w / scale, micro_usd, (t.sm, t.bw, t.numa))
        for (k, t), w, micro_usd in zip(tenants, big_w, split[1:])
    ]
    return out


def _denominators(pane: PaneTotals) -> tuple[int, int, int]:
    """The pane's component totals T, B, L, a zero total counted as 1 (its component is 0 for everyone)."""
    return (
        sum(t.sm for t in pane.tenants.values()) or 1,
        sum(t.bw for t in pane.tenants.values()) or 1,
        sum(t.numa for t in pane.tenants.values()) or 1,
    )


def tenant_weights(pane: PaneTotals, weights: Weights) -> list[int]:
    """Each tenant's weight ``w_i`` (tenants by key) times ``D·T·B·L``: integers over one denominator."""
    t_den, b_den, l_den = _denominators(pane)
    return [
        weights.alpha * t.sm * b_den * l_den
        + weights.beta * t.bw * t_den * l_den
        + weights.gamma * t.numa * t_den * b_den
        for _, t in sorted(pane.tenants.items())
    ]


def apportion_many(
    panes: PaneColumns, prices: list[Decimal | None], weights: Weights
) -> tuple[pa.Table, list[Decimal | None], np.ndarray]:
    """``apportion`` of many panes with GPU samples at once: the cost records as columns (in the
    order ``apportion`` gives them, pane after pane), their prices, and how many each pane has.

    The same integers as ``apportion``, over arrays of Python integers (a pane's denominator
    passes 64 bits): tenant values over the tenant rows, the idle party's over the panes, and
    the largest remainder ranks each party against the others of its pane.
    """
    billed = panes.covered_ms > 0  # a pane without covered time bills nothing, its tenants neither
    rows = np.flatnonzero(billed[panes.t_pane])
    pane = panes.t_pane[rows]  # each tenant row's pane
    lo = np.searchsorted(pane, np.arange(len(panes)))
    hi = np.searchsorted(pane, np.arange(len(panes)), "right")

    def per_pane(values: np.ndarray) -> np.ndarray:
        total = np.concatenate([[0], np.cumsum(values)]).astype(object)
        sums: np.ndarray = total[hi] - total[lo]  # numpy's stubs: an ndarray indexed by one is Any
        return sums

    sm, bw, numa = panes.t_sm[rows], panes.t_bw[rows], panes.t_numa[rows]
    sm_all, bw_all, numa_all = per_pane(sm), per_pane(bw), per_pane(numa)
    t_den, b_den, l_den = (np.where(v == 0, 1, v).astype(object) for v in (sm_all, bw_all, numa_all))
    t_p, b_p, l_p = t_den[pane], b_den[pane], l_den[pane]
    big_w = weights.alpha * sm * b_p * l_p + weights.beta * bw * t_p * l_p + weights.gamma * numa * t_p * b_p
    w_all = per_pane(big_w)
    covered = panes.covered_ms.astype(object)
    nothing = w_all == 0  # no weight at all: idle takes the whole pane
    full = ~nothing & (sm_all >= FULL_UTIL_CP * covered)
    busy_n = np.where(nothing, 0, np.where(full, 1, sm_all)).astype(object)
    busy_d = np.where(nothing | full, 1, FULL_UTIL_CP * covered).astype(object)
    denominator = np.where(nothing, 1, busy_d * w_all).astype(object)
    idle_n = np.where(nothing, 1, (busy_d - busy_n) * w_all).astype(object)
    tenant_n = busy_n[pane] * big_w  # 0 in a pane of nothing, as busy_n is

    cost = np.array([pane_cost_micro_usd(*p) for p in zip(prices, covered.tolist(), panes.gpu_model.tolist())], object)

    # the parties, pane after pane: idle first, then the tenants by key
    parties = np.where(billed, hi - lo + 1, 0)
    pane_of = np.repeat(np.arange(len(panes)), parties)
    at_idle = (np.cumsum(parties) - parties)[billed]
    at_tenant = np.repeat(at_idle + 1 - lo[billed], (hi - lo)[billed]) + np.arange(len(rows))
    n = len(pane_of)
    numerators = np.zeros(n, object)
    numerators[at_idle], numerators[at_tenant] = idle_n[billed], tenant_n
    micro_usd = split_many(cost, numerators, denominator, pane_of)

    def per_tenant(values: np.ndarray, fill: Any) -> np.ndarray:
        out = np.full(n, fill, values.dtype)
        out[at_tenant] = values
        return out

    scale = weights.denominator * t_den * b_den * l_den
    # each party's tenant among the few distinct ones (idle last), whose columns are taken from there
    codes, distinct = panes.distinct_tenants
    code = per_tenant(codes[rows], len(distinct))
    who = [*distinct, Tenant.named(IDLE_TENANT)]
    keys = np.array([t.key for t in distinct] + [IDLE_TENANT], object)[code].tolist()
    gpu, starts, pane_list = panes.gpu_uuid, panes.pane_start_ns.tolist(), pane_of.tolist()
    columns = {
        "record_id": record_ids(list(zip(gpu, starts)), pane_list, keys, 0),
        "gpu_uuid": pa.array(gpu, pa.string()).take(pane_of),
        "node_id": pa.array(panes.node_id, pa.string()).take(pane_of),
        "gpu_model": pa.array(panes.gpu_model, pa.string()).take(pane_of),
        "pane_start_ns": panes.pane_start_ns[pane_of],
        "pane_end_ns": panes.pane_end_ns[pane_of],
        "tenant_key": pa.array(keys, pa.string()),
        **{name: pa.array(values, pa.string()).take(code) for name, values in zip(TENANT_FIELDS, zip(*who))},
        "t_share": per_tenant(ratios(sm, t_p), 0.0),
        "b_share": per_tenant(ratios(bw, b_p), 0.0),
        "l_share": per_tenant(ratios(numa, l_p), 0.0),
        "weight": per_tenant(ratios(big_w, scale[pane]), 0.0),
        "busy_fraction": ratios(busy_n, busy_d)[pane_of],
        "usd_per_gpu_hour": pa.array(prices, ARROW_SCHEMAS["cost"].field("usd_per_gpu_hour").type).take(pane_of),
        "pane_cost_micro_usd": cost[pane_of].astype(np.int64),
        "cost_micro_usd": micro_usd,
        "unpriced": np.array([price is None for price in prices], bool)[pane_of],
        "revision": np.zeros(n, np.int64),
        **{
            name: wide_array(values)
            for name, values in (
                ("t_num", per_tenant(sm, 0)),
                ("b_num", per_tenant(bw, 0)),
                ("l_num", per_tenant(numa, 0)),
                ("busy_num", sm_all[pane_of]),
            )
        },
        "covered_ms": panes.covered_ms[pane_of],
    }
    table = pa.table(list(columns.values()), schema=ARROW_SCHEMAS["cost"])
    return table, [prices[j] for j in pane_list], parties
