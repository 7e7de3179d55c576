"""Each operator's batch entry against its own row entry, directly: the same records at the same
positions, and the same state, over random inputs cut into random batches.

(The whole audit's two paths are compared in tests/test_columnar.py; these hold each operator to
it alone, so that a drift shows where it is.)
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpucost.schemas.events import EbpfTrace, GpuSample, MemAccess, NumaEvent, ProcessSample, TenantBinding
from gpucost.streams.addresses import TakenAddresses
from gpucost.streams.mae import Mae
from gpucost.streams.pane_rules import KINDS
from gpucost.streams.pane_totals import PaneRows, PaneTotals
from gpucost.streams.panes import GpuPanes
from gpucost.streams.settings import AuditSettings
from gpucost.streams.tables import UNATTRIBUTED, BindingTable, Tenant
from tests.strategies import NS

T0 = 1_736_121_600 * 10**9


@st.composite
def mae_cases(draw: st.DrawFn) -> tuple[AuditSettings, list[tuple[int, int]], list[int]]:
    lo = draw(st.sampled_from([0, 1 << 12, (1 << 64) - (1 << 20)]))
    hi = draw(st.sampled_from([lo + 4096, lo + (1 << 32), 1 << 64]).filter(lambda h: h > lo))
    settings = AuditSettings(
        mae_window=draw(st.integers(1, 40)),
        mae_bins=draw(st.sampled_from([1, 7, 256, 1 << 16])),
        mae_lo=lo,
        mae_hi=min(hi, 1 << 64),
    )
    accesses = draw(st.lists(st.tuples(st.integers(0, 2), st.integers(0, (1 << 64) - 1)), max_size=200))
    cuts = sorted(draw(st.sets(st.integers(0, len(accesses)), max_size=5)))
    return settings, accesses, cuts


@given(mae_cases())
def test_mae_update_many_is_update_address_by_address(
    case: tuple[AuditSettings, list[tuple[int, int]], list[int]],
) -> None:
    settings, accesses, cuts = case
    by_row, by_batch = Mae(settings), Mae(settings)
    want = []
    for i, (pid, address) in enumerate(accesses):
        record = by_row.take(MemAccess(node_id="n", pid=pid, ts_ns=T0 + i, address=address))
        if record is not None:
            want.append((i, record))
    got = []
    for lo, hi in zip([0, *cuts], [*cuts, len(accesses)]):
        part = accesses[lo:hi]
        for pid in sorted({p for p, _ in part}):
            at = np.array([lo + k for k, (p, _) in enumerate(part) if p == pid], np.int64)
            address = np.array([a for p, a in part if p == pid], np.uint64)
            assert not by_batch.taken.verdicts_many(("n", pid), T0 + at, address)[0].any()  # all new: all taken
            got += [(int(at[k]), r) for k, r in by_batch.take_many(("n", pid), T0 + at, by_batch.bins_of(address))]
    assert sorted(got, key=lambda g: g[0]) == want
    assert normalised(by_batch) == normalised(by_row)


@given(
    st.lists(st.tuples(st.integers(0, 2), st.integers(0, 40), st.integers(0, 3)), max_size=80),
    st.lists(st.integers(0, 80), max_size=6),
    st.integers(0, 25),
)
def test_taken_addresses_batch_entry_is_its_row_entry(
    accesses: list[tuple[int, int, int]], cuts: list[int], keep: int
) -> None:
    """Addresses of three processes, out of order and repeated, through ``verdict``/``take`` one by one and
    through ``verdicts_many`` in batches cut anywhere: the same verdicts, the same latest times met, the same
    state. And each verdict is the rule's, by brute force over everything taken so far."""
    by_row, by_batch = TakenAddresses(keep), TakenAddresses(keep)
    want, taken = [], []
    for pid, ts, address in accesses:
        why = by_row.verdict(("n", pid), ts, address)
        mine = [(t, a) for p, t, a in taken if p == pid]
        brute = (
            None
            if not mine
            else "late"
            if ts < max(t for t, _ in mine) - keep
            else "duplicate"
            if (ts, address) in mine
            else None
        )
        assert why == brute
        want.append((why, by_row.latest(("n", pid))))
        if why is None:
            by_row.take(("n", pid), ts, address)
            taken.append((pid, ts, address))
    got: list[tuple[str | None, int | None] | None] = [None] * len(accesses)
    for lo, hi in zip([0, *sorted(set(cuts))], [*sorted(set(cuts)), len(accesses)]):
        for pid in {p for p, _, _ in accesses[lo:hi]}:
            at = [i for i in range(lo, min(hi, len(accesses))) if accesses[i][0] == pid]
            codes, latest = by_batch.verdicts_many(
                ("n", pid),
                np.array([accesses[i][1] for i in at], np.int64),
                np.array([accesses[i][2] for i in at], np.uint64),
            )
            for i, code, met in zip(at, codes.tolist(), latest.tolist()):
                got[i] = ([None, "duplicate", "late"][code], met)
    assert [(w, m if w == "late" else None) for w, m in want] == [(g, m if g == "late" else None) for g, m in got]
    assert sorted(by_batch.to_state()) == sorted(by_row.to_state())


