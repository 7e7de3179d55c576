"""What ``gpucost kernels`` makes of files that are not traces, of several files, and of GEMMs it cannot read work
from (docs/kernels.md; docs/definitions.md, "Kernel cost"), from a newcomer's run: a plain JSON file gave an empty
report and exit 0, a folder was "no such file", two runs' ``trace.json`` were one device."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import sqlite3

import pytest

from gpucost.cli import main
from tests.support.kernel_work import BASE, one_call


def _kernels(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["kernels", *argv])
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("content", [b'{"a": 1}', b"[1, 2, 3]", gzip.compress(b'{"traceEvents_": []}'), b"{}"])
def test_json_that_is_no_trace_is_refused(tmp_path, content):
    path = tmp_path / "x.json"
    path.write_bytes(content)
    code, out, err = _kernels(str(path))
    assert code == 2 and out == "" and "no traceEvents array" in err and "Traceback" not in err


def test_an_empty_trace_is_a_trace(tmp_path):
    path = tmp_path / "x.json"
    path.write_text('{"traceEvents": []}')
    code, out, _ = _kernels(str(path))
    assert code == 0 and json.loads(out)["devices"] == []


def test_an_sqlite_file_that_is_no_nsys_export_is_refused(tmp_path):
    path = tmp_path / "x.sqlite"
    sqlite3.connect(path).execute("CREATE TABLE t (a)").connection.commit()
    code, _, err = _kernels(str(path))
    assert code == 2 and "not an `nsys export --type sqlite` file" in err


def test_a_folder_is_said_to_be_one(tmp_path):
    code, _, err = _kernels(str(tmp_path))
    assert code == 2 and "is a folder: give the trace files in it" in err


def test_one_file_twice_is_refused_and_two_files_of_one_name_are_two_nodes(tmp_path):
    for run in ("run1", "run2"):
        (tmp_path / run).mkdir()
        one_call(tmp_path / run, [[64, 64], [64, 64]], ["float", "float"], 3).rename(tmp_path / run / "trace.json")
    code, _, err = _kernels(
        str(tmp_path / "run1" / "trace.json"), str(tmp_path / "run1" / ".." / "run1" / "trace.json")
    )
    assert code == 2 and "given again" in err
    code, out, _ = _kernels(str(tmp_path / "run1" / "trace.json"), str(tmp_path / "run2" / "trace.json"))
    nodes = [d["device"]["node"] for d in json.loads(out)["devices"]]
    assert code == 0 and nodes == sorted(str(tmp_path / r / "trace.json") for r in ("run1", "run2"))
    code, out, _ = _kernels(str(tmp_path / "run1" / "trace.json"))
    assert [d["device"]["node"] for d in json.loads(out)["devices"]] == ["trace.json"]  # alone: its name


def test_gemms_without_shapes_are_noted(tmp_path):
    ev = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 10},
        {"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "pid": 1, "tid": 1, "ts": 20, "dur": 10},
        {"ph": "X", "cat": "cpu_op", "name": "aten::relu", "pid": 1, "tid": 1, "ts": 40, "dur": 10},
    ]
    ev[1]["args"] = {"Input Dims": [[4, 4], [5, 4]], "Input type": ["float", "float"]}
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"baseTimeNanoseconds": BASE, "traceEvents": ev}))
    code, out, _ = _kernels(str(path))
    assert code == 0 and json.loads(out)["rejected"] == {
        "t.json: cpu_op: aten::mm with no shapes (profile with record_shapes=True): no FLOPs": 1,
        "t.json: cpu_op: aten::addmm with shapes that are no product: no FLOPs": 1,
    }


def test_gemms_faster_than_the_gpu_named_are_said(tmp_path):
    """2·512³ FLOPs in 1 µs is 268 TFLOP/s: past a T4's 65 (FP16), so the T4 named is not the part it ran on."""
    path = one_call(tmp_path, [[512, 512], [512, 512]], ["c10::Half", "c10::Half"], 1)
    code, out, err = _kernels(str(path), "--gpu-model", "T4")
    assert code == 0 and json.loads(out)["devices"][0]["work"][0]["efu"] > 1
    assert "ran faster than T4's peak or bandwidth" in err
    code, _, err = _kernels(str(path), "--gpu-model", "H100")
    assert code == 0 and "faster than" not in err


def test_text_keeps_the_innermost_end_of_a_long_path(tmp_path):
    outer = "o" * 150
    ev = [
        {"ph": "X", "cat": "user_annotation", "name": outer, "pid": 1, "tid": 1, "ts": 0, "dur": 20},
        {"ph": "X", "cat": "user_annotation", "name": "inner_step", "pid": 1, "tid": 1, "ts": 1, "dur": 10},
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "l",
            "pid": 1,
            "tid": 1,
            "ts": 2,
            "dur": 1,
            "args": {"correlation": 1},
        },
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 30, "dur": 5},
    ]
    ev[3]["args"] = {"device": 0, "stream": 7, "correlation": 1}
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"baseTimeNanoseconds": BASE, "traceEvents": ev}))
    code, out, _ = _kernels(str(path), "--format", "text")
    (line,) = [x for x in out.splitlines() if x.lstrip().startswith("range") and "inner_step" in x]
    assert code == 0 and line.endswith("/inner_step") and "…" in line  # cut from its start, not its end
