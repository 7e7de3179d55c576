"""Exact conversions applied once, on ingest, to every value that feeds money.

Floats read from JSON are taken at their shortest decimal text (``repr``), which is the
text a producer wrote for any value of up to 15 significant digits, and rounded half-even
from there. So ``10.0005`` s is 10 000 ms on every path, never 10 001 because of binary
representation error.
"""
from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal
from fractions import Fraction

__all__ = ["to_decimal", "round_scaled", "round_half_even", "micro_usd_per_hour"]


def to_decimal(value: float | int | str | Decimal) -> Decimal:
    """The decimal a producer meant: floats by their shortest round-tripping text."""
    if isinstance(value, Decimal):
        return value
    if isinstance(value, float):
        return Decimal(repr(value))
    return Decimal(value)


def round_scaled(value: float | int | str | Decimal, scale: int) -> int:
    """``value · scale`` rounded half-even to an integer (s → ms: scale 1000; % → 1/100 %: 100)."""
    return int((to_decimal(value) * scale).to_integral_value(rounding=ROUND_HALF_EVEN))


def round_half_even(value: Fraction) -> int:
    """Banker's rounding of an exact rational (Python's ``round`` on Fraction is half-even)."""
    return round(value)


def micro_usd_per_hour(usd_per_gpu_hour: Decimal) -> int:
    """A price of at most six decimal places is an exact integer of micro-dollars."""
    micro = usd_per_gpu_hour * 1_000_000
    if micro != micro.to_integral_value():
        raise ValueError(f"price {usd_per_gpu_hour} has more than 6 decimal places")
    return int(micro)