def normalised(mae: Mae) -> str:
    """The state with each window's bins in bin order (their order carries no meaning)."""
    state = mae.to_state()
    return json.dumps(
        [sorted([n, p, sorted(counts), *rest] for n, p, counts, *rest in state["open"]), sorted(state["taken"])]
    )


@given(
    st.lists(st.tuples(st.integers(0, 50), st.sampled_from(["a", "b", "c"])), max_size=30),
    st.lists(st.integers(-5, 60), max_size=40),
)
def test_binding_lookup_many_is_lookup_time_by_time(bindings: list[tuple[int, str]], times: list[int]) -> None:
    table = BindingTable()
    for ts, team in bindings:
        table.take(TenantBinding(node_id="n", pid=1, ts_ns=T0 + ts, team=team, env="", app="", tier="", sla="Gold"))
    tenants, at = table.lookup_many("n", 1, T0 + np.array(times, np.int64))
    assert [UNATTRIBUTED if i < 0 else tenants[i] for i in at.tolist()] == [table.lookup("n", 1, T0 + t) for t in times]
    assert table.lookup_many("n", 2, T0 + np.array(times, np.int64))[0] == []  # another process has none


TENANTS = [UNATTRIBUTED, Tenant.named("a"), Tenant.named("b")]


Keyed = GpuSample | ProcessSample | NumaEvent | EbpfTrace


def pane_rows(events: list[Keyed], first_row: int) -> PaneRows:
    """The events as ``GpuPanes.add_many`` takes them: by GPU (in order of first appearance), then arrival."""
    gpus = list(dict.fromkeys(e.gpu_uuid for e in events))
    order = sorted(range(len(events)), key=lambda i: (gpus.index(events[i].gpu_uuid), i))
    ev = [events[i] for i in order]
    ends = np.cumsum([sum(e.gpu_uuid == g for e in ev) for g in gpus]).astype(np.int64)
    nodes, models = sorted({e.node_id for e in ev}), sorted({e.gpu_model for e in ev if isinstance(e, GpuSample)})

    def ints(values: list[int]) -> np.ndarray:
        return np.array(values, np.int64)

    sample = [isinstance(e, (GpuSample, ProcessSample)) for e in ev]
    return PaneRows(
        first_row + ints(order),
        gpus,
        np.r_[0, ends[:-1]].astype(np.int64),
        ends,
        ints([KINDS.index(e.kind) for e in ev]),
        ints([-1 if isinstance(e, GpuSample) else e.pid for e in ev]),
        ints([e.ts_ns for e in ev]),
        ints([e.interval_ms if s else 0 for e, s in zip(ev, sample)]),
        ints([e.sm_util_cp if s else 0 for e, s in zip(ev, sample)]),
        ints([e.mem_bw_util_cp if s else 0 for e, s in zip(ev, sample)]),
        ints([e.power_mw if isinstance(e, GpuSample) else 0 for e in ev]),
        *(
            ints([-1 if not isinstance(e, GpuSample) or getattr(e, f) is None else getattr(e, f) for e in ev])
            for f in ("tensor_active_cp", "dram_active_cp", "fault_fatal", "fault_warning")
        ),
        ints([int(bool(e.power_estimated)) if isinstance(e, GpuSample) else 0 for e in ev]),
        ints([e.hops * e.latency_weight if isinstance(e, NumaEvent) else 0 for e in ev]),
        ints([nodes.index(e.node_id) for e in ev]),
        nodes,
        ints([models.index(e.gpu_model) if isinstance(e, GpuSample) else -1 for e in ev]),
        models,
        {p: e.flops_64b for p, e in enumerate(ev) if isinstance(e, EbpfTrace) and e.trace_source == "blas"},
    )


