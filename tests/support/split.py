"""The largest-remainder split the allocation tests recompute bills with (tests/test_allocation_basis.py,
tests/test_kubernetes_allocations.py), written from docs/definitions.md, not from the code."""

from __future__ import annotations

import math
from fractions import Fraction

__all__ = ["largest_remainder"]


def largest_remainder(total: int, weights: list[Fraction]) -> list[int]:
    """``total`` split in proportion to ``weights``, each party its floor and the rest one µ$ each to the largest
    fractional parts, ties to the party listed first: written from the definition, not from the code."""
    whole = sum(weights)
    quotas = [total * w / whole for w in weights]
    shares = [math.floor(q) for q in quotas]
    order = sorted(range(len(weights)), key=lambda i: (-(quotas[i] - shares[i]), i))
    for i in order[: total - sum(shares)]:
        shares[i] += 1
    return shares
