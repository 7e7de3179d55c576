"""The binding table answers as of each time with the latest binding at or before it, whatever order the
bindings arrived in: its repeats (a later binding of the tenant already in force, kept apart) included.
The reference reads the whole set of bindings at once."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpucost.schemas.blocks import expand
from gpucost.schemas.codec import encode_event
from gpucost.schemas.events import Event, GpuSample, Price, ProcessSample, TenantBinding
from gpucost.schemas.records import CostRecord, DeadLetter
from gpucost.streams.audit import Auditor
from gpucost.streams.settings import AuditSettings
from gpucost.streams.tables import UNATTRIBUTED, BindingTable
from tests.support.batch_path import closing_at

T0 = 1_767_571_200_000_000_000
NS = 1_000_000_000


def binding(ts: int, team: str) -> TenantBinding:
    return TenantBinding(
        node_id="n1", pid=7, ts_ns=T0 + ts, team=team, env="prod", app="app", tier="online", sla="Gold"
    )


def reference(bound: list[tuple[int, str]], t: int) -> str:
    earlier = [(ts, team) for ts, team in bound if ts <= t]
    return max(earlier)[1] if earlier else UNATTRIBUTED.team


@given(
    st.lists(
        st.tuples(st.integers(0, 30), st.sampled_from(["ads", "search", "infra"])),
        max_size=10,
        unique_by=lambda b: b[0],
    ),
    st.randoms(),
)
def test_lookups_do_not_depend_on_the_order_bindings_arrive_in(bound, rnd) -> None:
    arrival = list(bound)
    rnd.shuffle(arrival)
    table = BindingTable()
    for ts, team in arrival:
        table.take(binding(ts, team))
    for t in range(-1, 32):
        assert table.lookup("n1", 7, T0 + t).team == reference(bound, t), (arrival, t)
    restored = BindingTable.from_state(table.to_state(), AuditSettings())
    assert [restored.lookup("n1", 7, T0 + t) for t in range(32)] == [table.lookup("n1", 7, T0 + t) for t in range(32)]


def test_a_repeat_comes_back_into_force_after_a_binding_that_arrives_late_before_it() -> None:
    """Hypothesis's find: ``search`` at t0 and t2, then ``ads`` at t1, billed t2's sample to ``ads``."""
    table = BindingTable()
    for ts, team in ((0, "search"), (2, "search"), (1, "ads")):
        table.take(binding(ts, team))
    assert [table.lookup("n1", 7, T0 + t).team for t in range(3)] == ["search", "ads", "search"]


@pytest.mark.parametrize("horizon_s", [21_600, 0], ids=["R=6h", "R=0"])
@pytest.mark.parametrize("path", ["rows", "batch"])
def test_the_audit_bills_the_repeat_in_force_after_a_binding_that_arrives_late_before_it(horizon_s, path) -> None:
    """The same three bindings billed end to end, in the default configuration and with revisions off, on both
    paths: the process sample at t2 + 1 s is ``search``'s, whether ``ads`` at t1 arrives before its pane closes
    (open pane re-attributed) or after (a revision, within R)."""
    s = AuditSettings(revision_horizon_s=horizon_s)
    gpu = [
        GpuSample(
            node_id="n1",
            gpu_uuid="g",
            gpu_model="H100",
            ts_ns=T0 + t * NS,
            interval_s=1.0,
            sm_util_pct=50.0,
            mem_bw_util_pct=0.0,
            mem_used_bytes=0,
            mem_total_bytes=1,
            power_w=1.0,
            temp_c=1.0,
        )
        for t in range(0, 60, 5)
    ]
    proc = ProcessSample(
        node_id="n1",
        gpu_uuid="g",
        pid=7,
        ts_ns=T0 + 3 * NS,
        interval_s=1.0,
        sm_util_pct=40.0,
        mem_bw_util_pct=10.0,
        mem_used_bytes=1,
    )
    events = [
        Price(gpu_model="H100", ts_ns=T0, usd_per_gpu_hour=Decimal("3")),
        binding(0, "search"),
        binding(2 * NS, "search"),
        *gpu,
        proc,
        binding(1 * NS, "ads"),
    ]
    auditor = Auditor(s)
    if path == "rows":
        out = [r for e in events for r in auditor.update(e)]
    else:
        with closing_at(0, few_lines=0):
            out = expand(auditor.ingest_lines([encode_event(e).encode() for e in events], lambda i: f"line {i}"))
    out += auditor.finish()
    billed: dict[str, int] = {}
    for r in out:
        if isinstance(r, CostRecord):
            billed[r.team] = billed.get(r.team, 0) + r.cost_micro_usd
    assert billed.get("ads", 0) == 0 and billed["search"] > 0
    assert not [r for r in out if isinstance(r, DeadLetter)]


def test_a_repeat_sent_again_is_a_duplicate_as_any_binding_taken() -> None:
    table = BindingTable()
    verdicts = [table.take(binding(ts, "search")) for ts in (0, 5, 5)]
    assert verdicts == ["taken", "unchanged", "duplicate"]


def test_the_tenant_fields_a_type_checker_reads_are_the_bindings() -> None:
    """``Tenant`` spells its fields out once more for mypy, under ``TYPE_CHECKING``: the same names, in order."""
    import ast  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    from gpucost.schemas.events import TENANT_FIELDS  # noqa: PLC0415
    from gpucost.streams import tables  # noqa: PLC0415

    tree = ast.parse(Path(tables.__file__).read_text(encoding="utf-8"))
    tenant = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Tenant")
    block = next(n for n in tenant.body if isinstance(n, ast.If))
    declared = tuple(n.target.id for n in block.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name))
    assert declared == TENANT_FIELDS


@pytest.mark.parametrize("horizon_s", [21_600, 0], ids=["R=6h", "R=0"])
@pytest.mark.parametrize("first", ["", None], ids=["blank-first", "absent-first"])
def test_two_processes_whose_tenants_differ_only_by_a_field_given_as_blank_are_one_party(horizon_s, first) -> None:
    """Two processes bound to one tenant key, one binding with ``git_commit=""`` and one without: one party, so
    one cost record a pane with a unique id, on both paths and in either order (the batch entry once made two
    records of one id, and a sink keeping the first copy of each id lost one's µ$). Checked against the row
    entry's pane costs: Σ of each pane's records = its cost, whatever is kept by id."""
    s = AuditSettings(revision_horizon_s=horizon_s)
    second = None if first == "" else ""
    events: list[Event] = [Price(gpu_model="H100", ts_ns=T0 - 3600 * NS, usd_per_gpu_hour=Decimal("2.5"))]
    for pid, commit in ((1, first), (2, second)):
        events.append(
            TenantBinding(
                node_id="n1",
                pid=pid,
                ts_ns=T0 - NS,
                team="a",
                env="prod",
                app="x",
                tier="t",
                sla="Gold",
                git_commit=commit,
            )
        )
    for k in range(60):
        events.append(
            GpuSample(
                node_id="n1",
                gpu_uuid="g",
                gpu_model="H100",
                ts_ns=T0 + k * 10 * NS,
                interval_s=10.0,
                sm_util_pct=50.0,
                mem_bw_util_pct=10.0,
                mem_used_bytes=1,
                mem_total_bytes=2,
                power_w=100.0,
                temp_c=40.0,
            )
        )
        for pid in (1, 2):
            events.append(
                ProcessSample(
                    node_id="n1",
                    gpu_uuid="g",
                    pid=pid,
                    ts_ns=T0 + k * 10 * NS,
                    interval_s=10.0,
                    sm_util_pct=20.0,
                    mem_bw_util_pct=5.0,
                    mem_used_bytes=1,
                )
            )
    rows = Auditor(s)
    by_rows = [r for e in events for r in rows.update(e)] + rows.finish()
    batch = Auditor(s)
    with closing_at(0, few_lines=0):
        by_batch = expand(batch.ingest_lines([encode_event(e).encode() for e in events], lambda i: f"line {i}"))
    by_batch += batch.finish()
    for out in (by_rows, by_batch):
        cost = [r for r in out if isinstance(r, CostRecord)]
        kept = {r.record_id: r for r in cost}  # what a sink keeping one copy of each id holds
        assert len(kept) == len(cost)
        per_pane: dict[int, int] = {}
        for r in kept.values():
            per_pane[r.pane_start_ns] = per_pane.get(r.pane_start_ns, 0) + r.cost_micro_usd
        assert per_pane == {r.pane_start_ns: r.pane_cost_micro_usd for r in cost}
        assert {r.git_commit for r in cost if r.team == "a"} == {None}
    assert [r for r in by_batch if isinstance(r, CostRecord)] == [r for r in by_rows if isinstance(r, CostRecord)]


def test_a_state_from_before_the_one_form_reads_back_in_it() -> None:
    """A binding table written before tenants had one form may hold a process's tenant in two (``git_commit`` ""
    and none, ``env`` none): read back, each change point's tenant is in the one form, and the two forms'
    repeats are one tenant's, their times merged."""
    old = ["a", "prod", "x", "t", "Gold", "", None, None]
    other = ["a", "prod", "x", "t", "Gold", None, None, None]
    state = [["n1", 7, [[T0, old]], [[old, T0 + 5, [4]], [other, T0 + 7, [4]]]]]
    table = BindingTable.from_state(state)
    (row,) = table.to_state()
    assert row[2] == [[T0, other]]
    assert row[3] == [[other, T0 + 5, [2, 2, 2]]]  # T0 + 5, 9 and T0 + 7, 11, merged
    assert BindingTable.from_state([["n1", 7, [[T0, ["a", None, None, None, "Gold", None, None, None]]]]]).to_state()[
        0
    ][2] == [[T0, ["a", "", "", "", "Gold", None, None, None]]]


def test_an_open_pane_from_before_the_one_form_reads_back_in_it_and_keeps_the_pipelines_own_parties() -> None:
    """A pane's tenants written before the one form (``git_commit=""``) read back in it, so a pane open at an
    upgrade prints what an uninterrupted run prints; ``unattributed`` stays the pipeline's own party, all None."""
    from gpucost.streams.pane_totals import PaneTotals
    from gpucost.streams.tables import Tenant

    pane = PaneTotals("g", T0, T0 + 60 * NS, "n1", "H100")
    pane.tenant(Tenant("a", "prod", "x", "t", "Gold", "", "", None)).sm += 5
    pane.tenant(UNATTRIBUTED).sm += 7
    back = PaneTotals.from_state(pane.to_state())
    assert {t.tenant: t.sm for t in back.tenants.values()} == {
        Tenant("a", "prod", "x", "t", "Gold", None, None, None): 5,
        UNATTRIBUTED: 7,
    }