@st.composite
def gpu_keyed(draw: st.DrawFn) -> tuple[AuditSettings, list[Keyed]]:
    """Each source (GPU, kind, pid) a run of events 0 to 10 s apart on a 2.5 s grid (0: a re-send, a
    duplicate; closer than three quarters of the interval: an overlap), a few far ahead (jumps); they
    arrive after random delays, some past the lateness. Times meet pane ends, and pane ends plus the
    lateness, exactly; utilisation lies at and around the idle threshold. Traces (BLAS calls and kernel
    launches) come at the same times, some repeated: they are never duplicates and move no watermark."""
    settings = AuditSettings(
        pane_s=60,
        lateness_s=draw(st.sampled_from([0, 60])),
        max_jump_s=draw(st.sampled_from([30, 600])),
        idle_threshold_pct=5,
    )
    step = st.sampled_from([0, 1, 2, 2, 4]).map(lambda k: k * 2_500_000_000)
    pct = st.sampled_from([0.0, 4.99, 5.0, 5.01, 50.0])
    interval = st.sampled_from([1.0, 5.0, 10.0])
    events: list[Keyed] = []
    for gpu in ["GPU-00000000-0000-0000-0000-000000000000", "GPU-00000000-0000-0000-0000-000000000001"][
        : draw(st.integers(1, 2))
    ]:
        node = f"node-{gpu[-1]}"
        for kind, pid in [("gpu_sample", -1), *((k, p) for k in KINDS[1:] for p in (1, 2, 3))]:
            ts = T0 + draw(step)
            for _ in range(draw(st.integers(0, 12))):
                ts += draw(step) + draw(st.sampled_from([0] * 19 + [3600 * NS]))
                if kind == "gpu_sample":
                    events.append(
                        GpuSample(
                            node_id=node,
                            gpu_uuid=gpu,
                            gpu_model=draw(st.sampled_from(["H100", "H200"])),
                            ts_ns=ts,
                            interval_s=draw(interval),
                            sm_util_pct=draw(pct),
                            mem_bw_util_pct=draw(pct),
                            mem_used_bytes=1,
                            mem_total_bytes=2,
                            power_w=draw(st.sampled_from([0.0, 61.0005, 350.25, 700.0])),
                            temp_c=40.0,
                            tensor_active_pct=draw(st.sampled_from([None, 0.0, 50.005])),
                            dram_active_pct=draw(st.sampled_from([None, 12.5])),
                            power_estimated=draw(st.sampled_from([None, None, False, True])),
                        )
                    )
                elif kind == "process_sample":
                    events.append(
                        ProcessSample(
                            node_id=node,
                            gpu_uuid=gpu,
                            pid=pid,
                            ts_ns=ts,
                            interval_s=draw(interval),
                            sm_util_pct=draw(pct),
                            mem_bw_util_pct=draw(pct),
                            mem_used_bytes=1,
                        )
                    )
                elif kind == "ebpf_trace":
                    events.append(
                        EbpfTrace(
                            node_id=node,
                            gpu_uuid=gpu,
                            pid=pid,
                            ts_ns=ts,
                            sm_util_pct=50,
                            trace_source=draw(st.sampled_from(["blas", "launch"])),
                            flops_64b=draw(st.sampled_from([0, 7, (1 << 64) - 1])),
                        )
                    )
                else:
                    events.append(
                        NumaEvent(
                            node_id=node,
                            gpu_uuid=gpu,
                            pid=pid,
                            ts_ns=ts,
                            hops=draw(st.integers(0, 3)),
                            latency_weight=draw(st.integers(0, 40)),
                        )
                    )
    delay = st.sampled_from([0, 0, 0, 1, 4, 16, 40]).map(lambda k: k * 2_500_000_000)  # up to 100 s
    arrival = [e.ts_ns + draw(delay) for e in events]
    return settings, [e for _, _, e in sorted(zip(arrival, draw(st.permutations(range(len(events)))), events))]


