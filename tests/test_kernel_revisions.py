"""Late kernels in the default configuration (a 6 h revision horizon): a run of them is one revision of each closed
pane it joins, published before the GPU's next sample, at a silent close or at the end of input
(docs/definitions.md, "Kernel cost in the pipeline", Revisions), on both paths and across a snapshot.

Why it matters: a profiler's buffer replayed after its samples was one revision per kernel, each republishing every
line of the pane (1,000 late kernels in a pane: 8 s and 2,000 records). The lines as revised must still equal a run
in time order, and Σ lines = the tenant's cost in every revision.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpucost.schemas.blocks import expand
from gpucost.schemas.codec import encode_event
from gpucost.schemas.events import Event, GpuSample
from gpucost.schemas.kernels import KernelActivity
from gpucost.schemas.records import KernelCostRecord, Output
from gpucost.streams.audit import Auditor
from gpucost.streams.batch import FEW_CLOSES
from gpucost.streams.settings import AuditSettings
from tests.strategies import BASE_NS, NS
from tests.support.batch_path import closing_at
from tests.support.cli import gpucost
from tests.support.kernel_fleet import billed, binding, feed, fleet, kernel, paid_as_billed

AUDIT = AuditSettings(pane_s=60)


def trace(count: int, pane: int = 0, pid: int = 1, first_corr: int = 0) -> list[Event]:
    """``count`` kernels of 0.5 s in one pane, on two streams so that they overlap, of three names."""
    return [
        kernel(
            pane * 60 + (i % 50) + 0.25 * (i % 2),
            pane * 60 + (i % 50) + 0.25 * (i % 2) + 0.5,
            f"k{i % 3}",
            pid=pid,
            stream=i % 2,
            corr=first_corr + i,
        )
        for i in range(count)
    ]


def ts(event: Event) -> int:
    return event.ts_ns


def last_revision(out: list[Output]) -> dict[int, int]:
    """Each pane's last revision of its kernel lines."""
    last: dict[int, int] = {}
    for r in kernel_records(out):
        last[r.pane_start_ns] = max(last.get(r.pane_start_ns, 0), r.revision)
    return last


def kernel_records(out: list[Output]) -> list[KernelCostRecord]:
    return [r for r in out if isinstance(r, KernelCostRecord)]


def in_time_order(events: list[Event]) -> list[Output]:
    """The same events with each kernel placed at its start among the samples: nothing is late."""
    auditor = Auditor(AUDIT)
    return feed(auditor, events[:2] + sorted(events[2:], key=lambda e: e.ts_ns), False) + auditor.finish()


def test_a_trace_replayed_after_its_samples_is_one_revision_a_pane_and_bills_as_in_time_order() -> None:
    samples = fleet(8)  # panes 0 to 4 close as the samples come: every kernel below is late
    late = trace(300, pane=1) + trace(200, pane=2, first_corr=1000)
    auditor = Auditor(AUDIT)
    out = feed(auditor, samples, False)
    during = feed(auditor, late, False)
    assert not kernel_records(during) and auditor.kernel_revisions_pending() == {"GPU-0"}
    out += during + auditor.finish()
    assert billed(out) == billed(in_time_order(samples + late))
    assert {r.revision for r in kernel_records(out)} == {1}  # each pane published once more, not 300 times
    assert len(kernel_records(out)) == 2 * 4  # no_kernel and three names, in each of the two panes
    assert paid_as_billed(out)


def test_the_gpu_s_next_sample_publishes_the_pending_panes_before_its_own_records() -> None:
    samples = fleet(10)
    auditor = Auditor(AUDIT)
    feed(auditor, samples[:12], False)  # the samples of panes 0 to 4: panes 0 and 1 closed (lateness 120 s)
    feed(auditor, trace(40, pane=1), False)
    assert auditor.kernel_revisions_pending() == {"GPU-0"}
    nxt = feed(auditor, samples[12:13], False)  # the GPU sample of pane 5: it closes pane 2
    assert auditor.kernel_revisions_pending() == frozenset()
    pane1, pane2 = samples[4].ts_ns, samples[6].ts_ns
    revised = [i for i, r in enumerate(nxt) if isinstance(r, KernelCostRecord) and r.revision == 1]
    closing = [i for i, r in enumerate(nxt) if getattr(r, "pane_start_ns", None) == pane2]
    assert revised and {nxt[i].pane_start_ns for i in revised} == {pane1}  # type: ignore[union-attr]
    assert closing and max(revised) < min(closing)  # the revision first, then what the sample closes


