"""The ``work`` of ``gpucost kernels``: a GEMM operator call's FLOPs and bytes from its recorded shapes, set against
the GPU time of the kernels it launched, and its EFU against the platform table (docs/definitions.md, "Kernel
cost", "Work and EFU per operator").

Expected figures are recomputed here from the raw trace with the standard library: a kernel's call is the innermost
``cpu_op`` open on its launching thread at launch (brute force over every op), FLOPs and bytes are counted by
enumerating the index triples of small products, the peaks are read from ``platforms.toml`` with tomllib. Nothing
is taken from the code under test."""

from __future__ import annotations

import contextlib
import gzip
import io
import itertools
import json
import tomllib
from collections import defaultdict
from decimal import Decimal
from fractions import Fraction
from math import prod
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpucost.cli import main
from gpucost.schemas.gemm import gemm_work
from tests.support.kernel_money import KINETO, ns, raw_events

BASE = 1_711_964_646_000_000_000
NO_OPERATOR = "(no operator)"
TABLE = tomllib.loads((Path(__file__).parents[1] / "gpucost" / "schemas" / "platforms.toml").read_text())
SIZES = {"double": 8, "float": 4, "c10::Half": 2, "c10::BFloat16": 2}
PRECISION = {"double": "fp64", "float": "fp32", "c10::Half": "fp16", "c10::BFloat16": "bf16"}


def _counted(batch: int, m: int, k: int, n: int, bias: list[int], size: int) -> tuple[int, int]:
    """FLOPs and bytes of a (batched) product by enumeration: one multiply and one add per index triple, every
    element of A, B, the result and the bias touched once."""
    triples = list(itertools.product(range(batch), range(m), range(n), range(k)))
    a = {(b, i, p) for b, i, _, p in triples}
    bb = {(b, p, j) for b, _, j, p in triples}
    c = {(b, i, j) for b, i, j, _ in triples}
    return 2 * len(triples), size * (len(a) + len(bb) + len(c) + (prod(bias) if bias else 0))


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(["aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"]),
    st.integers(1, 3),
    st.integers(1, 4),
    st.integers(1, 4),
    st.integers(1, 4),
    st.sampled_from(sorted(SIZES)),
)
def test_gemm_work_counts_each_product_by_enumeration(op, batch, m, k, n, dtype):
    batched = op.endswith("bmm")
    batch = batch if batched else 1
    a, b = ([batch, m, k], [batch, k, n]) if batched else ([m, k], [k, n])
    bias = [n] if op.startswith("aten::add") else [batch, m, n] if op == "aten::baddbmm" else []
    dims = ([bias] if bias else []) + [a, b] + ([[], []] if bias else [])
    types = [dtype] * (3 if bias else 2) + (["Scalar", "Scalar"] if bias else [])
    work = gemm_work(op, dims, types)
    assert work is not None
    assert (work.flops, work.bytes) == _counted(batch, m, k, n, bias, SIZES[dtype])
    assert work.precision == PRECISION[dtype]


@pytest.mark.parametrize(
    ("op", "dims", "types"),
    [
        ("aten::linear", [[8, 4], [2, 4], [2]], ["float"] * 3),  # calls addmm: counted there, not twice
        ("aten::matmul", [[8, 4], [4, 2]], ["float"] * 2),
        ("aten::mm", [[8, 4], [5, 2]], ["float"] * 2),  # inner sizes differ
        ("aten::mm", [[8, 4, 1], [4, 2]], ["float"] * 2),  # a batch where none is
        ("aten::bmm", [[3, 8, 4], [2, 4, 2]], ["float"] * 2),  # batches differ
        ("aten::mm", [[8, 4], [4, 2]], ["float", "c10::Half"]),  # operands differ
        ("aten::mm", [[8, 4], [4, 2]], ["long", "long"]),  # no float type
        ("aten::mm", [[8, True], [4, 2]], ["float"] * 2),
        ("aten::mm", [[8, -4], [-4, 2]], ["float"] * 2),
        ("aten::mm", [[8, 4]], ["float"]),
        ("aten::mm", "[[8, 4], [4, 2]]", ["float"] * 2),
        ("aten::addmm", [[2], [8, 4], [4, 2]], ["c10::Half", "float", "float"]),  # a bias of another type
        ("aten::mm", [[2**40, 2**20], [2**20, 2**10]], ["float"] * 2),  # past int64: no shape a GPU ran
    ],
)
def test_gemm_work_refuses_what_is_no_product(op, dims, types):
    assert gemm_work(op, dims, types) is None


def _run(path: Path, *flags: str) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(["kernels", str(path), "--usd-per-gpu-hour", "2.5", *flags]) == 0
    return json.loads(out.getvalue())


def _peak(model: str, precision: str | None) -> Fraction | None:
    row = next(r for name, r in TABLE.items() if model == name or model in r.get("aliases", []))
    return None if precision not in row else Fraction(str(row[precision]))


