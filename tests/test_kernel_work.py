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
from decimal import Decimal
from fractions import Fraction
from math import prod

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpucost.cli import main
from gpucost.schemas.gemm import gemm_work
from tests.support.kernel_money import KINETO
from tests.support.kernel_work import (
    BASE,
    PRECISION,
    SIZES,
    check_whatif,
    check_work,
    expected_whatif,
    expected_work,
    one_call,
    run,
    trace,
)


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
        ("aten::addmm", [[2], [8, 4], [4, 2]], [None, "float", "float"]),
        ("aten::addmm", [[8, 4], [4, 2]], ["float", "float"]),  # no bias
        ("aten::mm", [[8, 4], [4, 2], [2, 2]], ["float"] * 3),  # a third tensor where mm takes two
        ("aten::mm", [[8, 4], [4, 2]], ["float"] * 3),  # types that do not match the inputs
        ("aten::mm", [[2**40, 2**20], [2**20, 2**10]], ["float"] * 2),  # past int64: no shape a GPU ran
    ],
)
def test_gemm_work_refuses_what_is_no_product(op, dims, types):
    assert gemm_work(op, dims, types) is None


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
    # launch (pid, thread, µs): processes 1 and 2 both have a thread 1; (2, 2) has no op
    st.one_of(st.none(), st.tuples(st.sampled_from([(1, 1), (1, 2), (2, 1), (2, 2)]), st.integers(0, 120))),
)


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(st.sampled_from([(1, 1), (1, 2), (2, 1)]), st.lists(op_st, max_size=8), max_size=3),
    st.lists(kernel_st, min_size=1, max_size=20),
    st.sampled_from([None, "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA L4 (rev 2)", "Tesla T4"]),
    st.sampled_from(["H200", "A100", "L4", "T4", "B200"]),  # T4 has no TF32, B200 no FP32 in the table
)
def test_generated_traces_equal_recomputation(tmp_path_factory, ops, kernels, model, target):
    events = []
    for (pid, tid), spans in ops.items():
        seen = set()
        for g, start, dur, (m, k, n), dtype in spans:
            if (g, start, dur) in seen:  # one call a span: two alike could not be told apart by any reader
                continue
            seen.add((g, start, dur))
            dims, types = GEMMS[g][1](m, k, n, dtype)
            events.append({"ph": "X", "cat": "cpu_op", "name": GEMMS[g][0], "pid": pid, "tid": tid, "ts": start})
            events[-1] |= {"dur": dur, "args": {"Input Dims": dims, "Input type": types}}
    for i, (stream, start, dur, launch) in enumerate(kernels):
        events.append({"ph": "X", "cat": "kernel", "name": f"k{stream}", "pid": 0, "tid": stream, "ts": start})
        events[-1] |= {"dur": dur, "args": {"device": 0, "stream": stream, "correlation": i}}
        if launch is not None:
            (pid, tid), ts = launch
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": pid, "tid": tid})
            events[-1] |= {"ts": ts, "dur": 1, "args": {"correlation": i}}
    doc = {"baseTimeNanoseconds": BASE, "traceEvents": events}
    path = tmp_path_factory.mktemp("work") / "t.json"
    path.write_text(json.dumps(doc))
    flags = ["--whatif-gpu", target, "--whatif-usd-per-gpu-hour", "7654321.123457"]  # 2 µ$ a ns: rounding shows
    report = run(path, *flags, *(["--gpu-model", model] if model else []))
    check_work(report, expected_work(doc, model))
    check_whatif(report, expected_whatif(doc, model, target, "7654321.123457"))


@pytest.mark.skipif(not KINETO, reason="../shared/data/profiler-traces/hta-kineto/ is absent")
@pytest.mark.parametrize("model", [None, "A100", "NVIDIA H100 80GB HBM3"])
def test_the_shared_trace_with_shapes_equals_recomputation(model):
    """``sampled_rank-0`` was recorded with shapes (580 ``aten::mm``, float32): its GEMMs' work, and on an A100 the
    calls faster than FP32 can go read against TF32."""
    path = next(p for p in KINETO if p.name == "sampled_rank-0.json.gz")
    report = run(path, "--whatif-gpu", "H100", *(["--gpu-model", model] if model else []))
    doc = json.loads(gzip.decompress(path.read_bytes()), parse_float=Decimal)
    expected = expected_work(doc, model)
    assert sum(len(e) for e in expected.values()) >= 5
    check_work(report, expected)
    check_whatif(report, expected_whatif(doc, model, "H100", "2.5"))  # the bill's own price where none is given
    if model is not None:  # an H100 does the GEMMs faster than an A100, and nothing else changes
        for device in report["devices"]:
            assert device["whatif"]["retimed"]
            assert (device["whatif"]["busy_ns"] < device["busy_ns"]) == (model == "A100")
    precisions = {w["precision"] for d in report["devices"] for w in d["work"]}
    assert precisions == {"fp32", "tf32"} if model == "A100" else "fp32" in precisions  # no peak, no switch


