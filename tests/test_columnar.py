"""The batch paths (``Auditor.ingest_batch`` for Parquet, ``Auditor.ingest_lines`` for JSON Lines)
against the row path (``Auditor.ingest``): same outputs, in the same order, and the same state, over
random streams cut into random batches, with bad rows and odd JSON, late and duplicate events, a
clock that puts some events in the future, and state restored between batches."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpucost.producers.simulate import FleetSpec, simulate
from gpucost.schemas.arrow import EVENT_SCHEMA, events_table, wire_rows
from gpucost.schemas.blocks import expand
from gpucost.schemas.codec import encode_event, present_fields
from gpucost.schemas.events import TS_MAX_NS, TS_MIN_NS, Event, GpuSample, ProcessSample
from gpucost.schemas.exact import exact_round, round_scaled
from gpucost.schemas.records import DeadLetter, Output
from gpucost.streams import columnar
from gpucost.streams.audit import Auditor
from gpucost.streams.batch import FEW_CLOSES
from gpucost.streams.json_lines import read_lines
from gpucost.streams.settings import AuditSettings
from tests.strategies import BASE_NS, NS, settings_st, streams
from tests.support.batch_path import closing_at, label, normalised

#: one field of a valid row, changed so that the row is refused (or, for some, still taken)
MUTATIONS: list[tuple[str, Any]] = [
    ("ts_ns", None),
    ("ts_ns", 5),
    ("ts_ns", 5_000_000_000 * NS),
    ("interval_s", 0.0004),
    ("interval_s", None),
    ("interval_s", math.nan),
    ("interval_s", 3600.5),
    ("sm_util_pct", 100.01),
    ("sm_util_pct", -1.0),
    ("sm_util_pct", math.inf),
    ("mem_bw_util_pct", None),
    ("mem_used_bytes", -1),
    ("mem_used_bytes", 3),
    ("mem_total_bytes", None),
    ("power_w", 10_001.0),
    ("temp_c", -61.0),
    ("pcie_tx_bytes_s", -5),
    ("pcie_rx_bytes_s", 7),
    ("gpu_uuid", ""),
    ("gpu_uuid", "G" * 257),
    ("gpu_uuid", None),
    ("node_id", None),
    ("gpu_model", ""),
    ("pid", -1),
    ("pid", 1 << 32),
    ("pid", None),
    ("hops", 65),
    ("latency_weight", -2),
    ("address", None),
    ("kind", "gpu_sampel"),
    ("team", "idle"),
    ("sla", "Platinum"),
    ("trace_hex", "zz"),
    ("usd_per_gpu_hour", None),
    ("node_id", "n" * 256),
]


#: whole lines that Arrow's JSON reader and Python's json may read differently (or refuse)
ODD_LINES: list[bytes] = [
    b'{"kind":"gpu_sample"',
    b"[1, 2]",
    b'"gpu_sample"',
    b'{"kind":"mem_access","node_id":"\xff","pid":1,"ts_ns":1767571200000000000,"address":5}',
    b'{"kind":"mem_access","node_id":"n","pid":1,"ts_ns":1767571200000000000,"address":5} {"kind":"x"}',
    b'{"kind":"mem_access","node_id":"n","pid":1,"ts_ns":1767571200000000000,"address":5,'
    b'"extra":' + b"[" * 3000 + b"]" * 3000 + b"}",
    b'{"kind":"mem_access","node_id":"n","pid":1,"pid":2,"ts_ns":1767571200000000000,"address":5}',
    b'\xef\xbb\xbf{"kind":"mem_access","node_id":"n","pid":1,"ts_ns":1767571200000000000,"address":5}',
]
#: one field of a valid line, given a JSON value of another type
ODD_VALUES: list[tuple[str, bytes]] = [
    ("pid", b"1.0"),
    ("pid", b'"1"'),
    ("pid", b"true"),
    ("ts_ns", b"1.7e18"),
    ("sm_util_pct", b"NaN"),
    ("sm_util_pct", b"Infinity"),
    ("sm_util_pct", b"50"),
    ("interval_s", b"10"),
    ("node_id", b"7"),
    ("gpu_uuid", b"null"),
    ("address", b"-1"),
    ("usd_per_gpu_hour", b"1.1234567"),
    ("hops", b"1e1"),
]


def as_line(row: dict[str, Any]) -> bytes:
    return json.dumps(present_fields(row), default=str).encode()


def odd_value(line: bytes, field: str, value: bytes) -> bytes:
    """The line with ``field`` set to the raw JSON ``value`` (last, so it is the one Python keeps)."""
    obj = {k: v for k, v in json.loads(line).items() if k != field}
    return json.dumps(obj).encode()[:-1] + b', "' + field.encode() + b'": ' + value + b"}"


Case = tuple[AuditSettings, list[Any], list[int], int | None, list[bool]]


@st.composite
def cases(draw: st.DrawFn, form: str) -> Case:
    """Settings, the inputs (Parquet rows or JSON lines), where batches end, the clock, and before
    which batches the state is restored from its JSON."""
    s = draw(settings_st(revisions=True))
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
    inputs: list[Any] = rows
    if form == "json":
        inputs = [as_line(r) for r in rows]
        for _ in range(draw(st.integers(0, 6)) if rows else 0):
            odd = (
                draw(st.sampled_from(ODD_LINES))
                if draw(st.booleans())
                else odd_value(as_line(draw(st.sampled_from(rows))), *draw(st.sampled_from(ODD_VALUES)))
            )
            inputs.insert(draw(st.integers(0, len(inputs))), odd)
    cuts = sorted(draw(st.lists(st.integers(0, len(inputs)), max_size=5)))
    clock = draw(st.one_of(st.none(), st.integers(0, 3 * 3600).map(lambda x: BASE_NS + x * NS)))
    restores = draw(st.lists(st.booleans(), min_size=len(cuts) + 1, max_size=len(cuts) + 1))
    return s, inputs, cuts, clock, restores


def check(case: Case, form: str) -> None:
    s, inputs, cuts, clock_ns, restores = case
    clock = None if clock_ns is None else (lambda: clock_ns)
    by_row = Auditor(s, clock)
    want: list[Output] = []
    for i, item in enumerate(inputs):
        want += by_row.ingest(present_fields(item) if form == "parquet" else item, label(i))

    by_batch = Auditor(s, clock)
    got: list[Output] = []
    table = pa.Table.from_pylist(inputs, schema=EVENT_SCHEMA) if form == "parquet" else None
    for lo, hi, restore in zip([0, *cuts], [*cuts, len(inputs)], restores):
        if restore:  # a worker restarting from its committed state between batches
            by_batch = Auditor.from_state(json.loads(json.dumps(by_batch.to_state())), s, clock)
        if table is None:
            got += expand(by_batch.ingest_lines(inputs[lo:hi], lambda i, first=lo: label(first + i)))
            continue
        for batch in table.slice(lo, hi - lo).to_batches():
            got += expand(by_batch.ingest_batch(batch, lambda i, first=lo: label(first + i)))
    assert got == want
    # equal models can still differ on the wire (a price of 2.5 against one of 2.500000)
    assert [r.model_dump_json() for r in got] == [r.model_dump_json() for r in want]
    assert normalised(by_batch) == normalised(by_row)
    assert by_batch.finish() == by_row.finish()


#: a batch closes its panes one by one below this many, as blocks from it: each way, for every batch
CLOSING = pytest.mark.parametrize("few_closes", [0, 1 << 30], ids=["blocks", "one-by-one"])


@pytest.mark.slow
@CLOSING
@settings(max_examples=300, deadline=None)
@given(case=cases("parquet"))
def test_parquet_batches_match_rows(case: Case, few_closes: int) -> None:
    with closing_at(few_closes):
        check(case, "parquet")


@pytest.mark.slow
@CLOSING
@settings(max_examples=200, deadline=None)
@given(case=cases("json"))
def test_json_batches_match_lines(case: Case, few_closes: int) -> None:
    with closing_at(few_closes):
        check(case, "json")


@pytest.mark.slow
@settings(max_examples=50, deadline=None)
@given(case=cases("json"))
def test_json_batches_below_few_lines_go_row_by_row_with_the_same_outputs(case: Case) -> None:
    """Small batches take the row path (a live poll's line or two), larger ones the batch path, in one
    stream: a threshold of 8 sends these tests' batches both ways."""
    with closing_at(FEW_CLOSES, few_lines=8):
        check(case, "json")


@given(
    st.lists(
        st.one_of(
            st.integers(0, 100_000).map(lambda x: x / 1000),
            st.integers(1, 36_000_000).map(lambda x: x / 10_000),
            st.floats(0, 3600, allow_nan=False),
        ),
        min_size=1,
    )
)
def test_exact_round_is_round_scaled(values: list[float]) -> None:
    for scale in (100, 1000):
        assert exact_round(np.array(values), scale).tolist() == [round_scaled(v, scale) for v in values]


FLEET_LINES = [encode_event(e).encode() for e in simulate(FleetSpec(gpus=2, hours=1, interval_s=10))]


@pytest.mark.slow
@settings(max_examples=15, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, len(FLEET_LINES)),
            st.one_of(
                st.sampled_from(ODD_LINES),
                st.sampled_from(ODD_VALUES).map(lambda fv: odd_value(FLEET_LINES[-1], *fv)),
                st.integers(70_000, 300_000).map(lambda n: b'{"kind":"gpu_sample","node_id":"' + b"n" * n + b'"}'),
            ),
        ),
        max_size=12,
    )
)
def test_json_parsed_in_blocks_side_by_side_matches_lines(odd: list[tuple[int, bytes]]) -> None:
    """Hundreds of kilobytes of lines, which Arrow's reader parses in blocks on every core, with odd
    lines anywhere (one longer than a block would be): the row path's outputs, in order."""
    lines = list(FLEET_LINES)
    for at, line in sorted(odd, reverse=True):
        lines.insert(at, line)
    assert sum(map(len, lines)) > 4 * (1 << 16)
    by_row = Auditor(AuditSettings())
    want = [out for i, line in enumerate(lines) for out in by_row.ingest(line, label(i))]
    got = expand(Auditor(AuditSettings()).ingest_lines(lines, label))
    assert [r.model_dump_json() for r in got] == [r.model_dump_json() for r in want]


