"""Kernel cost in the pipeline (docs/definitions.md, "Kernel cost in the pipeline"): a tenant's pane cost split over
its kernels, in the default configuration (a 6 h revision horizon) and with revisions off.

The lines are held to a brute-force recomputation over random streams in tests/test_audit.py (tests/support/
kernel_reference.py), to a replay in time order over revisions in tests/test_revisions.py, and across paths and
kills through the simulated fleet's kernels (tests/test_kafka.py); here, the rules one at a time, each against
figures worked out by hand from the definition, and the hostile kernels.
"""

from __future__ import annotations

import json
from fractions import Fraction

import pytest

from gpucost.schemas.blocks import expand
from gpucost.schemas.codec import encode_event
from gpucost.schemas.events import Event, ProcessSample, TenantBinding
from gpucost.schemas.records import CostRecord, DeadLetter, KernelCostRecord, Output
from gpucost.streams.audit import Auditor
from gpucost.streams.settings import AuditSettings
from tests.strategies import BASE_NS, NS
from tests.support.kernel_fleet import billed, binding, fleet, kernel, lines, paid_as_billed

CONFIGS = pytest.mark.parametrize(
    "audit", [AuditSettings(pane_s=60), AuditSettings(pane_s=60, revision_horizon_s=0)], ids=["R=6h", "R=0"]
)


def run(audit: AuditSettings, events: list[Event], batch: bool = False) -> list[Output]:
    auditor = Auditor(audit)
    if batch:
        lines = [encode_event(e).encode() for e in events]
        return expand(auditor.ingest_lines(lines, str)) + auditor.finish()
    return [o for e in events for o in auditor.update(e)] + auditor.finish()


@CONFIGS
def test_overlapping_kernels_split_their_overlap_equally_and_the_rest_is_no_kernel(audit: AuditSettings) -> None:
    # gemm [0, 10 s) and nccl [5 s, 15 s) on two streams: 5 s alone each, 5 s shared, so 7.5 s each of a 15 s union;
    # 45 s of the 60 s covered ran no kernel. The tenant pays the whole pane, 60,000 µ$.
    events = fleet(2)
    events[3:3] = [kernel(0, 10), kernel(5, 15, "nccl_all_reduce", stream=13, corr=1)]
    for batch in (False, True):
        got = lines(run(audit, events, batch))
        assert got == {
            (0, "a", "no_kernel"): (45_000, 45 * NS, 0),
            (0, "a", "gemm"): (7_500, 7_500_000_000, 1),
            (0, "a", "nccl_all_reduce"): (7_500, 7_500_000_000, 1),
        }


@CONFIGS
def test_a_kernel_across_a_pane_end_is_cut_there_and_called_once(audit: AuditSettings) -> None:
    # [50 s, 80 s): 10 s in pane 0, 20 s in pane 1; one call, in the pane it starts in
    events = fleet(3)
    events[3:3] = [kernel(50, 80)]
    got = lines(run(audit, events))
    assert got[(0, "a", "gemm")] == (10_000, 10 * NS, 1) and got[(0, "a", "no_kernel")] == (50_000, 50 * NS, 0)
    assert got[(1, "a", "gemm")] == (20_000, 20 * NS, 0) and got[(1, "a", "no_kernel")] == (40_000, 40 * NS, 0)


def test_the_money_is_dealt_by_largest_remainder_in_the_lines_order() -> None:
    # at 33.33 % SM the tenant pays a third of the pane (its cost record says how much, 19,998 µ$, idle the rest);
    # three kernels of 1 s in a pane covered 60 s weigh 1/60 each, no_kernel 57/60: remainders to deal
    events = fleet(2, sm_pct=33.33)
    events[3:3] = [kernel(0, 1, "a"), kernel(1, 2, "b", corr=1), kernel(2, 3, "c", corr=2)]
    out = run(AuditSettings(pane_s=60), events)
    (tenant,) = [r for r in out if isinstance(r, CostRecord) and r.team == "a" and r.pane_start_ns == BASE_NS]
    paid = tenant.cost_micro_usd
    shares = [Fraction(57, 60), Fraction(1, 60), Fraction(1, 60), Fraction(1, 60)]
    floors = [int(paid * s) for s in shares]
    rest = paid - sum(floors)
    order = sorted(range(4), key=lambda i: (-(paid * shares[i] - floors[i]), i))
    want = [f + (i in order[:rest]) for i, f in enumerate(floors)]
    got = lines(out)
    assert [got[(0, "a", k)][0] for k in ("no_kernel", "a", "b", "c")] == want and sum(want) == paid


