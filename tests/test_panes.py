"""Pane and watermark boundaries exactly as docs/definitions.md ("Time, panes and watermarks") states them."""

from __future__ import annotations

import json
from unittest.mock import patch

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from gpucost.schemas.events import GpuSample
from gpucost.streams import idle_index
from gpucost.streams.idle_index import IdleIndex, IdleWindow
from gpucost.streams.pane_rules import jump, last_pane_ns, pane_start_ns
from gpucost.streams.pane_totals import PaneTotals
from gpucost.streams.panes import GpuPanes
from gpucost.streams.settings import AuditSettings

NS = 1_000_000_000
P = 60 * NS
L = 120 * NS
T0 = 1_767_571_200 * NS  # a pane boundary


def sample(ts_ns: int) -> GpuSample:
    return GpuSample(
        node_id="n",
        gpu_uuid="GPU-x",
        gpu_model="H100",
        ts_ns=ts_ns,
        interval_s=1.0,
        sm_util_pct=50.0,
        mem_bw_util_pct=1.0,
        mem_used_bytes=0,
        mem_total_bytes=1,
        power_w=1.0,
        temp_c=30.0,
    )


@given(st.integers(-(10**12), 10**12), st.sampled_from([1, 7, 60 * NS]))
def test_pane_contains_its_event(offset: int, pane_ns: int) -> None:
    ts = T0 + offset
    start = pane_start_ns(ts, pane_ns)
    assert start <= ts < start + pane_ns and start % pane_ns == 0


@given(st.integers(-(10**12), 10**12), st.integers(0, 40), st.sampled_from([1, 3, 7, 60 * NS]), st.data())
def test_an_interval_touches_the_panes_of_its_instants(
    offset: int, panes: int, pane_ns: int, data: st.DataObject
) -> None:
    """The kernels' rule, read as ints (the row path) and as arrays (the batch path's cuts), against the panes of
    the interval's first and last instants; a length of 0 touches its start's pane."""
    start = T0 + offset
    end = start + data.draw(st.sampled_from([0, 1, panes * pane_ns, panes * pane_ns + data.draw(st.integers(0, 9))]))
    want = pane_start_ns(end - 1 if end > start else start, pane_ns)
    assert last_pane_ns(start, end, pane_ns) == want
    assert last_pane_ns(np.array([start], np.int64), np.array([end], np.int64), pane_ns).tolist() == [want]


