"""``streams.revisions`` on its own: a pane recomputed from its logged rows and the bindings in force, what a
re-sent event meets, what the horizon forgets, and the difference records of a recomputation
(docs/definitions.md, "Late data become revisions"), against sums written here."""

from __future__ import annotations

import random
from decimal import Decimal

from hypothesis import given
from hypothesis import strategies as st

from gpucost.schemas.events import GpuSample, NumaEvent, ProcessSample, TenantBinding
from gpucost.schemas.records import IDLE_TENANT
from gpucost.streams.apportion import Weights, apportion
from gpucost.streams.differences import differences
from gpucost.streams.revisions import Revisions
from gpucost.streams.settings import AuditSettings
from gpucost.streams.tables import UNATTRIBUTED, BindingTable
from tests.strategies import BASE_NS as T0
from tests.support.panes import pane_of

NS = 1_000_000_000
PANE_NS = 60 * NS
SETTINGS = AuditSettings(pane_s=60, revision_horizon_s=600)
GPU, NODE = "GPU-0", "node-0"

ts = st.integers(T0, T0 + PANE_NS - 1)  # one pane, starting at T0
pct = st.sampled_from([0.0, 4.99, 5.0, 37.5, 100.0])
interval = st.sampled_from([0.5, 1.0, 10.0])
gpu_samples = st.builds(
    lambda t, i, sm, bw: GpuSample(
        node_id=NODE,
        gpu_uuid=GPU,
        gpu_model="H100",
        ts_ns=t,
        interval_s=i,
        sm_util_pct=sm,
        mem_bw_util_pct=bw,
        mem_used_bytes=1,
        mem_total_bytes=2,
        power_w=100.0,
        temp_c=40.0,
    ),
    ts,
    interval,
    pct,
    pct,
)
process_samples = st.builds(
    lambda t, pid, i, sm, bw: ProcessSample(
        node_id=NODE, gpu_uuid=GPU, pid=pid, ts_ns=t, interval_s=i, sm_util_pct=sm, mem_bw_util_pct=bw, mem_used_bytes=1
    ),
    ts,
    st.sampled_from([7, 8]),
    interval,
    pct,
    pct,
)
numa_events = st.builds(
    lambda t, pid, hops, w: NumaEvent(node_id=NODE, gpu_uuid=GPU, pid=pid, ts_ns=t, hops=hops, latency_weight=w),
    ts,
    st.sampled_from([7, 8]),
    st.integers(0, 3),
    st.integers(0, 40),
)
bindings = st.lists(
    st.tuples(st.sampled_from([7, 8]), st.integers(T0, T0 + PANE_NS), st.sampled_from(["ads", "search"])),
    max_size=4,
    unique_by=lambda b: (b[0], b[1]),
)


def team_at(bound: list[tuple[int, int, str]], pid: int, t: int) -> str:
    """The team of the latest binding of ``pid`` at or before ``t``; ``unattributed`` if none."""
    earlier = [(bt, team) for p, bt, team in bound if p == pid and bt <= t]
    return max(earlier)[1] if earlier else UNATTRIBUTED.team


@given(
    st.lists(gpu_samples, max_size=6),
    st.lists(process_samples, max_size=8),
    st.lists(numa_events, max_size=4),
    bindings,
    st.randoms(),
)
def test_a_pane_is_recomputed_from_its_events_whatever_their_order(gpu, proc, numa, bound, rnd: random.Random) -> None:
    events = [*gpu, *proc, *numa]
    rnd.shuffle(events)
    revisions = Revisions(SETTINGS)
    for e in events:
        revisions.take(e)
    table = BindingTable()
    for pid, bt, team in bound:
        table.take(
            TenantBinding(node_id=NODE, pid=pid, ts_ns=bt, team=team, env="prod", app="app", tier="online", sla="Gold")
        )
    pane = revisions.totals(GPU, T0, table)

    assert pane.covered_ms == sum(e.interval_ms for e in gpu)
    assert pane.idle_ms == sum(e.interval_ms for e in gpu if e.sm_util_cp < SETTINGS.idle_threshold_cp)
    assert pane.busy_cp_ms == sum(e.interval_ms * e.sm_util_cp for e in gpu)
    assert pane.tenant_events == len(proc) + len(numa)
    expected: dict[str, list[int]] = {}
    for e in proc:
        sums = expected.setdefault(team_at(bound, e.pid, e.ts_ns), [0, 0, 0, 0])
        sums[0] += e.sm_util_cp * e.interval_ms
        sums[1] += e.mem_bw_util_cp * e.interval_ms
        sums[3] += 1
    for e in numa:
        expected.setdefault(team_at(bound, e.pid, e.ts_ns), [0, 0, 0, 0])[2] += e.hops * e.latency_weight
    assert {t.tenant.team: [t.sm, t.bw, t.numa, t.samples] for t in pane.tenants.values()} == expected
    assert pane.placed == sum(1 for e in proc if team_at(bound, e.pid, e.ts_ns) != UNATTRIBUTED.team)


