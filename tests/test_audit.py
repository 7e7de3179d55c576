"""The composed operators against the batch reference, over random streams."""
from __future__ import annotations

import json
import random

from hypothesis import given
from hypothesis import strategies as st
from pytest import approx

from schemas.events import Event, GpuSample, MemAccess, NumaEvent, ProcessSample
from schemas.records import CostRecord, DeadLetter, IdleIndexRecord, MaeRecord
from streams.audit import Auditor, Output
from streams.settings import AuditSettings
from tests.reference import reference
from tests.strategies import settings_st, streams


def run(events: list[Event], s: AuditSettings) -> list[Output]:
    auditor = Auditor(s)
    out: list[Output] = []
    for ev in events:
        out += auditor.update(ev)
    return out + auditor.finish()


def tabulate(outs: list[Output]) -> dict[str, object]:
    keys = [(r.gpu_uuid, r.pane_start_ns, getattr(r, "tenant_key", None))
            for r in outs if isinstance(r, (IdleIndexRecord, CostRecord))]
    assert len(keys) == len(set(keys)), "a (GPU, pane) was published twice"
    idle = {(r.gpu_uuid, r.pane_start_ns): (r.node_id, r.gpu_model, r.idle_ms, r.covered_ms, r.idle_ms_72h,
                                            r.covered_ms_72h, r.idle_index_72h)
            for r in outs if isinstance(r, IdleIndexRecord)}
    cost = {(r.gpu_uuid, r.pane_start_ns, r.tenant_key): (r.cost_micro_usd, r.pane_cost_micro_usd, r.t_share,
                                                          r.b_share, r.l_share, r.weight, r.busy_fraction, r.unpriced)
            for r in outs if isinstance(r, CostRecord)}
    mae = sorted((r.node_id, r.pid, r.first_ts_ns, r.last_ts_ns, r.n, r.out_of_range, r.mae_bits)
                 for r in outs if isinstance(r, MaeRecord))
    late = sum(1 for r in outs if isinstance(r, DeadLetter) and r.reason == "late")
    dup = sum(1 for r in outs if isinstance(r, DeadLetter) and r.reason == "duplicate")
    return {"idle": idle, "cost": cost, "mae": mae, "late": late, "duplicate": dup}


def assert_same(got: dict, want: dict) -> None:
    assert got["late"] == want["late"]
    assert got["duplicate"] == want["duplicate"]
    assert got["idle"].keys() == want["idle"].keys()
    for k, w in want["idle"].items():
        assert got["idle"][k][:6] == w[:6], k
        assert got["idle"][k][6] == approx(w[6], abs=1e-12)
    assert got["cost"].keys() == want["cost"].keys()
    for k, w in want["cost"].items():
        g = got["cost"][k]
        assert (g[0], g[1], g[7]) == (w[0], w[1], w[7]), k  # µ$ exactly, and the unpriced flag
        assert g[2:7] == approx(w[2:7], abs=1e-12), k
    assert len(got["mae"]) == len(want["mae"])
    for g, w in zip(got["mae"], want["mae"]):
        assert g[:6] == w[:6]
        assert g[6] == approx(w[6], abs=1e-9)


@given(streams(), settings_st())
def test_operators_match_batch_reference(events: list[Event], s: AuditSettings) -> None:
    assert_same(tabulate(run(events, s)), reference(events, s))


@given(streams(), settings_st())
def test_every_pane_bills_exactly_its_cost(events: list[Event], s: AuditSettings) -> None:
    panes: dict[tuple[str, int], list[CostRecord]] = {}
    for r in run(events, s):
        if isinstance(r, CostRecord):
            panes.setdefault((r.gpu_uuid, r.pane_start_ns), []).append(r)
    for recs in panes.values():
        assert len({r.pane_cost_micro_usd for r in recs}) == 1
        assert sum(r.cost_micro_usd for r in recs) == recs[0].pane_cost_micro_usd
        assert all(r.cost_micro_usd >= 0 for r in recs)
        assert sum(r.tenant_key == "idle" for r in recs) == 1
        assert len({r.record_id for r in recs}) == len(recs)


def _lane(ev: Event) -> object:
    if isinstance(ev, (GpuSample, ProcessSample, NumaEvent)):
        return ev.gpu_uuid
    if isinstance(ev, MemAccess):
        return (ev.node_id, ev.pid)
    return None  # bindings and prices stay in front


@given(streams(), settings_st(), st.randoms(use_true_random=False))
def test_results_do_not_depend_on_how_gpus_interleave(events: list[Event], s: AuditSettings,
                                                      rnd: random.Random) -> None:
    head = [e for e in events if _lane(e) is None]
    lanes: dict[object, list[Event]] = {}
    for e in events:
        if _lane(e) is not None:
            lanes.setdefault(_lane(e), []).append(e)
    # a random merge that keeps each GPU's (and each process's) own order
    tickets = [k for k, evs in lanes.items() for _ in evs]
    rnd.shuffle(tickets)
    cursors = {k: iter(v) for k, v in lanes.items()}
    shuffled = head + [next(cursors[k]) for k in tickets]
    assert tabulate(run(shuffled, s)) == tabulate(run(events, s))


@given(streams(), settings_st(), st.floats(0, 1))
def test_state_round_trip_mid_stream_changes_nothing(events: list[Event], s: AuditSettings, at: float) -> None:
    cut = int(len(events) * at)
    first = Auditor(s)
    out: list[Output] = []
    for ev in events[:cut]:
        out += first.update(ev)
    state = json.loads(json.dumps(first.to_state()))
    resumed = Auditor.from_state(s, state)
    for ev in events[cut:]:
        out += resumed.update(ev)
    out += resumed.finish()
    assert tabulate(out) == tabulate(run(events, s))
    assert resumed.counts == run_counts(events, s)


def run_counts(events: list[Event], s: AuditSettings) -> object:
    auditor = Auditor(s)
    for ev in events:
        auditor.update(ev)
    auditor.finish()
    return auditor.counts
