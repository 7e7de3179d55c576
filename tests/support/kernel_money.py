"""Exact money for the ``gpucost kernels`` tests, written from docs/definitions.md ("Kernel cost"), sharing no
code with ``streams/kernel_split``: the shared Kineto traces, rounding half-even of an exact fraction, and the
largest-remainder deal (ties to the ascending name) over exact fractional weights."""

from __future__ import annotations

from collections import defaultdict
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "profiler-traces"
KINETO = sorted((DATA / "hta-kineto").glob("*.json.gz"))


def half_even(x: Fraction) -> int:
    floor = x.numerator // x.denominator
    rest = x - floor
    return floor + (1 if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and floor % 2) else 0)


def deal(total: int, weights: dict[str, Fraction]) -> dict[str, int]:
    whole = sum(weights.values())
    if not whole:
        return {n: 0 for n in weights}
    quota = {n: Fraction(total) * w / whole for n, w in weights.items()}
    out = {n: q.numerator // q.denominator for n, q in quota.items()}
    for n in sorted(quota, key=lambda n: (-(quota[n] - out[n]), n))[: total - sum(out.values())]:
        out[n] += 1
    return out


def ns(us: object) -> int:
    """A Kineto time (µs, an int or a decimal) as integer ns; every trace here writes whole ns."""
    return int(Decimal(str(us)) * 1000)


def raw_events(
    doc: dict, spans: tuple[str, ...] = ("cpu_op",), gpu: tuple[str, ...] = ("kernel",)
) -> tuple[dict, dict, list]:
    """A Kineto trace's launches (correlation → (pid, tid, epoch ns), the last of an id winning), its host spans of
    the categories ``spans`` by (pid, tid) as (start ns, end ns, event) and its GPU events of the categories ``gpu``,
    read with the standard library alone."""
    base = int(doc.get("baseTimeNanoseconds", 0))
    launches, host, kernels = {}, defaultdict(list), []
    for ev in doc["traceEvents"]:
        if ev.get("ph") != "X":
            continue
        if ev.get("cat") in ("cuda_runtime", "cuda_driver"):
            launches[ev["args"]["correlation"]] = (ev["pid"], ev["tid"], base + ns(ev["ts"]))
        elif ev.get("cat") in spans:
            start = base + ns(ev["ts"])
            host[ev["pid"], ev["tid"]].append((start, start + ns(ev["dur"]), ev))
        elif ev.get("cat") in gpu:
            kernels.append(ev)
    return launches, host, kernels


def shares(kernels: list[tuple[int, int]]) -> tuple[int, list[Fraction]]:
    """Busy ns and each (start, end)'s exact part of it: a sweep over the slices between boundaries, each
    slice shared equally by the kernels running through it."""
    bounds = sorted({t for s, e in kernels for t in (s, e)})
    starting, ending = defaultdict(list), defaultdict(list)
    for i, (s, e) in enumerate(kernels):
        if e > s:
            starting[s].append(i)
            ending[e].append(i)
    running: set[int] = set()
    share = [Fraction(0)] * len(kernels)
    busy = 0
    for lo, hi in zip(bounds, bounds[1:]):
        running.difference_update(ending[lo])
        running.update(starting[lo])
        if running:
            busy += hi - lo
            for i in running:
                share[i] += Fraction(hi - lo, len(running))
    return busy, share
