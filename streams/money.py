"""Exact money: the largest-remainder split of integer micro-dollars by rational shares.

Shares come as integer numerators over one common denominator, so the split is integer
arithmetic only: the same integers as with exact fractions, without building any.
"""
from __future__ import annotations

__all__ = ["largest_remainder", "split_in_order"]


def split_in_order(total: int, numerators: list[int], denominator: int) -> list[int]:
    """``largest_remainder`` over parties listed in their tie-break order (ties go to the earlier
    one): the cost split's own form, which lists idle first and then tenants by key."""
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


def largest_remainder(total: int, numerators: dict[str, int], denominator: int,
                      first: str | None = None) -> dict[str, int]:
    """Split ``total`` µ$ so each party gets ``floor(total·n/d)`` plus at most one µ$ of the rest.

    The shares ``n/d`` must sum to exactly 1. Leftover µ$ go one each to the largest
    fractional parts; ties go to the ascending key, except that ``first`` (the pseudo-tenant
    ``idle``) sorts before every other key. The result always sums to ``total``.

    >>> largest_remainder(10, {"a": 1, "b": 1, "idle": 1}, 3, "idle")
    {'a': 3, 'b': 3, 'idle': 4}
    """
    keys = sorted(numerators, key=lambda k: (k != first, k))
    split = dict(zip(keys, split_in_order(total, [numerators[k] for k in keys], denominator)))
    return {k: split[k] for k in numerators}