def expected_work(doc: dict, model: str | None) -> dict[int, dict[str, dict]]:
    """Per device, per operator path: the rows of ``work`` recomputed from the raw trace."""
    launches, raw_ops, kernels = raw_events(doc)
    ops = {key: [(s, -e, ev["name"], json.dumps(ev["args"])) for s, e, ev in spans] for key, spans in raw_ops.items()}
    sums: dict[int, dict[str, list]] = defaultdict(dict)
    for ev in kernels:
        pid, tid, t = launches.get(ev["args"].get("correlation"), (None, None, None))
        opened = sorted(o for o in ops.get((pid, tid), []) if t is not None and o[0] <= t <= -o[1])
        if not opened:
            continue
        call = opened[-1]
        args = json.loads(call[3])
        work = _by_hand(call[2], args.get("Input Dims"), args.get("Input type"))
        if work is None:
            continue
        path = "/".join(o[2] for o in opened)
        s = sums[ev["args"]["device"]].setdefault(path, [set(), 0, 0, 0, set()])
        s[3] += ns(ev["dur"])
        if (pid, tid, call) not in s[0]:  # a call is one op on one thread
            s[0].add((pid, tid, call))
            s[1], s[2] = s[1] + work[0], s[2] + work[1]
            s[4].add(work[2])
    return {device: {p: _figures(s, model) for p, s in paths.items()} for device, paths in sums.items()}


def _by_hand(op: str, dims, types) -> tuple[int, int, str] | None:
    """docs/definitions.md's rule, written out: 2·b·m·n·k FLOPs, (b·(mk + kn + mn) + bias) elements."""
    first = {"aten::mm": 0, "aten::bmm": 0, "aten::addmm": 1, "aten::baddbmm": 1}.get(op)
    if first is None or types[first] not in SIZES:
        return None
    a, b = dims[first], dims[first + 1]
    batch = a[0] if op.endswith("bmm") else 1
    m, k, n = a[-2], a[-1], b[-1]
    bias = prod(dims[0]) if first else 0
    return 2 * batch * m * n * k, SIZES[types[first]] * (batch * (m * k + k * n + m * n) + bias), types[first]


def _figures(s: list, model: str | None) -> dict:
    calls, flops, moved, kernel_ns, types = s
    precision = PRECISION[next(iter(types))] if len(types) == 1 else None
    rate = Fraction(flops, kernel_ns * 1000) if kernel_ns else None
    peak = None if model is None or precision is None else _peak(model, precision)
    if precision == "fp32" and peak is not None and rate is not None and rate > peak and _peak(model, "tf32"):
        precision, peak = "tf32", _peak(model, "tf32")  # faster than FP32 goes: it ran as TF32, where a part has it
    bandwidth = None if model is None else _peak(model, "mem_bw_gbps")
    return {
        "precision": precision,
        "calls": len(calls),
        "flops": flops,
        "bytes": moved,
        "kernel_ns": kernel_ns,
        "efu": None if peak is None or rate is None else float(rate / peak),
        "bw_util": None if bandwidth is None or not kernel_ns else float(Fraction(moved, kernel_ns) / bandwidth),
    }


def _check(report: dict, expected: dict[int, dict[str, dict]]) -> None:
    assert {d["device"]["device"] for d in report["devices"] if d["work"]} == set(expected)
    for device in report["devices"]:
        got = {
            w["path"]: {k: w[k] for k in ("precision", "calls", "flops", "bytes", "kernel_ns", "efu", "bw_util")}
            for w in device["work"]
        }
        assert got == expected.get(device["device"]["device"], {})
        tree = {o["path"]: (o["busy_ns"], o["cost_micro_usd"]) for o in device["operators"]}
        for w in device["work"]:  # each row's money is its operator path's, as the operator tree deals it
            assert (w["busy_ns"], w["cost_micro_usd"]) == tree[w["path"]]