def test_both_paths_publish_the_pending_panes_at_the_same_row_and_keep_the_same_state() -> None:
    """The batch path settles a GPU's pending panes at its first sample after late kernels, where the row path does:
    a batch of late kernels and the samples after them gives the row path's records, in its order. Kernels of a
    second process (pid 2) come in the batch before, so that the GPU is pending as the batch starts, too."""
    samples = fleet(200)
    head, tail = samples[:300], samples[300:]
    before = trace(30, pane=100, pid=2, first_corr=5000)
    batch = trace(30, pane=120) + tail[:6] + trace(20, pane=121, first_corr=100) + tail[6:]
    assert len(before) < 128 <= len(batch)  # the first goes row by row, the second through the batch path
    rows, cols = Auditor(AUDIT), Auditor(AUDIT)
    by_rows = feed(rows, head, False) + feed(rows, before, False) + feed(rows, batch, False) + rows.finish()
    by_cols = feed(cols, head, True) + feed(cols, before, True) + feed(cols, batch, True) + cols.finish()
    assert [r.model_dump() for r in by_cols] == [r.model_dump() for r in by_rows]
    assert cols.to_state() == rows.to_state()
    assert set(last_revision(by_rows).values()) == {1}  # the three panes of late kernels, revised once each


def test_a_sample_that_does_not_decode_settles_nothing_on_either_path() -> None:
    """The pending panes are republished at the GPU's first sample that decodes: a sample of it refused before that
    one (``sm_util_pct`` 150) settles nothing, so another GPU's closes between them come before the revision, on
    both paths (the batch path settling within the batch, the row path at the row)."""
    samples = fleet(200)
    head, tail = samples[:300], samples[300:]
    other = [GpuSample(**{**e.model_dump(), "gpu_uuid": "GPU-1"}) for e in samples if isinstance(e, GpuSample)]
    bad = json.loads(encode_event(tail[0]))
    bad["sm_util_pct"] = 150
    lines = [
        *(encode_event(e).encode() for e in trace(30, pane=120)),
        json.dumps(bad).encode(),
        *(encode_event(e).encode() for e in other[150:156]),
        *(encode_event(e).encode() for e in tail),
    ]
    rows, cols = Auditor(AUDIT), Auditor(AUDIT)
    for auditor in (rows, cols):
        feed(auditor, head + other[:150], False)
    by_rows = [o for i, line in enumerate(lines) for o in rows.ingest(line, str(i))] + rows.finish()
    with closing_at(FEW_CLOSES):
        by_cols = expand(cols.ingest_lines(lines, str)) + cols.finish()
    assert [r.model_dump() for r in by_cols] == [r.model_dump() for r in by_rows]
    assert cols.to_state() == rows.to_state()
    revised = min(i for i, r in enumerate(by_rows) if isinstance(r, KernelCostRecord) and r.revision == 1)
    assert any(getattr(r, "gpu_uuid", None) == "GPU-1" for r in by_rows[:revised])


def test_another_gpu_s_sample_leaves_the_pending_panes_pending() -> None:
    """Each GPU's panes are settled at its own next sample: the Kafka worker of one GPU's key sees no other GPU's
    samples, and both transports must publish the same revisions."""
    samples = fleet(8)
    auditor = Auditor(AUDIT)
    feed(auditor, samples, False)
    feed(auditor, trace(10, pane=1), False)
    other = GpuSample(**{**samples[-2].model_dump(), "gpu_uuid": "GPU-1"})
    assert not kernel_records(auditor.update(other)) and auditor.kernel_revisions_pending() == {"GPU-0"}


