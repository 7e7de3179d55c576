"""An allocation on time rides in its batch: the batch path takes it before the batch's samples, as it takes an
on-time kernel, and only one that may revise a closed pane, or whose verdict could hang on what its device drops
as the batch moves its watermark, cuts the batch (``gpucost.streams.columnar.revising_rows``). Either way the
batch path's outputs and state are the row path's, on JSON lines and on Arrow, in the default configuration (a 6 h
revision horizon). Once every allocation cut, and a replay's batches of a fleet with a scheduler went through the
row path in a thousand stretches (benchmark 1)."""

from __future__ import annotations

import json

import pytest

from gpucost.schemas.arrow import events_table
from gpucost.schemas.blocks import expand
from gpucost.schemas.codec import encode_event
from gpucost.schemas.events import Allocation, Event, GpuSample, Price
from gpucost.schemas.records import AllocationRecord, DeadLetter, Output
from gpucost.streams import allocations, columnar
from gpucost.streams.audit import Auditor
from gpucost.streams.settings import AuditSettings
from tests.support.allocations import steady
from tests.support.batch_path import label, normalised

NS = 10**9
T0 = 1_750_000_020 * NS - (1_750_000_020 * NS) % (60 * NS)
PRICE = Price(gpu_model="M", ts_ns=T0 - 3600 * NS, usd_per_gpu_hour="2.718281")
PAST_HORIZON = 2_900  # samples 10 s apart: past 8 h, so a hold that ended in the first minutes is dropped


def sample(k: int, gpu: str = "GPU-0") -> GpuSample:
    return steady(gpu, T0 + k * 10 * NS)


def hold(
    name: str, start_k: int, end_k: int | None = None, team: str = "search", den: int = 4, gpu: str = "GPU-0"
) -> Allocation:
    end = None if end_k is None else T0 + end_k * 10 * NS
    return Allocation(
        node_id="n1",
        gpu_uuid=gpu,
        allocation_id=name,
        ts_ns=T0 + start_k * 10 * NS,
        end_ts_ns=end,
        sharing="time_slicing",
        fraction_num=1,
        fraction_den=den,
        team=team,
    )


def samples(first: int, last: int, *at: tuple[int, Event]) -> list[Event]:
    """Samples ``first`` to ``last`` with each event of ``at`` after the sample of its index."""
    out: list[Event] = []
    for k in range(first, last):
        out.append(sample(k))
        out += [e for i, e in at if i == k]
    return out


def both(
    batches: list[list[Event]] | list[list[bytes]], form: str, settings: AuditSettings | None = None
) -> tuple[list[Output], list[Output], Auditor]:
    """The row path's outputs event by event, and the batch path's batch by batch (``form``: JSON lines or Arrow;
    lines given as bytes go as they are), with the state of each compared at the end; the batch path's auditor."""
    by_row, by_batch = Auditor(settings or AuditSettings()), Auditor(settings or AuditSettings())
    want: list[Output] = []
    got: list[Output] = []
    at = 0
    for events in batches:
        lines = [e if isinstance(e, bytes) else encode_event(e).encode() for e in events]
        for i, line in enumerate(lines):
            want += by_row.ingest(line, label(at + i))

        def source(i: int, at: int = at) -> str:
            return label(at + i)

        if form == "json":
            got += expand(by_batch.ingest_lines(lines, source))
        else:
            table = events_table([e for e in events if not isinstance(e, bytes)]).combine_chunks()
            got += expand(by_batch.ingest_batch(table.to_batches()[0], source))
        at += len(events)
    assert normalised(by_batch) == normalised(by_row)
    return want, got, by_batch


def dumped(out: list[Output]) -> list[str]:
    return [r.model_dump_json() for r in out]


def cut_kinds(before: list[list[Event]], events: list[Event]) -> list[str]:
    """The kinds of the rows of ``events`` that ``revising_rows`` cuts, after ``before`` was taken."""
    auditor = Auditor(AuditSettings())
    for e in (e for b in before for e in b):
        auditor.update(e)
    batch = events_table(events).combine_chunks().to_batches()[0]
    return [batch.column("kind")[i].as_py() for i in columnar.revising_rows(auditor, batch)]


@pytest.mark.parametrize("form", ["json", "arrow"])
def test_allocations_on_time_ride_in_their_batch(form: str) -> None:
    """Holds starting and ending on time (one ending hours after its start, whose start's pane closed long ago: the
    end changes only the panes from its own) cut no batch, and split the panes as the row path does."""
    first = [PRICE, *samples(0, 1_000, (10, hold("a", 11)), (100, hold("b", 101, team="ads")))]
    second = samples(1_000, 2_200, (1_500, hold("a", 11, 1_501)), (1_600, hold("c", 1_601, team="ml")))
    assert cut_kinds([first], second) == []
    want, got, _ = both([first, second], form)
    assert dumped(got) == dumped(want)
    teams = {r.team for r in got if isinstance(r, AllocationRecord) and r.cost_micro_usd}
    assert {"search", "ads", "ml", "unallocated"} <= teams


@pytest.mark.parametrize("form", ["json", "arrow"])
def test_a_hold_dropped_within_the_batch_and_sent_again_is_late_on_both_paths(form: str) -> None:
    """A hold ended in the first minutes; the next batch's samples move its device's watermark past the horizon,
    which drops it, and then it comes again with another start (what would be a ``conflict`` were it still kept):
    ``late`` on both paths, the row path having dropped it at a sample and the batch path cutting the batch at it."""
    first = [PRICE, *samples(0, 30, (1, hold("a", 2, 12)))]
    second = samples(30, PAST_HORIZON, (PAST_HORIZON - 5, hold("a", PAST_HORIZON - 4)))
    assert cut_kinds([first], second) == ["allocation"]
    want, got, _ = both([first, second], form)
    assert dumped(got) == dumped(want)
    assert [r.reason for r in got if isinstance(r, DeadLetter)] == ["late"]


