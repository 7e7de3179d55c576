"""Late data become revisions: the bill they adjust, against a replay of the same events in time order.

The independent recomputation: the events that are not beyond the horizon, sorted by event time (bindings
and prices first at a tie), go through an auditor where nothing is late; for every (GPU, pane, party) the sum
of ``cost_micro_usd`` over the revisions of the delayed run must equal that replay's record. Which events are
beyond the horizon is decided here too, from the horizon's definition alone (a watermark per GPU over the
events taken so far), and must be exactly the ``late`` dead letters.
"""

from __future__ import annotations

import json
from collections import defaultdict
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpucost.schemas.codec import encode_event
from gpucost.schemas.events import Event, GpuSample, NumaEvent, Price, ProcessSample, TenantBinding
from gpucost.schemas.kernels import KernelActivity
from gpucost.schemas.records import CostRecord, DeadLetter, IdleIndexRecord, KernelCostRecord, Output
from gpucost.streams import columnar, idle_index
from gpucost.streams.audit import Auditor
from gpucost.streams.settings import AuditSettings
from tests.strategies import BASE_NS, NS
from tests.support.bills import bills, run

PANE_S = 60
MANY_REVISING = columnar.MANY_REVISING
TEAMS = ("search", "ads", "vision")


@st.composite
def fleets(draw: st.DrawFn) -> tuple[AuditSettings, list[Event], list[Event]]:
    """Settings, the events in time order, and the same events in a delayed arrival order: one sampler per
    device (no duplicates or overlaps, whose verdict depends on arrival order), bindings that reach the node
    up to the horizon after their time, samples up to the horizon and beyond it."""
    horizon_s = draw(st.sampled_from([600, 1800]))
    s = AuditSettings(
        pane_s=PANE_S,
        lateness_s=draw(st.sampled_from([0, 120])),
        max_jump_s=86_400,
        window_h=1,
        revision_horizon_s=horizon_s,
        alpha=Decimal("0.6"),
        beta=Decimal("0.3"),
        gamma=Decimal("0.1"),
    )
    span_s = draw(st.integers(5, 100)) * 60  # past the 1 h window: panes leave it while revisions reach them
    gpus = [f"GPU-{i}" for i in range(draw(st.integers(1, 2)))]
    pids = [1, 2, 3]
    events: list[Event] = [Price(gpu_model="H100", ts_ns=BASE_NS - 3600 * NS, usd_per_gpu_hour=Decimal("2.5"))]
    for pid in pids:
        # at the process's start, or later (a tenant change), mid-pane; two at one instant would be a duplicate
        for at_s in draw(st.lists(st.integers(0, span_s), unique=True, max_size=2)):
            events.append(
                TenantBinding(
                    node_id="node-0",
                    pid=pid,
                    ts_ns=BASE_NS + at_s * NS,
                    team=draw(st.sampled_from(TEAMS)),
                    env="prod",
                    app="app",
                    tier="online",
                    sla="Gold",
                )
            )
    pct = st.integers(0, 100).map(float)
    for gpu in gpus:
        step = draw(st.sampled_from([10, 15]))
        offset = draw(st.integers(0, step - 1))
        on = [t for t in range(offset, span_s, step) if draw(st.integers(0, 9))]  # a gap now and then
        for t in on:
            events.append(
                GpuSample(
                    node_id="node-0",
                    gpu_uuid=gpu,
                    gpu_model="H100",
                    ts_ns=BASE_NS + t * NS,
                    interval_s=float(step),
                    sm_util_pct=draw(pct),
                    mem_bw_util_pct=draw(pct),
                    mem_used_bytes=1,
                    mem_total_bytes=2,
                    power_w=100.0,
                    temp_c=40.0,
                )
            )
        for pid in draw(st.lists(st.sampled_from(pids), unique=True, max_size=3)):
            for t in on:
                if draw(st.integers(0, 3)):
                    events.append(
                        ProcessSample(
                            node_id="node-0",
                            gpu_uuid=gpu,
                            pid=pid,
                            ts_ns=BASE_NS + t * NS + pid,
                            interval_s=float(step),
                            sm_util_pct=draw(pct),
                            mem_bw_util_pct=draw(pct),
                            mem_used_bytes=1,
                        )
                    )
                if not draw(st.integers(0, 5)):
                    events.append(
                        NumaEvent(
                            node_id="node-0",
                            gpu_uuid=gpu,
                            pid=pid,
                            ts_ns=BASE_NS + t * NS + 7,
                            hops=draw(st.integers(0, 3)),
                            latency_weight=draw(st.integers(0, 40)),
                        )
                    )
        # kernels of its processes, some overlapping, some crossing a pane's end, each launch once (no duplicates)
        for n, t in enumerate(draw(st.lists(st.sampled_from(on), max_size=12)) if on else []):
            start = BASE_NS + t * NS + draw(st.integers(0, step * NS))
            events.append(
                KernelActivity(
                    node_id="node-0",
                    pid=draw(st.sampled_from(pids)),
                    name=draw(st.sampled_from(["gemm", "nccl:all_reduce", "softmax"])),
                    start_ns=start,
                    end_ns=start + draw(st.sampled_from([0, 10**6, 7 * NS, 90 * NS])),
                    gpu_uuid=gpu,
                    device=0,
                    stream=n % 2,
                    correlation_id=n,
                    category="kernel",
                )
            )
    in_time = sorted(events, key=_time_order)

    def delay(e: Event) -> int:
        if isinstance(e, Price):
            return -(10**12) * NS  # prices first: they do not revise
        if isinstance(e, TenantBinding):
            return draw(st.one_of(st.just(0), st.integers(0, horizon_s))) * NS  # never beyond the horizon
        return draw(st.one_of(st.just(0), st.just(0), st.integers(1, 200), st.integers(0, horizon_s + 1200))) * NS

    delays = [delay(e) for e in events]
    arrival = [
        e
        for _, _, e in sorted(
            ((e.ts_ns + d, i, e) for i, (e, d) in enumerate(zip(events, delays))), key=lambda t: t[:2]
        )
    ]
    return s, in_time, arrival


