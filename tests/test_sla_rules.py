"""``streams.sla`` on its own: idle runs, reclaim triggers and quota scale over one GPU's closed panes,
recomputed pane by pane from docs/definitions.md, "SLA tiers: reclaim triggers and quota scale", by
walking back over the panes seen (no state carried)."""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction
from types import SimpleNamespace
from typing import cast

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from gpucost.schemas.events import TENANT_FIELDS, Allocation
from gpucost.schemas.records import QuotaRecord, ReclaimRecord
from gpucost.streams.allocations import AllocationTable
from gpucost.streams.pane_totals import PaneColumns, PaneTotals, TenantTotals
from gpucost.streams.settings import AuditSettings, SlaTier
from gpucost.streams.sla import SlaOperator
from gpucost.streams.sla_holds import held_by, held_in
from gpucost.streams.tables import Tenant
from tests.support.panes import closing

PANE_S = 60
TIERS = {
    "Gold": SlaTier(threshold_pct=Decimal(5), duration_s=180, max_idle_s=300, quota_base=Decimal(1)),
    "Bronze": SlaTier(threshold_pct=Decimal(0), duration_s=60, max_idle_s=90, quota_base=Decimal("0.5")),
}
SETTINGS = AuditSettings(pane_s=PANE_S, sla_tiers=TIERS)
COVERED_MS = 50_000


def tenant(key: str, sla: str | None) -> Tenant:
    return Tenant(*({"team": key, "sla": sla}.get(f) for f in TENANT_FIELDS))


def idle(tier: SlaTier, sm: int) -> bool:
    util = Fraction(sm, COVERED_MS)  # in hundredths of a percent
    return util < tier.threshold_pct * 100 if tier.threshold_pct else sm == 0


# a pane: (its index, {tenant key: (sla, Σ sm_util_cp · ms, samples)})
usage = st.sampled_from([0, 1, 500 * COVERED_MS - 1, 500 * COVERED_MS, 10_000 * COVERED_MS])  # Gold: idle below 5 %
SLA_OF = {"a": "Gold", "b": "Bronze", "c": "Platinum", "d": None}  # Platinum: not in the table
pane_tenants = st.dictionaries(
    st.sampled_from(sorted(SLA_OF)), st.tuples(usage, st.sampled_from([0, 1, 3])), max_size=4
).map(lambda d: {k: (SLA_OF[k], sm, n) for k, (sm, n) in d.items()})
histories = st.lists(st.tuples(st.integers(1, 2), pane_tenants), max_size=12)  # index steps: 2 skips a pane


def expected(panes: list[tuple[int, dict]]) -> list[tuple[list, list]]:
    """Per pane: quota rows (key, idle_run_ms, quota_scale) and reclaims (key, run start, idle_run_ms)."""
    out = []
    for i, (k, tenants) in enumerate(panes):
        quotas, reclaims = [], []
        for key, (sla, sm, samples) in sorted(tenants.items()):
            tier = TIERS.get(sla) if samples else None
            if tier is None:
                continue
            run = 0
            if idle(tier, sm):  # walk back while the panes are consecutive and the tenant idle in each
                j = i
                while j >= 0:
                    kj, tj = panes[j]
                    if kj != k - (i - j) or key not in tj or not tj[key][2] or not idle(tier, tj[key][1]):
                        break
                    run, j = run + 1, j - 1
            run_ms = run * PANE_S * 1000
            base = float(tier.quota_base)
            scale = (
                base * (0.3 + 0.7 * math.exp(-(run_ms / 1000) / 300))
                if run_ms
                else base * min(1.5, 1 + 0.5 * (sm / (10_000 * COVERED_MS)))
            )
            quotas.append((key, run_ms, scale))
            if run_ms >= tier.duration_s * 1000 and (run - 1) * PANE_S * 1000 < tier.duration_s * 1000:  # first reached
                reclaims.append((key, (k - run + 1) * PANE_S * 10**9, run_ms))
        out.append((quotas, reclaims))
    return out


def as_panes(history: list[tuple[int, dict]]) -> list[tuple[int, dict]]:
    k, out = 0, []
    for step, tenants in history:
        k += step
        out.append((k, tenants))
    return out


