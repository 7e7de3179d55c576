"""Expected figures of ``gpucost kernels``' ``work`` and ``whatif`` (docs/definitions.md, "Kernel cost"), recomputed
from the raw trace with the standard library: a kernel's call is the innermost ``cpu_op`` open on its launching
process and thread at launch (brute force over every op), a call's FLOPs and bytes come from docs/definitions.md's
rule written out here, the peaks from ``platforms.toml`` read with tomllib. Nothing is taken from the code under
test. And the small traces the tests write."""

from __future__ import annotations

import contextlib
import io
import json
import re
import tomllib
from collections import defaultdict
from decimal import Decimal
from fractions import Fraction
from math import prod
from pathlib import Path

from gpucost.cli import main
from tests.support.kernel_money import half_even, ns, raw_events, shares

BASE = 1_711_964_646_000_000_000
NO_OPERATOR = "(no operator)"
TABLE = tomllib.loads((Path(__file__).parents[2] / "gpucost" / "schemas" / "platforms.toml").read_text())
SIZES = {"double": 8, "float": 4, "c10::Half": 2, "c10::BFloat16": 2}
PRECISION = {"double": "fp64", "float": "fp32", "c10::Half": "fp16", "c10::BFloat16": "bf16"}


def run(path: Path, *flags: str) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(["kernels", str(path), "--usd-per-gpu-hour", "2.5", *flags]) == 0
    return json.loads(out.getvalue())


def table_figure(model: str, figure: str | None) -> Fraction | None:
    """The table's ``figure`` for the row whose name or alias is the longest the model contains, case aside and
    followed by no letter or digit (docs/definitions.md, "Health audit"); the tests name no partition."""
    keys = [(k, name) for name, row in TABLE.items() for k in (name, *row.get("aliases", []))]
    hits = [
        (-len(k), k, name) for k, name in keys if re.search(re.escape(k.casefold()) + r"(?![^\W_])", model.casefold())
    ]
    row = TABLE[min(hits)[2]] if hits else {}
    return None if figure not in row else Fraction(str(row[figure]))


def raw_work(doc: dict) -> dict[int, tuple[list, dict[str, list]]]:
    """Per device: each kernel's (start, end, work path or None), and per work path the sums [calls, FLOPs,
    bytes, kernel ns, operand types]. A kernel's call is the innermost op open on its launching thread at launch;
    a call's work path is the operator path of its earliest launch (then of its first kernel in the file)."""
    launches, raw_ops, kernels = raw_events(doc)
    base = int(doc.get("baseTimeNanoseconds", 0))
    ops = {  # ties of start and end nest in the file's order, a call before the calls it makes
        key: [(s, -e, i, ev["name"], json.dumps(ev["args"])) for i, (s, e, ev) in enumerate(spans)]
        for key, spans in raw_ops.items()
    }
    seen = []  # (device, start, end, launch ns, file order, call, path, work)
    for order, ev in enumerate(kernels):
        pid, tid, t = launches.get(ev["args"].get("correlation"), (None, None, None))
        opened = sorted(o for o in ops.get((pid, tid), []) if t is not None and o[0] <= t <= -o[1])
        start = base + ns(ev["ts"])
        work = by_hand(opened[-1][3], **json.loads(opened[-1][4])) if opened else None
        call = (pid, tid, opened[-1]) if opened else None  # a call is one op on one thread of one process
        path = "/".join(o[3] for o in opened)
        seen.append((ev["args"]["device"], start, start + ns(ev["dur"]), t, order, call, path, work))
    first: dict = {}
    for device, _, _, _, _, call, path, work in sorted(seen, key=lambda k: (k[3] or 0, k[4])):
        if work is not None:
            first.setdefault((device, call), path)
    out: dict[int, tuple[list, dict[str, list]]] = defaultdict(lambda: ([], {}))
    for device, start, end, _, _, call, _, work in seen:
        listed, sums = out[device]
        path = None if work is None else first[device, call]
        listed.append((start, end, path))
        if path is None:
            continue
        s = sums.setdefault(path, [set(), 0, 0, 0, set()])
        s[3] += end - start
        if call not in s[0]:
            s[0].add(call)
            s[1], s[2] = s[1] + work[0], s[2] + work[1]
            s[4].add(work[2])
    return out


def expected_work(doc: dict, model: str | None) -> dict[int, dict[str, dict]]:
    """Per device, per operator path: the rows of ``work`` recomputed from the raw trace."""
    return {d: {p: figures(s, model) for p, s in sums.items()} for d, (_, sums) in raw_work(doc).items() if sums}


def roofline(s: list, precision: str | None, model: str | None) -> Fraction | None:
    if model is None:
        return None
    peak, bandwidth = table_figure(model, precision), table_figure(model, "mem_bw_gbps")
    return (
        None if peak is None or bandwidth is None else max(Fraction(s[1]) / (peak * 1000), Fraction(s[2]) / bandwidth)
    )


def expected_whatif(doc: dict, model: str | None, target: str, price: str) -> dict[int, dict]:
    """Per device, the ``whatif`` recomputed: each kernel with work takes its path's ratio of roofline times,
    ``target``'s over ``model``'s (a TF32 path on a part without TF32 at its FP32), on its exact share of busy
    time; the sum rounded once. The paths not re-timed, with their precision."""
    out = {}
    for device, (listed, sums) in raw_work(doc).items():
        scales, skipped = {}, {}
        for path, s in sums.items():
            precision = figures(s, model)["precision"]
            now, there = roofline(s, precision, model), roofline(s, precision, target)
            if there is None and precision == "tf32":
                there = roofline(s, "fp32", target)
            if now and there is not None:
                scales[path] = there / now
            else:
                skipped[path] = precision
        _, share = shares([(a, b) for a, b, _ in listed])
        total, own = Fraction(0), dict.fromkeys(scales, Fraction(0))
        for (_, _, path), part in zip(listed, share):
            scaled = path in scales
            total += part * scales[path] if scaled else part
            if scaled:
                own[path] += part
        out[device] = {
            "gpu_model": target,
            "busy_ns": half_even(total),
            "cost_micro_usd": half_even(total * Fraction(Decimal(price)) * 10**6 / (3600 * 10**9)),
            "retimed": {p: (float(scales[p]), half_even(own[p]), half_even(own[p] * scales[p])) for p in scales},
            "not_retimed": skipped,
        }
    return out


