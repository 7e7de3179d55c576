"""Largest-remainder splits and the entropy/L2 helpers."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpucost.schemas.exact import div_half_even
from gpucost.streams.mae import entropy_bits, l2_estimate
from gpucost.streams.money import split_in_order
from gpucost.streams.settings import DEFAULT_L2_CALIBRATION
from tests.reference import split


@st.composite
def shares(draw: st.DrawFn) -> dict[str, int]:
    weights = draw(st.lists(st.integers(0, 10**30), min_size=1, max_size=8).filter(lambda w: sum(w) > 0))
    keys = ["idle"] + [f"team{i}:e:a:t:Gold::" for i in range(len(weights) - 1)]
    return dict(zip(keys, weights))


@given(st.integers(0, 10**12), shares())
def test_split_is_exact_and_within_one_micro_dollar(total: int, s: dict[str, int]) -> None:
    den = sum(s.values())
    keys = sorted(s, key=lambda k: (k != "idle", k))  # the tie-break order the cost split lists parties in
    got = dict(zip(keys, split_in_order(total, [s[k] for k in keys], den)))
    assert sum(got.values()) == total
    for k, v in got.items():
        assert abs(v - Fraction(total * s[k], den)) < 1
    assert got == split(total, [(k, Fraction(n, den)) for k, n in s.items()])


def test_ties_go_to_the_party_listed_first() -> None:
    assert split_in_order(2, [1, 1, 1], 3) == [1, 1, 0]
    assert split_in_order(1, [0, 1, 1], 2) == [0, 1, 0]  # a tie after the first party: still the earlier one


@given(st.integers(0, 10**15), st.integers(1, 10**9))
def test_half_even_division(n: int, d: int) -> None:
    assert div_half_even(n, d) == round(Fraction(n, d))  # Python rounds a Fraction half to even


def test_shares_must_sum_to_one() -> None:
    with pytest.raises(ValueError, match="sum to 1"):
        split_in_order(10, [1], 2)


@given(st.lists(st.integers(0, 10**6), min_size=1, max_size=300))
def test_entropy_matches_numpy_and_stays_in_bounds(counts: list[int]) -> None:
    arr = np.array(counts, dtype=float)
    n = arr.sum()
    want = 0.0 if n == 0 else float(-sum(p * np.log2(p) for p in arr[arr > 0] / n))
    got = entropy_bits(counts)
    assert got == pytest.approx(want, abs=1e-9)
    assert 0 <= got <= math.log2(len(counts)) + 1e-12


def test_l2_estimate_hits_the_table_and_clamps() -> None:
    for x, y in DEFAULT_L2_CALIBRATION:
        assert l2_estimate(x, DEFAULT_L2_CALIBRATION) == pytest.approx(y)
    assert l2_estimate(0.0, DEFAULT_L2_CALIBRATION) == 8.3 and l2_estimate(8.0, DEFAULT_L2_CALIBRATION) == 127.4
    mid = (2.1 + 5.7) / 2
    assert l2_estimate(mid, DEFAULT_L2_CALIBRATION) == pytest.approx((8.3 + 41.9) / 2)


@given(st.floats(0, 8), st.floats(0, 8))
def test_l2_estimate_is_monotone(a: float, b: float) -> None:
    lo, hi = sorted((a, b))
    assert l2_estimate(lo, DEFAULT_L2_CALIBRATION) <= l2_estimate(hi, DEFAULT_L2_CALIBRATION)