@pytest.mark.parametrize("form", ["json", "arrow"])
def test_a_hold_sent_again_within_its_batch_cuts_it(form: str) -> None:
    """A hold's start and end, eight hours of samples and the hold again, all in one batch: its later rows cut the
    batch, and it is dropped and ``late`` on both paths."""
    events = [PRICE, *samples(0, PAST_HORIZON, (1, hold("a", 2)), (12, hold("a", 2, 12)), (2_890, hold("a", 2_891)))]
    assert cut_kinds([], events) == ["allocation", "allocation"]
    want, got, _ = both([events], form)
    assert dumped(got) == dumped(want)
    assert [r.reason for r in got if isinstance(r, DeadLetter)] == ["late"]


@pytest.mark.parametrize("form", ["json", "arrow"])
def test_a_device_near_its_hold_bound_cuts_at_its_allocations(form: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A device at ``MAX_HOLDS`` (2 here) whose ended holds the batch's samples drop: the new hold after them is
    taken on both paths (taken before the samples, it would have been ``out_of_range``)."""
    monkeypatch.setattr(allocations, "MAX_HOLDS", 2)
    first = [PRICE, *samples(0, 30, (1, hold("a", 2, 12)), (2, hold("b", 3, 13)))]
    second = samples(30, PAST_HORIZON, (2_890, hold("c", 2_891, team="ads")))
    assert cut_kinds([first], second) == ["allocation"]
    want, got, auditor = both([first, second], form)
    assert dumped(got) == dumped(want)
    assert not [r for r in got if isinstance(r, DeadLetter)]
    assert [h.tenant.team for h in auditor.allocations.table.held("GPU-0")] == ["ads"]


def test_the_batch_path_drops_what_the_row_path_drops_at_each_sample() -> None:
    """Samples alone move the watermark past an ended hold: both paths drop it, to a tombstone (the row path at a
    sample, the batch path at its batch's end), with no allocation in the batch."""
    first: list[Event] = [PRICE, *samples(0, 30, (1, hold("a", 2, 12)))]
    _, _, auditor = both([first, samples(30, PAST_HORIZON)], "arrow")
    assert auditor.allocations.table.state_of("GPU-0", "a") == "ended"
    assert auditor.allocations.table.held("GPU-0") == []


def test_a_refused_denominator_does_not_hide_a_device_near_its_bound() -> None:
    """``MAX_DENOMINATOR`` 4: a hold of quarters ended in the first minutes; the next batch has an allocation the
    model refuses (``fraction_den`` 0), eight hours of samples (which drop the hold) and a hold of thirds, which only
    that drop lets in: it is taken on both paths (the refused row's 0 once made the room check pass, and the batch
    path took the thirds before the samples: ``out_of_range``)."""
    refused = json.loads(encode_event(hold("x", 31)))
    refused["fraction_den"] = 0
    first = [PRICE, *samples(0, 30, (1, hold("a", 2, 12)))]
    second = [json.dumps(refused).encode(), *(encode_event(e).encode() for e in samples(30, PAST_HORIZON))]
    second.append(encode_event(hold("c", PAST_HORIZON, den=3, team="ads")).encode())
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(allocations, "MAX_DENOMINATOR", 4)
        want, got, auditor = both([first, second], "json")
    assert dumped(got) == dumped(want)
    assert [(r.reason, "fraction_den" in r.detail) for r in got if isinstance(r, DeadLetter)] == [
        ("out_of_range", True)
    ]
    assert [h.tenant.team for h in auditor.allocations.table.held("GPU-0")] == ["ads"]


@pytest.mark.parametrize("form", ["json", "arrow"])
def test_a_device_whose_sample_is_refused_drops_nothing_on_either_path(form: str) -> None:
    """A device that never sent a sample takes a hold; another device is forgotten, which moves the floor its
    watermark stands on; then its only sample is late and refused, beside another device's samples. The row path
    drops holds after a sample it takes, so it keeps the hold, and so does the batch path (it once dropped the
    holds of every device with a row in the batch): the hold sent again is a ``duplicate`` on both, not ``late``."""
    settings = AuditSettings(revision_horizon_s=300, window_h=1, idle_timeout_s=60)
    history: list[Event] = [PRICE, *(sample(k, "GPU-A") for k in range(100)), hold("h", 0, 6, gpu="GPU-B")]
    batches: list[list[Event]] = [
        [sample(5, "GPU-B"), *(sample(k, "GPU-C") for k in range(1_100, 1_300))],
        [hold("h", 0, 6, gpu="GPU-B"), *(sample(k, "GPU-C") for k in range(1_300, 1_500))],
    ]
    outputs = []
    for path in ("row", "batch"):
        auditor = Auditor(settings)
        for e in history:
            auditor.update(e)
        auditor.close_silent(T0 + 3 * 3600 * NS)  # GPU-A forgotten: the floor of every GPU without a watermark
        out: list[Output] = []
        for events in batches:
            if path == "row":
                out += [r for e in events for r in auditor.update(e)]
            elif form == "json":
                out += expand(auditor.ingest_lines([encode_event(e).encode() for e in events], label))
            else:
                out += expand(auditor.ingest_batch(events_table(events).combine_chunks().to_batches()[0], label))
        outputs.append(([r.reason for r in out if isinstance(r, DeadLetter)], normalised(auditor)))
    (row_letters, row_state), (batch_letters, batch_state) = outputs
    assert batch_letters == row_letters == ["late", "duplicate"]
    assert batch_state == row_state
