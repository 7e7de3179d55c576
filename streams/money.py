"""Exact money: the largest-remainder split of integer micro-dollars by rational shares.

Shares come as integer numerators over one common denominator, so the split is integer
arithmetic only: the same integers as with exact fractions, without building any.
"""
from __future__ import annotations

__all__ = ["largest_remainder"]


def largest_remainder(total: int, numerators: dict[str, int], denominator: int,
                      first: str | None = None) -> dict[str, int]:
    """Split ``total`` µ$ so each party gets ``floor(total·n/d)`` plus at most one µ$ of the rest.

    The shares ``n/d`` must sum to exactly 1. Leftover µ$ go one each to the largest
    fractional parts; ties go to the ascending key, except that ``first`` (the pseudo-tenant
    ``idle``) sorts before every other key. The result always sums to ``total``.

    >>> largest_remainder(10, {"a": 1, "b": 1, "idle": 1}, 3, "idle")
    {'a': 3, 'b': 3, 'idle': 4}
    """
    if denominator <= 0 or sum(numerators.values()) != denominator:
        raise ValueError(f"shares must sum to 1, got {sum(numerators.values())}/{denominator}")
    out, rest = {}, {}
    for k, n in numerators.items():
        out[k], rest[k] = divmod(total * n, denominator)  # fractional part = rest / denominator
    left = total - sum(out.values())
    for k in sorted(rest, key=lambda k: (-rest[k], k != first, k))[:left]:
        out[k] += 1
    return out
