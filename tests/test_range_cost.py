"""Range cost in the pipeline (docs/definitions.md, "Range cost in the pipeline"): each tenant's kernel µ$ of a pane
dealt down the tree of the range paths its kernels were launched in, checked against a brute force over time slices
in exact fractions, through revisions, snapshots and both paths."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpucost.schemas.codec import Rejected, decode_line, encode_event
from gpucost.schemas.events import Event
from gpucost.schemas.kernels import MAX_RANGE_DEPTH, NAME_MAX_CHARS, KernelActivity
from gpucost.schemas.records import KernelCostRecord, Output, RangeCostRecord
from gpucost.sinks.parquet import ParquetSink
from gpucost.sinks.views import connect
from gpucost.streams.audit import Auditor
from gpucost.streams.kernel_cost import MAX_TENANT_PATHS
from gpucost.streams.kernel_log import Kernel, KernelLog
from gpucost.streams.settings import AuditSettings
from tests.strategies import BASE_NS
from tests.support.cli import gpucost
from tests.support.kernel_fleet import PANE, binding, brute, feed, fleet, kernel

AUDIT = AuditSettings(pane_s=60)
PATHS = (None, ("step",), ("step", "fwd"), ("step", "fwd", "attn"), ("step", "bwd"), ("load",))
NAMES = ("gemm", "nccl_all_reduce", "Memcpy HtoD", "relu")


def ranges(out: list[Output]) -> dict[tuple[int, str, str], tuple[int, int, int]]:
    """Each (pane, team, path) summed over revisions: µ$, then the latest busy ns and calls; emptied ones left out."""
    money: dict[tuple[int, str, str], int] = defaultdict(int)
    latest: dict[tuple[int, str, str], RangeCostRecord] = {}
    for r in out:
        if isinstance(r, RangeCostRecord):
            key = ((r.pane_start_ns - BASE_NS) // PANE, r.team, r.range_path)
            money[key] += r.cost_micro_usd
            if key not in latest or latest[key].revision < r.revision:
                latest[key] = r
    got = {k: (money[k], latest[k].busy_ns, latest[k].calls) for k in money}
    return {k: v for k, v in got.items() if v != (0, 0, 0)}


kernels_st = st.lists(
    st.tuples(
        st.integers(0, 130),  # start, s into the fleet (pane 0 from 0 s, pane 1 from 60 s; its bindings from 0 s)
        st.integers(0, 40),  # length, s
        st.sampled_from(NAMES),
        st.sampled_from(PATHS),
        st.sampled_from((1, 2)),  # pid: 1 is team a's, 2 team b's
        st.integers(0, 2),  # stream
    ),
    min_size=1,
    max_size=10,
)


def two_team_fleet(panes: int) -> list[Event]:
    events = fleet(panes)
    events.insert(2, binding(2, 0, "b"))
    for i in range(panes):  # pid 2 samples too, after pid 1's of each pane
        pid1 = next(e for e in events if e.kind == "process_sample" and e.ts_ns == BASE_NS + i * PANE + 1)
        events.insert(events.index(pid1) + 1, pid1.model_copy(update={"pid": 2, "sm_util_pct": 50.0}))
    return events


@settings(max_examples=60, deadline=None)
@given(kernels_st)
def test_each_path_is_its_exact_share_of_the_tenant_s_kernel_cost_within_a_micro_dollar_a_level(spec) -> None:
    ks = [
        kernel(s, s + n, name, pid=pid, stream=stream, corr=i, path=path)
        for i, (s, n, name, path, pid, stream) in enumerate(spec)
    ]
    events = two_team_fleet(4)
    auditor = Auditor(AUDIT)
    out = feed(auditor, events[:3] + ks + events[3:], False) + auditor.finish()
    assert all(r.revision == 0 for r in out if isinstance(r, RangeCostRecord))  # nothing late here
    lines = [r for r in out if isinstance(r, KernelCostRecord)]
    published = defaultdict(dict)
    for r in out:
        if isinstance(r, RangeCostRecord):
            published[(r.pane_start_ns, r.team)][tuple(json.loads(r.range_path))] = r
    for pane in range(4):
        lo, hi = BASE_NS + pane * PANE, BASE_NS + (pane + 1) * PANE
        for pid, team in ((1, "a"), (2, "b")):
            mine = [
                k
                for k in ks
                if k.pid == pid and k.category != "memcpy" and k.start_ns < hi and (k.end_ns > lo or k.start_ns >= lo)
            ]
            got = published.get((lo, team), {})
            if not any(k.range_path for k in mine):
                assert not got
                continue
            root = sum(
                r.cost_micro_usd for r in lines if (r.pane_start_ns, r.team) == (lo, team) and r.kernel != "no_kernel"
            )
            busy, share = brute(mine, lo, hi)
            # every prefix of every path (a kernel of no length too: its calls), and nothing else
            assert set(got) == {(k.range_path or ())[:d] for k in mine for d in range(1, len(k.range_path or ()) + 1)}
            for path, r in got.items():
                assert r.tenant_kernel_cost_micro_usd == root and r.depth == len(path) and r.range_name == path[-1]
                assert r.calls == sum(1 for k in mine if lo <= k.start_ns and (k.range_path or ())[: len(path)] == path)
                if busy:
                    assert abs(r.cost_micro_usd - root * share.get(path, 0) / busy) < len(path)
                    assert abs(r.busy_ns - share.get(path, 0)) < len(path)
                children = [
                    c for c in got.values() if c.depth == r.depth + 1 and tuple(json.loads(c.range_path))[:-1] == path
                ]
                assert sum(c.cost_micro_usd for c in children) <= r.cost_micro_usd
                assert sum(c.busy_ns for c in children) <= r.busy_ns
            assert sum(r.cost_micro_usd for p, r in got.items() if len(p) == 1) <= root


def trace(pane: int, pid: int = 1, first_corr: int = 0) -> list[Event]:
    """Kernels of every path and none in one pane, on two streams so that they overlap."""
    return [
        kernel(pane * 60 + i, pane * 60 + i + 1.5, NAMES[i % 4], pid=pid, stream=i % 2, corr=first_corr + i, path=p)
        for i, p in enumerate(PATHS * 4)
    ]


def in_time_order(events: list[Event]) -> list[Output]:
    auditor = Auditor(AUDIT)
    return feed(auditor, sorted(events, key=lambda e: (e.kind != "price", e.ts_ns)), False) + auditor.finish()


def test_a_late_binding_moves_the_paths_to_the_new_tenant_and_closes_the_old_one_s() -> None:
    events = fleet(6)
    events[4:4] = trace(0) + trace(1, first_corr=100)
    auditor = Auditor(AUDIT)
    first = feed(auditor, events, False)
    moved = feed(auditor, [binding(1, 30, "b")], False) + auditor.finish()
    revised = [r for r in moved if isinstance(r, RangeCostRecord)]
    assert revised and {r.revision for r in revised} == {1}
    assert ranges(first + moved) == ranges(in_time_order(events + [binding(1, 30, "b")]))
    closed = [r for r in revised if r.team == "a" and r.pane_start_ns == BASE_NS + PANE]
    assert closed and all((r.busy_ns, r.calls, r.tenant_kernel_cost_micro_usd) == (0, 0, 0) for r in closed)
    for r in revised:  # each revision's records say what the tenant's kernel lines hold now
        lines = [k for k in moved if isinstance(k, KernelCostRecord) and k.pane_start_ns == r.pane_start_ns]
        now = defaultdict(int)
        for k in first + lines:
            if isinstance(k, KernelCostRecord) and k.pane_start_ns == r.pane_start_ns and k.kernel != "no_kernel":
                now[k.tenant_key] += k.cost_micro_usd
        assert r.tenant_kernel_cost_micro_usd == now[r.tenant_key]


@pytest.mark.parametrize("batch", [False, True], ids=["rows", "batch"])
def test_late_kernels_with_paths_are_one_revision_and_bill_as_in_time_order(batch: bool) -> None:
    samples, late = fleet(8), trace(1) + trace(2, first_corr=100)
    auditor = Auditor(AUDIT)
    out = feed(auditor, samples, batch) + feed(auditor, late, batch) + auditor.finish()
    assert {r.revision for r in out if isinstance(r, RangeCostRecord)} == {1}
    assert ranges(out) == ranges(in_time_order(samples + late))


def test_both_paths_and_a_snapshot_publish_the_same_range_records() -> None:
    events = fleet(6)
    events[4:4] = trace(0) + trace(1, first_corr=100)
    events += trace(2, pid=1, first_corr=200) + [binding(1, 70, "c")]
    rows = Auditor(AUDIT)
    expected = feed(rows, events, False) + rows.finish()
    assert any(isinstance(r, RangeCostRecord) and r.revision for r in expected)
    batch = Auditor(AUDIT)
    assert [r.model_dump() for r in feed(batch, events, True) + batch.finish()] == [r.model_dump() for r in expected]
    first = Auditor(AUDIT)
    out = feed(first, events[:20], False)
    again = Auditor.from_state(first.to_state(), AUDIT)
    out += feed(again, events[20:], False) + again.finish()
    assert [r.model_dump() for r in out] == [r.model_dump() for r in expected]


def test_a_snapshot_of_the_version_before_paths_is_read_its_kernels_carrying_none() -> None:
    log = KernelLog(AUDIT)
    log.take(kernel(1, 2, path=("step",)))  # type: ignore[arg-type]
    state = log.to_state()
    (gpu,) = state.values()
    gpu["panes"] = [[p, [row[:9] for row in rows]] for p, rows in gpu["panes"]]  # version 3: nine items a kernel
    (k,) = KernelLog.from_state(state, AUDIT).kernels("GPU-0", BASE_NS)[0]
    assert k == Kernel(*state["GPU-0"]["panes"][0][1][0]) and k.path == -1


def line(**change: object) -> str:
    base = json.loads(encode_event(kernel(1, 2, path=("step", "fwd"))))
    return json.dumps(base | change)


@pytest.mark.parametrize(
    "path, why",
    [
        ([], "at least 1"),
        (["x"] * (MAX_RANGE_DEPTH + 1), f"at most {MAX_RANGE_DEPTH}"),
        (["x" * (NAME_MAX_CHARS + 1)], f"at most {NAME_MAX_CHARS}"),
        (["ok", ""], "at least 1"),
        ("step", "tuple"),
        ([1, 2], "string"),
        ({"a": 1}, "tuple"),
    ],
)
def test_a_range_path_out_of_bounds_is_refused_with_what_was_wrong(path: object, why: str) -> None:
    got = decode_line(line(range_path=path))
    assert isinstance(got, Rejected) and "range_path" in got.detail and why in got.detail, got


def test_a_range_path_travels_as_sent() -> None:
    got = decode_line(line(range_path=["step", "fwd", "a/b \u00e9"]))
    assert isinstance(got, KernelActivity) and got.range_path == ("step", "fwd", "a/b \u00e9")


def test_a_tenant_s_pane_publishes_its_costliest_paths_a_parent_before_its_children() -> None:
    ks = [
        kernel(1 + i * 0.2, 1.1 + i * 0.2 + 0.01 * (i % 9), "gemm", corr=i, path=("step", f"op{i}", "inner"))
        for i in range(200)
    ]
    events = fleet(3)
    auditor = Auditor(AUDIT)
    out = feed(auditor, events[:2] + ks + events[2:], False) + auditor.finish()
    got = {tuple(json.loads(r.range_path)): r for r in out if isinstance(r, RangeCostRecord)}
    assert len(got) == MAX_TENANT_PATHS < 1 + 2 * len(ks)
    assert all(path[:-1] in got for path in got if len(path) > 1)  # every parent of a path published is too
    busy, share = brute([k for k in ks if k.start_ns < BASE_NS + PANE], BASE_NS, BASE_NS + PANE)
    (root,) = {r.tenant_kernel_cost_micro_usd for r in got.values()}
    left_out = [root * share[p] / busy for p in share if p and p not in got]
    assert left_out and min(r.cost_micro_usd for r in got.values()) >= max(left_out) - 3


def test_a_path_s_text_is_freed_with_its_kernels_so_paths_named_by_step_keep_the_state_bounded() -> None:
    audit = AuditSettings(pane_s=60, revision_horizon_s=120)
    auditor, events, kept = Auditor(audit), fleet(40), []
    feed(auditor, events[:2], False)
    for p in range(40):
        step = [
            kernel(p * 60 + i, p * 60 + i + 0.5, corr=p * 100 + i, path=(f"ProfilerStep#{p}", "fwd")) for i in range(5)
        ]
        feed(auditor, events[2 + 2 * p : 4 + 2 * p] + step, False)
        (log,) = auditor.kernels.to_state().values()
        kept.append(sum(text is not None for text in log["paths"]))
        assert len(log["paths"]) <= 8  # codes are reused: the table is as long as the most paths kept at once
    assert max(kept[10:]) == max(kept[10:20]) <= 6  # the steps of the panes kept (the horizon's, the open ones)
    texts = {json.loads(text)[0] for text in log["paths"] if text is not None}
    assert "ProfilerStep#39" in texts and "ProfilerStep#3" not in texts


def test_the_spend_views_count_the_panes_where_a_team_has_any_not_those_a_revision_emptied(tmp_path: Path) -> None:
    events = fleet(6)
    events[4:4] = trace(1)
    auditor = Auditor(AUDIT)
    sink = ParquetSink(tmp_path)
    for r in feed(auditor, events, False) + feed(auditor, [binding(1, 60, "b")], False) + auditor.finish():
        sink.write(r)
    sink.flush()
    con = connect(tmp_path)
    for view, key in (("range_spend", "range_path"), ("kernel_spend", "kernel")):
        rows = con.execute(f"SELECT team, {key}, cost_micro_usd, calls, panes FROM {view} WHERE calls > 0").fetchall()
        assert rows and {team for team, *_ in rows} == {"b"} and {panes for *_, panes in rows} == {1}, rows
        emptied = con.execute(f"SELECT cost_micro_usd, calls, panes FROM {view} WHERE team = 'a'").fetchall()
        assert emptied and set(emptied) <= {(0, 0, 0)}, emptied  # team a's lines of pane 1 moved to b, pane 0 had none


def test_the_run_s_summary_lists_the_costliest_ranges_as_the_views_give_them(tmp_path: Path) -> None:
    events = fleet(5)
    events[4:4] = trace(1)
    (tmp_path / "in.jsonl").write_text("".join(encode_event(e) + "\n" for e in events))
    run = gpucost("replay", str(tmp_path / "in.jsonl"), "--out", str(tmp_path / "audit"), "--pane-s", "60")
    section = run.stdout.split("Costliest ranges over the run")[1].split("\n\n")[0].splitlines()[3:]
    rows = connect(tmp_path / "audit").execute("SELECT range_path, cost_micro_usd FROM range_spend").fetchall()
    assert len(section) == len(rows) == 5  # step, step > fwd, step > fwd > attn, step > bwd, load
    cells = [re.split(r"\s{2,}", line.strip()) for line in section]  # a range's " > " has single spaces
    listed = {cell[1]: int(cell[4]) for cell in cells}
    assert listed == {" > ".join(json.loads(path)): usd for path, usd in rows}
    assert [int(cell[4]) for cell in cells] == sorted(listed.values(), reverse=True)
    assert "Costliest kernels over the run" in run.stdout


def test_a_log_restored_from_a_snapshot_hands_out_the_same_path_codes_as_the_live_one() -> None:
    """Codes freed out of order (pane 0's path took code 1, pane 1's code 0): the live log and one restored from its
    snapshot must hand out the same code next, or their states part though their records agree."""
    live = KernelLog(AuditSettings(pane_s=60, revision_horizon_s=0))
    live.take(kernel(61, 62, corr=1, path=("b",)))  # type: ignore[arg-type]
    live.take(kernel(1, 2, corr=2, path=("a",)))  # type: ignore[arg-type]
    live.prune("GPU-0", BASE_NS + 2 * PANE)  # pane 0 goes: code 1 is free
    live.prune("GPU-0", BASE_NS + 3 * PANE)  # then pane 1: code 0
    restored = KernelLog.from_state(json.loads(json.dumps(live.to_state())), AUDIT)
    for log in (live, restored):
        log.take(kernel(200, 201, corr=3, path=("c",)))  # type: ignore[arg-type]
    assert restored.to_state() == live.to_state()
