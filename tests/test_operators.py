"""One check suite over every operator on closed panes (``gpucost.streams.operator``), taken from the auditor's
own list, so an operator added there is checked without a line here:

- the row entry, pane by pane, gives what the batch entry gives over the same panes, and the same state;
- the batch entry over the panes cut anywhere gives what it gives over them whole;
- snapshot → JSON → restore at any pane, then the rest, gives what the uninterrupted run gives.

Panes are generated (several GPUs, gaps between panes, tenants of every tier and none, traces, GPM sums), their
idle records rolled by a fresh ``IdleIndex`` on each path, as the auditor does.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from gpucost.schemas.events import TENANT_FIELDS, Allocation, TenantBinding
from gpucost.schemas.kernels import KernelActivity
from gpucost.streams.allocations import AllocationSplit
from gpucost.streams.audit import Auditor
from gpucost.streams.idle_index import IdleIndex
from gpucost.streams.kernel_cost import KernelCost
from gpucost.streams.operator import Closing, ClosingMany, PaneOperator
from gpucost.streams.pane_totals import PaneColumns, PaneTotals, TenantTotals
from gpucost.streams.settings import AuditSettings
from gpucost.streams.sla import SlaOperator
from gpucost.streams.tables import Tenant

SETTINGS = AuditSettings(pane_s=600, health_window_h=1, admission_h=1)
PANE_NS = SETTINGS.pane_ns
CP = 10_000
#: each team's SLA tier, the same in every pane, so that idle runs carry on (Platinum: no such tier)
TIER_OF = {"a": "Gold", "b": "Silver", "c": "Bronze", "d": "Platinum", "unattributed": None}


def tenant(team: str, sla: str | None) -> Tenant:
    return Tenant(**{f: (team if f == "team" else sla if f == "sla" else None) for f in TENANT_FIELDS})


@st.composite
def pane(draw: Any, gpu: str, k: int) -> PaneTotals:
    covered = draw(st.integers(1, 600_000))
    busy = draw(st.integers(0, CP * covered))
    tensor_ms = draw(st.sampled_from([0, covered]))
    dram_ms = draw(st.sampled_from([0, covered // 2]))
    tenants = {}
    for team in draw(st.lists(st.sampled_from(sorted(TIER_OF)), unique=True, max_size=3)):
        who = tenant(team, TIER_OF[team])
        # idle (0, or under the tiers' thresholds) often enough for runs to span panes, and a snapshot
        sm = draw(st.one_of(st.just(0), st.integers(0, 400 * covered), st.integers(0, CP * covered)))
        tenants[who.key] = TenantTotals(
            who, sm, draw(st.integers(0, CP * covered)), draw(st.integers(0, 50)), draw(st.sampled_from([0, 1, 1, 2]))
        )
    return PaneTotals(
        gpu_uuid=gpu,
        pane_start_ns=k * PANE_NS,
        pane_end_ns=(k + 1) * PANE_NS,
        node_id=f"node-{gpu[-1]}",
        gpu_model=draw(st.sampled_from(["NVIDIA H100 80GB HBM3", "T4", "unknown"])),
        covered_ms=covered,
        idle_ms=draw(st.integers(0, covered)),
        tenant_events=len(tenants),
        tenants=tenants,
        energy_uj=draw(st.integers(0, 700_000 * covered)),
        busy_cp_ms=busy,
        placed=draw(st.integers(0, 2)),
        bw_cp_ms=draw(st.integers(0, CP * covered)),
        tensor_cp_ms=draw(st.integers(0, CP * tensor_ms)),
        tensor_ms=tensor_ms,
        dram_cp_ms=draw(st.integers(0, CP * dram_ms)),
        dram_ms=dram_ms,
        flops=draw(st.dictionaries(st.integers(0, 4), st.integers(0, 2**60), max_size=2)),
    )


@st.composite
def closed_panes(draw: Any) -> tuple[list[PaneTotals], list[Decimal | None]]:
    """Panes as they close: interleaved across GPUs, each GPU's ascending, some indices skipped."""
    panes: list[PaneTotals] = []
    next_k = {gpu: draw(st.integers(0, 5)) for gpu in ("GPU-0", "GPU-1")}
    for gpu in draw(st.lists(st.sampled_from(sorted(next_k)), min_size=2, max_size=24)):
        k = next_k[gpu]
        panes.append(draw(pane(gpu, k)))
        next_k[gpu] = k + draw(st.sampled_from([1, 1, 1, 1, 2, 7]))
    prices = [draw(st.sampled_from([None, Decimal("2.5"), Decimal("3.720001")])) for _ in panes]
    return panes, prices


#: holds on both GPUs for the allocation basis (pane times here start at 0, before any valid event time: built
#: without validation), one ending mid-pane, one still held, one a third of the device
HOLDS = [
    Allocation.model_construct(
        node_id="node-0",
        gpu_uuid="GPU-0",
        allocation_id="a",
        ts_ns=PANE_NS // 2,
        end_ts_ns=9 * PANE_NS + 7,
        sharing="mps",
        fraction_num=30,
        fraction_den=100,
        team="a",
        sla="Gold",
    ),
    Allocation.model_construct(
        node_id="node-1",
        gpu_uuid="GPU-1",
        allocation_id="b",
        ts_ns=3 * PANE_NS,
        end_ts_ns=None,
        sharing="time_slicing",
        fraction_num=1,
        fraction_den=3,
        team="b",
        sla="Silver",
    ),
]


