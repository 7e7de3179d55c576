"""``gpucost trace-events``: profiler traces' kernels as ``kernel_activity`` events with their range paths, checked
against the raw files read with the standard library (``tests/support/trace_oracle.py``), then billed by a replay in
the default configuration and checked against exact shares worked out from the raw trace."""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import duckdb
import pytest

from gpucost.schemas.codec import decode_line, encode_event
from gpucost.schemas.events import GpuSample, Price, ProcessSample, TenantBinding
from gpucost.schemas.kernels import KernelActivity
from tests.support.cli import gpucost
from tests.support.kernel_money import DATA, KINETO, shares
from tests.support.trace_oracle import kineto, nsys

NSYS = DATA / "pipit-nsys" / "saxpy-mpi-cuda_nsys_perlmutter0.sqlite"
CATS = {"ranges": ("user_annotation",), "operators": ("cpu_op",), "both": ("user_annotation", "cpu_op")}
FIELDS = ("node_id", "pid", "gpu_uuid", "device", "name", "category", "end_ns", "launch_tid", "launch_ns")


def convert(tmp_path: Path, *args: str, check: bool = True) -> tuple[dict, dict, object]:
    """Run the command; its events by (correlation id, start ns, stream) and its summary (and the process)."""
    out = tmp_path / "kernels.jsonl"
    proc = gpucost("trace-events", *args, "--out", str(out), check=check)
    if proc.returncode:
        return {}, {}, proc
    events = {}
    for line in out.read_text().splitlines():
        ev = decode_line(line)
        assert isinstance(ev, KernelActivity), ev  # the pipeline's own decoder takes every line
        key = (ev.correlation_id, ev.start_ns, ev.stream)
        assert key not in events
        events[key] = ev
    return events, json.loads(proc.stderr)["trace_events"], proc


def same(events: dict, expected: dict) -> None:
    assert events.keys() == expected.keys()
    for key, want in expected.items():
        got = events[key]
        assert {f: getattr(got, f) for f in FIELDS} == {f: want[f] for f in FIELDS}, key
        assert (list(got.range_path) if got.range_path else None) == want["range_path"], key


def trace_pid(path: Path) -> int:
    with gzip.open(path, "rt") as f:
        pids = {e["pid"] for e in json.load(f)["traceEvents"] if e.get("cat") == "cuda_runtime"}
    assert len(pids) == 1
    return pids.pop()


@pytest.mark.parametrize("trace", KINETO, ids=lambda p: p.name)
def test_each_kineto_kernel_is_written_with_its_launch_s_range_path(tmp_path, trace):
    pid = trace_pid(trace)
    events, summary, _ = convert(
        tmp_path, str(trace), "--node-id", "n1", "--gpu-uuid", "0=GPU-T0", "--pid", f"{pid}=4242"
    )
    same(events, kineto(trace, "n1", {0: "GPU-T0"}, {pid: 4242}, CATS["ranges"]))
    assert summary["events"]["kernel_activity"] == len(events)
    assert summary["events"]["with_range_path"] == sum(e.range_path is not None for e in events.values()) > 0
    assert {e.source for e in events.values()} == {"kineto"}


@pytest.mark.parametrize("paths", ["operators", "both"])
def test_paths_of_operators_or_of_both_nest_by_time_on_the_thread(tmp_path, paths):
    trace = next(p for p in KINETO if p.name == "nccl_data.json.gz")
    events, _, _ = convert(tmp_path, str(trace), "--node-id", "n1", "--paths", paths)
    same(events, kineto(trace, "n1", {}, {}, CATS[paths]))
    deepest = max(len(e.range_path or ()) for e in events.values())
    assert deepest > 3  # operators nest (aten::linear > aten::addmm …), so these paths are deeper than the ranges


def test_each_nsys_kernel_and_copy_is_written_with_its_nvtx_path(tmp_path):
    events, summary, _ = convert(tmp_path, str(NSYS), "--node-id", "n2", "--gpu-uuid", "0=GPU-N")
    same(events, nsys(NSYS, "n2", {0: "GPU-N"}))
    assert {e.category for e in events.values()} == {"kernel", "memcpy"}
    assert any(e.range_path for e in events.values() if e.category == "kernel")
    assert summary["warnings"] == []


def _trace(tmp_path: Path, events: list[dict]) -> Path:
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"baseTimeNanoseconds": 1_767_571_200 * 10**9, "traceEvents": events}))
    return path


def _span(cat: str, name: str, ts: int, dur: int, **args: object) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 7, "tid": 8, "ts": ts, "dur": dur, "args": args}


