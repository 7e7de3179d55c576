"""The health audit against an independent recomputation from the raw events.

The reference never calls the operator: DuckDB sums the raw events per window (energy, busy
and idle time, the scheduling deviation per pane, the idle index at the window's last pane),
and a transition table written from docs/definitions.md's "Health audit" drives the breaker. Fleets are scripted
per GPU and window (tests/support/health_fleet.py) so that every grade and every breaker state is reached, including
``removed`` and back, skipped windows, a spare with no busy time and a model missing from
the peak table; a property test draws the scripts at random. Both paths are checked.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.health_fleet import (
    BEHAVIOURS,
    H_S,
    MODELS,
    NS,
    SCRIPTS,
    T0,
    audit_settings,
    by_batches,
    by_rows,
    fleet,
)
from tests.support.health_oracle import checked, reference


@pytest.mark.parametrize("path", [by_rows, by_batches], ids=["rows", "batches"])
def test_every_health_record_is_the_raw_events_recomputed(path: Any) -> None:
    s = audit_settings()
    events = fleet(SCRIPTS)
    key = b"k" * 32
    got = checked(path(events, s, key), key)
    want = reference(events, s)
    assert got == want
    # the scripts reach every grade and every breaker state, skip windows, and leave a GPU unjudged
    assert {r["grade"] for r in got} == {"excellent", "good", "needs_optimisation", "idle"}
    assert {r["breaker_state"] for r in got} == {"probation", "in_service", "observation", "removed"}
    states = [r["breaker_state"] for r in got if r["gpu_uuid"] == "GPU-h100"]
    assert states.index("removed") < len(states) - 1 - states[::-1].index("in_service"), "never back from removed"
    assert any(r["windows_skipped"] for r in got) and any(r["kw_per_tops"] is None for r in got)
    assert {r["fail_reasons"][0] for r in got if r["fail_reasons"]} == {"grade", "sched_deviation", "coverage"}
    t4 = {(r["window_start_ns"] - T0) // (H_S * NS): r for r in got if r["gpu_uuid"] == "GPU-t4"}
    at_thresholds = [(t4[w]["kw_per_tops"], t4[w]["grade"]) for w in (11, 12)]
    assert at_thresholds == [(0.18, "good"), (0.25, "good")]


@pytest.mark.slow
@settings(max_examples=25, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(sorted(MODELS)),
        st.lists(st.sampled_from(sorted(BEHAVIOURS)), min_size=1, max_size=8),
        min_size=1,
        max_size=3,
    ),
    st.sampled_from([0, 1, 3]),
    st.sampled_from([1, 2]),
)
def test_random_fleets_recomputed_on_both_paths(scripts: dict[str, list[str]], admission_h: int, readmit: int) -> None:
    s = audit_settings(admission_h=admission_h, readmit_passes=readmit)
    events = fleet(scripts)
    want = reference(events, s)
    assert checked(by_rows(events, s)) == want
    assert checked(by_batches(events, s)) == want
