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

import numpy as np

from gpucost.schemas.exact import div_half_even
from gpucost.streams.money import split_in_order

__all__ = ["Interval", "Spans", "busy_shares", "device_cost", "split_by_name", "range_paths", "split_tree"]

NS_PER_HOUR = 3_600_000_000_000


@dataclass(frozen=True, slots=True)
class Interval:
    """One kernel as the split sees it: its name and GPU time."""

    name: str
    start_ns: int
    end_ns: int


@dataclass(frozen=True)
class Spans:
    """Host spans of one kind (ranges, or PyTorch operators) as int64 columns: thread, name code, start and end
    ns, with ``names[code]`` the text. Columns rather than one object a span, because a trace holds a
    ``cpu_op`` for every PyTorch operator called, millions of them, most launching nothing."""

    tid: np.ndarray
    name: np.ndarray
    start_ns: np.ndarray
    end_ns: np.ndarray
    names: list[str]


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


def range_paths(launch_tid: np.ndarray, launch_ns: np.ndarray, spans: Spans) -> list[tuple[str, ...]]:
    """Each kernel's path from its launch's thread and time (int64, -1 unknown): the names of the spans open
    on that thread at that time (start ≤ launch ≤ end), outermost first (earlier start, then the longer, then
    the name), never by GPU-time overlap; the empty path without a known launch or with no span open.

    Spans are sorted once and each gets a parent: the innermost span of its thread still open at its start
    (the stack they make). Every span open at a launch is then the last span begun by it or on that span's
    chain of parents, so a kernel walks up from there past the spans already closed, and the path of the
    innermost open one is built once and shared. Where a thread's spans cross instead of nesting, the spans
    of that chain that have closed are left out of the path one by one."""
    if not len(spans.names) or not len(launch_tid):
        return [()] * len(launch_tid)
    rank = np.argsort(np.argsort(np.array(spans.names, dtype=object)))
    order = np.lexsort((rank[spans.name], -spans.end_ns, spans.start_ns, spans.tid))
    tid, start, end, name = (c[order] for c in (spans.tid, spans.start_ns, spans.end_ns, spans.name))
    parent, low = _parents(tid.tolist(), start.tolist(), end.tolist())
    innermost = np.full(len(launch_tid), -1, dtype=np.int64)  # the last span begun by the launch, then walked up
    known = launch_ns >= 0
    for t in np.unique(launch_tid[known]).tolist():
        lo, hi = np.searchsorted(tid, t, side="left"), np.searchsorted(tid, t, side="right")
        at = np.flatnonzero(known & (launch_tid == t))
        begun = np.searchsorted(start[lo:hi], launch_ns[at], side="right")  # spans of thread t begun by then
        innermost[at] = np.where(begun > 0, lo + begun - 1, -1)
    parents = np.array(parent, dtype=np.int64)
    while True:
        live = np.flatnonzero(innermost >= 0)
        closed = live[end[innermost[live]] < launch_ns[live]]
        if not closed.size:
            break
        innermost[closed] = parents[innermost[closed]]
    text = [spans.names[n] for n in name.tolist()]
    paths: dict[int, tuple[str, ...]] = {-1: ()}
    interned: dict[tuple[str, ...], tuple[str, ...]] = {}
    end_at = end.tolist()
    out: list[tuple[str, ...]] = []
    for i, t in zip(innermost.tolist(), launch_ns.tolist()):
        if i < 0 or low[i] >= t:  # every span on its chain is open
            out.append(_path(i, parent, text, paths, interned))
            continue
        chain = []
        while i >= 0:
            if end_at[i] >= t:
                chain.append(text[i])
            i = parent[i]
        out.append(tuple(reversed(chain)))
    return out


def _parents(tid: list[int], start: list[int], end: list[int]) -> tuple[list[int], list[int]]:
    """For sorted spans: each one's parent (-1 for none) and the earliest end on its chain of parents, itself
    included (where that is before a launch, some span of the chain closed before it: they cross)."""
    parent, low = [-1] * len(tid), [0] * len(tid)
    stack: list[int] = []
    for i in range(len(tid)):
        if i and tid[i] != tid[i - 1]:
            stack.clear()
        while stack and end[stack[-1]] < start[i]:
            stack.pop()
        parent[i] = stack[-1] if stack else -1
        low[i] = min(end[i], low[parent[i]]) if stack else end[i]
        stack.append(i)
    return parent, low


def _path(
    i: int,
    parent: list[int],
    text: list[str],
    paths: dict[int, tuple[str, ...]],
    interned: dict[tuple[str, ...], tuple[str, ...]],
) -> tuple[str, ...]:
    """The names on span ``i``'s chain, outermost first, built once per span and once per distinct path."""
    todo = []
    while i not in paths:
        todo.append(i)
        i = parent[i]
    for j in reversed(todo):
        path = paths[parent[j]] + (text[j],)
        paths[j] = interned.setdefault(path, path)
    return paths[todo[0]] if todo else paths[i]


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