def _gpu(corr: int, ts: int, device: int = 0) -> dict:
    args = {"correlation": corr, "device": device, "stream": 3}
    return {"ph": "X", "cat": "kernel", "name": "k", "pid": device, "tid": 3, "ts": ts, "dur": 5, "args": args}


def test_what_cannot_be_written_as_it_is_is_counted_and_said(tmp_path):
    deep = [_span("user_annotation", f"level{i:02}", i, 1000 - 2 * i) for i in range(40)]
    long_name = _span("user_annotation", "x" * 2000, 2000, 10)
    trace = _trace(
        tmp_path,
        [
            *deep,
            long_name,
            _span("cuda_runtime", "cudaLaunchKernel", 50, 1, correlation=1),
            _span("cuda_runtime", "cudaLaunchKernel", 2005, 1, correlation=2),
            _gpu(1, 60),
            _gpu(2, 2010, device=1),
            _gpu(3, 120),  # its launch is not in the trace: no process is known
        ],
    )
    events, summary, _ = convert(tmp_path, str(trace), "--node-id", "n1", "--gpu-uuid", "0=GPU-A")
    by_corr = {k[0]: e for k, e in events.items()}
    assert sorted(by_corr) == [1, 2]
    assert list(by_corr[1].range_path) == [f"level{i:02}" for i in range(32)]  # the outermost 32 of 40
    assert by_corr[2].range_path == ("x" * 1024,)  # a name cut to 1,024 characters
    assert by_corr[2].gpu_uuid == "n1/1"
    assert summary["left_out"] == {
        "kernels left out: no launch in the trace names their process (pid 0)": 1,
        "range paths cut to their outermost 32 levels": 1,
    }
    assert len(summary["warnings"]) == 1 and "device 1 has no --gpu-uuid" in summary["warnings"][0]
    assert "n1/1" in summary["warnings"][0]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ((), "needs --node-id"),
        (("--node-id", "n", "--gpu-uuid", "GPU-x"), "is not KEY=VALUE"),
        (("--node-id", "n", "--gpu-uuid", "a=GPU-x"), "the device is the trace's index"),
        (("--node-id", "n", "--gpu-uuid", "0=GPU-x", "--gpu-uuid", "0=GPU-y"), "two UUIDs"),
        (("--node-id", "n", "--pid", "1=-4"), "a process id is a whole number"),
        (("--node-id", "n", "--pid", "1=2", "--pid", "1=3"), "two host ids"),
    ],
)
def test_flags_that_say_nothing_sensible_are_refused_with_what_to_give(tmp_path, args, said):
    trace = _trace(tmp_path, [])
    _, _, proc = convert(tmp_path, str(trace), *args, check=False)
    assert proc.returncode == 2 and said in proc.stderr and "Traceback" not in proc.stderr


def test_a_file_that_is_no_trace_leaves_the_output_as_it_was(tmp_path):
    good = _trace(tmp_path, [_span("cuda_runtime", "cudaLaunchKernel", 50, 1, correlation=1), _gpu(1, 60)])
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [')
    out = tmp_path / "kernels.jsonl"
    out.write_text("before\n")
    proc = gpucost("trace-events", str(good), str(bad), "--node-id", "n", "--out", str(out), check=False)
    assert proc.returncode == 2 and "bad.json: cannot be read" in proc.stderr and "Traceback" not in proc.stderr
    assert out.read_text() == "before\n" and sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["t.json", "bad.json", "kernels.jsonl"]
    )


PANE_NS = 60 * 10**9


def _fleet(first_pane_ns: int, panes: int, pid: int) -> list:
    """A price, pid ``pid`` bound to team ml and pid 5 to team web on node n1, and GPU-T's and both processes'
    samples every 10 s over ``panes`` panes (ml at 60 % of the SMs, web at 20 %)."""
    out: list = [
        Price(gpu_model="H100", ts_ns=first_pane_ns - 3600 * 10**9, usd_per_gpu_hour=Decimal("3.6")),
        *(
            TenantBinding(node_id="n1", pid=p, ts_ns=first_pane_ns, team=t, env="e", app="a", tier="t", sla="Gold")
            for p, t in ((pid, "ml"), (5, "web"))
        ),
    ]
    for i in range(1, panes * 6 + 1):
        at = first_pane_ns + i * 10 * 10**9
        common = {"node_id": "n1", "gpu_uuid": "GPU-T", "ts_ns": at, "interval_s": 10.0, "mem_bw_util_pct": 5.0}
        out.append(
            GpuSample(
                **common,
                gpu_model="H100",
                sm_util_pct=80.0,
                mem_used_bytes=1,
                mem_total_bytes=2,
                power_w=300.0,
                temp_c=50.0,
            )
        )
        for p, sm in ((pid, 60.0), (5, 20.0)):
            out.append(ProcessSample(**common, pid=p, sm_util_pct=sm, mem_used_bytes=1))
    return out


