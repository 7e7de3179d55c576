"""The kernel cost lines of docs/definitions.md ("Kernel cost in the pipeline"), recomputed by brute force for the
batch reference (tests/reference.py): every elementary slice of a pane's time walked with exact fractions, the
money dealt by a largest remainder written out plainly. Nothing of ``gpucost.streams.kernel_*`` is used."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from fractions import Fraction

from gpucost.schemas.kernels import KernelActivity

Key = tuple[str, int, str, str, str]  # GPU, pane start, tenant key, category, kernel


def deal(total: int, weights: list[Fraction]) -> list[int]:
    """``total`` over ``weights`` (not all 0): floors, then one each to the largest remainders, ties to the first."""
    whole = sum(weights)
    exact = [total * w / whole for w in weights]
    out = [e.numerator // e.denominator for e in exact]
    for i in sorted(range(len(out)), key=lambda i: (-(exact[i] - out[i]), i))[: total - sum(out)]:
        out[i] += 1
    return out


def kernel_lines(
    kernels: list[KernelActivity],
    pane_ns: int,
    tenant_key: Callable[[str, int, int], str],
    billed: dict[tuple[str, int], tuple[int, dict[str, int]]],
) -> dict[Key, tuple[int, int, int, int]]:
    """(µ$, the tenant's µ$, busy ns, calls) of every line of every billed pane: ``billed`` gives a pane's covered
    ms and its tenants' µ$; ``tenant_key(node, pid, ts_ns)`` a process's tenant as of a time."""
    pieces: dict[tuple[str, int, str], list[tuple[int, int, str, str, bool]]] = defaultdict(list)
    for k in kernels:
        first, last = k.start_ns // pane_ns, max(k.start_ns, k.end_ns - 1) // pane_ns
        for p in range(first, last + 1):
            lo, hi = p * pane_ns, (p + 1) * pane_ns
            who = tenant_key(k.node_id, k.pid, k.start_ns)
            pieces[(k.gpu_uuid, lo, who)].append(
                (max(k.start_ns, lo), min(k.end_ns, hi), k.name, k.category, p == first)
            )
    out: dict[Key, tuple[int, int, int, int]] = {}
    for (gpu, start, who), mine in pieces.items():
        if (gpu, start) not in billed:
            continue
        covered_ms, costs = billed[(gpu, start)]
        cost = costs.get(who, 0)
        # copies and sets take no share of the time: their line is their own summed time, and no µ$
        computing = [piece for piece in mine if piece[3] not in ("memcpy", "memset")]
        edges = sorted({t for s, e, *_ in computing for t in (s, e)})
        share: dict[tuple[str, str], Fraction] = defaultdict(Fraction)
        union = 0
        for a, b in zip(edges, edges[1:]):
            running = [(name, cat) for s, e, name, cat, _ in computing if s <= a and b <= e and s < e]
            union += (b - a) if running else 0
            for line in running:
                share[line] += Fraction(b - a, len(running))
        lines = sorted({(name, cat) for _, _, name, cat, _ in mine})
        rest = max(covered_ms * 1_000_000 - union, 0)
        money = deal(cost, [Fraction(rest), *(share[line] for line in lines)])
        busy = deal(union, [share[line] for line in lines]) if union else [0] * len(lines)
        out[(gpu, start, who, "no_kernel", "no_kernel")] = (money[0], cost, rest, 0)
        for (name, cat), usd, ns in zip(lines, money[1:], busy):
            calls = sum(1 for *_, n, c, first in mine if (n, c) == (name, cat) and first)
            if cat in ("memcpy", "memset"):
                ns = sum(e - s for s, e, n, c, _ in mine if (n, c) == (name, cat))
            out[(gpu, start, who, cat, name)] = (usd, cost, ns, calls)
    return out