#: pids bound to teams (pid 2 stays unattributed), and kernels of those processes in many panes of both GPUs:
#: overlapping on two streams, crossing pane ends, of zero length, a memcpy; built without validation, as the holds
BINDINGS = [
    TenantBinding.model_construct(node_id=f"node-{g}", pid=pid, ts_ns=0, **tenant(team, TIER_OF[team])._asdict())
    for g in (0, 1)
    for pid, team in ((1, "a"), (3, "b"))
]
KERNELS = [
    KernelActivity.model_construct(
        node_id=f"node-{g}",
        pid=1 + (k + i) % 3,
        name=f"k{(k * i) % 4}" if i != 3 else "Memcpy HtoD",
        start_ns=k * PANE_NS // 2 + i * PANE_NS // 7,
        end_ns=k * PANE_NS // 2 + i * PANE_NS // 7 + (0 if i == 2 else PANE_NS // (1 + i)),
        gpu_uuid=f"GPU-{g}",
        device=g,
        stream=i % 2,
        correlation_id=k * 10 + i,
        category="memcpy" if i == 3 else "kernel",
    )
    for g in (0, 1)
    for k in range(0, 360, 1 + g)
    for i in range(4)
]


def operators() -> list[PaneOperator]:
    auditor = Auditor(SETTINGS)
    for hold in HOLDS:
        auditor.allocations.table.take(hold)
    for binding in BINDINGS:
        auditor.bindings.take(binding)
    for kernel in KERNELS:
        auditor.kernels.log.take(kernel)
    return auditor.pane_operators


def published(records: list[Any]) -> list[str]:
    return [r.model_dump_json() for r in records]


def by_rows(
    ops: list[PaneOperator], panes: list[PaneTotals], prices: list[Decimal | None], idle: IdleIndex
) -> list[list[list[str]]]:
    """Each operator's records of each pane through the row entry."""
    out: list[list[list[str]]] = [[] for _ in ops]
    for p, price in zip(panes, prices, strict=True):
        record = idle.on_close(p)
        assert record is not None
        for i, op in enumerate(ops):
            out[i].append(published(op.on_close(Closing(p, price, record))))
    return out


def by_batch(
    ops: list[PaneOperator], panes: list[PaneTotals], prices: list[Decimal | None], idle: IdleIndex
) -> list[list[list[str]]]:
    if not panes:
        return [[] for _ in ops]
    columns = PaneColumns.of(panes)
    closing = ClosingMany(columns, prices, idle.close_many(columns))
    return [[published(records) for records in op.close_many(closing).per_pane(len(panes))] for op in ops]


def states(ops: list[PaneOperator]) -> list[Any]:
    return [json.loads(json.dumps(op.to_state())) for op in ops]


@given(closed_panes())
def test_the_row_entry_gives_what_the_batch_entry_gives(generated) -> None:
    panes, prices = generated
    rows, batch = operators(), operators()
    assert by_rows(rows, panes, prices, IdleIndex(SETTINGS)) == by_batch(batch, panes, prices, IdleIndex(SETTINGS))
    assert states(rows) == states(batch)


@given(closed_panes(), st.data())
def test_the_batch_entry_over_panes_cut_anywhere_gives_what_it_gives_over_them_whole(generated, data) -> None:
    panes, prices = generated
    cut = data.draw(st.integers(0, len(panes)))
    whole, parts = operators(), operators()
    idle_whole, idle_parts = IdleIndex(SETTINGS), IdleIndex(SETTINGS)
    expected = by_batch(whole, panes, prices, idle_whole)
    first = by_batch(parts, panes[:cut], prices[:cut], idle_parts)
    rest = by_batch(parts, panes[cut:], prices[cut:], idle_parts)
    assert [a + b for a, b in zip(first, rest, strict=True)] == expected
    assert states(parts) == states(whole)


@given(closed_panes(), st.data())
def test_snapshot_then_restore_then_the_rest_gives_the_uninterrupted_run(generated, data) -> None:
    panes, prices = generated
    cut = data.draw(st.integers(0, len(panes)))
    straight = operators()
    idle = IdleIndex(SETTINGS)
    expected = by_rows(straight, panes, prices, idle)
    before = operators()
    idle_before = IdleIndex(SETTINGS)
    first = by_rows(before, panes[:cut], prices[:cut], idle_before)
    restored = [type(op).from_state(state, SETTINGS) for op, state in zip(before, states(before), strict=True)]
    # wired as ``AuditState.from_state`` wires them: the SLA operator reads the restored allocation split's holds
    [holds] = [op.table for op in restored if isinstance(op, AllocationSplit)]
    for op in restored:
        if isinstance(op, SlaOperator):
            op.allocations = holds
        if isinstance(op, KernelCost):  # and the kernel split the auditor's bindings
            op.bindings = before[[type(o) for o in before].index(KernelCost)].bindings
    idle_after = IdleIndex.from_state(json.loads(json.dumps(idle_before.to_state())), SETTINGS)
    rest = by_rows(restored, panes[cut:], prices[cut:], idle_after)
    assert [a + b for a, b in zip(first, rest, strict=True)] == expected
    assert states(restored) == states(straight)


def test_every_operator_the_auditor_closes_panes_with_is_checked_here() -> None:
    """The list is the auditor's: the checks above see a new operator once it is added there."""
    names = [type(op).__name__ for op in operators()]
    assert names == ["CostSplit", "AllocationSplit", "KernelCost", "SlaOperator", "Efficiency", "HealthAudit"]