def test_a_silent_close_publishes_the_pending_panes() -> None:
    samples = fleet(8)
    auditor = Auditor(AUDIT)
    feed(auditor, samples, False)
    feed(auditor, trace(10, pane=1), False)
    out = auditor.close_silent(samples[-1].ts_ns + 3600 * 10**9)
    assert {r.revision for r in kernel_records(out) if r.pane_start_ns == samples[4].ts_ns} == {1}
    assert not auditor.kernel_revisions_pending()


def test_a_gpu_quiet_on_the_clock_but_not_behind_in_event_time_stays_pending() -> None:
    """From a review: the embedded run asks a GPU whose largest event time has not moved for a while (kernels move
    none) to close; the Kafka worker asks only a key behind in event time. Settling at every such look was one
    revision per look, and one the Kafka worker never made."""
    samples = fleet(8)
    auditor = Auditor(AUDIT)
    feed(auditor, samples, False)
    feed(auditor, trace(10, pane=1), False)
    assert not auditor.close_silent(auditor.largest_watermark() or 0, {"GPU-0"})  # type: ignore[arg-type]
    assert auditor.kernel_revisions_pending() == {"GPU-0"}


def test_pending_panes_survive_a_snapshot_and_publish_the_same_records() -> None:
    """The Kafka worker snapshots its auditor with each transaction, wherever its polls cut the input."""
    samples, late = fleet(8), trace(50, pane=1)
    whole = Auditor(AUDIT)
    expected = feed(whole, samples + late, False) + whole.finish()
    first = Auditor(AUDIT)
    out = feed(first, samples + late[:20], False)
    again = Auditor.from_state(first.to_state(), AUDIT)
    assert again.kernel_revisions_pending() == {"GPU-0"}
    out += feed(again, late[20:], False) + again.finish()
    assert [r.model_dump() for r in out] == [r.model_dump() for r in expected]


def test_a_late_binding_reaching_a_pending_pane_republishes_it_from_what_was_published() -> None:
    """The binding's revision of a pane late kernels joined must difference against the lines as published (the
    pane's kernels before them): against the lines with them, the late kernels' first lines are never published."""
    events = fleet(8)
    events[4:4] = [kernel(40, 50, "early", corr=500)]  # published with pane 0
    late = trace(20, pane=0)
    auditor = Auditor(AUDIT)
    out = feed(auditor, events, False) + feed(auditor, [*late, binding(1, 0, "b")], False) + auditor.finish()
    assert billed(out) == billed(in_time_order(events[:2] + [binding(1, 0, "b")] + events[2:] + late))
    assert paid_as_billed(out)


@pytest.mark.parametrize("batch", [False, True], ids=["rows", "batch"])
def test_kernels_nobody_can_pay_for_are_counted_not_dropped_silently(batch: bool) -> None:
    """Kernels of a GPU that sends no samples (a collector's ``<node>/<index>`` for NVML's UUID) and kernels of a pane
    with no GPU sample bill no one: each kernel is counted once in ``unbilled_kernels`` (in the pane it starts in),
    on both paths alike, and the summary reports them."""
    samples = fleet(80)
    del samples[2 + 2 * 3]  # pane 3 has its process sample but no GPU sample: it closes unbilled
    ghost = [KernelActivity(**{**k.model_dump(), "gpu_uuid": "n/0"}) for k in trace(5, pane=1, first_corr=50)]
    across = kernel(3 * 60 + 50, 4 * 60 + 10, "across", corr=99)  # starts in pane 3, ends in billed pane 4
    into = kernel(2 * 60 + 50, 3 * 60 + 10, "into", corr=98)  # billed in pane 2, where it starts
    events = samples[:2] + ghost + sorted(samples[2:] + trace(4, pane=3, first_corr=70) + [across, into], key=ts)
    auditor = Auditor(AUDIT)
    out = feed(auditor, events, batch) + auditor.finish()
    assert len(events) >= 128
    assert auditor.counts["unbilled_kernels"] == len(ghost) + 4 + 1
    assert not any(r.gpu_uuid == "n/0" for r in kernel_records(out))
    (across_line,) = [r for r in kernel_records(out) if r.kernel == "across"]
    assert across_line.pane_start_ns == samples[2 + 2 * 4 - 1].ts_ns and across_line.calls == 0  # billed in pane 4
    (into_line,) = [r for r in kernel_records(out) if r.kernel == "into"]
    assert into_line.calls == 1 and into_line.pane_start_ns == samples[2 + 2 * 2].ts_ns