def test_a_trace_naming_its_gpu_is_judged_by_that_gpu(tmp_path):
    """``deviceProperties`` wins over ``--gpu-model``, which only names devices a trace leaves unnamed: one call
    of 2·64·64·64 FLOPs whose kernel ran 1 µs is 0.524 TFLOP/s, 0.0269 of an A100's 19.5 FP32 TFLOPS."""
    path = one_call(
        tmp_path,
        [[64, 64], [64, 64]],
        ["float", "float"],
        1,
        deviceProperties=[{"id": 0, "name": "NVIDIA A100-SXM4-40GB"}],
    )
    (device,) = run(path, "--gpu-model", "NVIDIA H100 80GB HBM3")["devices"]
    (work,) = device["work"]
    assert work["peak_tflops"] == 19.5 and work["efu"] == float(Fraction(2 * 64**3, 1000 * 1000) / Fraction("19.5"))
    # 2·64³ FLOPs over 3·64²·4 bytes is 10.7 FLOP/B: short of the 40 GB A100's FP32 ridge, 19.5e12 / 1555e9 =
    # 12.5 FLOP/B (its 1,555 GB/s, not the 80 GB part's 2,039, whose ridge of 9.6 the call would pass)
    assert work["bound"] == "memory" and work["arithmetic_intensity"] == pytest.approx(2 * 64**3 / (3 * 64**2 * 4))
    assert work["bw_util"] == float(Fraction(3 * 64**2 * 4, 1000) / 1555)


def test_a_gpu_model_the_table_does_not_know_is_said_and_gives_no_efu(tmp_path):
    path = one_call(tmp_path, [[8, 8], [8, 8]], ["c10::Half", "c10::Half"], 3)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert main(["kernels", str(path), "--gpu-model", "Voodoo 5"]) == 0
    assert "'Voodoo 5' is in no row of the platform table" in err.getvalue()
    (named,) = json.loads(out.getvalue())["devices"]
    assert named["gpu_model"] == "Voodoo 5"  # the device is named by it, as the docs say
    (work,) = json.loads(out.getvalue())["devices"][0]["work"]
    assert work["flops"] == 2 * 8**3 and work["precision"] == "fp16"
    assert (work["efu"], work["peak_tflops"], work["bound"]) == (None, None, None)


def test_a_call_launching_under_crossing_operators_is_counted_once(tmp_path):
    """``aten::linear`` [0, 10] µs and ``aten::mm`` [5, 20] µs cross on one thread; the mm call launches at 7 µs
    (in both) and at 15 µs (in mm alone). Its FLOPs are counted once, on the path of its first launch."""
    mm = (1, 1, "aten::mm", 5, 20, [[64, 64], [64, 64]], ["float", "float"])
    linear = (1, 1, "aten::linear", 0, 10, [[64, 64], [64, 64], [64]], ["float"] * 3)
    (device,) = run(trace(tmp_path, [linear, mm], [(1, 1, 7), (1, 1, 15)]))["devices"]
    (work,) = device["work"]
    assert (work["path"], work["calls"], work["flops"], work["kernel_ns"]) == (
        "aten::linear/aten::mm",
        1,
        2 * 64**3,
        10_000,
    )


def test_a_thread_is_its_process_and_its_id(tmp_path):
    """Processes 1 and 2 each run an ``aten::mm`` on their thread 1, of 64³ and 8³: each launch is in its own
    process's call, never in the other's."""
    ops = [(p, 1, "aten::mm", 0, 20, [[n, n], [n, n]], ["float", "float"]) for p, n in ((1, 64), (2, 8))]
    (device,) = run(trace(tmp_path, ops, [(1, 1, 5), (2, 1, 6)]))["devices"]
    (work,) = device["work"]  # one path, two calls
    assert (work["calls"], work["flops"], work["kernel_ns"]) == (2, 2 * 64**3 + 2 * 8**3, 10_000)


def test_a_gpu_the_trace_names_and_the_table_lacks_is_said(tmp_path):
    path = one_call(tmp_path, [[8, 8], [8, 8]], ["float", "float"], 3, deviceProperties=[{"id": 0, "name": "A10G"}])
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert main(["kernels", str(path), "--gpu-model", "H100", "--whatif-gpu", "L4", "--format", "text"]) == 0
    assert "GPU model 'A10G' is in no row of the platform table" in err.getvalue()
    assert "'H100'" not in err.getvalue()
    assert "work" in out.getvalue() and "n/a TFLOP/s" not in out.getvalue()
    assert "what if L4: busy 3000 ns" in out.getvalue()  # nothing re-timed without the GPU's own peaks
