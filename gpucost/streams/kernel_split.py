"""The split rules of kernel cost (docs/definitions.md, section "Kernel cost"), pure: no I/O, no clock.

A device's busy time is the union of its kernels' intervals over all streams. Each elementary slice of time
(between two consecutive kernel starts or ends) is shared equally by the kernels running in it; shares are kept
as integers over one common denominator ``lcm(1..most kernels at once)``, so no fraction is built. Integer ns
and µ$ are then dealt by largest remainder (ties by ascending name), so parts always sum to the whole.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from math import lcm

import numpy as np

from gpucost.schemas.exact import div_half_even
from gpucost.streams.money import split_in_order

__all__ = ["INT64_SAFE", "Spans", "busy_shares", "device_cost", "split_by_name", "range_paths", "split_tree", "sums_by"]

#: a column of shares whose cumulative sums could pass this (span × denominator) is kept as Python ints
INT64_SAFE = 2**62

NS_PER_HOUR = 3_600_000_000_000


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


def busy_shares(start_ns: np.ndarray, end_ns: np.ndarray) -> tuple[int, int, np.ndarray]:
    """``(busy_ns, denominator, shares)`` of kernels given as int64 columns: the union of their intervals and each
    kernel's part of it as ``shares[i] / denominator`` ns, the overlap split equally; ``Σ shares = busy_ns ·
    denominator``. Column by column: no object a kernel (the report of a 1 GiB trace held 509 bytes a kernel in
    ``Interval`` objects, Python ints and lists). The shares are int64 where no cumulative share can pass 2^62
    (the span × the denominator), else Python ints in an object array: the same values either way."""
    if not len(start_ns):
        return 0, 1, np.zeros(0, dtype=np.int64)
    edges = np.unique(np.concatenate([start_ns, end_ns]))
    lo, hi = np.searchsorted(edges, start_ns), np.searchsorted(edges, end_ns)
    running = end_ns > start_ns
    delta = np.zeros(len(edges), dtype=np.int64)
    np.add.at(delta, lo[running], 1)
    np.add.at(delta, hi[running], -1)
    counts = np.cumsum(delta)[:-1]  # kernels running in each slice between two consecutive edges
    lengths = np.diff(edges)
    busy = int(lengths[counts > 0].sum())
    denominator = lcm(1, *np.unique(counts[counts > 0]).tolist())
    exact = (int(edges[-1]) - int(edges[0])) * denominator >= INT64_SAFE
    dtype = object if exact else np.int64
    # cumulative share per kernel running since edge 0: prefix[j] = Σ_{s<j} len(s)·D/count(s)
    per = np.where(counts > 0, lengths.astype(dtype) * denominator // np.maximum(counts, 1), 0).astype(dtype)
    prefix = np.concatenate([np.zeros(1, dtype=dtype), np.cumsum(per, dtype=dtype)])
    return busy, denominator, prefix[hi] - prefix[lo]


def sums_by(codes: np.ndarray, shares: np.ndarray, n: int) -> list[int]:
    """Σ shares by code ``0..n-1``, exact (int64 stays within ``busy_shares``' bound; Python ints beyond it)."""
    out = np.zeros(n, dtype=shares.dtype)
    np.add.at(out, codes, shares)
    return [int(v) for v in out.tolist()]


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


def range_paths(
    launch_tid: np.ndarray, launch_ns: np.ndarray, spans: Spans
) -> tuple[list[tuple[str, ...]], np.ndarray]:
    """Each kernel's path from its launch's thread and time (int64, -1 unknown): the names of the spans open
    on that thread at that time (start ≤ launch ≤ end), outermost first (earlier start, then the longer, then
    the order ``spans`` list them: a profiler writes a call before the calls it makes, so spans of one start and
    end nest in call order), never by GPU-time overlap; the empty path without a known launch or with no span
    open. With the paths, each kernel's innermost open span as its row in ``spans`` (-1: none), the call a PyTorch
    operator's work is read from.

    Spans are sorted once and each gets a parent: the innermost span of its thread still open at its start
    (the stack they make). Every span open at a launch is then the last span begun by it or on that span's
    chain of parents, so a kernel walks up that chain (as long as the spans nest deep) and keeps those not
    yet closed; a thread's spans that cross instead of nesting are kept or left out one by one alike. Equal
    paths are one tuple, and nothing is kept per span beyond int64 columns."""
    if not len(spans.names) or not len(spans.tid) or not len(launch_tid):
        return [()] * len(launch_tid), np.full(len(launch_tid), -1, dtype=np.int64)
    order = np.lexsort((-spans.end_ns, spans.start_ns, spans.tid))  # stable: ties keep the spans' own order
    tid, start, end, name = (c[order].astype(np.int64) for c in (spans.tid, spans.start_ns, spans.end_ns, spans.name))
    last = np.full(len(launch_tid), -1, dtype=np.int64)  # the last span of the launching thread begun by then
    known = launch_ns >= 0
    for t in np.unique(launch_tid[known]).tolist():
        lo, hi = np.searchsorted(tid, t, side="left"), np.searchsorted(tid, t, side="right")
        at = np.flatnonzero(known & (launch_tid == t))
        begun = np.searchsorted(start[lo:hi], launch_ns[at], side="right")
        last[at] = np.where(begun > 0, lo + begun - 1, -1)
    ends, codes = _int64s(end), _int64s(name)
    parent = _parents(_int64s(tid), _int64s(start), ends)
    outlives = _outliving(parent, ends)
    interned: dict[tuple[str, ...], tuple[str, ...]] = {}
    out: list[tuple[str, ...]] = []
    innermost = array("q", bytes(8 * len(launch_tid)))
    for k, (i, t) in enumerate(zip(last.tolist(), launch_ns.tolist())):
        chain = []
        inner = -1
        while i >= 0:
            if ends[i] >= t:
                if inner < 0:
                    inner = i
                chain.append(spans.names[codes[i]])
                i = parent[i]
            else:  # closed by then, and so is every ancestor up to the first that outlives it
                i = outlives[i]
        innermost[k] = inner
        path = tuple(reversed(chain))
        out.append(interned.setdefault(path, path))
    inner_rows = np.frombuffer(innermost, dtype=np.int64) if len(innermost) else np.zeros(0, np.int64)
    return out, np.where(inner_rows >= 0, order[np.maximum(inner_rows, 0)], -1)


def _int64s(column: np.ndarray) -> array[int]:
    """A column as an ``array``: read one item at a time in a Python loop without a Python int kept per item."""
    out = array("q")
    out.frombytes(np.ascontiguousarray(column, dtype=np.int64).tobytes())
    return out


def _parents(tid: array[int], start: array[int], end: array[int]) -> array[int]:
    """For sorted spans, each one's parent: the innermost span of its thread still open at its start, -1 for
    none (equally, the last span before it on its thread that ends at or after its start)."""
    parent = array("q", bytes(8 * len(tid)))
    stack: list[int] = []  # as deep as the spans nest
    for i in range(len(tid)):
        if i and tid[i] != tid[i - 1]:
            stack.clear()
        while stack and end[stack[-1]] < start[i]:
            stack.pop()
        parent[i] = stack[-1] if stack else -1
        stack.append(i)
    return parent


def _outliving(parent: array[int], end: array[int]) -> array[int]:
    """Each span's nearest ancestor that ends after it (-1: none). A walk up from a span closed at a launch skips
    to it: the ancestors between end no later, so they are closed too. Without it, spans that begin while the
    one before is open (steps of 5 ms begun every 1 ms) chain every earlier span, and each kernel walked all of
    them (400,000 kernels: the report took 65 s before this and the tree's fix, 2.2 s after; BENCHMARKS.md)."""
    up = array("q", bytes(8 * len(parent)))
    for i in range(len(parent)):  # a parent comes before its child in the order the spans are sorted in
        a = parent[i]
        while a >= 0 and end[a] <= end[i]:
            a = up[a]
        up[i] = a
    return up


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
    children: dict[tuple[str, ...], list[tuple[str, ...]]] = {}  # each path's children, found once (not per path)
    for p in subtotal:
        if p:
            children.setdefault(p[:-1], []).append(p)
    out: dict[tuple[str, ...], tuple[int, int]] = {(): (total_busy, total_micro)}
    for path in sorted(subtotal, key=len):
        if path not in children:
            continue
        busy, micro = out[path]
        parts = {p[-1]: subtotal[p] for p in children[path]}
        parts[""] = weights.get(path, 0)  # the path's own kernels; "" sorts first, so it wins equal remainders
        ns, mu = split_by_name(busy, parts), split_by_name(micro, parts)
        for name in parts:
            if name:
                out[path + (name,)] = (ns[name], mu[name])
    return out