def _as_revised(out: Path) -> tuple[dict, dict]:
    """Each (pane, team, path) of range_cost summed over revisions (µ$, latest busy ns and calls), and each (pane,
    team)'s kernel µ$ but no_kernel's, read from the Parquet files."""
    con = duckdb.connect()
    paths = {
        (pane, team, tuple(json.loads(path))): (usd, busy, calls)
        for pane, team, path, usd, busy, calls in con.execute(
            f"""SELECT pane_start_ns, team, range_path, sum(cost_micro_usd),
                       arg_max(busy_ns, revision), arg_max(calls, revision)
                FROM read_parquet('{out}/range_cost/**/*.parquet') GROUP BY ALL"""
        ).fetchall()
        if (usd, busy, calls) != (0, 0, 0)
    }
    kernel_usd = dict(
        ((pane, team), usd)
        for pane, team, usd in con.execute(
            f"""SELECT pane_start_ns, team, sum(cost_micro_usd) FROM read_parquet('{out}/kernel_cost/**/*.parquet')
                WHERE kernel <> 'no_kernel' GROUP BY ALL"""
        ).fetchall()
    )
    return paths, kernel_usd


def test_a_converted_trace_bills_its_ranges_in_a_replay_whichever_file_comes_first(tmp_path):
    trace = next(p for p in KINETO if p.name == "nccl_data.json.gz")
    pid = trace_pid(trace)
    kernels = tmp_path / "kernels.jsonl"
    gpucost(
        "trace-events",
        str(trace),
        "--node-id",
        "n1",
        "--gpu-uuid",
        "0=GPU-T",
        "--pid",
        f"{pid}=4242",
        "--out",
        str(kernels),
    )
    expected = kineto(trace, "n1", {0: "GPU-T"}, {pid: 4242}, CATS["ranges"])
    first = min(start for _, start, _ in expected) // PANE_NS * PANE_NS
    samples = tmp_path / "samples.jsonl"
    samples.write_text("".join(encode_event(e) + "\n" for e in _fleet(first - PANE_NS, 3, 4242)))
    runs = {}
    for order in ("kernels-first", "samples-first"):
        files = (kernels, samples) if order == "kernels-first" else (samples, kernels)
        gpucost("replay", *map(str, files), "--out", str(tmp_path / order))  # the default configuration
        runs[order] = _as_revised(tmp_path / order)
    assert runs["kernels-first"] == runs["samples-first"]  # the late file revises to what a run in order gives
    paths, kernel_usd = runs["kernels-first"]
    # the exact shares from the raw trace: each pane's computing kernels, each slice shared equally among them
    computing = [(start, v) for (_, start, _), v in expected.items() if v["category"] in ("kernel", "communication")]
    panes = {start // PANE_NS * PANE_NS for start, _ in computing}
    assert panes and {p for p, _, _ in paths} == panes
    for pane in panes:
        lo, hi = pane, pane + PANE_NS
        ks = [(s, v) for s, v in computing if s < hi and (v["end_ns"] > lo or s >= lo)]
        busy, share = shares([(max(s, lo), min(v["end_ns"], hi)) for s, v in ks])
        weight: dict[tuple[str, ...], Fraction] = defaultdict(Fraction)
        calls: dict[tuple[str, ...], int] = defaultdict(int)
        for (s, v), w in zip(ks, share):
            path = tuple(v["range_path"] or ())
            for depth in range(1, len(path) + 1):
                weight[path[:depth]] += w
                calls[path[:depth]] += s >= lo
        got = {path: v for (p, team, path), v in paths.items() if p == pane}
        assert {team for p, team, _ in paths if p == pane} == {"ml"}
        assert got.keys() == weight.keys()
        root = kernel_usd[(pane, "ml")]
        assert root > 0
        for path, (usd, busy_ns, n) in got.items():
            assert n == calls[path]
            assert abs(usd - root * weight[path] / busy) < len(path)  # within 1 µ$ a level of its exact share
            assert abs(busy_ns - weight[path]) < len(path)


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
    assert bad.returncode == 2 and "GPUCOST_TRACE_PATHS 'all'" in bad.stderr
