"""Late kernels inside a batch (``gpucost.streams.batch_kernels``): a profiled fleet whose profiler buffers come
minutes late, so their kernels revise panes closed within the same batch, is taken by the batch path without
cutting the batch at them, with the row path's outputs in its order and its state; in the default configuration
(revisions on) and with revisions off (each such kernel then a ``late`` dead letter)."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest

from gpucost.producers.simulate import FleetSpec, simulate
from gpucost.schemas.arrow import events_table, wire_rows
from gpucost.schemas.blocks import expand
from gpucost.schemas.codec import encode_event
from gpucost.schemas.events import Event, GpuSample
from gpucost.schemas.kernels import KernelActivity
from gpucost.schemas.records import DeadLetter, Output
from gpucost.streams import columnar
from gpucost.streams.audit import Auditor
from gpucost.streams.json_lines import read_lines
from gpucost.streams.settings import AuditSettings
from tests.support.batch_path import closing_at, label, normalised

NS = 1_000_000_000
#: four GPUs for three hours: about 11,000 events, 17 of them kernels of buffers that came after their panes closed
FLEET = FleetSpec(gpus=4, hours=3, interval_s=10, late_binding_fraction=0)

SETTINGS = {"default": AuditSettings(), "no revisions": AuditSettings(revision_horizon_s=0)}


@pytest.fixture(scope="module")
def events() -> list[Event]:
    return list(simulate(FLEET))


def _row_path(s: AuditSettings, inputs: list[Any]) -> tuple[Auditor, list[Output]]:
    auditor = Auditor(s)
    return auditor, [out for i, item in enumerate(inputs) for out in auditor.ingest(item, label(i))]


def _pane(ts_ns: int, s: AuditSettings) -> int:
    return ts_ns - ts_ns % s.pane_ns


@pytest.mark.parametrize("name", list(SETTINGS))
@pytest.mark.parametrize("form", ["arrow", "json"])
def test_late_kernels_do_not_cut_the_batch_and_match_the_row_path(events: list[Event], form: str, name: str) -> None:
    s = SETTINGS[name]
    lines = [encode_event(e).encode() for e in events]
    batch = read_lines(lines) if form == "json" else events_table(events).combine_chunks().to_batches()[0]
    inputs: list[Any] = lines if form == "json" else wire_rows(batch)
    by_row, want = _row_path(s, inputs)
    # the kernels the row path found late, counted from its outputs and state, not from the batch path
    late = by_row.counts["revised_by_late:kernel_activity"] + sum(
        isinstance(o, DeadLetter) and o.reason == "late" and o.kind == "kernel_activity" for o in want
    )
    assert late >= 5, "the fleet's late profiler buffers should give the batch late kernels to take"
    # the only kernels that still cut the batch are those over a pane's boundary
    kernels = {i: e for i, e in enumerate(events) if e.kind == "kernel_activity"}
    for i in columnar.revising_rows(Auditor(s), batch):
        if i in kernels:
            k = kernels[i]
            assert _pane(k.start_ns, s) != _pane(max(k.start_ns, k.end_ns - 1), s)  # type: ignore[attr-defined]
    for few_closes in (0, 1 << 30):  # closes as blocks, and one by one
        by_row, want = _row_path(s, inputs)  # again: ``finish`` below ends its state
        with closing_at(few_closes):
            by_batch = Auditor(s)
            got = expand(by_batch.ingest_lines(lines, label) if form == "json" else by_batch.ingest_batch(batch, label))
        assert [r.model_dump_json() for r in got] == [r.model_dump_json() for r in want]
        assert normalised(by_batch) == normalised(by_row)
        assert by_batch.finish() == by_row.finish()


@pytest.mark.parametrize("name", list(SETTINGS))
def test_batches_cut_anywhere_and_restored_between_match_the_row_path(events: list[Event], name: str) -> None:
    """The same fleet in batches of 997 rows (a worker's polls), its state restored from JSON before every other
    one: a late kernel's GPU may leave its panes pending across a batch's end, settled in the next."""
    s = SETTINGS[name]
    table = events_table(events).combine_chunks()
    by_row, want = _row_path(s, wire_rows(table.to_batches()[0]))
    by_batch, got = Auditor(s), []
    for n, lo in enumerate(range(0, table.num_rows, 997)):
        if n % 2:
            by_batch = Auditor.from_state(json.loads(json.dumps(by_batch.to_state())), s)
        part: pa.RecordBatch = table.slice(lo, 997).to_batches()[0]
        got += expand(by_batch.ingest_batch(part, lambda i, lo=lo: label(lo + i)))
    assert [r.model_dump_json() for r in got] == [r.model_dump_json() for r in want]
    assert normalised(by_batch) == normalised(by_row)
    assert by_batch.finish() == by_row.finish()


@pytest.mark.parametrize("name", list(SETTINGS))
def test_a_kernel_over_a_closed_and_an_open_pane_cuts_the_batch(events: list[Event], name: str) -> None:
    """A kernel whose first pane had closed at its row and whose last had not joins the open one as it comes and
    revises the closed one: the batch is cut there, and the batch path matches the row path (without the cut the
    open pane would close without it)."""
    s = SETTINGS[name]
    kernel = next(e for e in events if isinstance(e, KernelActivity))
    at = next(
        i
        for i, e in enumerate(events)
        if i > len(events) // 2 and isinstance(e, GpuSample) and e.gpu_uuid == kernel.gpu_uuid
    )
    max_ts = max(e.ts_ns for e in events[:at] if isinstance(e, GpuSample) and e.gpu_uuid == kernel.gpu_uuid)
    boundary = _pane(max_ts - s.lateness_ns, s)  # the end of the GPU's last closed pane at ``at``
    over = kernel.model_copy(update={"start_ns": boundary - NS // 2, "end_ns": boundary + NS // 2})
    stream = [*events[: at + 1], over, *events[at + 1 :]]
    batch = events_table(stream).combine_chunks().to_batches()[0]
    cut = at + 1 in columnar.revising_rows(Auditor(s), batch)
    by_row, want = _row_path(s, wire_rows(batch))
    by_batch = Auditor(s)
    got = expand(by_batch.ingest_batch(batch, label))
    assert [r.model_dump_json() for r in got] == [r.model_dump_json() for r in want]
    assert normalised(by_batch) == normalised(by_row)
    assert cut