def by_hand(op: str, **args) -> tuple[int, int, str] | None:
    """docs/definitions.md's rule, written out: 2·b·m·n·k FLOPs, (b·(mk + kn + mn) + bias) elements."""
    first = {"aten::mm": 0, "aten::bmm": 0, "aten::addmm": 1, "aten::baddbmm": 1}.get(op)
    dims, types = args.get("Input Dims"), args.get("Input type")
    if first is None or types[first] not in SIZES:
        return None
    a, b = dims[first], dims[first + 1]
    batch = a[0] if op.endswith("bmm") else 1
    m, k, n = a[-2], a[-1], b[-1]
    bias = prod(dims[0]) if first else 0
    return 2 * batch * m * n * k, SIZES[types[first]] * (batch * (m * k + k * n + m * n) + bias), types[first]


def figures(s: list, model: str | None) -> dict:
    calls, flops, moved, kernel_ns, types = s
    precision = PRECISION[next(iter(types))] if len(types) == 1 else None
    rate = Fraction(flops, kernel_ns * 1000) if kernel_ns else None
    peak = None if model is None or precision is None else table_figure(model, precision)
    tf32 = None if model is None else table_figure(model, "tf32")
    if precision == "fp32" and peak is not None and rate is not None and rate > peak and tf32:
        precision, peak = "tf32", tf32  # faster than FP32 goes: it ran as TF32, where a part has it
    bandwidth = None if model is None else table_figure(model, "mem_bw_gbps")
    intensity = Fraction(flops, moved) if moved else None
    ridge = None if peak is None or bandwidth is None else peak * 10**12 / (bandwidth * 10**9)
    return {
        "precision": precision,
        "calls": len(calls),
        "flops": flops,
        "bytes": moved,
        "kernel_ns": kernel_ns,
        "achieved_tflops": None if rate is None else float(rate),
        "arithmetic_intensity": None if intensity is None else float(intensity),
        "peak_tflops": None if peak is None else float(peak),
        "efu": None if peak is None or rate is None else float(rate / peak),
        "bw_util": None if bandwidth is None or not kernel_ns else float(Fraction(moved, kernel_ns) / bandwidth),
        "bound": None if ridge is None or intensity is None else "compute" if intensity >= ridge else "memory",
    }


def check_work(report: dict, expected: dict[int, dict[str, dict]]) -> None:
    assert {d["device"]["device"] for d in report["devices"] if d["work"]} == set(expected)
    for device in report["devices"]:
        got = {
            w["path"]: {k: v for k, v in w.items() if k not in ("path", "busy_ns", "cost_micro_usd")}
            for w in device["work"]
        }
        assert got == expected.get(device["device"]["device"], {})
        tree = {o["path"]: (o["busy_ns"], o["cost_micro_usd"]) for o in device["operators"]}
        for w in device["work"]:  # each row's money is its operator path's, as the operator tree deals it
            assert (w["busy_ns"], w["cost_micro_usd"]) == tree[w["path"]]


def check_whatif(report: dict, expected: dict[int, dict]) -> None:
    for device in report["devices"]:
        got = dict(device["whatif"])
        got["retimed"] = {r["path"]: (r["scale"], r["busy_ns"], r["projected_busy_ns"]) for r in got["retimed"]}
        got["not_retimed"] = {r["path"]: r["precision"] for r in got["not_retimed"]}
        assert got == expected[device["device"]["device"]]


def one_call(tmp_path: Path, dims: list, types: list[str], kernel_us: int, **header: object) -> Path:
    """A trace of one GEMM call on thread 1 launching one kernel of ``kernel_us`` µs."""
    ev = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 10},
        {"ph": "X", "cat": "cuda_runtime", "name": "l", "pid": 1, "tid": 1, "ts": 2, "dur": 1},
        {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 20, "dur": kernel_us},
    ]
    ev[0]["args"] = {"Input Dims": dims, "Input type": types}
    ev[1]["args"], ev[2]["args"] = {"correlation": 5}, {"device": 0, "stream": 7, "correlation": 5}
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"baseTimeNanoseconds": BASE, **header, "traceEvents": ev}))
    return path


def trace(tmp_path: Path, ops: list[tuple], launches: list[tuple]) -> Path:
    """``ops`` as (pid, tid, name, start µs, end µs, dims, types), and one 5 µs kernel for each launch, as
    (pid, tid, µs)."""
    ev = [
        {"ph": "X", "cat": "cpu_op", "name": n, "pid": p, "tid": t, "ts": a, "dur": b - a}
        | {"args": {"Input Dims": d, "Input type": ty}}
        for p, t, n, a, b, d, ty in ops
    ]
    for i, (pid, tid, at) in enumerate(launches):
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "l", "pid": pid, "tid": tid, "ts": at, "dur": 1})
        ev[-1]["args"] = {"correlation": i}
        ev.append({"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 100 + 10 * i, "dur": 5})
        ev[-1]["args"] = {"device": 0, "stream": 7, "correlation": i}
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"baseTimeNanoseconds": BASE, "traceEvents": ev}))
    return path