def closed(pane: PaneTotals) -> tuple[object, ...]:
    """A closed pane's totals (what is billed; its counted times are dropped once it closes)."""
    return (
        pane.gpu_uuid,
        pane.pane_start_ns,
        pane.node_id,
        pane.gpu_model,
        pane.covered_ms,
        pane.idle_ms,
        pane.tenant_events,
        pane.energy_uj,
        pane.busy_cp_ms,
        pane.placed,
        pane.bw_cp_ms,
        pane.tensor_cp_ms,
        pane.tensor_ms,
        pane.dram_cp_ms,
        pane.dram_ms,
        sorted(pane.flops.items()),
        sorted((k, t.sm, t.bw, t.numa, t.samples) for k, t in pane.tenants.items()),
    )


def normalised_panes(panes: GpuPanes) -> str:
    state = panes.to_state()
    state["open"] = sorted([*p[:8], sorted(p[8]), *p[9:]] for p in state["open"])
    return json.dumps(state, sort_keys=True)


@pytest.mark.slow
@given(gpu_keyed(), st.data())
def test_panes_batch_entry_is_the_row_entry_event_by_event(
    case: tuple[AuditSettings, list[Keyed]], data: st.DataObject
) -> None:
    """Late, duplicate and overlapping rows, the panes closed (by which row) and the state left: the
    same through ``judge_many``/``add_many`` over random cuts as through the row entry, event by event."""
    settings, events = case
    tenant_of = [TENANTS[e.pid % len(TENANTS)] if not isinstance(e, GpuSample) else None for e in events]
    by_row, by_batch = GpuPanes(settings), GpuPanes(settings)
    want_verdicts, want_closes = [], []
    for i, e in enumerate(events):
        if by_row.is_late(e.gpu_uuid, e.ts_ns):
            want_verdicts.append((i, "late", by_row.watermark(e.gpu_uuid)))
            continue
        refused = by_row.admit(e)  # a blas call its pane holds already is a duplicate too
        if refused is not None:
            want_verdicts.append((i, refused, None))
            continue
        if isinstance(e, EbpfTrace):
            by_row.take(e)  # a trace moves no watermark
            continue
        by_row.take(e, tenant_of[i] or UNATTRIBUTED)
        want_closes += [(i, closed(p)) for p in by_row.advance(e.gpu_uuid, e.ts_ns)]

    cuts = sorted(data.draw(st.sets(st.integers(0, len(events)), max_size=4)))
    got_verdicts, got_closes = [], []
    for lo, hi in zip([0, *cuts], [*cuts, len(events)]):
        if lo == hi:
            continue
        rows = pane_rows(events[lo:hi], lo)
        verdicts = by_batch.judge_many(rows)
        late = np.flatnonzero(verdicts.late)
        got_verdicts += [
            (int(rows.row[p]), "late", w) for p, w in zip(late, by_batch.watermarks_before(verdicts, late))
        ]
        got_verdicts += [
            (int(rows.row[p]), why, None)
            for why, mask in (("duplicate", verdicts.duplicate), ("overlap", verdicts.overlap))
            for p in np.flatnonzero(mask)
        ]
        tenants = [tenant_of[r] or UNATTRIBUTED for r in rows.row.tolist()]
        at, columns = by_batch.add_many(
            rows, verdicts, np.array([TENANTS.index(t) for t in tenants], np.int64), TENANTS
        )
        got_closes += [(int(r), closed(p)) for r, p in zip(at.tolist(), columns.totals())]
    assert sorted(got_verdicts) == sorted(want_verdicts)
    assert sorted(got_closes, key=repr) == sorted(want_closes, key=repr)
    assert normalised_panes(by_batch) == normalised_panes(by_row)
