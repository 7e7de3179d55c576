"""``streams.apportion`` on its own: one pane's cost split, recomputed from docs/definitions.md,
"Cost split", steps 1–5, with exact fractions and a largest-remainder split written here."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

from hypothesis import given
from hypothesis import strategies as st

from gpucost.schemas.records import IDLE_TENANT
from gpucost.streams.apportion import Weights, apportion
from gpucost.streams.pane_totals import PaneTotals
from tests.strategies import WEIGHTS
from tests.support.panes import pane_of


def expected(pane: PaneTotals, price: Decimal, alpha: Decimal, beta: Decimal, gamma: Decimal) -> dict[str, int]:
    """Steps 1–5 of the definition, each party's µ$ by tenant key (``idle`` included)."""
    cost = round(Fraction(price) * 1_000_000 * pane.covered_ms / 3_600_000)  # round(Fraction) is half-even
    keys = sorted(pane.tenants)
    totals = [sum(getattr(pane.tenants[k], c) for k in keys) for c in ("sm", "bw", "numa")]
    share = [
        Fraction(getattr(pane.tenants[k], c), total) if total else Fraction(0)
        for k in keys
        for c, total in zip(("sm", "bw", "numa"), totals)
    ]
    w = [
        Fraction(alpha) * share[3 * i] + Fraction(beta) * share[3 * i + 1] + Fraction(gamma) * share[3 * i + 2]
        for i in range(len(keys))
    ]
    u = Fraction(0) if sum(w) == 0 else min(Fraction(1), Fraction(totals[0], 100 * 100 * pane.covered_ms))
    if sum(w):
        exact = [(1 - u) * cost, *((u * wi / sum(w)) * cost for wi in w)]
    else:
        exact = [Fraction(cost)] + [Fraction(0)] * len(w)
    floors = [int(x) for x in exact]  # all ≥ 0: int() is floor
    left = cost - sum(floors)
    # largest fractional part first; ties to the party listed first (idle, then tenants by key)
    for i in sorted(range(len(exact)), key=lambda i: (-(exact[i] - floors[i]), i))[:left]:
        floors[i] += 1
    return dict(zip([IDLE_TENANT, *keys], floors))


amount = st.integers(0, 10**9)
tenant_sums = st.dictionaries(
    st.sampled_from(["ads", "search", "vision", "a", "zz"]),
    st.tuples(amount, amount, st.integers(0, 10**6)),
    max_size=5,
)
prices = st.decimals(min_value=0, max_value=100, places=6, allow_nan=False, allow_infinity=False)


@given(st.integers(1, 600_000), tenant_sums, prices, st.sampled_from(WEIGHTS))
def test_each_party_gets_what_the_definition_gives(covered_ms, tenants, price, weights) -> None:
    pane = pane_of(covered_ms, tenants)
    alpha, beta, gamma = map(Decimal, weights)
    records = apportion(pane, price, Weights(alpha, beta, gamma))
    assert {r.tenant_key: r.cost_micro_usd for r in records} == expected(pane, price, alpha, beta, gamma)
    assert [r.tenant_key for r in records] == [IDLE_TENANT, *sorted(tenants)]  # idle first, then by key


@given(st.integers(1, 600_000), tenant_sums, prices, st.sampled_from(WEIGHTS))
def test_the_parties_add_up_to_the_pane_cost_and_none_is_a_microdollar_off_its_share(
    covered_ms, tenants, price, weights
) -> None:
    records = apportion(pane_of(covered_ms, tenants), price, Weights(*map(Decimal, weights)))
    cost = records[0].pane_cost_micro_usd
    assert cost == round(Fraction(price) * 1_000_000 * covered_ms / 3_600_000)
    assert sum(r.cost_micro_usd for r in records) == cost
    assert all(r.cost_micro_usd >= 0 for r in records)


def test_overlapping_processes_past_full_utilisation_leave_idle_nothing() -> None:
    # two tenants at 80 % each over the whole covered time: u = min(1, 1.6) = 1
    records = apportion(
        pane_of(60_000, {"a": (8000 * 60_000, 0, 0), "b": (8000 * 60_000, 0, 0)}),
        Decimal("3.6"),
        Weights(Decimal(1), Decimal(0), Decimal(0)),
    )
    assert {r.tenant_key: r.cost_micro_usd for r in records} == {IDLE_TENANT: 0, "a": 30_000, "b": 30_000}


def test_a_tie_goes_to_the_smaller_key() -> None:
    # C = 3 µ$, u = 1, two equal tenants: 1.5 µ$ each, the µ$ left goes to "a"
    records = apportion(
        pane_of(1_000, {"b": (5000 * 1_000, 0, 0), "a": (5000 * 1_000, 0, 0)}),
        Decimal("0.0108"),
        Weights(Decimal(1), Decimal(0), Decimal(0)),
    )
    assert [(r.tenant_key, r.cost_micro_usd) for r in records] == [(IDLE_TENANT, 0), ("a", 2), ("b", 1)]


def test_a_pane_without_covered_time_bills_nothing() -> None:
    assert apportion(pane_of(0, {"a": (10, 10, 10)}), Decimal(1), Weights(Decimal(1), Decimal(0), Decimal(0))) == []


def test_all_weights_zero_bills_idle_alone() -> None:
    # β = 1 but no tenant used memory bandwidth: Σw = 0, u = 0, idle takes C
    records = apportion(
        pane_of(3_600_000, {"a": (10**6, 0, 0)}), Decimal(2), Weights(Decimal(0), Decimal(1), Decimal(0))
    )
    assert [(r.tenant_key, r.cost_micro_usd) for r in records] == [(IDLE_TENANT, 2_000_000), ("a", 0)]