def _time_order(e: Event) -> tuple[int, int]:
    return e.ts_ns, 0 if isinstance(e, (Price, TenantBinding)) else 1


def beyond_horizon(s: AuditSettings, arrival: list[Event]) -> set[str]:
    """The events (as JSON) that arrive for a pane ended more than the horizon before their GPU's watermark:
    the largest time of that GPU's events taken so far, less the lateness (no jumps at these settings)."""
    top: dict[str, int] = {}
    out = set()
    for e in arrival:
        if not isinstance(e, (GpuSample, ProcessSample, NumaEvent, KernelActivity)):
            continue
        end = e.ts_ns - e.ts_ns % s.pane_ns + s.pane_ns  # a kernel's ts_ns: its start
        if e.gpu_uuid in top and top[e.gpu_uuid] - s.lateness_ns - end > s.revision_horizon_ns:
            out.add(encode_event(e))
            continue
        if not isinstance(e, KernelActivity):  # a kernel moves no watermark
            top[e.gpu_uuid] = max(top.get(e.gpu_uuid, e.ts_ns), e.ts_ns)
    return out


def kernel_bills(out: list[Output]) -> dict[tuple[str, int, str, str, str], int]:
    """Each kernel line's µ$ summed over its revisions."""
    total: dict[tuple[str, int, str, str, str], int] = defaultdict(int)
    for r in out:
        if isinstance(r, KernelCostRecord):
            total[(r.gpu_uuid, r.pane_start_ns, r.tenant_key, r.category, r.kernel)] += r.cost_micro_usd
    return dict(total)


def latest_lines(out: list[Output]) -> dict[tuple[str, int, str, str, str], KernelCostRecord]:
    """Each kernel line's record of its latest revision (each revision published once)."""
    latest: dict[tuple[str, int, str, str, str], KernelCostRecord] = {}
    for r in out:
        if isinstance(r, KernelCostRecord):
            key = (r.gpu_uuid, r.pane_start_ns, r.tenant_key, r.category, r.kernel)
            assert key not in latest or latest[key].revision < r.revision, "a line's revision published twice"
            latest[key] = r
    return latest


def run_batches(s: AuditSettings, events: list[Event], size: int) -> list[Output]:
    from gpucost.schemas.blocks import expand

    auditor = Auditor(s)
    lines = [encode_event(e).encode() for e in events]
    out: list[Output] = []
    for lo in range(0, len(lines), size):
        out += expand(auditor.ingest_lines(lines[lo : lo + size], lambda i, lo=lo: f"line {lo + i}"))
    return out + auditor.finish()


