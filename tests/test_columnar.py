"""The batch path (``Auditor.ingest_batch``) against the row path (``Auditor.ingest``): same outputs,
in the same order, and the same state, over random streams cut into random batches, with bad rows,
late and duplicate events, a clock that puts some events in the future, and state restored between
batches."""
from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.arrow import EVENT_SCHEMA, events_table
from schemas.events import Event
from schemas.exact import round_scaled
from streams.audit import Auditor, Output
from schemas.codec import present_fields
from streams.columnar import exact_round
from streams.settings import AuditSettings
from tests.strategies import BASE_NS, NS, settings_st, streams

#: one field of a valid row, changed so that the row is refused (or, for some, still taken)
MUTATIONS: list[tuple[str, Any]] = [
    ("ts_ns", None), ("ts_ns", 5), ("ts_ns", 5_000_000_000 * NS), ("interval_s", 0.0004), ("interval_s", None),
    ("interval_s", math.nan), ("interval_s", 3600.5), ("sm_util_pct", 100.01), ("sm_util_pct", -1.0),
    ("sm_util_pct", math.inf), ("mem_bw_util_pct", None), ("mem_used_bytes", -1), ("mem_used_bytes", 3),
    ("mem_total_bytes", None), ("power_w", 10_001.0), ("temp_c", -61.0), ("pcie_tx_bytes_s", -5),
    ("pcie_rx_bytes_s", 7), ("gpu_uuid", ""), ("gpu_uuid", "G" * 257), ("gpu_uuid", None), ("node_id", None),
    ("gpu_model", ""), ("pid", -1), ("pid", 1 << 32), ("pid", None), ("hops", 65), ("latency_weight", -2),
    ("address", None), ("kind", "gpu_sampel"), ("team", "idle"), ("sla", "Platinum"), ("trace_hex", "zz"),
    ("usd_per_gpu_hour", None), ("node_id", "n" * 256),
]


def label(i: int) -> str:
    return f"events.parquet#{i + 1}"


def normalised(auditor: Auditor) -> dict[str, Any]:
    """The state, with the lists whose order carries no meaning sorted."""
    state = json.loads(json.dumps(auditor.to_state()))
    for pane in state["panes"]["open"]:
        pane[8].sort(key=json.dumps)
    state["panes"]["open"].sort(key=lambda p: (p[0], p[1]))
    for window in state["mae"]:
        window[2].sort()
    state["mae"].sort(key=json.dumps)
    state["bindings"].sort(key=json.dumps)
    return state


@st.composite
def rows_and_cuts(draw: st.DrawFn) -> tuple[AuditSettings, list[dict[str, Any]], list[int], int | None, list[bool]]:
    s = draw(settings_st())
    events: list[Event] = draw(streams())
    rows = events_table(events).to_pylist() if events else []
    if draw(st.booleans()):  # on a 30 s grid: events fall on pane ends and on each other's ts_ns
        for row in rows:
            if row["ts_ns"] is not None:
                row["ts_ns"] -= (row["ts_ns"] - BASE_NS) % (30 * NS)
    for _ in range(draw(st.integers(0, 12))):  # bindings and prices among the samples, not only before them
        if rows:
            rows.insert(draw(st.integers(0, len(rows) - 1)), rows.pop(draw(st.integers(0, len(rows) - 1))))
    for _ in range(draw(st.integers(0, 8))):
        if not rows:
            break
        bad = dict(rows[draw(st.integers(0, len(rows) - 1))])
        field, value = draw(st.sampled_from(MUTATIONS))
        bad[field] = value
        rows.insert(draw(st.integers(0, len(rows))), bad)
    cuts = sorted(draw(st.lists(st.integers(0, len(rows)), max_size=5)))
    clock = draw(st.one_of(st.none(), st.integers(0, 3 * 3600).map(lambda x: BASE_NS + x * NS)))
    restores = draw(st.lists(st.booleans(), min_size=len(cuts) + 1, max_size=len(cuts) + 1))
    return s, rows, cuts, clock, restores


@settings(max_examples=300, deadline=None)
@given(rows_and_cuts())
def test_batches_match_rows(case: tuple[AuditSettings, list[dict[str, Any]], list[int], int | None, list[bool]]) -> None:
    s, rows, cuts, clock_ns, restores = case
    clock = None if clock_ns is None else (lambda: clock_ns)
    by_row = Auditor(s, clock)
    want: list[Output] = []
    for i, row in enumerate(rows):
        want += by_row.ingest(present_fields(row), label(i))

    by_batch = Auditor(s, clock)
    got: list[Output] = []
    table = pa.Table.from_pylist(rows, schema=EVENT_SCHEMA)
    for lo, hi, restore in zip([0, *cuts], [*cuts, len(rows)], restores):
        if restore:  # a worker restarting from its committed state between batches
            by_batch = Auditor.from_state(s, json.loads(json.dumps(by_batch.to_state())), clock)
        for batch in table.slice(lo, hi - lo).to_batches():
            got += by_batch.ingest_batch(batch, lambda i, first=lo: label(first + i))
    assert got == want
    assert normalised(by_batch) == normalised(by_row)
    assert by_batch.finish() == by_row.finish()


@given(st.lists(st.one_of(st.integers(0, 100_000).map(lambda x: x / 1000), st.integers(1, 36_000_000).map(
    lambda x: x / 10_000), st.floats(0, 3600, allow_nan=False)), min_size=1))
def test_exact_round_is_round_scaled(values: list[float]) -> None:
    for scale in (100, 1000):
        assert exact_round(np.array(values), scale).tolist() == [round_scaled(v, scale) for v in values]