def test_a_resent_event_is_a_duplicate_and_the_horizon_forgets_old_panes() -> None:
    revisions = Revisions(SETTINGS)
    sample = GpuSample(
        node_id=NODE,
        gpu_uuid=GPU,
        gpu_model="H100",
        ts_ns=T0 + 10 * NS,
        interval_s=1.0,
        sm_util_pct=50.0,
        mem_bw_util_pct=0.0,
        mem_used_bytes=1,
        mem_total_bytes=2,
        power_w=100.0,
        temp_c=40.0,
    )
    revisions.take(sample)
    assert revisions.admit(sample) == "duplicate"
    assert revisions.admit(sample.model_copy(update={"ts_ns": T0 + 30 * NS})) is None
    revisions.hold(GPU, T0, Decimal(2), True)
    end = T0 + PANE_NS
    assert revisions.reaches(end, end + 600 * NS) and not revisions.reaches(end, end + 600 * NS + 1)
    revisions.prune(GPU, end + 600 * NS)  # the pane ended exactly R ago: kept
    assert revisions.totals(GPU, T0, BindingTable()).covered_ms == 1000
    revisions.prune(GPU, end + 600 * NS + 1)
    assert revisions.totals(GPU, T0, BindingTable()).covered_ms == 0
    assert revisions.held(GPU, T0).revision is None  # forgotten: a fresh, never published pane


amount = st.integers(0, 10**8)
tenant_sums = st.dictionaries(
    st.sampled_from(["ads", "search", "vision"]), st.tuples(amount, amount, amount), max_size=3
)


@given(st.lists(st.tuples(st.integers(0, 60_000), tenant_sums), min_size=1, max_size=5))
def test_the_records_of_every_revision_add_up_to_the_last_split(versions) -> None:
    weights = Weights(Decimal("0.6"), Decimal("0.3"), Decimal("0.1"))
    splits = [apportion(pane_of(covered, tenants), Decimal("3.6"), weights) for covered, tenants in versions]
    published = list(splits[0])
    for revision, (old, new) in enumerate(zip(splits, splits[1:]), start=1):
        records = differences(old, new, revision)
        assert all(r.revision == revision for r in records)
        assert len({r.record_id for r in records}) == len(records)
        assert sum(r.cost_micro_usd for r in records) == (
            sum(r.cost_micro_usd for r in new) - sum(r.cost_micro_usd for r in old)
        )
        if [r.model_dump(exclude={"record_id"}) for r in old] == [r.model_dump(exclude={"record_id"}) for r in new]:
            assert records == []  # nothing changed: nothing published
        published += records
    totals: dict[str, int] = {}
    for r in published:
        totals[r.tenant_key] = totals.get(r.tenant_key, 0) + r.cost_micro_usd
    final = {r.tenant_key: r.cost_micro_usd for r in splits[-1]}
    assert {k: v for k, v in totals.items() if k in final or v} == final
    assert all(totals[k] == 0 for k in totals if k not in final)  # a party left with nothing is closed to 0


def test_a_party_left_with_nothing_gets_a_closing_record() -> None:
    weights = Weights(Decimal(1), Decimal(0), Decimal(0))
    old = apportion(pane_of(60_000, {"ads": (10_000 * 60_000, 0, 0)}), Decimal("3.6"), weights)
    new = apportion(pane_of(60_000, {"search": (10_000 * 60_000, 0, 0)}), Decimal("3.6"), weights)
    records = differences(old, new, 1)
    assert [(r.tenant_key, r.cost_micro_usd) for r in records] == [("ads", -60_000), ("search", 60_000)]
    assert (records[0].t_share, records[0].weight) == (0.0, 0.0)
    assert IDLE_TENANT not in {r.tenant_key for r in records}  # idle's record did not change


@given(st.lists(st.tuples(st.integers(0, 30), st.booleans()), max_size=40), st.integers(0, 40))
def test_the_horizon_forgets_exactly_the_held_panes_before_it_whatever_order_they_closed_in(
    closes: list[tuple[int, bool]], watermark_pane: int
) -> None:
    """Panes held in any order (a pane closes in order, or is met first by a late event: ``held``), then a prune:
    every pane starting before the floor goes, every other stays, as a brute-force filter of the starts says (a
    prune drops the held panes as a prefix, so their order is the state's to keep)."""
    revisions = Revisions(SETTINGS)
    for k, first_by_a_late_event in closes:
        if first_by_a_late_event:
            revisions.held(GPU, T0 + k * PANE_NS)
        else:
            revisions.hold(GPU, T0 + k * PANE_NS, Decimal(1), True)
    watermark = T0 + watermark_pane * PANE_NS
    revisions.prune(GPU, watermark)
    floor = watermark - SETTINGS.revision_horizon_ns - PANE_NS
    kept = sorted({T0 + k * PANE_NS for k, _ in closes} - set(range(T0, floor, PANE_NS)))
    assert sorted(s for s, _, _ in revisions.to_state()["held"].get(GPU, [])) == kept
