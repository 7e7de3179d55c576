"""SLA tiers on the allocation basis (docs/definitions.md, "SLA tiers"): a tenant holding a GPU is a candidate in
every pane its holds cover part of, processes or not, with its processes' ``sm`` there (0 without them), over the
pane's ``covered_ms``; one candidate per tenant key, holding and bound alike. Each case runs the row path and the
batch path in the default configuration (revisions on) and holds both to ``tests/reference.py``'s ``sla``, a
recomputation from the raw events; the paths must leave the same state, and a snapshot mid-run changes nothing.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpucost.schemas.arrow import events_table
from gpucost.schemas.blocks import expand
from gpucost.schemas.events import Allocation, Event
from gpucost.schemas.records import Output, QuotaRecord, ReclaimRecord, trigger_id
from gpucost.streams.audit import Auditor
from gpucost.streams.settings import AuditSettings
from tests.sla_reference import sla
from tests.support.sla_fleet import NS, P_S, T0, TENANTS
from tests.support.sla_fleet import fleet as scripted

S = AuditSettings()  # the default configuration: revisions on, a 6 h horizon
P = P_S * NS
BUSY, IDLE = 40.0, 1.0  # 1 %: idle for Gold (< 5 %) and Silver (< 10 %)
#: what each path left of the SLA operator, by path name
STATES: dict[str, Any] = {}
#: every fleet's panes: a GPU of its own (``GP``, busy) makes each GPU report this many, so that the batch path's
#: halves close enough panes at once (``batch.FEW_CLOSES``) to take the SLA operator's batch entry
PANES = 24


def fleet(scripts: dict[str, dict[int, list[float | None]]]) -> list[Event]:
    return scripted({**scripts, "GP": {1: [BUSY] * PANES}})


def hold(gpu: str, pid: int, start: int, end: int | None = None, name: str = "pod") -> list[Allocation]:
    """Tenant ``pid``'s hold of the whole of ``gpu`` (its fields as ``fleet``'s bindings give them), and its end."""
    team, tier = TENANTS[pid]
    first = Allocation(
        node_id=f"n-{gpu}",
        gpu_uuid=gpu,
        allocation_id=f"{name}-{pid}",
        ts_ns=start,
        sharing="exclusive",
        fraction_num=1,
        fraction_den=1,
        team=team,
        env="prod",
        app="a",
        tier="P1",
        sla=tier,
    )
    return [first] if end is None else [first, first.model_copy(update={"end_ts_ns": end})]


def with_holds(events: list[Event], holds: list[Allocation], at_pane: int = 0) -> list[Event]:
    """``events`` with ``holds`` sent just before the first event of pane ``at_pane`` (before it closes)."""
    at = next(i for i, e in enumerate(events) if e.kind == "gpu_sample" and e.ts_ns >= T0 + at_pane * P)
    return [*events[:at], *holds, *events[at:]]


def by_rows(events: list[Event]) -> list[Output]:
    auditor = Auditor(S)
    out = [r for e in events for r in auditor.update(e)] + auditor.finish()
    STATES["rows"] = auditor.sla.to_state()
    return out


def by_batches(events: list[Event]) -> list[Output]:
    auditor = Auditor(S)
    cut = len(events) // 2
    out: list[Output] = []
    for part in (events[:cut], events[cut:]):
        if part:
            out += expand(auditor.ingest_batch(events_table(part).to_batches()[0], str))
    out += auditor.finish()
    STATES["batches"] = auditor.sla.to_state()
    return out


def published(out: list[Output]) -> tuple[dict[tuple, tuple], dict[tuple, tuple]]:
    """The quota and reclaim records keyed as the reference keys them; each key once."""
    quotas = [q for q in out if isinstance(q, QuotaRecord)]
    reclaims = [r for r in out if isinstance(r, ReclaimRecord)]
    q = {
        (r.gpu_uuid, r.pane_start_ns, r.tenant_key): (r.team, r.sla, r.util_pct, r.idle_run_ms, r.quota_scale)
        for r in quotas
    }
    t = {
        (r.gpu_uuid, r.tenant_key, r.run_start_ns): (
            r.node_id,
            r.gpu_model,
            r.team,
            r.env,
            r.app,
            r.tier,
            r.sla,
            r.trigger_ns,
            r.idle_run_ms,
            r.deadline_ns,
            r.usd_per_gpu_hour,
            r.held,
        )
        for r in reclaims
    }
    assert len(q) == len(quotas), "a tenant judged twice in one pane"
    assert len(t) == len(reclaims), "a run triggered twice"
    assert all(r.trigger_id == trigger_id(r.gpu_uuid, r.tenant_key, r.run_start_ns) for r in reclaims)
    return q, t


def in_order(out: list[Output]) -> list[tuple[str, dict[str, Any]]]:
    """The SLA records as published, in order (a price compared as a number: the batch path's has Arrow's scale)."""
    return [(type(r).__name__, r.model_dump()) for r in out if isinstance(r, (QuotaRecord, ReclaimRecord))]


def both_paths(events: list[Event]) -> tuple[dict[tuple, tuple], dict[tuple, tuple]]:
    """The records of both paths, each held to the reference, and the states they leave held to each other."""
    want = sla(events, S)
    rows_out, batches_out = by_rows(events), by_batches(events)
    assert in_order(rows_out) == in_order(batches_out), "the paths published in different orders"
    rows, batches = published(rows_out), published(batches_out)
    assert rows == want
    assert batches == want
    assert STATES["rows"] == STATES["batches"], "the paths left different runs"
    return rows


def key(pid: int) -> str:
    team, tier = TENANTS[pid]
    return f"{team}:prod:a:P1:{tier}::"


def test_a_held_gpu_with_no_process_triggers_after_its_tiers_duration() -> None:
    # a time-sliced GPU: the Gold tenant (pid 1) holds it and runs busy; the Silver tenant (pid 2) holds it and runs
    # nothing on it
    events = with_holds(fleet({"G0": {1: [BUSY] * PANES}}), [*hold("G0", 2, T0), *hold("G0", 1, T0, name="busy")])
    quotas, reclaims = both_paths(events)
    assert list(reclaims) == [("G0", key(2), T0)]
    fired = reclaims[("G0", key(2), T0)]
    assert fired[7:9] == (T0 + 3 * P, 180_000) and fired[-1] is True  # at 3 panes (Silver: 180 s), held
    assert [quotas[("G0", T0 + p * P, key(2))][2:4] for p in range(6)] == [(0.0, (p + 1) * 60_000) for p in range(6)]


def test_a_held_gpu_kept_busy_does_not_trigger() -> None:
    events = with_holds(fleet({"G0": {2: [BUSY] * PANES}}), hold("G0", 2, T0))
    quotas, reclaims = both_paths(events)
    assert reclaims == {}
    assert {q[2:4] for k, q in quotas.items() if k[2] == key(2)} == {(40.0, 0)}


def test_a_tenant_holding_and_bound_is_one_candidate() -> None:
    # the Silver tenant holds the GPU and runs on it, idle: one quota record a pane, one trigger, held
    events = with_holds(fleet({"G0": {2: [IDLE] * 5}}), hold("G0", 2, T0))
    quotas, reclaims = both_paths(events)
    assert sorted(k for k in quotas if k[2] == key(2)) == [("G0", T0 + p * P, key(2)) for p in range(PANES)]
    assert len(reclaims) == 1 and reclaims[("G0", key(2), T0)][-1] is True
    assert quotas[("G0", T0, key(2))][2] == 1.0  # its processes' utilisation, not 0


def test_usage_under_a_key_that_holds_nothing_keeps_the_holders_from_being_judged_on_their_holds() -> None:
    """The Silver tenant holds the GPU and runs nothing; the GPU is busy with a process whose binding names another
    tenant that holds nothing there (a job whose processes set other fields than its hold's, or unattributed work):
    that usage could be the holder's own, so no reclaim; once the busy tenant holds the GPU too, the holder is
    judged and triggers."""
    for busy_pid in (1, 99):  # a bound tenant without a hold; a process with no binding (unattributed)
        events = with_holds(fleet({"G0": {busy_pid: [BUSY] * PANES}}), hold("G0", 2, T0))
        quotas, reclaims = both_paths(events)
        assert reclaims == {} and not [k for k in quotas if k[2] == key(2)], busy_pid
    events = with_holds(fleet({"G0": {1: [BUSY] * PANES}}), [*hold("G0", 2, T0), *hold("G0", 1, T0, name="busy")])
    assert list(both_paths(events)[1]) == [("G0", key(2), T0)]


def test_a_trigger_without_a_hold_says_so() -> None:
    quotas, reclaims = both_paths(fleet({"G0": {2: [IDLE] * 4}}))
    assert reclaims[("G0", key(2), T0)][-1] is False


def test_a_hold_that_ends_mid_run_ends_the_run() -> None:
    # held through pane 0 and the first half of pane 1, not in pane 2, held again from pane 3 on: a pane held in
    # part is not judged, so the run of pane 0 ends there, and starts again at 3
    events = fleet({"G0": {1: [BUSY] * PANES}})
    events = with_holds(events, [*hold("G0", 2, T0, T0 + P + 30 * NS, "first"), *hold("G0", 1, T0, name="busy")])
    events = with_holds(events, hold("G0", 2, T0 + 3 * P, None, "second"), at_pane=3)
    quotas, reclaims = both_paths(events)
    assert ("G0", T0 + 2 * P, key(2)) not in quotas and ("G0", T0 + P, key(2)) not in quotas  # held in part: not
    assert quotas[("G0", T0, key(2))][3] == 60_000
    assert list(reclaims) == [("G0", key(2), T0 + 3 * P)]
    assert reclaims[("G0", key(2), T0 + 3 * P)][7] == T0 + 6 * P


def test_holds_covering_a_pane_end_to_end_count_as_whole_and_a_gap_between_them_does_not() -> None:
    # the Silver tenant's pod replaced in pane 1: back to back, its run goes on; 10 s apart, pane 1 is not judged
    for gap_s, judged in ((0, True), (10, False)):
        events = fleet({"G0": {1: [BUSY] * PANES}})
        first = hold("G0", 2, T0, T0 + P + 20 * NS, "old")
        events = with_holds(events, [*first, *hold("G0", 2, T0 + P + (20 + gap_s) * NS, None, "new")])
        events = with_holds(events, hold("G0", 1, T0, name="busy"))
        quotas, reclaims = both_paths(events)
        assert (("G0", T0 + P, key(2)) in quotas) is judged, gap_s
        assert list(reclaims) == [("G0", key(2), T0 if judged else T0 + 2 * P)], gap_s


def test_a_hold_ended_before_its_pane_closes_is_read_as_ended() -> None:
    # the end sent mid-stream, in the pane it falls in (still open): Bronze (0 %, 60 s) triggers in pane 0 only
    events = fleet({"G0": {1: [BUSY] * PANES}})
    events = with_holds(events, [*hold("G0", 3, T0), *hold("G0", 1, T0, name="busy")])
    end = hold("G0", 3, T0, T0 + 2 * P + NS)[1]
    events = with_holds(events, [end], at_pane=2)
    quotas, reclaims = both_paths(events)
    assert list(reclaims) == [("G0", key(3), T0)]
    assert [k[1] for k in quotas if k[2] == key(3)] == [T0, T0 + P]  # pane 2 held for 1 ns of it: not judged


def test_snapshot_mid_run_then_the_rest_gives_the_uninterrupted_run() -> None:
    events = with_holds(
        fleet({"G0": {2: [BUSY] * PANES}, "G1": {1: [IDLE] * 16}}),
        [*hold("G0", 1, T0), *hold("G0", 2, T0, name="busy"), *hold("G1", 1, T0)],
    )
    straight = by_rows(events)
    for cut in (len(events) // 3, len(events) // 2):
        first = Auditor(S)
        out = [r for e in events[:cut] for r in first.update(e)]
        assert first.sla.to_state(), "the cut falls mid-run"
        resumed = Auditor.from_state(json.loads(json.dumps(first.to_state())), S)
        assert resumed.sla.allocations is resumed.allocations.table
        out += [r for e in events[cut:] for r in resumed.update(e)] + resumed.finish()
        assert published(out) == published(straight)
    assert len(published(straight)[1]) == 2  # Gold on each GPU: held-only on G0, held and idle on G1


def test_a_successor_reads_the_holds_it_is_handed() -> None:
    auditor = Auditor(S)
    for e in hold("G0", 2, T0):
        auditor.update(e)
    nxt = auditor.successor()
    assert nxt.sla.allocations is nxt.allocations.table is auditor.allocations.table


@settings(max_examples=20, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["G0", "G1"]),
        st.dictionaries(
            st.sampled_from(sorted(TENANTS)),
            st.lists(st.sampled_from([None, 0.0, 0.01, 4.99, 5.0, 9.99, 40.0]), min_size=1, max_size=12),
            min_size=1,
        ),
        min_size=1,
    ),
    st.lists(
        st.tuples(
            st.sampled_from(["G0", "G1"]),
            st.sampled_from(sorted(TENANTS)),
            st.integers(0, 11 * P_S),
            st.one_of(st.none(), st.integers(1, 8 * P_S)),
        ),
        max_size=4,
    ),
)
def test_random_holds_and_tenants_recomputed_on_both_paths(
    scripts: dict[str, dict[int, list[float | None]]], holds: list[tuple[str, int, int, int | None]]
) -> None:
    events = fleet(scripts)
    sent: list[Allocation] = []
    for i, (gpu, pid, start_s, length_s) in enumerate(holds):
        sent += hold(gpu, pid, T0 + start_s * NS, None if length_s is None else T0 + (start_s + length_s) * NS, f"h{i}")
    both_paths(with_holds(events, sent))
