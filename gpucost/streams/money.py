"""Exact money: the largest-remainder split of integer micro-dollars by rational shares.

Shares come as integer numerators over one common denominator, so the split is integer
arithmetic only: the same integers as with exact fractions, without building any.
"""

from __future__ import annotations

__all__ = ["split_in_order"]


def split_in_order(total: int, numerators: list[int], denominator: int) -> list[int]:
    """Split ``total`` µ$ so each party gets ``floor(total·n/d)`` plus at most one µ$ of the rest.

    The shares ``n/d`` must sum to exactly 1. Leftover µ$ go one each to the largest
    fractional parts; ties go to the party listed first, so the caller lists parties in their
    tie-break order (the cost split: idle first, then tenants by key). The result always sums
    to ``total``.

    >>> split_in_order(10, [1, 1, 1], 3)
    [4, 3, 3]
    """
    if denominator <= 0 or sum(numerators) != denominator:
        raise ValueError(f"shares must sum to 1, got {sum(numerators)}/{denominator}")
    parts = [divmod(total * n, denominator) for n in numerators]  # fractional part = rest / denominator
    out = [q for q, _ in parts]
    left = total - sum(out)
    if left:
        # Python's sort is stable, reverse=True included: equal remainders keep the listed order
        for i in sorted(range(len(parts)), key=lambda i: parts[i][1], reverse=True)[:left]:
            out[i] += 1
    return out
