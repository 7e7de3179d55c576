"""``streams.kernel_split.busy_shares``, the split of a device's busy time among its kernels, against the brute-force
sweep of ``tests/support/kernel_money.shares`` (exact fractions, slice by slice), on int64 columns and on the Python
ints it falls back to where a cumulative share could pass int64."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpucost.streams import kernel_split
from gpucost.streams.kernel_split import busy_shares, sums_by
from tests.support.kernel_money import shares

interval = st.tuples(st.integers(0, 10**6), st.integers(0, 10**5)).map(lambda t: (t[0], t[0] + t[1]))


def _check(kernels: list[tuple[int, int]]) -> tuple[int, int, np.ndarray]:
    start = np.array([s for s, _ in kernels], dtype=np.int64)
    end = np.array([e for _, e in kernels], dtype=np.int64)
    busy, denominator, got = busy_shares(start, end)
    want_busy, want = shares(kernels)
    assert busy == want_busy
    assert [Fraction(int(g), denominator) for g in got.tolist()] == want
    assert sum(int(g) for g in got.tolist()) == busy * denominator
    return busy, denominator, got


@settings(max_examples=200, deadline=None)
@given(st.lists(interval, max_size=40))
def test_shares_equal_the_sweep_on_both_representations(kernels):
    _, _, fast = _check(kernels)
    saved = kernel_split.INT64_SAFE
    kernel_split.INT64_SAFE = 0  # every column as Python ints
    try:
        _, _, exact = _check(kernels)
    finally:
        kernel_split.INT64_SAFE = saved
    assert exact.dtype == object or not kernels
    assert [int(v) for v in exact.tolist()] == [int(v) for v in fast.tolist()]


def test_a_denominator_past_int64_keeps_python_ints():
    """40 kernels nested in one another over a second: 1 to 40 run at once, so the denominator is lcm(1..40), about
    5.3·10^15, and a cumulative share reaches 5.3·10^24: past int64, where the shares stay exact Python ints."""
    kernels = [(i * 1_000_000, 10**9 - i * 1_000_000) for i in range(40)]
    _, denominator, got = _check(kernels)
    assert denominator > 2**52 and got.dtype == object
    codes = np.array([i % 3 for i in range(40)], dtype=np.int64)
    assert sums_by(codes, got, 3) == [sum(int(g) for g in got.tolist()[r::3]) for r in range(3)]
