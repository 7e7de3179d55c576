"""``gpucost kernels --whatif-gpu``: the bill had the GEMM operators run on another part, re-timed by the roofline
(docs/definitions.md, "Kernel cost", "What-if per operator"). The generated and shared traces' what-ifs are checked
against a recomputation in ``tests/test_kernel_work.py``; here, figures worked out by hand."""

from __future__ import annotations

import json
import subprocess
import sys
from fractions import Fraction

import pytest

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
    # 360,000,000 $ an hour is 100 µ$ a ns: the bill is the exact busy time's, rounded once, not the rounded time's
    flags = ["--gpu-model", "A100", "--whatif-gpu", "H100", "--whatif-usd-per-gpu-hour", "360000000"]
    (device,) = run(path, *flags)["devices"]
    flops, moved = 2 * 512**3, 3 * 512**2 * 4
    a100 = max(Fraction(flops) / (Fraction("19.5") * 1000), Fraction(moved) / 2039)
    h100 = max(Fraction(flops) / (67 * 1000), Fraction(moved) / 3350)
    assert device["busy_ns"] == 50_000 and device["work"][0]["precision"] == "fp32"
    busy = 20_000 * h100 / a100 + 30_000
    assert device["whatif"]["busy_ns"] == half_even(busy)
    assert device["whatif"]["cost_micro_usd"] == half_even(busy * 100) != half_even(busy) * 100
    (row,) = device["whatif"]["retimed"]
    assert (row["path"], row["busy_ns"], row["scale"]) == ("aten::mm", 20_000, float(h100 / a100))


def test_a_whatif_on_a_part_without_peaks_is_refused(tmp_path, capsys):
    path = one_call(tmp_path, [[8, 8], [8, 8]], ["float", "float"], 3)
    assert main(["kernels", str(path), "--whatif-gpu", "Voodoo 5"]) == 2
    err = capsys.readouterr().err
    assert "--whatif-gpu 'Voodoo 5'" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--usd-per-gpu-hour", "1e5000"], "under 1,000,000,000"),
        (["--whatif-gpu", "H100", "--whatif-usd-per-gpu-hour", "1000000000"], "under 1,000,000,000"),
        (["--whatif-usd-per-gpu-hour", "3"], "give that part too"),
        (["--whatif-usd-per-gpu-hour", "abc"], "give that part too"),
    ],
)
def test_prices_past_any_price_and_a_price_without_a_part_are_refused(tmp_path, capsys, flags, said):
    path = one_call(tmp_path, [[8, 8], [8, 8]], ["float", "float"], 3)
    assert main(["kernels", str(path), *flags]) == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err


def test_paths_that_cannot_be_retimed_are_listed(tmp_path, capsys):
    """A float32 call that ran as TF32 on an A100 (faster than its FP32 peak) is re-timed on a T4, which has no
    TF32, at the T4's FP32; on a B200, which the table gives no FP32 and a TF32, at its TF32; a bfloat16 call on a
    T4 (no BF16 in the table) is listed as not re-timed, with its precision."""
    tf32 = one_call(tmp_path, [[512, 512], [512, 512]], ["float", "float"], 5)  # 53.7 TFLOP/s: past 19.5
    (device,) = run(tf32, "--gpu-model", "A100", "--whatif-gpu", "T4")["devices"]
    assert device["work"][0]["precision"] == "tf32"
    assert [r["path"] for r in device["whatif"]["retimed"]] == ["aten::mm"] and not device["whatif"]["not_retimed"]
    bf16 = one_call(tmp_path, [[512, 512], [512, 512]], ["c10::BFloat16"] * 2, 5)
    (device,) = run(bf16, "--gpu-model", "A100", "--whatif-gpu", "T4", "--format", "json")["devices"]
    (skipped,) = device["whatif"]["not_retimed"]
    assert (skipped["path"], skipped["precision"]) == ("aten::mm", "bf16") and "T4" in skipped["reason"]
    assert device["whatif"]["busy_ns"] == device["busy_ns"]  # nothing re-timed: the measured time


def test_a_device_whose_gpu_no_one_names_is_said_so(tmp_path):
    path = one_call(tmp_path, [[8, 8], [8, 8]], ["float", "float"], 3)
    out = subprocess.run(
        [sys.executable, "-m", "gpucost.cli", "kernels", str(path)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and "None" not in out.stderr
    assert "no GPU model is named (the trace names none and --gpu-model is not given)" in out.stderr