def test_pane_closes_when_watermark_reaches_its_end_and_later_events_for_it_are_late() -> None:
    panes = GpuPanes(AuditSettings(pane_s=P // NS, lateness_s=L // NS, max_jump_s=3600))
    panes.take(sample(T0 + 5 * NS))
    assert panes.advance("GPU-x", T0 + 5 * NS) == []
    # watermark = (T0 + P + L - 1ns) - L: one ns short of the pane's end, so still open
    assert panes.advance("GPU-x", T0 + P + L - 1) == []
    assert not panes.is_late("GPU-x", T0 + P - 1)
    # watermark = T0 + P: exactly the end, so the pane [T0, T0+P) closes
    closed = panes.advance("GPU-x", T0 + P + L)
    assert [(p.pane_start_ns, p.covered_ms) for p in closed] == [(T0, 1000)]
    assert panes.is_late("GPU-x", T0 + P - 1)
    assert not panes.is_late("GPU-x", T0 + P)  # the next pane is open


def test_watermarks_are_per_gpu() -> None:
    panes = GpuPanes(AuditSettings(pane_s=P // NS, lateness_s=L // NS, max_jump_s=3600))
    panes.advance("GPU-a", T0 + 10 * P)
    assert panes.is_late("GPU-a", T0)
    assert not panes.is_late("GPU-b", T0)  # another GPU's clock never makes this one late


def test_idle_window_survives_panes_beyond_32_bits() -> None:
    """A pane holding more than 2^32 ms (forged or absurd intervals) widens the ring, losing nothing."""
    index = IdleIndex(AuditSettings(window_h=1, pane_s=1200))  # a window of three panes
    sizes = [(1, 60_000), (5_000_000_000, 6_000_000_000), (7, 60_000), (0, 60_000)]
    got = []
    for k, (idle, covered) in enumerate(sizes):
        pane = PaneTotals("GPU-1", T0 + k * 1200 * NS, T0 + (k + 1) * 1200 * NS, "n", "H100", covered, idle)
        rec = index.on_close(pane)
        got.append((rec.idle_ms_72h, rec.covered_ms_72h))
    want = [
        (sum(i for i, _ in sizes[max(0, k - 2) : k + 1]), sum(c for _, c in sizes[max(0, k - 2) : k + 1]))
        for k in range(len(sizes))
    ]
    assert got == want


@given(
    st.integers(1, 12),
    st.lists(
        st.lists(
            st.tuples(
                st.sampled_from([1, 1, 1, 2, 3, 11, 12, 13, 25]),
                st.integers(0, 50),
                st.integers(0, 50),
                st.sampled_from([0, 0, 0, 0, 1 << 33]),
            ),
            min_size=1,
            max_size=6,
        ),
        min_size=1,
        max_size=6,
    ),
    st.sampled_from([0, 3, 64]),
    st.sampled_from([0, 0, 1, 4, 30]),
)
def test_rolling_panes_in_at_once_is_rolling_them_one_by_one(
    n: int, calls: list[list[tuple[int, int, int, int]]], sparse_panes: int, keep: int
) -> None:
    """Sums after each pane and the state left behind (with a revision horizon: the panes that left the window
    and are kept), over gaps shorter and longer than the window, a pane past 32 bits, and windows held as lists
    and as rings (``SPARSE_PANES``)."""
    with patch.object(idle_index, "SPARSE_PANES", sparse_panes):
        roll_both(n, calls, keep)


def roll_both(n: int, calls: list[list[tuple[int, int, int, int]]], keep: int = 0) -> None:
    one, many = IdleWindow(n, keep), IdleWindow(n, keep)
    k = 0
    all_ks: list[int] = []
    all_idle: list[int] = []
    all_covered: list[int] = []
    for call in calls:
        ks, idle, covered = [], [], []
        for step, i, extra, big in call:
            k += step
            ks.append(k)
            idle.append(i)
            covered.append(i + extra + big)
        all_ks += ks
        all_idle += idle
        all_covered += covered
        k_last = k
        want = []
        for pane, i, c in zip(ks, idle, covered):
            one.roll(pane, i, c)
            want.append((one.idle_sum, one.covered_sum))
        got = many.roll_many(np.array(ks), np.array(idle, np.int64), np.array(covered, np.int64))
        assert list(zip(got[0].tolist(), got[1].tolist())) == want
        assert many.to_state() == one.to_state()
        brute = [(k, i, c) for k, i, c in zip(all_ks, all_idle, all_covered) if k > k_last - n]
        assert (one.idle_sum, one.covered_sum) == (sum(i for _, i, _ in brute), sum(c for _, _, c in brute))
        restored = IdleWindow.from_state(json.loads(json.dumps(one.to_state())), n, keep)
        assert restored.to_state() == one.to_state()


@given(
    st.sets(
        st.tuples(
            st.sampled_from(["gpu_sample", "process_sample", "numa_event"]), st.integers(-1, 4), st.integers(0, P - 1)
        ),
        max_size=60,
    )
)
def test_a_panes_seen_events_survive_its_state_through_json(seen: set[tuple[str, int, int]]) -> None:
    """``seen`` is written as gaps between times; what comes back is the same set, and a state written
    before the gaps (one ``[kind, pid, ts_ns]`` each) still reads."""

    pane = PaneTotals("GPU-x", T0, T0 + P, "n", "H100", 1, 0, 0)
    for kind, pid, at in seen:
        pane.remember(kind, pid, T0 + at)
    assert {(k, p, t) for (k, p), times in pane.seen.items() for t in times} == {(k, p, T0 + at) for k, p, at in seen}
    state = json.loads(json.dumps(pane.to_state()))
    assert PaneTotals.from_state(state).seen == pane.seen
    state[9] = [[kind, pid, T0 + at] for kind, pid, at in sorted(seen)]  # the form written before
    assert PaneTotals.from_state(state).seen == pane.seen
    if len(seen) > 1:
        assert len(json.dumps(pane.to_state())) < len(json.dumps(state))


@given(
    st.one_of(st.none(), st.integers(0, 10**4)),
    st.one_of(st.none(), st.integers(0, 10**4)),
    st.integers(0, 10**4),
    st.integers(1, 600),
)
def test_a_watermark_never_moves_back_whatever_pending_jump_it_holds(
    max_ts: int | None, pending: int | None, ts: int, max_jump: int
) -> None:
    """From a review: a silent close moves a GPU's largest time past its pending jump; the next jump then took that
    pending jump, below the largest, as the new largest, and a pane already billed opened and was billed again. The
    largest never moves back, and a pending jump is held only above it."""
    top, held = jump(max_ts, pending, ts, max_jump)
    assert top is not None and top >= (ts if max_ts is None else max_ts)
    assert top >= ts or (max_ts is not None and ts > max_ts + max_jump)  # an event far ahead is held, not taken
    assert held is None or held > top
