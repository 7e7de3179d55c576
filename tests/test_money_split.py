"""``streams.money.split_many``: many panes' largest-remainder splits at once, in int64 where a pane's products
fit and over exact Python integers where they do not, against a split written here with exact fractions."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from gpucost.streams.money import split_many

# magnitudes that keep C × d in int64, that pass it only until a common factor is divided out, and that pass it
# whatever is divided out (the usage split's weights reach 10^25)
_SMALL = st.integers(0, 1_000)
_FACTORED = st.integers(0, 50).map(lambda n: n * 10**12)
_HUGE = st.integers(0, 10**25)


@st.composite
def panes(draw: st.DrawFn) -> list[tuple[int, list[int]]]:
    """Panes as (C, numerators): 1 to 40 parties (past the 16 that are ranked pairwise), the denominator their sum."""
    out = []
    for _ in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from([_SMALL, _FACTORED, _HUGE]))
        numerators = draw(st.lists(kind, min_size=1, max_size=40))
        if draw(st.booleans()):  # equal remainders, which go to the party listed first
            numerators = [numerators[0]] * len(numerators)
        if sum(numerators) == 0:
            numerators[draw(st.integers(0, len(numerators) - 1))] = 1
        total = draw(st.one_of(st.integers(0, 100), st.integers(0, 10**9), st.integers(0, 10**15)))
        out.append((total, numerators))
    return out


def by_fractions(total: int, numerators: list[int]) -> list[int]:
    """docs/definitions.md, "Cost split", step 7: floors of the exact shares, then one µ$ each to the largest
    fractional parts, ties to the party listed first."""
    exact = [Fraction(total * n, sum(numerators)) for n in numerators]
    out = [int(x) for x in exact]
    order = sorted(range(len(exact)), key=lambda i: (-(exact[i] - out[i]), i))
    for i in order[: total - sum(out)]:
        out[i] += 1
    return out


@given(panes())
def test_split_many_gives_each_pane_the_exact_largest_remainder_split(given_panes: list[tuple[int, list[int]]]) -> None:
    totals = np.array([t for t, _ in given_panes], object)
    numerators = np.array([n for _, ns in given_panes for n in ns], object)
    denominators = np.array([sum(ns) for _, ns in given_panes], object)
    pane_of = np.repeat(np.arange(len(given_panes)), [len(ns) for _, ns in given_panes])
    got = split_many(totals, numerators, denominators, pane_of).tolist()
    want = [m for t, ns in given_panes for m in by_fractions(t, ns)]
    assert got == want
    for j, (total, _) in enumerate(given_panes):
        assert sum(m for m, p in zip(got, pane_of.tolist()) if p == j) == total


def test_a_pane_past_int64_beside_panes_within_it() -> None:
    """A pane whose C × n pass 64 bits and have no common factor, between two that fit, and an unpriced pane (C = 0)
    whose numerators pass 64 bits themselves."""
    panes = [(10**6, [1, 2]), (10**15, [10**10 + 1, 10**10, 7]), (999, [3, 3, 3]), (0, [10**20 + 1, 3])]
    totals = np.array([t for t, _ in panes], object)
    numerators = np.array([n for _, ns in panes for n in ns], object)
    denominators = np.array([sum(ns) for _, ns in panes], object)
    pane_of = np.array([0, 0, 1, 1, 1, 2, 2, 2, 3, 3])
    got = split_many(totals, numerators, denominators, pane_of).tolist()
    assert got == [m for t, ns in panes for m in by_fractions(t, ns)]
