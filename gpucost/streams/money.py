"""Exact money: the largest-remainder split of integer micro-dollars by rational shares.

Shares come as integer numerators over one common denominator, so the split is integer
arithmetic only: the same integers as with exact fractions, without building any. ``split_in_order``
splits one pane (the row entries); ``split_many`` splits many at once (the batch entries), in int64
where a pane's products fit and over exact Python integers for the panes whose products do not.
"""

from __future__ import annotations

import numpy as np

from gpucost.streams.runs import runs

__all__ = ["split_in_order", "split_many"]

#: a pane's products ``C × n`` (n ≤ its denominator) are taken in int64 when ``C × denominator`` is below this,
#: judged in floating point: 2^62 leaves a factor of two for the float's rounding
_INT64_SAFE = float(1 << 62)
_PAIRWISE = 16  # parties of a pane up to which ranks come from comparing each pair


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


def split_many(totals: np.ndarray, numerators: np.ndarray, denominators: np.ndarray, pane_of: np.ndarray) -> np.ndarray:
    """``split_in_order`` of many panes at once, as int64 µ$ per party: pane ``j`` splits ``totals[j]`` (≥ 0) by
    the numerators of its parties over ``denominators[j]``. ``pane_of`` gives each party's pane, ascending, a pane's
    parties in their tie-break order; their numerators (≥ 0) sum to its denominator, as ``split_in_order`` requires
    (the callers build them so; the property tests hold both entries equal).

    Why two paths: a pane's products ``C × n`` pass 64 bits in the usage split (its weights are products of sums),
    so numpy takes them as Python integers in object arrays, a Python call per party. A pane whose ``C × d`` fits in
    int64 is split in int64, after dividing its numerators and denominator by their common factor where they fit
    in int64 themselves (the allocation basis's ``Σ fraction × held ns`` share the pane's length); the others, and
    only they, over exact Python integers. Dividing by a common factor changes neither the quotients nor the order
    of the remainders, so both paths give ``split_in_order``'s integers.
    """
    out = np.zeros(len(pane_of), np.int64)
    if not len(pane_of):
        return out
    starts, ends = runs(pane_of)
    sizes = ends - starts
    panes = pane_of[starts]
    num, den = _reduced(numerators, denominators[panes], starts, sizes)
    total = totals[panes]
    fits = _fits(total, den)
    for chosen, dtype in ((fits, np.int64), (~fits, object)):
        lo = np.flatnonzero(chosen)
        if not len(lo):
            continue
        size = sizes[lo]
        parties = np.repeat(starts[lo] - np.cumsum(size) + size, size) + np.arange(int(size.sum()))
        dense = np.repeat(np.arange(len(lo)), size)  # each chosen party's pane among the chosen
        c = total[lo].astype(dtype)
        share = c[dense] * num[parties].astype(dtype)
        quotient, rest = share // den[lo].astype(dtype)[dense], share % den[lo].astype(dtype)[dense]
        left = c - np.add.reduceat(quotient, np.r_[0, np.cumsum(size)[:-1]])
        out[parties] = (quotient + (rank_by_remainder(rest, dense) < left[dense])).astype(np.int64)
    return out


def _reduced(
    numerators: np.ndarray, denominators: np.ndarray, starts: np.ndarray, sizes: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Each pane's numerators (``sizes`` of them from each of ``starts``) and denominator divided by their greatest
    common factor, where all fit in int64 (else as given)."""
    try:
        num, den = numerators.astype(np.int64), denominators.astype(np.int64)
    except OverflowError:  # a value past 64 bits: the exact path takes them as they are
        return numerators, denominators
    factor = np.gcd(np.gcd.reduceat(num, starts), den)
    factor[factor == 0] = 1
    return num // np.repeat(factor, sizes), den // factor


def _fits(totals: np.ndarray, denominators: np.ndarray) -> np.ndarray:
    """Per pane: whether ``C``, ``d`` and ``C × d`` (which bounds every ``C × n`` of the pane, n ≤ d) are all safely
    inside int64 (``d`` on its own too: an unpriced pane's ``C`` is 0, and its ``d`` may pass 64 bits)."""
    try:
        c, d = totals.astype(np.float64), denominators.astype(np.float64)
    except OverflowError:  # a value past a float's range: surely not int64
        return np.zeros(len(totals), bool)
    fits: np.ndarray = (c * d < _INT64_SAFE) & (d < _INT64_SAFE) & (c < _INT64_SAFE)
    return fits


def rank_by_remainder(rest: np.ndarray, pane_of: np.ndarray) -> np.ndarray:
    """Each party's place in its pane when the pane's parties are sorted by remainder, largest
    first, ties to the party listed first: the largest-remainder split's order. ``pane_of`` numbers
    the panes 0, 1, … in order, each pane's parties together.

    Panes of up to 16 parties (a GPU shared by a few tenants) compare each pair, one numpy pass
    over all of them per distance; a bigger pane, whose pairs would grow as its square, is sorted.
    """
    rank = np.zeros(len(rest), np.int64)
    size = np.bincount(pane_of)
    first = np.cumsum(size) - size
    for j in np.flatnonzero(size > _PAIRWISE).tolist():
        lo, part = int(first[j]), rest[first[j] : first[j] + size[j]].tolist()
        order = sorted(range(len(part)), key=part.__getitem__, reverse=True)  # stable: ties keep their order
        rank[lo + np.array(order)] = np.arange(len(part))
    small = size[pane_of] <= _PAIRWISE
    for shift in range(1, _PAIRWISE):
        # party a and party a + shift share a small pane
        a = np.flatnonzero(small[:-shift] & (pane_of[:-shift] == pane_of[shift:]))
        if not len(a):
            break
        after = rest[a + shift] > rest[a]  # the later party ranks first only if strictly larger
        rank[a[after]] += 1  # each party once per shift: no index repeats
        rank[a[~after] + shift] += 1
    return rank