def test_the_run_s_summary_tells_the_user_why_the_kernels_were_not_billed(tmp_path: Path) -> None:
    """The newcomer's mistake: a collector without pynvml names the GPU ``<node>/<index>``. The replay says so."""
    ghost = [KernelActivity(**{**k.model_dump(), "gpu_uuid": "n/0"}) for k in trace(7, pane=1)]
    (tmp_path / "a_kernels.jsonl").write_text("".join(encode_event(e) + "\n" for e in ghost))
    (tmp_path / "b_samples.jsonl").write_text("".join(encode_event(e) + "\n" for e in fleet(5)))
    files = [str(tmp_path / "a_kernels.jsonl"), str(tmp_path / "b_samples.jsonl")]
    run = gpucost("replay", *files, "--out", str(tmp_path / "audit"), "--pane-s", "60")
    assert "7 kernels started in panes never billed (without a GPU sample), or are of GPUs that sent none" in run.stdout
    assert "pynvml" in run.stdout


@pytest.mark.parametrize("batch", [False, True], ids=["rows", "batch"])
def test_a_kernel_is_counted_unbilled_once_when_it_leaves_the_log_in_a_pane_never_billed(batch: bool) -> None:
    """Counted as it leaves the log (pruned past the horizon, or at the end of input), so that a pane closed without a
    GPU sample and billed later by a late one is not counted, and kernels before the GPU's first sample (a pane that
    never opened) are."""
    audit = AuditSettings(pane_s=60, revision_horizon_s=600)
    samples = fleet(64)
    gpu_sample_of_pane_3 = samples.pop(2 + 2 * 3)  # pane 3 closes unbilled; the sample comes late, within 600 s
    early = kernel(-120, -110, "before", corr=1)  # two panes before the first sample: a pane that never opens
    in_3 = trace(3, pane=3, first_corr=10)
    events = samples[:2] + [early] + sorted(samples[2:16] + in_3, key=ts) + [gpu_sample_of_pane_3] + samples[16:]
    assert len(events) >= 128
    auditor = Auditor(audit)
    out = feed(auditor, events, batch)
    assert auditor.counts["unbilled_kernels"] == 1  # pruned in the run: the early kernel, not pane 3's
    assert sum(r.calls for r in kernel_records(out) if r.pane_start_ns == gpu_sample_of_pane_3.ts_ns) == 3
    out += auditor.finish()
    assert auditor.counts["unbilled_kernels"] == 1


def test_late_kernels_of_a_pane_that_stays_unbilled_are_counted_at_the_end_of_input() -> None:
    samples = fleet(8)
    del samples[2 + 2 * 1]  # pane 1 has no GPU sample
    auditor = Auditor(AUDIT)
    feed(auditor, samples, False)
    feed(auditor, trace(6, pane=1), False)
    assert not kernel_records(auditor.finish()) and auditor.counts["unbilled_kernels"] == 6


def test_the_unbilled_kernels_of_a_gpu_forgotten_are_counted() -> None:
    samples = fleet(8)
    del samples[2 + 2 * 1]  # pane 1 has no GPU sample
    auditor = Auditor(AUDIT)
    feed(auditor, samples[:4] + trace(6, pane=1) + samples[4:], False)
    auditor.close_silent(samples[-1].ts_ns + 80 * 3600 * 10**9, {"GPU-0"})
    assert auditor.counts["forgotten_gpus"] == 1 and auditor.counts["unbilled_kernels"] == 6