@pytest.mark.slow
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["GPU-0", "GPU-1"]),
            st.sampled_from([TS_MIN_NS, BASE_NS, TS_MAX_NS - 3600 * NS]),
            st.integers(0, 600),
        ),
        min_size=1,
        max_size=40,
    ),
    st.lists(st.booleans(), min_size=3, max_size=3),
)
@settings(max_examples=50, deadline=None)
def test_a_batch_spanning_a_century_matches_rows(samples: list[tuple[str, int, int]], restores: list[bool]) -> None:
    """Times from 2000 to 2099 in one batch: too far apart for the watermark's levels to sit beside the
    GPU in 64 bits, so the batch ranks its distinct times instead. Same outputs and state as the rows."""
    events = []
    for gpu, base, offset_s in samples:
        events.append(
            GpuSample(
                node_id="n",
                gpu_uuid=gpu,
                gpu_model="H100",
                ts_ns=base + offset_s * NS,
                interval_s=10.0,
                sm_util_pct=float(offset_s % 101),
                mem_bw_util_pct=1.0,
                mem_used_bytes=0,
                mem_total_bytes=1,
                power_w=1.0,
                temp_c=30.0,
            )
        )
        events.append(
            ProcessSample(
                node_id="n",
                gpu_uuid=gpu,
                pid=offset_s % 3,
                ts_ns=base + offset_s * NS,
                interval_s=10.0,
                sm_util_pct=50.0,
                mem_bw_util_pct=1.0,
                mem_used_bytes=0,
            )
        )
    rows = events_table(events).to_pylist()
    check((AuditSettings(), rows, [len(rows) // 3, 2 * len(rows) // 3], None, restores), "parquet")


@pytest.mark.parametrize("form", ["json", "arrow"])
def test_a_profiled_fleet_s_kernels_on_time_do_not_cut_its_batch(form: str) -> None:
    """The simulated fleet's kernels (with range paths: lists, which Arrow's JSON reader is not given) come with their
    samples, on time, so none cuts a batch: each kernel did, and a batch with more than ``MANY_REVISING`` of them went
    row by row (benchmark 2: 17k events/s against 51k). The batch path's outputs and state stay the row path's."""
    events = list(simulate(FleetSpec(gpus=2, hours=1, interval_s=10)))
    lines = [encode_event(e).encode() for e in events]
    batch = read_lines(lines) if form == "json" else events_table(events).combine_chunks().to_batches()[0]
    kinds = batch.column("kind").to_pylist()
    assert kinds.count("kernel_activity") > columnar.MANY_REVISING
    assert "kernel_activity" not in [kinds[i] for i in columnar.revising_rows(Auditor(AuditSettings()), batch)]
    inputs: list[Any] = lines if form == "json" else wire_rows(batch)
    by_row, by_batch = Auditor(AuditSettings()), Auditor(AuditSettings())
    want = [out for i, item in enumerate(inputs) for out in by_row.ingest(item, label(i))]
    got = expand(by_batch.ingest_lines(lines, label) if form == "json" else by_batch.ingest_batch(batch, label))
    assert [r.model_dump_json() for r in got] == [r.model_dump_json() for r in want]
    assert normalised(by_batch) == normalised(by_row)


def test_a_large_batch_with_sparse_revising_rows_is_cut_not_taken_row_by_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch with more revising rows than ``MANY_REVISING`` but many rows between them (a replay's batches of a
    fleet with the odd sample delayed past the lateness; once, every allocation cut) is cut at them: the row path
    takes those rows alone, not the whole batch (which made benchmark 1's replay 90x slower), with the row path's
    outputs and state."""
    monkeypatch.setattr(columnar, "MANY_REVISING", 4)  # the rule at a batch size a unit test can run row by row
    events = list(simulate(FleetSpec(gpus=2, hours=3, interval_s=10, max_delay_s=200)))
    batch = events_table(events).combine_chunks().to_batches()[0]
    cuts = columnar.revising_rows(Auditor(AuditSettings()), batch)
    assert columnar.MANY_REVISING < len(cuts) < batch.num_rows / columnar.ROWS_PER_CUT
    by_row, by_batch = Auditor(AuditSettings()), Auditor(AuditSettings())
    want = [out for i, row in enumerate(wire_rows(batch)) for out in by_row.ingest(row, label(i))]
    taken: list[str] = []
    ingest = by_batch.ingest
    monkeypatch.setattr(
        by_batch, "ingest", lambda row, source, scope=None: taken.append(source) or ingest(row, source, scope)
    )
    got = expand(by_batch.ingest_batch(batch, label))
    assert [r.model_dump_json() for r in got] == [r.model_dump_json() for r in want]
    assert normalised(by_batch) == normalised(by_row)
    assert set(map(label, cuts)) <= set(taken) and len(taken) < batch.num_rows / 4


def test_a_batch_continuing_open_panes_refuses_what_the_row_path_refuses() -> None:
    """A second batch's samples of panes the first left open (what nearly every batch of a replay meets): its sample
    5 s after a counted one of a 10 s interval is an overlap, one at a counted time a duplicate, and the rest are
    taken, on the batch path as on the row path (the rows of such a suspect pane are found by codes: losing them
    took every refused one)."""

    def gpu(offset_s: int, pid: int | None = None) -> Event:
        fields = {"node_id": "n", "gpu_uuid": "GPU-0", "ts_ns": BASE_NS + offset_s * NS, "interval_s": 10.0}
        fields |= {"sm_util_pct": 50.0, "mem_bw_util_pct": 1.0, "mem_used_bytes": 0}
        if pid is None:
            return GpuSample(**fields, gpu_model="H100", mem_total_bytes=1, power_w=100.0, temp_c=30.0)
        return ProcessSample(**fields, pid=pid)

    first = [gpu(0), gpu(0, 7), gpu(10), gpu(10, 7)]
    second = [gpu(15), gpu(10), gpu(20), gpu(13, 7), gpu(20, 7)]
    by_row, by_batch = Auditor(AuditSettings()), Auditor(AuditSettings())
    want = [
        out for i, row in enumerate(events_table(first + second).to_pylist()) for out in by_row.ingest(row, label(i))
    ]
    got = expand(by_batch.ingest_batch(events_table(first).combine_chunks().to_batches()[0], label))
    got += expand(by_batch.ingest_batch(events_table(second).combine_chunks().to_batches()[0], lambda i: label(i + 4)))
    assert [r.model_dump_json() for r in got] == [r.model_dump_json() for r in want]
    assert sorted(r.reason for r in got if isinstance(r, DeadLetter)) == ["duplicate", "overlap", "overlap"]
    assert normalised(by_batch) == normalised(by_row)
