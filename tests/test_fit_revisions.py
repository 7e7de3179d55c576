"""The weights fit sees every pane as it finally stands: a late sample that revises a closed pane (the default
6 h horizon) changes that pane's features; with revisions off the late sample is refused and the pane keeps its
first features. Both against a brute-force reading of the accepted samples, written apart from the pipeline.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpucost.fit import pane_features
from gpucost.schemas.codec import encode_event
from gpucost.schemas.events import GpuSample, ProcessSample
from gpucost.streams.audit import Auditor
from gpucost.streams.pane_totals import PaneColumns
from gpucost.streams.settings import AuditSettings

NS = 1_000_000_000
T0 = 1_767_571_200 * NS  # a pane boundary
PANES, STEP_S = 6, 10  # six 60 s panes of 10 s samples: the last passes the first two's lateness (120 s)


def fleet(powers: list[int], sms: list[int]) -> list[GpuSample | ProcessSample]:
    """One GPU with one process, a sample of each every 10 s."""
    out: list[GpuSample | ProcessSample] = []
    for i, (power, sm) in enumerate(zip(powers, sms)):
        ts = T0 + (i + 1) * STEP_S * NS - 1  # each covers (ts − 10 s, ts]: inside one pane
        out.append(
            GpuSample(
                node_id="n1",
                gpu_uuid="GPU-1",
                gpu_model="H100",
                ts_ns=ts,
                interval_s=STEP_S,
                sm_util_pct=sm,
                mem_bw_util_pct=0,
                mem_used_bytes=0,
                mem_total_bytes=1 << 30,
                power_w=power,
                temp_c=40,
            )
        )
        out.append(
            ProcessSample(
                node_id="n1",
                gpu_uuid="GPU-1",
                pid=7,
                ts_ns=ts,
                interval_s=STEP_S,
                sm_util_pct=sm,
                mem_bw_util_pct=0,
                mem_used_bytes=0,
            )
        )
    return out


def brute_force(events: list[GpuSample | ProcessSample]) -> np.ndarray:
    """Per pane with GPU samples, in pane order: mean power (W), mean SM % of the process over the covered time,
    and 0, 0 (no bandwidth, no NUMA events here)."""
    panes: dict[int, list[float]] = {}
    for ev in events:
        row = panes.setdefault((ev.ts_ns - T0) // (60 * NS), [0.0, 0.0, 0.0])
        if isinstance(ev, GpuSample):
            row[0] += ev.power_w * ev.interval_s
            row[2] += ev.interval_s
        else:
            row[1] += ev.sm_util_pct * ev.interval_s
    return np.array([[p / c, t / c, 0.0, 0.0] for _, (p, t, c) in sorted(panes.items()) if c > 0])


@pytest.mark.parametrize("horizon_s", [21_600, 0], ids=["R=6h", "R=0"])
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_a_revised_pane_reaches_the_fit(
    tmp_path_factory: pytest.TempPathFactory, horizon_s: int, data: st.DataObject
) -> None:
    n = PANES * 60 // STEP_S
    powers = data.draw(st.lists(st.integers(60, 700), min_size=n, max_size=n))
    sms = data.draw(st.lists(st.integers(0, 100), min_size=n, max_size=n))
    events = fleet(powers, sms)
    early = [i for i, ev in enumerate(events) if ev.ts_ns < T0 + 120 * NS]  # the first two panes
    late = set(data.draw(st.lists(st.sampled_from(early), min_size=1, unique=True)))
    order = [ev for i, ev in enumerate(events) if i not in late] + [events[i] for i in sorted(late)]
    path = tmp_path_factory.mktemp("fit") / "events.jsonl"
    path.write_text("".join(encode_event(ev) + "\n" for ev in order))
    got = pane_features([path], AuditSettings(revision_horizon_s=horizon_s))
    taken = events if horizon_s else [ev for i, ev in enumerate(events) if i not in late]
    want = brute_force(taken)
    assert np.allclose(np.column_stack([got.power_w, got.x]), want, rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("entry", ["rows", "batch"])
@pytest.mark.parametrize("horizon_s", [21_600, 0], ids=["R=6h", "R=0"])
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_every_close_path_calls_the_hook(entry: str, horizon_s: int, data: st.DataObject) -> None:
    """``Auditor.on_closed`` sees each pane as it finally stands, on the row entry and the batch entry: its
    covered ms, energy (µJ) and the process's Σ SM cp · ms, exactly, as the accepted samples sum them."""
    n = PANES * 60 // STEP_S
    events = fleet(
        data.draw(st.lists(st.integers(60, 700), min_size=n, max_size=n)),
        data.draw(st.lists(st.integers(0, 100), min_size=n, max_size=n)),
    )
    early = [i for i, ev in enumerate(events) if ev.ts_ns < T0 + 120 * NS]
    late = set(data.draw(st.lists(st.sampled_from(early), min_size=1, unique=True)))
    order = [ev for i, ev in enumerate(events) if i not in late] + [events[i] for i in sorted(late)]
    seen: dict[int, tuple[int, int, int]] = {}

    def hook(panes: PaneColumns) -> None:
        for j, start in enumerate(panes.pane_start_ns.tolist()):
            sm = sum(v for p, v in zip(panes.t_pane.tolist(), panes.t_sm.tolist()) if p == j)
            seen[start] = (int(panes.covered_ms[j]), int(panes.energy_uj[j]), sm)

    auditor = Auditor(AuditSettings(revision_horizon_s=horizon_s))
    auditor.on_closed = hook
    if entry == "rows":
        for ev in order:
            auditor.update(ev)
    else:
        auditor.ingest_lines([encode_event(ev).encode() for ev in order], lambda i: "test")
    auditor.finish()
    want: dict[int, list[int]] = {}
    for i, ev in enumerate(events):
        if horizon_s or i not in late:
            row = want.setdefault(ev.ts_ns - ev.ts_ns % (60 * NS), [0, 0, 0])
            if isinstance(ev, GpuSample):
                row[0] += STEP_S * 1000
                row[1] += round(ev.power_w * 1000) * STEP_S * 1000
            else:
                row[2] += round(ev.sm_util_pct * 100) * STEP_S * 1000
    assert {s: v for s, v in seen.items() if v[0]} == {s: tuple(v) for s, v in want.items() if v[0]}