def test_kernels_counted_at_an_end_of_input_are_not_counted_again_by_its_successor() -> None:
    """``successor`` keeps the kernel log (a kernel sent again is a duplicate): its pruning must not count again the
    kernels the end of input counted."""
    samples = fleet(8)
    del samples[2 + 2 * 1]
    auditor = Auditor(AUDIT)
    feed(auditor, samples[:4] + trace(6, pane=1) + samples[4:], False)
    auditor.finish()
    nxt = auditor.successor()
    later = fleet(8 * 60)[2 + 2 * 420 :]  # seven hours on: pane 1 is pruned past the horizon
    feed(nxt, later, False)
    assert auditor.counts["unbilled_kernels"] + nxt.counts["unbilled_kernels"] == 6
    assert not nxt.kernels.log.has("GPU-0", samples[3].ts_ns - 1)


@pytest.mark.parametrize("batch", [False, True], ids=["rows", "batch"])
def test_a_binding_leaves_a_pane_no_sample_has_opened_to_its_close(batch: bool) -> None:
    """From a property test: kernels of pid 2 came before any sample of their pane, then, in one batch, the pane's
    samples and a binding of pid 2. The row path takes the binding with the pane open; the batch path takes a batch's
    bindings before its samples, with the pane not opened yet. A binding revised such a pane as if it had closed
    (a revision record held for a pane never published, and the revision log as of then); a pane is closed when its
    GPU's watermark has passed it, as an event is late, so the binding leaves it to its close on both paths."""
    events = fleet(6)
    head, tail = events[:8], events[8:]  # panes 0 to 2, then 3 to 5
    early = [kernel(4 * 60 + 10, 4 * 60 + 20, "k", pid=2, corr=7)]  # pane 4, which no sample has opened
    late_part = [*tail, binding(2, 4 * 60 + 5, "b")]  # before the kernel: it governs it
    by_rows, by_batch = Auditor(AUDIT), Auditor(AUDIT)
    with closing_at(FEW_CLOSES, few_lines=0):
        want = feed(by_rows, head + early, False) + feed(by_rows, late_part, False)
        got = feed(by_batch, head + early, False) + feed(by_batch, late_part, batch)
    assert [r.model_dump() for r in got] == [r.model_dump() for r in want]
    assert by_batch.to_state() == by_rows.to_state()
    assert by_rows.to_state()["revisions"]["held"]["GPU-0"][-1][0] < BASE_NS + 4 * 60 * NS  # pane 4: not billed yet


@pytest.mark.parametrize("late", [True, False], ids=["closed-in-the-batch", "open"])
def test_a_kernel_whose_pane_the_batch_closes_before_it_comes_is_late_on_both_paths(late: bool) -> None:
    """The batch path takes a batch's on-time kernels before its samples; a kernel whose pane the batch's own earlier
    samples closed is late at its row (a revision, pending until the GPU's next sample), though on time as the batch
    starts. Both paths: the same records, in the same order, and the same state."""
    events = fleet(10)
    head, body = events[:4], events[4:]  # pane 0, then panes 1 to 9 in one batch
    at = 12 if late else 4  # after the samples of pane 5 (lateness 120 s: pane 1 closed), or before pane 3's
    body[at:at] = [kernel(60 + 10, 60 + 20, "k", corr=3), kernel(60 + 30, 60 + 31, "k", corr=4)]
    by_rows, by_batch = Auditor(AUDIT), Auditor(AUDIT)
    with closing_at(FEW_CLOSES, few_lines=0):
        want = feed(by_rows, head, False) + feed(by_rows, body, False) + by_rows.finish()
        got = feed(by_batch, head, False) + feed(by_batch, body, True) + by_batch.finish()
    assert [r.model_dump() for r in got] == [r.model_dump() for r in want]
    assert by_batch.to_state() == by_rows.to_state()
    # pane 1's kernel lines: first published by its revision, or with the pane
    assert {r.revision for r in kernel_records(want) if r.pane_start_ns == BASE_NS + 60 * NS} == {1 if late else 0}
