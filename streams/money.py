"""Exact money: the largest-remainder split of integer micro-dollars by rational shares."""
from __future__ import annotations

from fractions import Fraction
from math import floor

__all__ = ["largest_remainder"]


def largest_remainder(total: int, shares: dict[str, Fraction], first: str | None = None) -> dict[str, int]:
    """Split ``total`` µ$ so each party gets ``floor(total·s)`` plus at most one µ$ of the rest.

    ``shares`` must sum to exactly 1. Leftover µ$ go one each to the largest fractional parts;
    ties go to the ascending key, except that ``first`` (the pseudo-tenant ``idle``) sorts
    before every other key. The result always sums to ``total``.

    >>> largest_remainder(10, {"a": Fraction(1, 3), "b": Fraction(1, 3), "idle": Fraction(1, 3)}, "idle")
    {'a': 3, 'b': 3, 'idle': 4}
    """
    if sum(shares.values()) != 1:
        raise ValueError(f"shares must sum to 1, got {sum(shares.values())}")
    exact = {k: total * s for k, s in shares.items()}
    out = {k: floor(v) for k, v in exact.items()}
    left = total - sum(out.values())
    order = sorted(exact, key=lambda k: (-(exact[k] - out[k]), k != first, k))
    for k in order[:left]:
        out[k] += 1
    return out