@CONFIGS
def test_a_copy_is_a_line_of_its_time_and_calls_that_takes_no_money_and_no_kernel_s_time(audit: AuditSettings) -> None:
    # a copy [0, 20 s) beside gemm [10 s, 30 s): gemm alone makes the union (20 s); the copy's line is its 20 s and
    # its call, and no µ$; the 10 s only the copy ran are no_kernel's (40 s in all)
    events = fleet(2)
    events[3:3] = [kernel(0, 20, "Memcpy HtoD", stream=13, corr=1), kernel(10, 30)]
    got = lines(run(audit, events))
    assert got == {
        (0, "a", "no_kernel"): (40_000, 40 * NS, 0),
        (0, "a", "gemm"): (20_000, 20 * NS, 1),
        (0, "a", "Memcpy HtoD"): (0, 20 * NS, 1),
    }


@CONFIGS
def test_kernels_longer_than_the_covered_time_leave_no_kernel_nothing(audit: AuditSettings) -> None:
    # two streams busy the whole pane: 120 s of kernels in a 60 s pane, 60 s of union; the two share it equally
    events = fleet(2)
    events[3:3] = [kernel(0, 60, "x"), kernel(0, 60, "y", stream=13, corr=1)]
    got = lines(run(audit, events))
    assert got[(0, "a", "no_kernel")] == (0, 0, 0)
    assert got[(0, "a", "x")] == (30_000, 30 * NS, 1) and got[(0, "a", "y")] == (30_000, 30 * NS, 1)


@CONFIGS
def test_a_kernel_sent_again_is_a_duplicate_and_one_too_long_is_refused(audit: AuditSettings) -> None:
    events = fleet(2)
    events[3:3] = [kernel(0, 10), kernel(0, 10)]
    hung = {**json.loads(encode_event(kernel(0, 10, "hung", corr=5))), "end_ns": BASE_NS + 3601 * NS}
    auditor = Auditor(audit)
    out = [o for e in events for o in auditor.update(e)]
    out += auditor.ingest(json.dumps(hung), "k.jsonl:1") + auditor.finish()
    assert sorted(r.reason for r in out if isinstance(r, DeadLetter)) == ["duplicate", "invalid"]
    assert lines(out)[(0, "a", "gemm")] == (10_000, 10 * NS, 1) and (0, "a", "hung") not in lines(out)
    (letter,) = [r for r in out if isinstance(r, DeadLetter) and r.reason == "invalid"]
    assert "3601000000000 ns" in letter.detail and "re-export" in letter.detail


@CONFIGS
def test_kernels_replayed_after_their_samples_revise_within_the_horizon_and_are_late_without_one(
    audit: AuditSettings,
) -> None:
    """The user's replay of two files, the samples' then the profiler's: every pane has closed when the kernels
    come. With a horizon they revise the panes and bill as in time order; without, each is a ``late`` dead letter."""
    samples = fleet(8)  # the last sample at 420 s: with the default lateness of 120 s panes 0 to 4 have closed
    kernels = [kernel(10 + 60 * p, 40 + 60 * p, corr=p) for p in range(4)]
    in_order = lines(run(audit, samples[:2] + sorted(samples[2:] + kernels, key=lambda e: e.ts_ns)))
    out = run(audit, samples + kernels)
    if audit.revision_horizon_s:
        assert lines(out) == in_order and len(in_order) == 8
        assert {r.revision for r in out if isinstance(r, KernelCostRecord)} == {1}
    else:
        assert [r.reason for r in out if isinstance(r, DeadLetter)] == ["late"] * 4 and not lines(out)