@pytest.mark.slow
@given(fleets())
def test_revisions_sum_to_a_replay_in_time_order(fleet: tuple[AuditSettings, list[Event], list[Event]]) -> None:
    s, in_time, arrival = fleet
    out = run(s, arrival)
    beyond = beyond_horizon(s, arrival)
    assert {r.raw for r in out if isinstance(r, DeadLetter)} == beyond  # late beyond R, and nothing else refused
    replay = run(s, [e for e in in_time if encode_event(e) not in beyond])
    assert not [r for r in replay if isinstance(r, DeadLetter)]
    want, got = bills(replay), bills(out)
    for key in want.keys() | got.keys():  # a party a late binding emptied sums to 0 and has no record in the replay
        assert got.get(key, 0) == want.get(key, 0), key

    # the latest revision of every record equals the replay's, and every revision keeps Σ parties = C
    latest: dict[tuple[str, int, str], CostRecord] = {}
    by_revision: dict[tuple[str, int, int], list[CostRecord]] = defaultdict(list)
    for r in out:
        if isinstance(r, CostRecord):
            key = (r.gpu_uuid, r.pane_start_ns, r.tenant_key)
            assert key not in latest or latest[key].revision < r.revision, "a revision published twice"
            latest[key] = r
            by_revision[(r.gpu_uuid, r.pane_start_ns, r.revision)].append(r)
    assert len({r.record_id for r in out if isinstance(r, CostRecord)}) == sum(map(len, by_revision.values()))
    for r in replay:
        if isinstance(r, CostRecord):
            mine = latest[(r.gpu_uuid, r.pane_start_ns, r.tenant_key)]
            assert mine.model_dump(exclude={"record_id", "revision", "cost_micro_usd"}) == r.model_dump(
                exclude={"record_id", "revision", "cost_micro_usd"}
            )
    cost_before: dict[tuple[str, int], int] = {}
    for (gpu, start, revision), records in sorted(by_revision.items()):
        assert len({r.pane_cost_micro_usd for r in records}) == 1
        c = records[0].pane_cost_micro_usd
        assert sum(r.cost_micro_usd for r in records) == c - cost_before.get((gpu, start), 0), (gpu, start, revision)
        cost_before[(gpu, start)] = c

    # the kernel lines: Σ over revisions of each line is the replay's, whose lines of a tenant sum to its cost; and
    # the latest revision of each line the replay's line
    lines, kernels_latest = kernel_bills(out), latest_lines(out)
    want_lines = kernel_bills(replay)
    for key in lines.keys() | want_lines.keys():  # a line a late binding emptied sums to 0 and is not in the replay
        assert lines.get(key, 0) == want_lines.get(key, 0), key
    tenant_total: dict[tuple[str, int, str], int] = defaultdict(int)
    for r in replay:
        if isinstance(r, KernelCostRecord):
            tenant_total[(r.gpu_uuid, r.pane_start_ns, r.tenant_key)] += r.cost_micro_usd
            assert r.tenant_cost_micro_usd == want.get((r.gpu_uuid, r.pane_start_ns, r.tenant_key), 0)
            assert kernels_latest[(r.gpu_uuid, r.pane_start_ns, r.tenant_key, r.category, r.kernel)].model_dump(
                exclude={"record_id", "revision", "cost_micro_usd"}
            ) == r.model_dump(exclude={"record_id", "revision", "cost_micro_usd"})
    for (gpu, start, tenant), total in tenant_total.items():
        assert total == want.get((gpu, start, tenant), 0)

    # the idle index: each pane's last figures are the replay's, and every record's window sums the figures of
    # its GPU's panes as published up to it (a revised pane's new figures count from its revision on)
    idle_last = {
        (r.gpu_uuid, r.pane_start_ns): (r.idle_ms, r.covered_ms) for r in out if isinstance(r, IdleIndexRecord)
    }
    assert idle_last == {
        (r.gpu_uuid, r.pane_start_ns): (r.idle_ms, r.covered_ms) for r in replay if isinstance(r, IdleIndexRecord)
    }
    known: dict[str, dict[int, tuple[int, int]]] = defaultdict(dict)
    for r in out:
        if isinstance(r, IdleIndexRecord):
            known[r.gpu_uuid][r.pane_start_ns] = (r.idle_ms, r.covered_ms)
            window = [
                v for start, v in known[r.gpu_uuid].items() if r.pane_start_ns - s.window_ns < start <= r.pane_start_ns
            ]
            assert (r.idle_ms_72h, r.covered_ms_72h) == (sum(i for i, _ in window), sum(c for _, c in window))


@pytest.mark.slow
@pytest.mark.parametrize("many", [columnar.MANY_REVISING, 10**9], ids=["as-shipped", "always-cut"])
@given(fleet=fleets(), size=st.sampled_from([128, 500, 4096]))
def test_the_batch_path_revises_as_the_row_path(
    fleet: tuple[AuditSettings, list[Event], list[Event]], size: int, many: int
) -> None:
    """The batch path cuts its batches at the rows that may revise (``columnar.revising_rows``), or goes row by
    row past ``MANY_REVISING`` of them at fewer than ``ROWS_PER_CUT`` rows each; "always-cut" holds the cuts
    themselves to the row path."""
    s, _, arrival = fleet
    columnar.MANY_REVISING = many
    want = [r.model_dump_json() for r in run(s, arrival) if not isinstance(r, DeadLetter)]
    try:
        assert [r.model_dump_json() for r in run_batches(s, arrival, size) if not isinstance(r, DeadLetter)] == want
    finally:
        columnar.MANY_REVISING = MANY_REVISING


