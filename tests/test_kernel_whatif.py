"""``gpucost kernels --whatif-gpu``: the bill had the GEMM operators run on another part, re-timed by the roofline
(docs/definitions.md, "Kernel cost", "What-if per operator"). The generated and shared traces' what-ifs are checked
against a recomputation in ``tests/test_kernel_work.py``; here, figures worked out by hand."""

from __future__ import annotations

import json
from fractions import Fraction

from gpucost.cli import main
from tests.support.kernel_money import half_even
from tests.support.kernel_work import BASE, one_call, run


def test_a_whatif_retimes_only_the_kernels_of_calls_with_work(tmp_path):
    """Two ``aten::mm`` calls on one path, float32 and int64: only the float call's kernel (20 µs: 13.4 TFLOP/s, FP32
    on an A100) is re-timed, by the ratio of an H100's roofline time to an A100's for its work; the int64 call's
    (30 µs) keeps its time."""
    ev = []
    for i, dtype in enumerate(["float", "long"]):
        ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 20 * i, "dur": 10})
        ev[-1]["args"] = {"Input Dims": [[512, 512], [512, 512]], "Input type": [dtype, dtype]}
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "l", "pid": 1, "tid": 1, "ts": 20 * i + 2, "dur": 1})
        ev[-1]["args"] = {"correlation": i}
        ev.append(
            {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 100 + 30 * i, "dur": 20 + 10 * i}
        )
        ev[-1]["args"] = {"device": 0, "stream": 7, "correlation": i}
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"baseTimeNanoseconds": BASE, "traceEvents": ev}))
    # 3,600,000,000 $ an hour is 1,000 µ$ a ns: the bill is the exact busy time's, rounded once, not the rounded
    # time's
    flags = ["--gpu-model", "A100", "--whatif-gpu", "H100", "--whatif-usd-per-gpu-hour", "3600000000"]
    (device,) = run(path, *flags)["devices"]
    flops, moved = 2 * 512**3, 3 * 512**2 * 4
    a100 = max(Fraction(flops) / (Fraction("19.5") * 1000), Fraction(moved) / 2039)
    h100 = max(Fraction(flops) / (67 * 1000), Fraction(moved) / 3350)
    assert device["busy_ns"] == 50_000 and device["work"][0]["precision"] == "fp32"
    busy = 20_000 * h100 / a100 + 30_000
    assert device["whatif"]["busy_ns"] == half_even(busy)
    assert device["whatif"]["cost_micro_usd"] == half_even(busy * 1000) != half_even(busy) * 1000
    (row,) = device["whatif"]["retimed"]
    assert (row["path"], row["busy_ns"], row["scale"]) == ("aten::mm", 20_000, float(h100 / a100))


def test_a_whatif_on_a_part_without_peaks_is_refused(tmp_path, capsys):
    path = one_call(tmp_path, [[8, 8], [8, 8]], ["float", "float"], 3)
    assert main(["kernels", str(path), "--whatif-gpu", "Voodoo 5"]) == 2
    err = capsys.readouterr().err
    assert "--whatif-gpu 'Voodoo 5'" in err and "Traceback" not in err
