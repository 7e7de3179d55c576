"""``gpucost trace-events``: profiler traces' kernels as ``kernel_activity`` events with their range paths, checked
against the raw files read with the standard library (``tests/support/trace_oracle.py``), then billed by a replay in
the default configuration and checked against exact shares worked out from the raw trace."""

from __future__ import annotations

import json
import sqlite3
from collections import defaultdict
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import duckdb
import pytest

from gpucost.schemas.codec import encode_event
from gpucost.schemas.events import GpuSample, Price, ProcessSample, TenantBinding
from tests.support.cli import gpucost
from tests.support.kernel_money import KINETO, shares
from tests.support.trace_oracle import kineto, nsys
from tests.support.trace_runs import CATS, NSYS, convert, gpu_event, same, span, trace_pid, write_trace


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


def test_what_cannot_be_written_as_it_is_is_counted_and_said(tmp_path):
    deep = [span("user_annotation", f"level{i:02}", i, 1000 - 2 * i) for i in range(40)]
    long_name = span("user_annotation", "x" * 2000, 2000, 10)
    trace = write_trace(
        tmp_path,
        [
            *deep,
            long_name,
            span("cuda_runtime", "cudaLaunchKernel", 50, 1, correlation=1),
            span("cuda_runtime", "cudaLaunchKernel", 2005, 1, correlation=2),
            gpu_event(1, 60),
            gpu_event(2, 2010, device=1),
            gpu_event(3, 120),  # its launch is not in the trace: no process is known
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


def test_an_nsys_export_of_two_processes_ties_each_kernel_to_its_own_process_s_launch(tmp_path):
    """An MPI job's ranks in one export: each process numbers its correlation ids from 1, so the same ids name
    launches of both. The second rank here is the first's copy, 1 ms later, on device 1, inside a range of its own."""
    export = tmp_path / "two.sqlite"
    export.write_bytes(NSYS.read_bytes())
    con = sqlite3.connect(export)
    shift, other = 1_000_000, 1 << 24  # 1 ms; the next pid in a global id's bits 24..47
    for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY"):
        con.execute(f"CREATE TEMP TABLE c AS SELECT * FROM {table}")
        con.execute(f"UPDATE c SET start = start + {shift}, end = end + {shift}, globalPid = globalPid + {other}")
        con.execute("UPDATE c SET deviceId = 1")
        con.execute(f"INSERT INTO {table} SELECT * FROM c")
        con.execute("DROP TABLE c")
    con.execute("CREATE TEMP TABLE c AS SELECT * FROM CUPTI_ACTIVITY_KIND_RUNTIME")
    con.execute(f"UPDATE c SET start = start + {shift}, end = end + {shift}, globalTid = globalTid + {other}")
    con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME SELECT * FROM c")
    ((lo, hi, gtid),) = con.execute("SELECT min(start), max(end), min(globalTid) FROM c").fetchall()
    con.execute(
        "INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid) VALUES (?, ?, 59, 'rank1', ?)",
        (lo - 1, hi + 1, gtid),
    )
    con.commit()
    con.close()
    events, _, _ = convert(tmp_path, str(export), "--node-id", "n2", "--gpu-uuid", "0=GPU-N0", "--gpu-uuid", "1=GPU-N1")
    same(events, nsys(export, "n2", {0: "GPU-N0", 1: "GPU-N1"}))
    second = [e for e in events.values() if e.device == 1]
    assert second and all(e.launch_ns is not None and e.launch_ns <= e.start_ns for e in second)
    assert all(e.range_path and e.range_path[0] == "rank1" for e in second if e.category == "kernel")
    assert not any(e.range_path and "rank1" in e.range_path for e in events.values() if e.device == 0)


def test_a_correlation_id_launched_by_two_processes_is_noted(tmp_path):
    trace = write_trace(
        tmp_path,
        [
            span("cuda_runtime", "cudaLaunchKernel", 50, 1, correlation=1),
            span("cuda_runtime", "cudaLaunchKernel", 55, 1, correlation=1) | {"pid": 8},
            gpu_event(1, 60),
        ],
    )
    events, summary, _ = convert(tmp_path, str(trace), "--node-id", "n")
    assert [e.pid for e in events.values()] == [8]  # the last launch's, as the reader ties it
    assert summary["rejected"] == {
        "t.json: cuda_runtime: correlation ids launched more than once (a kernel takes the last launch)": 1,
        "t.json: cuda_runtime: correlation ids launched by more than one process (a kernel takes the last's)": 1,
    }