def test_the_horizon_reaches_a_pane_that_ended_exactly_r_before_the_watermark() -> None:
    """docs/definitions.md, "Late data become revisions": a closed pane whose end is within R of the watermark is
    revised; one further back is late."""
    s = AuditSettings(lateness_s=0, revision_horizon_s=600, max_jump_s=86_400)
    auditor = Auditor(s)
    auditor.update(Price(gpu_model="H100", ts_ns=BASE_NS, usd_per_gpu_hour=Decimal("3")))

    def sample(t_s: int) -> GpuSample:
        return GpuSample(
            node_id="n",
            gpu_uuid="g",
            gpu_model="H100",
            ts_ns=BASE_NS + t_s * NS,
            interval_s=1.0,
            sm_util_pct=50.0,
            mem_bw_util_pct=0.0,
            mem_used_bytes=0,
            mem_total_bytes=1,
            power_w=1.0,
            temp_c=1.0,
        )

    for t in (0, 60, 660):  # the watermark now stands at BASE + 660 s: pane [0, 60) ended 600 s before it
        auditor.update(sample(t))
    revised = auditor.update(sample(30))
    assert [type(r).__name__ for r in revised] == ["IdleIndexRecord", "CostRecord"]  # idle alone: no process
    assert {r.revision for r in revised} == {1}  # type: ignore[union-attr]
    auditor.update(sample(661))  # and now 601 s: that pane is beyond the horizon
    assert [r.reason for r in auditor.update(sample(31)) if isinstance(r, DeadLetter)] == ["late"]


@pytest.mark.slow
@given(fleets(), st.data())
def test_a_late_event_sent_again_revises_once(
    fleet: tuple[AuditSettings, list[Event], list[Event]], data: st.DataObject
) -> None:
    s, _, arrival = fleet
    samples = [e for e in arrival if isinstance(e, (GpuSample, ProcessSample, NumaEvent, KernelActivity))]
    if not samples:
        return
    withheld = data.draw(st.sampled_from(samples))
    auditor = Auditor(s)
    for e in arrival:
        if e is not withheld:
            auditor.update(e)
    first = auditor.update(withheld)
    if letters := [r for r in first if isinstance(r, DeadLetter)]:  # beyond the horizon
        assert [r.reason for r in letters] == ["late"]
        # before a sample, its GPU's panes that late kernels left pending are republished (their kernel lines)
        assert all(isinstance(r, KernelCostRecord) for r in first if not isinstance(r, DeadLetter))
        return
    resumed = Auditor.from_state(json.loads(json.dumps(auditor.to_state())), s)  # a restart, between the two
    for again in (auditor, resumed):
        out = again.update(withheld)
        assert [r.reason for r in out if isinstance(r, DeadLetter)] == ["duplicate"] and len(out) == 1


@pytest.mark.parametrize("sparse", [idle_index.SPARSE_PANES, 2], ids=["as-shipped", "rings"])
@given(
    n=st.integers(1, 12),
    keep=st.integers(0, 12),
    steps=st.lists(
        st.tuples(st.integers(0, 4), st.integers(0, 20), st.integers(0, 3), st.integers(0, 30), st.integers(1, 30)),
        max_size=60,
    ),
)
def test_a_window_knows_the_sums_ending_at_any_pane_a_revision_reaches(
    n: int, keep: int, steps: list[tuple[int, int, int, int, int]], sparse: int
) -> None:
    """``IdleWindow`` against a plain dict of every pane's figures: after each new pane or revision, the window's
    sums, and those ending at every pane within ``keep`` of the newest (in lists and in rings)."""
    saved, idle_index.SPARSE_PANES = idle_index.SPARSE_PANES, sparse
    try:
        window, known, last = idle_index.IdleWindow(n, keep), {}, None  # type: ignore[var-annotated]
        for kind, value, back, idle, extra in steps:
            if kind or last is None:  # a new pane, after a gap of 0 to 3
                last = (last or 0) + 1 + kind % 4
                known[last] = (idle, idle + extra)
                window.roll(last, *known[last])
            else:  # a revision of a pane at most ``keep`` back (one that never had a figure, too)
                k = last - min(back, keep)
                known[k] = (value, value + extra)
                assert window.revise(k, *known[k]) == _brute(known, k, n)
            assert (window.idle_sum, window.covered_sum) == _brute(known, last, n)
            for k in range(last - keep, last + 1):
                assert window.sums_ending(k) == _brute(known, k, n), k
    finally:
        idle_index.SPARSE_PANES = saved


def _brute(known: dict[int, tuple[int, int]], k: int, n: int) -> tuple[int, int]:
    inside = [v for j, v in known.items() if k - n < j <= k]
    return sum(i for i, _ in inside), sum(c for _, c in inside)
