"""The ``operators`` of ``gpucost kernels`` (PyTorch ``cpu_op`` events) against an independent recomputation.

Each kernel's operator path is found here by brute force: every ``cpu_op`` of the launching process and thread
open at the launch's time (start ≤ launch ≤ end), outermost first (earlier start, then the longer, then the
name), or ``(no operator)`` where none is open or the launch is not in the trace. Each kernel's exact share of
busy time is swept slice by slice with fractions, and every level of the tree is dealt from its parent with the
largest-remainder deal of ``tests/support/kernel_money`` (its parent's own kernels, key ``""``, a party of the
deal). Expected figures come from the raw trace read with the standard library, never from the code under test."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
from collections import defaultdict
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpucost.cli import main
from tests.support.kernel_money import KINETO, deal, half_even, ns, raw_events, shares

NO_OPERATOR = "(no operator)"  # docs/definitions.md, "Kernel cost"
BASE = 1_711_964_646_000_000_000
OPS = ["aten::linear", "aten::addmm", "aten::mm", "aten::relu"]


def _open_ops(ops: list[tuple[str, int, int]], t: int | None) -> tuple[str, ...]:
    """The names of the ops open at ``t``, outermost first; ``(no operator)`` for none."""
    if t is None:
        return (NO_OPERATOR,)
    opened = sorted((s, -e, i, n) for i, (n, s, e) in enumerate(ops) if s <= t <= e)  # ties: the file's order
    return tuple(n for *_, n in opened) or (NO_OPERATOR,)


def expected_tree(paths: list[tuple[str, ...]], share: list[Fraction], busy: int, micro: int) -> dict:
    """Every prefix of every path: (busy ns, µ$), each level dealt from its parent over its children and the
    parent's own kernels."""
    out: dict[str, tuple[int, int]] = {}

    def level(prefix: tuple[str, ...], ns: int, mu: int) -> None:
        parts: dict[str, Fraction] = defaultdict(Fraction)
        children = set()
        for p, s in zip(paths, share):
            if p[: len(prefix)] == prefix:
                key = p[len(prefix)] if len(p) > len(prefix) else ""
                parts[key] += s
                children |= {key} - {""}
        if not children:
            return
        parts[""] += 0
        dealt_ns, dealt_mu = deal(ns, parts), deal(mu, parts)
        for c in children:
            out["/".join(prefix + (c,))] = (dealt_ns[c], dealt_mu[c])
            level(prefix + (c,), dealt_ns[c], dealt_mu[c])

    level((), busy, micro)
    return out


def _micro(busy: int, price: str) -> int:
    return half_even(Fraction(busy) * Fraction(Decimal(price)) * 10**6 / (3600 * 10**9))


def _run(path: Path, price: str, fmt: str = "json") -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(["kernels", str(path), "--usd-per-gpu-hour", price, "--format", fmt]) == 0
    return out.getvalue()


def _check_levels(device: dict, paths: list[tuple[str, ...]]) -> None:
    """The top level sums to the device exactly; each level sums to its parent, less the parent's own kernels
    where it has some (a kernel's path is where it was launched, in no child of it)."""
    own = {"/".join(p) for p in paths}
    ops = {o["path"]: (o["busy_ns"], o["cost_micro_usd"]) for o in device["operators"]}
    top = [v for p, v in ops.items() if "/" not in p]
    assert (sum(b for b, _ in top), sum(m for _, m in top)) == (device["busy_ns"], device["cost_micro_usd"])
    for parent, (b, m) in ops.items():
        kids = [v for p, v in ops.items() if p.rsplit("/", 1)[0] == parent and p.count("/") == parent.count("/") + 1]
        if not kids:
            continue
        kid_ns, kid_mu = sum(k[0] for k in kids), sum(k[1] for k in kids)
        if parent in own:
            assert kid_ns <= b and kid_mu <= m
        else:
            assert (kid_ns, kid_mu) == (b, m)