def test_a_late_binding_moves_a_process_s_kernel_lines_to_its_tenant() -> None:
    # pid 2 runs unbound, then its binding (to team b) arrives after its pane closed: its lines move from
    # unattributed to b in a revision, each summing to 0 for the one and to b's cost for the other
    events = fleet(6)  # pane 0 has closed when the binding comes
    events[3:3] = [
        kernel(0, 30, pid=2),
        ProcessSample(
            node_id="n",
            gpu_uuid="GPU-0",
            pid=2,
            ts_ns=BASE_NS + 2,
            interval_s=60.0,
            sm_util_pct=50.0,
            mem_bw_util_pct=0.0,
            mem_used_bytes=1,
        ),
    ]
    events.append(TenantBinding(node_id="n", pid=2, ts_ns=BASE_NS, team="b", env="prod", app="x", tier="t", sla="Gold"))
    out = run(AuditSettings(pane_s=60), events)
    got = lines(out)
    assert got[(0, "unattributed", "gemm")][0] == 0 and got[(0, "unattributed", "no_kernel")][0] == 0
    first = [r for r in out if isinstance(r, KernelCostRecord) and r.team == "unattributed" and r.revision == 0]
    assert sum(r.cost_micro_usd for r in first) > 0  # billed to no one first, then moved
    paid_b = sum(
        r.cost_micro_usd for r in out if isinstance(r, CostRecord) and r.team == "b" and r.pane_start_ns == BASE_NS
    )
    assert paid_b > 0 and got[(0, "b", "gemm")][0] + got[(0, "b", "no_kernel")][0] == paid_b
    assert got[(0, "b", "gemm")][0] * 2 == paid_b  # 30 s of a 60 s pane: half of it


def test_a_late_binding_moves_the_kernels_of_a_pane_its_process_sent_no_sample_after() -> None:
    """From a review: a binding mid-pane, after the process's one sample of it, changed the tenant of the pane's
    later kernels without republishing it; the next revision of the pane then billed team a twice (120,000 µ$ of
    lines against 60,000 of cost). Now the binding revises the pane, and every revision keeps Σ lines = cost."""
    events = fleet(8)
    events[4:4] = [kernel(40, 50)]  # pid 1's kernel at 40 s of pane 0; its one sample there is at 0 s
    events += [binding(1, 30, "b"), kernel(10, 20, "gemm1", corr=9)]  # a late binding, then a late kernel
    out = run(AuditSettings(pane_s=60), events)
    assert paid_as_billed(out)
    in_order = events[:4] + [events[-2]] + events[4:-2] + [events[-1]]
    assert billed(out) == billed(run(AuditSettings(pane_s=60), in_order))


def test_pruning_the_bindings_keeps_the_one_in_force_at_a_long_kernel_s_start() -> None:
    """From a review: ``Auditor.prune`` (the Kafka worker's, after each transaction) dropped the binding in force at
    the start of a 15-minute kernel still kept within the horizon; its pane, revised, then billed team a twice."""
    audit = AuditSettings(pane_s=60, revision_horizon_s=600)
    events = fleet(26)
    events[2:2] = [binding(2, 0, "a"), binding(2, 200, "b"), kernel(100, 1000, "long", pid=2, stream=3)]
    auditor = Auditor(audit)
    out = [o for e in events for o in auditor.update(e)]
    auditor.prune()
    assert auditor.bindings.lookup("n", 2, BASE_NS + 100 * NS).team == "a"
    out += auditor.update(kernel(970, 975, "gemm1", corr=9)) + auditor.finish()  # a late kernel revises pane 16
    assert paid_as_billed(out)


def test_two_lines_whose_names_hold_the_separator_keep_their_own_ids() -> None:
    """From a review: a tenant field and a kernel name both holding the id's separator gave two lines one
    ``record_id``, and the sink keeps one record per id."""
    events = fleet(2)
    events[2:2] = [
        TenantBinding(
            node_id="n",
            pid=2,
            ts_ns=BASE_NS,
            team="a",
            env="p",
            app="x",
            tier="t",
            sla="Gold",
            ci_pipeline_id="p\x1fkernel\x1ffoo",
        ),
        TenantBinding(
            node_id="n", pid=3, ts_ns=BASE_NS, team="a", env="p", app="x", tier="t", sla="Gold", ci_pipeline_id="p"
        ),
    ]
    events[5:5] = [kernel(0, 10, "bar", pid=2), kernel(0, 10, "foo\x1fkernel\x1fbar", pid=3, corr=1)]
    records = [r for r in run(AuditSettings(pane_s=60), events) if isinstance(r, KernelCostRecord)]
    assert len(records) >= 4 and len({r.record_id for r in records}) == len(records)
