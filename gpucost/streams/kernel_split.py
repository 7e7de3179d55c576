"""The split rules of kernel cost (docs/definitions.md, section "Kernel cost"), pure: no I/O, no clock.

A device's busy time is the union of its kernels' intervals over all streams. Each elementary slice of time
(between two consecutive kernel starts or ends) is shared equally by the kernels running in it; shares are kept
as integers over one common denominator ``lcm(1..most kernels at once)``, so no fraction is built. Integer ns
and µ$ are then dealt by largest remainder (ties by ascending name), so parts always sum to the whole.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from math import lcm

from gpucost.schemas.exact import div_half_even
from gpucost.streams.money import split_in_order

__all__ = ["Interval", "Span", "busy_shares", "device_cost", "split_by_name", "range_paths", "split_tree"]

NS_PER_HOUR = 3_600_000_000_000


@dataclass(frozen=True, slots=True)
class Interval:
    """One kernel as the split sees it: its name, GPU time, and the (thread, time) of its launch if known."""

    name: str
    start_ns: int
    end_ns: int
    launch_tid: int | None = None
    launch_ns: int | None = None


@dataclass(frozen=True, slots=True)
class Span:
    """One host range on one thread."""

    tid: int
    name: str
    start_ns: int
    end_ns: int


def busy_shares(kernels: list[Interval]) -> tuple[int, int, list[int]]:
    """``(busy_ns, denominator, shares)``: the union of the intervals and each kernel's part of it as
    ``shares[i] / denominator`` ns, the overlap split equally; ``Σ shares = busy_ns · denominator``."""
    edges = sorted({k.start_ns for k in kernels} | {k.end_ns for k in kernels})
    if not edges:
        return 0, 1, []
    delta = [0] * (len(edges) + 1)
    for k in kernels:
        if k.end_ns > k.start_ns:
            delta[bisect.bisect_left(edges, k.start_ns)] += 1
            delta[bisect.bisect_left(edges, k.end_ns)] -= 1
    running, counts = 0, []
    for d in delta[:-1]:
        running += d
        counts.append(running)
    denominator = lcm(1, *[c for c in counts if c])
    # cumulative share per kernel running since edge 0: prefix[j] = Σ_{s<j} len(s)·D/count(s)
    prefix, busy = [0], 0
    for j in range(len(edges) - 1):
        length, c = edges[j + 1] - edges[j], counts[j]
        prefix.append(prefix[-1] + (length * denominator // c if c else 0))
        busy += length if c else 0
    shares = [
        prefix[bisect.bisect_left(edges, k.end_ns)] - prefix[bisect.bisect_left(edges, k.start_ns)] for k in kernels
    ]
    return busy, denominator, shares


def device_cost(busy_ns: int, micro_usd_per_hour: int) -> int:
    """Busy time × price, rounded half-even once: ``round(busy_ns · rate / 3.6e12)`` µ$."""
    return div_half_even(busy_ns * micro_usd_per_hour, NS_PER_HOUR)


def split_by_name(total: int, weights: dict[str, int]) -> dict[str, int]:
    """``total`` dealt over names in proportion to integer weights, largest remainder, ties by ascending name."""
    names = sorted(weights)
    whole = sum(weights.values())
    if not whole:
        return {n: 0 for n in names} if not total else _refuse(total)
    return dict(zip(names, split_in_order(total, [weights[n] for n in names], whole)))


def _refuse(total: int) -> dict[str, int]:
    raise ValueError(f"{total} µ$ to split over parts that all weigh nothing")


def range_paths(kernels: list[Interval], spans: list[Span]) -> list[tuple[str, ...]]:
    """Each kernel's range path: the ranges open on its launching thread at its launch time, outermost first
    (never by GPU-time overlap). A kernel with no known launch has the empty path."""
    by_tid: dict[int, list[Span]] = {}
    for s in sorted(spans, key=lambda s: (s.start_ns, -s.end_ns, s.name)):
        by_tid.setdefault(s.tid, []).append(s)
    starts = {tid: [s.start_ns for s in ss] for tid, ss in by_tid.items()}
    out: list[tuple[str, ...]] = []
    for k in kernels:
        if k.launch_tid is None or k.launch_ns is None or k.launch_tid not in by_tid:
            out.append(())
            continue
        open_ = by_tid[k.launch_tid][: bisect.bisect_right(starts[k.launch_tid], k.launch_ns)]
        out.append(tuple(s.name for s in open_ if s.end_ns >= k.launch_ns))
    return out


def split_tree(
    total_busy: int, total_micro: int, weights: dict[tuple[str, ...], int]
) -> dict[tuple[str, ...], tuple[int, int]]:
    """Busy ns and µ$ of every range path from the weights of kernels by exact path. Each level is dealt from
    its parent's figures over its children and the parent's own kernels (key ``""``), so children never sum to
    more than the parent, and the root is the device."""
    subtotal: dict[tuple[str, ...], int] = {}
    for path, w in weights.items():
        for i in range(len(path) + 1):
            subtotal[path[:i]] = subtotal.get(path[:i], 0) + w
    out: dict[tuple[str, ...], tuple[int, int]] = {(): (total_busy, total_micro)}
    for path in sorted(subtotal, key=len):
        busy, micro = out[path]
        parts = {p[-1]: subtotal[p] for p in subtotal if len(p) == len(path) + 1 and p[:-1] == path}
        if not parts:
            continue
        parts[""] = weights.get(path, 0)  # the path's own kernels; "" sorts first, so it wins equal remainders
        ns, mu = split_by_name(busy, parts), split_by_name(micro, parts)
        for name in parts:
            if name:
                out[path + (name,)] = (ns[name], mu[name])
    return out