@given(histories)
def test_runs_reclaims_and_quotas_follow_the_definition(history) -> None:
    panes = as_panes(history)
    op = SlaOperator(SETTINGS)
    got = []
    for k, tenants in panes:
        pane = PaneTotals(
            gpu_uuid="GPU-0",
            pane_start_ns=k * PANE_S * 10**9,
            pane_end_ns=(k + 1) * PANE_S * 10**9,
            node_id="n",
            gpu_model="H100",
            covered_ms=COVERED_MS,
            tenants={
                key: TenantTotals(tenant(key, sla), sm, 0, 0, samples) for key, (sla, sm, samples) in tenants.items()
            },
        )
        out = op.on_close(closing(pane, Decimal("2.5")))
        quotas = [r for r in out if isinstance(r, QuotaRecord)]
        reclaims = [r for r in out if isinstance(r, ReclaimRecord)]
        assert out == quotas + reclaims  # a pane's quota records, then the triggers it fires
        got.append(
            (
                [(q.tenant_key, q.idle_run_ms, q.quota_scale) for q in quotas],
                [(r.tenant_key, r.run_start_ns, r.idle_run_ms) for r in reclaims],
            )
        )
        for r in reclaims:
            assert r.trigger_ns == pane.pane_end_ns
            assert r.deadline_ns == r.run_start_ns + TIERS[r.sla].max_idle_s * 10**9
    assert got == expected(panes)


def test_a_state_restored_carries_the_runs_on() -> None:
    tenants = {"a": TenantTotals(tenant("a", "Gold"), 0, 0, 0, 1)}

    def pane(k: int) -> PaneTotals:
        return PaneTotals(
            gpu_uuid="GPU-0",
            pane_start_ns=k * PANE_S * 10**9,
            pane_end_ns=(k + 1) * PANE_S * 10**9,
            node_id="n",
            gpu_model="H100",
            covered_ms=COVERED_MS,
            tenants=tenants,
        )

    op = SlaOperator(SETTINGS)
    op.on_close(closing(pane(1)))
    op.on_close(closing(pane(2)))
    restored = SlaOperator.from_state(op.to_state(), SETTINGS)
    out = restored.on_close(closing(pane(3)))
    quotas = [r for r in out if isinstance(r, QuotaRecord)]
    reclaims = [r for r in out if isinstance(r, ReclaimRecord)]
    assert [q.idle_run_ms for q in quotas] == [180_000]
    assert [(r.run_start_ns, r.usd_per_gpu_hour) for r in reclaims] == [(PANE_S * 10**9, None)]


holds_drawn = st.lists(
    st.tuples(
        st.sampled_from(["GPU-A", "GPU-B"]),
        st.integers(0, 28),  # start, in 15 s steps: on a pane's boundary or inside it
        st.one_of(st.none(), st.integers(1, 28)),  # length in 15 s steps; none: no end yet
        st.sampled_from(["x", "y", "z"]),
    ),
    max_size=8,
)
# every pane of three devices over 8 minutes, in any order (one without holds)
panes_drawn = st.permutations([(gpu, k) for gpu in ("GPU-A", "GPU-B", "GPU-C") for k in range(8)])


@given(holds_drawn, panes_drawn)
def test_the_batch_entrys_holders_are_each_panes_own(
    holds: list[tuple[str, int, int | None, str]], panes: list[tuple[str, int]]
) -> None:
    """``held_in`` (the batch entry, one ``held_by`` for a device's panes between the same two cuts of its holds)
    gives every pane what ``held_by`` gives that pane alone: holds starting and ending on and inside panes, with and
    without an end, on devices with and without holds, panes in any order."""
    table, step_ns, t0 = AllocationTable(), 15 * 10**9, 1_750_000_020 * 10**9 // (60 * 10**9) * 60 * 10**9
    for n, (gpu, start, length, team) in enumerate(holds):
        begin = t0 + start * step_ns
        end = None if length is None else begin + length * step_ns
        table.take(Allocation(node_id="n", gpu_uuid=gpu, allocation_id=f"h{n}", ts_ns=begin, end_ts_ns=end, team=team))
    starts = [t0 + k * PANE_S * 10**9 for _, k in panes]
    columns = SimpleNamespace(
        gpu_uuid=np.array([g for g, _ in panes], object),
        pane_start_ns=np.array(starts, np.int64),
        pane_end_ns=np.array([s + PANE_S * 10**9 for s in starts], np.int64),
    )
    expected = {
        j: found
        for j, ((gpu, _), start) in enumerate(zip(panes, starts))
        if (found := held_by(table, gpu, start, start + PANE_S * 10**9))
    }
    assert held_in(table, cast(PaneColumns, columns)) == expected
