"""``gpucost trace-events``' flags and output file: refusals that say what to give, the variables' fallbacks, mappings
that would merge GPUs or processes, an output that is an input, a folder, a link or a pipe."""

from __future__ import annotations

import json
import os
import stat
import threading

import pytest

from gpucost.schemas.codec import decode_line
from tests.support.cli import gpucost
from tests.support.kernel_money import KINETO
from tests.support.trace_oracle import kineto
from tests.support.trace_runs import CATS, convert, gpu_event, same, small_trace, span, trace_pid, write_trace


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ((), "needs --node-id"),
        (("--node-id", "n", "--gpu-uuid", "GPU-x"), "is not KEY=VALUE"),
        (("--node-id", "n", "--gpu-uuid", "a=GPU-x"), "the device is the trace's index"),
        (("--node-id", "n", "--gpu-uuid", "0=GPU-x", "--gpu-uuid", "0=GPU-y"), "two UUIDs"),
        (("--node-id", "n", "--pid", "1=-4"), "a process id is a whole number"),
        (("--node-id", "n", "--pid", "1=2", "--pid", "1=3"), "two host pids"),
    ],
)
def test_flags_that_say_nothing_sensible_are_refused_with_what_to_give(tmp_path, args, said):
    trace = write_trace(tmp_path, [])
    _, _, proc = convert(tmp_path, str(trace), *args, check=False)
    assert proc.returncode == 2 and said in proc.stderr and "Traceback" not in proc.stderr


def test_a_file_that_is_no_trace_leaves_the_output_as_it_was(tmp_path):
    good = write_trace(tmp_path, [span("cuda_runtime", "cudaLaunchKernel", 50, 1, correlation=1), gpu_event(1, 60)])
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [')
    out = tmp_path / "kernels.jsonl"
    out.write_text("before\n")
    proc = gpucost("trace-events", str(good), str(bad), "--node-id", "n", "--out", str(out), check=False)
    assert proc.returncode == 2 and "bad.json: cannot be read" in proc.stderr and "Traceback" not in proc.stderr
    assert out.read_text() == "before\n" and sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["t.json", "bad.json", "kernels.jsonl"]
    )


def test_the_flags_fall_back_to_their_variables(tmp_path):
    trace = next(p for p in KINETO if p.name == "sampled_rank-1.json.gz")  # device 1
    pid = trace_pid(trace)
    env = {
        "GPUCOST_NODE_ID": "n9",
        "GPUCOST_TRACE_GPU_UUIDS": "0=GPU-zero, 1=GPU-one",
        "GPUCOST_TRACE_PIDS": f"{pid}=77",
        "GPUCOST_TRACE_PATHS": "both",
        "GPUCOST_TRACE_EVENTS_OUT": str(tmp_path / "env.jsonl"),
    }
    proc = gpucost("trace-events", str(trace), env=env)
    written = [decode_line(line) for line in (tmp_path / "env.jsonl").read_text().splitlines()]
    expected = kineto(trace, "n9", {0: "GPU-zero", 1: "GPU-one"}, {pid: 77}, CATS["both"])
    same({(e.correlation_id, e.start_ns, e.stream): e for e in written}, expected)
    assert json.loads(proc.stderr)["trace_events"]["devices"] == {"1": "GPU-one"}
    bad = gpucost("trace-events", str(trace), env={**env, "GPUCOST_TRACE_PATHS": "all"}, check=False)
    assert bad.returncode == 2 and "GPUCOST_TRACE_PATHS) 'all'" in bad.stderr


def test_an_output_that_is_a_trace_is_refused_and_the_trace_kept(tmp_path):
    trace = small_trace(tmp_path)
    before = trace.read_bytes()
    proc = gpucost("trace-events", str(trace), "--node-id", "n", "--out", str(trace), check=False)
    assert proc.returncode == 2 and "would destroy it" in proc.stderr and trace.read_bytes() == before