GEMMS = [
    ("aten::mm", lambda m, k, n, t: ([[m, k], [k, n]], [t, t])),
    ("aten::addmm", lambda m, k, n, t: ([[n], [m, k], [k, n], [], []], [t, t, t, "Scalar", "Scalar"])),
    ("aten::bmm", lambda m, k, n, t: ([[2, m, k], [2, k, n]], [t, t])),
    ("aten::linear", lambda m, k, n, t: ([[m, k], [n, k], [n]], [t, t, t])),
]
op_st = st.tuples(
    st.integers(0, len(GEMMS) - 1),
    st.integers(0, 90),  # start, µs
    st.integers(0, 30),  # duration, µs
    st.tuples(st.integers(1, 4096), st.integers(1, 4096), st.integers(1, 4096)),
    st.sampled_from(["float", "c10::Half", "c10::BFloat16", "long"]),
)
kernel_st = st.tuples(
    st.integers(0, 2),  # stream
    st.integers(0, 200),  # start, µs
    st.integers(0, 40),  # duration, µs
    st.one_of(st.none(), st.tuples(st.integers(1, 2), st.integers(0, 120))),  # launch (thread, µs)
)


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(st.integers(1, 2), st.lists(op_st, max_size=8), max_size=2),
    st.lists(kernel_st, min_size=1, max_size=20),
    st.sampled_from([None, "NVIDIA H100 80GB HBM3", "NVIDIA L4", "Tesla T4"]),
)
def test_generated_traces_equal_recomputation(tmp_path_factory, ops, kernels, model):
    events = []
    for tid, spans in ops.items():
        seen = set()
        for g, start, dur, (m, k, n), dtype in spans:
            if (g, start, dur) in seen:  # one call a span: two alike could not be told apart by any reader
                continue
            seen.add((g, start, dur))
            dims, types = GEMMS[g][1](m, k, n, dtype)
            events.append({"ph": "X", "cat": "cpu_op", "name": GEMMS[g][0], "pid": 1, "tid": tid, "ts": start})
            events[-1] |= {"dur": dur, "args": {"Input Dims": dims, "Input type": types}}
    for i, (stream, start, dur, launch) in enumerate(kernels):
        events.append({"ph": "X", "cat": "kernel", "name": f"k{stream}", "pid": 0, "tid": stream, "ts": start})
        events[-1] |= {"dur": dur, "args": {"device": 0, "stream": stream, "correlation": i}}
        if launch is not None:
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": launch[0]})
            events[-1] |= {"ts": launch[1], "dur": 1, "args": {"correlation": i}}
    doc = {"baseTimeNanoseconds": BASE, "traceEvents": events}
    path = tmp_path_factory.mktemp("work") / "t.json"
    path.write_text(json.dumps(doc))
    _check(_run(path, *(["--gpu-model", model] if model else [])), expected_work(doc, model))


@pytest.mark.skipif(not KINETO, reason="../shared/data/profiler-traces/hta-kineto/ is absent")
@pytest.mark.parametrize("model", [None, "A100", "NVIDIA H100 80GB HBM3"])
def test_the_shared_trace_with_shapes_equals_recomputation(model):
    """``sampled_rank-0`` was recorded with shapes (580 ``aten::mm``, float32): its GEMMs' work, and on an A100 the
    calls faster than FP32 can go read against TF32."""
    path = next(p for p in KINETO if p.name == "sampled_rank-0.json.gz")
    report = _run(path, *(["--gpu-model", model] if model else []))
    expected = expected_work(json.loads(gzip.decompress(path.read_bytes()), parse_float=Decimal), model)
    assert sum(len(e) for e in expected.values()) >= 5
    _check(report, expected)
    precisions = {w["precision"] for d in report["devices"] for w in d["work"]}
    assert precisions == {"fp32", "tf32"} if model == "A100" else "fp32" in precisions  # no peak, no switch


def _one_call(tmp_path: Path, dims: list, types: list[str], kernel_us: int, **header: object) -> Path:
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


def test_a_trace_naming_its_gpu_is_judged_by_that_gpu(tmp_path):
    """``deviceProperties`` wins over ``--gpu-model``, which only names devices a trace leaves unnamed: one call
    of 2·64·64·64 FLOPs whose kernel ran 1 µs is 0.524 TFLOP/s, 0.0269 of an A100's 19.5 FP32 TFLOPS."""
    path = _one_call(
        tmp_path,
        [[64, 64], [64, 64]],
        ["float", "float"],
        1,
        deviceProperties=[{"id": 0, "name": "NVIDIA A100-SXM4-40GB"}],
    )
    (device,) = _run(path, "--gpu-model", "NVIDIA H100 80GB HBM3")["devices"]
    (work,) = device["work"]
    assert work["peak_tflops"] == 19.5 and work["efu"] == float(Fraction(2 * 64**3, 1000 * 1000) / Fraction("19.5"))
    # 2·64³ FLOPs over 3·64²·4 bytes is 10.7 FLOP/B, past the A100's FP32 ridge of 19.5e12 / 2039e9 = 9.6 FLOP/B
    assert work["bound"] == "compute" and work["arithmetic_intensity"] == pytest.approx(2 * 64**3 / (3 * 64**2 * 4))


def test_a_gpu_model_the_table_does_not_know_is_said_and_gives_no_efu(tmp_path):
    path = _one_call(tmp_path, [[8, 8], [8, 8]], ["c10::Half", "c10::Half"], 3)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert main(["kernels", str(path), "--gpu-model", "Voodoo 5"]) == 0
    assert "'Voodoo 5' is in no row of the platform table" in err.getvalue()
    (work,) = json.loads(out.getvalue())["devices"][0]["work"]
    assert work["flops"] == 2 * 8**3 and work["precision"] == "fp16"
    assert (work["efu"], work["peak_tflops"], work["bound"]) == (None, None, None)