@st.composite
def nested_ops(draw, lo: int, hi: int, depth: int) -> list[tuple[str, int, int]]:
    """Properly nested ops within [lo, hi] µs: siblings from sorted cut points, each with its own children."""
    if depth == 0 or hi <= lo:
        return []
    cuts = sorted(draw(st.lists(st.integers(lo, hi), max_size=6)))
    out = []
    for a, b in zip(cuts[::2], cuts[1::2]):
        out.append((draw(st.sampled_from(OPS)), a, b))
        out += draw(nested_ops(a, b, depth - 1))
    return out


loose_op = st.tuples(st.sampled_from(OPS), st.integers(0, 100), st.integers(0, 40)).map(
    lambda t: (t[0], t[1], t[1] + t[2])
)
kernel_st = st.tuples(
    st.sampled_from(["gemm", "relu", "ncclKernel_AllReduce"]),
    st.integers(0, 3),  # stream
    st.integers(0, 120_000),  # start, ns
    st.integers(0, 30_000),  # duration, ns
    st.one_of(st.none(), st.tuples(st.integers(1, 4), st.integers(0, 100))),  # launch (thread, µs); 4 has no op
)


@settings(max_examples=60, deadline=None)
@given(
    st.fixed_dictionaries({tid: nested_ops(0, 100, 4) for tid in (1, 2)}),
    st.lists(loose_op, max_size=5),  # thread 3: ops that may cross instead of nesting
    nested_ops(0, 100, 2),  # process 2, thread 1: launches nothing here, so never counted
    st.lists(kernel_st, min_size=1, max_size=25),
    st.sampled_from(["2.5", "3600", "98.765432"]),
)
def test_generated_traces_equal_brute_force(tmp_path_factory, ops, loose, other_process, kernels, price):
    ops = {**ops, 3: loose}
    events = [
        {"ph": "X", "cat": "cpu_op", "name": n, "pid": 1, "tid": tid, "ts": s, "dur": e - s}
        for tid, spans in ops.items()
        for n, s, e in spans
    ]
    events += [
        {"ph": "X", "cat": "cpu_op", "name": n, "pid": 2, "tid": 1, "ts": s, "dur": e - s} for n, s, e in other_process
    ]
    intervals, paths = [], []
    for i, (name, stream, start, dur, launch) in enumerate(kernels):
        start_ns = start // 1000 * 1000  # whole µs, as written
        args = {"device": 0, "stream": stream, "correlation": i}
        events.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": start // 1000})
        events[-1] |= {"dur": dur // 1000, "args": args}
        if launch is not None:
            tid, t = launch
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": tid})
            events[-1] |= {"ts": t, "dur": 1, "args": {"correlation": i}}
        intervals.append((BASE + start_ns, BASE + start_ns + dur // 1000 * 1000))
        launch_ns = None if launch is None else BASE + launch[1] * 1000
        thread_ops = [(n, BASE + s * 1000, BASE + e * 1000) for n, s, e in ops.get(launch and launch[0], [])]
        paths.append(_open_ops(thread_ops, launch_ns))
    path = tmp_path_factory.mktemp("ops") / "t.json"
    path.write_text(json.dumps({"baseTimeNanoseconds": BASE, "traceEvents": events}))
    (device,) = json.loads(_run(path, price))["devices"]
    busy, share = shares(intervals)
    micro = _micro(busy, price)
    assert (device["busy_ns"], device["cost_micro_usd"]) == (busy, micro)
    assert {o["path"]: (o["busy_ns"], o["cost_micro_usd"]) for o in device["operators"]} == expected_tree(
        paths, share, busy, micro
    )
    _check_levels(device, paths)


def _raw_operator_paths(path: Path) -> dict[int, tuple[list, list]]:
    """Per device: the kernels' (start, end) and operator paths, from the raw trace and the rule above."""
    doc = json.loads(gzip.decompress(path.read_bytes()), parse_float=Decimal)
    base = int(doc.get("baseTimeNanoseconds", 0))
    launches, raw_ops, kernels = raw_events(doc)
    ops = {key: [(ev["name"][:1024], s, e) for s, e, ev in spans] for key, spans in raw_ops.items()}
    out: dict[int, tuple[list, list]] = defaultdict(lambda: ([], []))
    for ev in kernels:
        start = base + ns(ev["ts"])
        pid, tid, t = launches.get(ev["args"].get("correlation"), (None, None, None))
        intervals, paths = out[ev["args"]["device"]]
        intervals.append((start, start + ns(ev["dur"])))
        paths.append(_open_ops(ops.get((pid, tid), []), t))
    return out


@pytest.mark.skipif(not KINETO, reason="../shared/data/profiler-traces/hta-kineto/ is absent")
@pytest.mark.parametrize("path", KINETO, ids=lambda p: p.name)
def test_real_traces_price_their_operators(path):
    """Every shared trace's operators equal the recomputation, and their top level sums to the device."""
    report = json.loads(_run(path, "2.5"))
    raw = _raw_operator_paths(path)
    assert sorted(d["device"]["device"] for d in report["devices"]) == sorted(raw)
    for device in report["devices"]:
        intervals, paths = raw[device["device"]["device"]]
        busy, share = shares(intervals)
        micro = _micro(busy, "2.5")
        assert micro > 0 and len(device["operators"]) > 1
        got = {o["path"]: (o["busy_ns"], o["cost_micro_usd"]) for o in device["operators"]}
        assert got == expected_tree(paths, share, busy, micro)
        _check_levels(device, paths)


def test_text_format_lists_operators_after_ranges(tmp_path):
    """One kernel in aten::linear > aten::addmm, one launched outside any op: both parties in the text."""
    ev = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": 1, "tid": 1, "ts": 0, "dur": 10},
        {"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "pid": 1, "tid": 1, "ts": 2, "dur": 5},
        {"ph": "X", "cat": "user_annotation", "name": "fwd", "pid": 1, "tid": 1, "ts": 0, "dur": 20},
    ]
    for i, (launch, start) in enumerate([(3, 100), (15, 200)]):
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "l", "pid": 1, "tid": 1, "ts": launch, "dur": 1})
        ev[-1]["args"] = {"correlation": i}
        ev.append({"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": start, "dur": 50})
        ev[-1]["args"] = {"device": 0, "stream": 7, "correlation": i}
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"baseTimeNanoseconds": BASE, "traceEvents": ev}))
    lines = _run(path, "3600", "text").splitlines()
    # 3600 $/h is 1 µ$ a µs: each kernel runs 50 µs alone
    sections = [line.split()[0] for line in lines[2:]]
    assert sections == ["range", "operator", "operator", "operator"]
    ops = {line.split("ns")[-1].strip(): line.split()[1] for line in lines if line.lstrip().startswith("operator")}
    assert ops == {"aten::linear": "50", "aten::linear/aten::addmm": "50", NO_OPERATOR: "50"}


def test_crossing_ops_hold_only_those_still_open(tmp_path):
    """Ops that cross instead of nesting (a [0, 20] µs, b [10, 30] µs): a launch at 15 µs is in a/b, one at
    25 µs in b alone, since a has closed by then although b began inside it."""
    ev = [
        {"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 0, "dur": 20},
        {"ph": "X", "cat": "cpu_op", "name": "b", "pid": 1, "tid": 1, "ts": 10, "dur": 20},
    ]
    for i, (launch, start) in enumerate([(15, 100), (25, 200)]):
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "l", "pid": 1, "tid": 1, "ts": launch, "dur": 1})
        ev[-1]["args"] = {"correlation": i}
        ev.append({"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": start, "dur": 50})
        ev[-1]["args"] = {"device": 0, "stream": 7, "correlation": i}
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"baseTimeNanoseconds": BASE, "traceEvents": ev}))
    (device,) = json.loads(_run(path, "3600"))["devices"]
    assert {o["path"]: o["cost_micro_usd"] for o in device["operators"]} == {"a": 50, "a/b": 50, "b": 50}