def test_an_output_that_is_a_folder_is_refused_and_nothing_is_left_beside_it(tmp_path):
    trace, folder = small_trace(tmp_path), tmp_path / "out"
    folder.mkdir()
    proc = gpucost("trace-events", str(trace), "--node-id", "n", "--out", str(folder), check=False)
    assert proc.returncode == 2 and "is a directory" in proc.stderr and "Traceback" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "t.json"] and not any(folder.iterdir())


def test_a_link_is_written_through_and_stays_a_link(tmp_path):
    trace, real, link = small_trace(tmp_path), tmp_path / "real.jsonl", tmp_path / "link.jsonl"
    real.write_text("old\n")
    link.symlink_to(real)
    gpucost("trace-events", str(trace), "--node-id", "n", "--out", str(link))
    assert link.is_symlink() and [json.loads(line)["correlation_id"] for line in real.read_text().splitlines()] == [1]


def test_a_named_pipe_is_written_into_not_replaced(tmp_path):
    trace, fifo = small_trace(tmp_path), tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()), daemon=True)
    reader.start()
    gpucost("trace-events", str(trace), "--node-id", "n", "--out", str(fifo))
    reader.join(timeout=60)
    assert stat.S_ISFIFO(fifo.lstat().st_mode) and [json.loads(x)["correlation_id"] for x in got[0].splitlines()] == [1]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--gpu-uuid", "0=GPU-x", "--gpu-uuid", "1=GPU-x"), "one UUID"),
        (("--pid", "7=1", "--pid", "8=1"), "one host pid"),
        (("--pid", "7=0"), "host pid 0 is no process"),
        (("--node-id", "x" * 252), "1 to 251 characters"),
        (("--paths", "all"), "give one of ranges, operators, both"),
    ],
)
def test_mappings_that_would_merge_gpus_or_processes_are_refused(tmp_path, args, said):
    out = tmp_path / "out.jsonl"
    proc = gpucost("trace-events", str(small_trace(tmp_path)), "--node-id", "n", *args, "--out", str(out), check=False)
    assert proc.returncode == 2 and said in proc.stderr and "Traceback" not in proc.stderr and not out.exists()


def test_mappings_the_traces_do_not_use_and_an_empty_output_are_said(tmp_path):
    _, summary, _ = convert(
        tmp_path,
        str(small_trace(tmp_path)),
        "--node-id",
        "n",
        "--gpu-uuid",
        "0=A",
        "--gpu-uuid",
        "3=B",
        "--pid",
        "7=70",
        "--pid",
        "9=90",
    )
    assert summary["warnings"] == [
        "--gpu-uuid 3=B: no kernel of device 3 in the traces",
        "--pid 9=90: no kernel of process 9 in the traces",
    ]
    empty = write_trace(tmp_path, [gpu_event(1, 60)])  # no launch: no process, left out
    events, summary, _ = convert(tmp_path, str(empty), "--node-id", "n")
    assert events == {} and summary["warnings"][-1].startswith("no kernel_activity written")


def test_a_mapping_onto_another_process_or_gpu_of_the_traces_is_warned_of(tmp_path):
    trace = write_trace(
        tmp_path,
        [
            span("cuda_runtime", "cudaLaunchKernel", 50, 1, correlation=1),
            span("cuda_runtime", "cudaLaunchKernel", 55, 1, correlation=2) | {"pid": 8},
            gpu_event(1, 60),
            gpu_event(2, 70, device=1),
        ],
    )
    events, summary, _ = convert(tmp_path, str(trace), "--node-id", "n", "--pid", "7=8", "--gpu-uuid", "0=n/1")
    assert {e.pid for e in events.values()} == {8} and {e.gpu_uuid for e in events.values()} == {"n/1"}
    assert summary["warnings"][-2:] == [
        "--pid 7=8: the traces have a process 8 too, not mapped: both are written as that pid",
        "--gpu-uuid 0=n/1: device 1 has no --gpu-uuid and falls back to that id: both are written as one GPU",
    ]
