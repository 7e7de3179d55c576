"""Exact conversions applied once, on ingest, to every value that feeds money.

Floats read from JSON are taken at their shortest decimal text (``repr``), which is the
text a producer wrote for any value of up to 15 significant digits, and rounded half-even
from there. So ``10.0005`` s is 10 000 ms on every path, never 10 001 because of binary
representation error.
"""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal
from functools import lru_cache

import numpy as np

__all__ = ["to_decimal", "round_scaled", "round_float", "exact_round", "div_half_even", "micro_usd_per_hour", "ratios"]


def to_decimal(value: float | int | str | Decimal) -> Decimal:
    """The decimal a producer meant: floats by their shortest round-tripping text."""
    if isinstance(value, Decimal):
        return value
    if isinstance(value, float):
        return Decimal(repr(value))
    return Decimal(value)


def div_half_even(numerator: int, denominator: int) -> int:
    """``numerator / denominator`` (denominator > 0) rounded half-even to an integer."""
    q, r = divmod(numerator, denominator)
    return q + 1 if 2 * r > denominator or (2 * r == denominator and q % 2 == 1) else q


def round_scaled(value: float | int | str | Decimal, scale: int) -> int:
    """``value · scale`` rounded half-even to an integer (s → ms: scale 1000; % → 1/100 %: 100).

    A float's shortest text in plain notation (``10.0005``, every value a producer writes
    for a percentage or an interval) is read as an integer of digits over a power of ten,
    without a Decimal; other forms (``1e-05``) take the Decimal path. Both give the same integer.
    """
    if isinstance(value, float):
        return round_float(value, scale)
    return int((to_decimal(value) * scale).to_integral_value(rounding=ROUND_HALF_EVEN))


@lru_cache(maxsize=1 << 16)
def round_float(value: float, scale: int) -> int:
    """``round_scaled`` of a float; memoised: a fleet's samples repeat a few intervals and a few
    thousand percentages."""
    whole, dot, frac = repr(value).partition(".")
    if dot and whole.isdigit() and frac.isdigit():
        return div_half_even(int(whole + frac) * scale, 10 ** len(frac))
    return int((to_decimal(value) * scale).to_integral_value(rounding=ROUND_HALF_EVEN))


def exact_round(values: np.ndarray, scale: int) -> np.ndarray:
    """``round_scaled`` of each float, vectorised.

    ``values · scale`` in binary is within 1e-6 of the decimal the float stands for (values
    here are at most 3.6e6 once scaled), so away from a half the nearest integer is the
    answer; values that land near a half are few and distinct, and take the exact path.
    """
    scaled = values * scale
    out = np.rint(scaled)
    unsure = np.abs(scaled - np.floor(scaled) - 0.5) < 1e-5
    if unsure.any():
        distinct, where = np.unique(values[unsure], return_inverse=True)
        out[unsure] = np.array([round_float(float(v), scale) for v in distinct], dtype=np.float64)[where]
    rounded: np.ndarray = out.astype(np.int64)
    return rounded


@lru_cache(maxsize=1024)
def micro_usd_per_hour(usd_per_gpu_hour: Decimal) -> int:
    """A price of at most six decimal places is an exact integer of micro-dollars."""
    micro = usd_per_gpu_hour * 1_000_000
    if micro != micro.to_integral_value():
        raise ValueError(f"price {usd_per_gpu_hour} has more than 6 decimal places")
    return int(micro)


def ratios(numerators: np.ndarray, denominators: np.ndarray) -> np.ndarray:
    """Python's ``int / int`` of each pair (correctly rounded), as float64: numpy's own division
    where both fit in 53 bits (then it is the same float), Python's otherwise."""
    if len(numerators) == 0:
        return np.zeros(0, np.float64)
    if (
        numerators.dtype != object
        and denominators.dtype != object
        and max(int(np.abs(numerators).max()), int(np.abs(denominators).max())) < 1 << 53
    ):
        return numerators.astype(np.float64) / denominators.astype(np.float64)
    exact: np.ndarray = (numerators.astype(object) / denominators.astype(object)).astype(np.float64)
    return exact
