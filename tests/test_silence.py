"""GPUs that leave the fleet: their last panes billed once they have gone silent, their state forgotten.

The independent recomputation: the same events, sent once each and in time order, through an auditor that
closes nothing early and forgets nothing; its bill per (GPU, pane, party) must be the sum over revisions of a
run that closes silent GPUs' panes, forgets GPUs gone for good and meets some events a second time, long after
(a producer sending a file again). Every event sent again is refused, never billed twice.
"""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpucost.embedded import run_embedded
from gpucost.schemas.blocks import expand
from gpucost.schemas.codec import encode_event
from gpucost.schemas.events import EbpfTrace, Event, GpuSample, MemAccess, Price, ProcessSample, TenantBinding
from gpucost.schemas.records import CostRecord, DeadLetter, Output
from gpucost.sinks.views import connect
from gpucost.streams import columnar
from gpucost.streams.audit import Auditor
from gpucost.streams.batch import FEW_CLOSES
from gpucost.streams.settings import AuditSettings
from tests.strategies import BASE_NS, NS
from tests.support.batch_path import closing_at
from tests.support.bills import bills, run

STEP_S = 30


def _sample(gpu: str, t_s: int, sm: float, interval_s: int = STEP_S) -> GpuSample:
    return GpuSample(
        node_id="node-0",
        gpu_uuid=gpu,
        gpu_model="H100",
        ts_ns=BASE_NS + t_s * NS,
        interval_s=float(interval_s),
        sm_util_pct=sm,
        mem_bw_util_pct=sm / 2,
        mem_used_bytes=1,
        mem_total_bytes=2,
        power_w=100.0,
        temp_c=40.0,
    )


def _process(gpu: str, t_s: int, pid: int, sm: float) -> ProcessSample:
    return ProcessSample(
        node_id="node-0",
        gpu_uuid=gpu,
        pid=pid,
        ts_ns=BASE_NS + t_s * NS + pid,
        interval_s=float(STEP_S),
        sm_util_pct=sm,
        mem_bw_util_pct=sm / 3,
        mem_used_bytes=1,
    )


@st.composite
def churn(draw: st.DrawFn) -> tuple[AuditSettings, list[Event], list[Event], list[int]]:
    """Settings, the events once each in time order, the arrival (with some sent again, later), and where
    the arrival is cut to look for silent GPUs. Each GPU is on for one or two spans: it leaves, and may come
    back, hours later or not."""
    s = AuditSettings(
        pane_s=60,
        lateness_s=draw(st.sampled_from([0, 120])),
        window_h=1,
        idle_timeout_s=draw(st.sampled_from([180, 600])),
        max_jump_s=draw(st.sampled_from([3600, 86_400])),
        revision_horizon_s=draw(st.sampled_from([0, 600, 1800])),
    )
    span_s = 4 * 3600
    events: list[Event] = [Price(gpu_model="H100", ts_ns=BASE_NS - 3600 * NS, usd_per_gpu_hour=Decimal("2.5"))]
    events += [
        TenantBinding(
            node_id="node-0", pid=pid, ts_ns=BASE_NS - NS, team=team, env="prod", app="a", tier="online", sla="Gold"
        )
        for pid, team in ((1, "search"), (2, "ads"))
    ]
    pct = st.integers(0, 100).map(float)
    for g in range(draw(st.integers(2, 3))):
        cuts = sorted(draw(st.lists(st.integers(0, span_s // STEP_S), min_size=2, max_size=4, unique=True)))
        for lo, hi in zip(cuts[::2], cuts[1::2]):
            for k in range(lo, hi):
                events.append(_sample(f"GPU-{g}", k * STEP_S, draw(pct)))
                events += [_process(f"GPU-{g}", k * STEP_S, pid, draw(pct)) for pid in (1, 2) if draw(st.booleans())]
    in_time = sorted(events, key=lambda e: (e.ts_ns, not isinstance(e, (Price, TenantBinding))))
    arrival = list(in_time)
    samples = [e for e in in_time if isinstance(e, (GpuSample, ProcessSample))]
    for e in draw(st.lists(st.sampled_from(samples), max_size=8, unique_by=id)) if samples else []:
        # soon after the original, or last: after it in ``arrival``, which earlier copies made longer (a copy put
        # before its original moved the watermark first, and made a later event of the input rightly late)
        at = draw(st.one_of(st.integers(arrival.index(e) + 1, len(arrival)), st.just(len(arrival))))
        arrival.insert(at, e)
    looks = sorted(draw(st.lists(st.integers(1, len(arrival)), max_size=40, unique=True)))
    return s, in_time, arrival, looks


def _silent_run(
    s: AuditSettings, arrival: list[Event], looks: list[int], batches: bool
) -> tuple[list[Output], Auditor]:
    """The arrival in chunks ending at ``looks`` (row by row, or each chunk as one batch of lines), every GPU
    looked at for silence after each chunk against the largest watermark, as the embedded run does."""
    auditor, out = Auditor(s), []
    for lo, hi in zip([0, *looks], [*looks, len(arrival)]):
        chunk = arrival[lo:hi]
        if batches:
            out += expand(auditor.ingest_lines([encode_event(e).encode() for e in chunk], str))
        else:
            for i, e in enumerate(chunk):
                out += auditor.update(e, None, str(i))  # labelled as the batch path labels line i
        largest = auditor.panes.largest_watermark()
        if largest is not None:
            out += auditor.close_silent(largest)
    return out + auditor.finish(), auditor


@pytest.mark.slow
@given(churn())
def test_gpus_that_leave_are_billed_once_and_forgotten(
    fleet: tuple[AuditSettings, list[Event], list[Event], list[int]],
) -> None:
    s, in_time, arrival, looks = fleet
    out, auditor = _silent_run(s, arrival, looks, batches=False)
    reference = run(s, in_time)
    assert not [r for r in reference if isinstance(r, DeadLetter)]
    refused = Counter(r.raw for r in out if isinstance(r, DeadLetter))
    again = Counter(encode_event(e) for e in arrival) - Counter(encode_event(e) for e in in_time)
    assert refused == again  # each event sent again refused once, and nothing else
    assert {r.reason for r in out if isinstance(r, DeadLetter)} <= {"duplicate", "late"}
    want, got = bills(reference), bills(out)
    for key in want.keys() | got.keys():
        assert got.get(key, 0) == want.get(key, 0), key
    # a GPU silent for the window (longer than R here) past the timeout is forgotten: none of its state is kept
    last = {e.gpu_uuid: e.ts_ns for e in in_time if isinstance(e, GpuSample)}
    state = json.dumps({k: v for k, v in auditor.to_state().items() if k != "health"})
    for gpu, _ts in last.items():
        if gpu not in state:
            assert auditor.counts["forgotten_gpus"] > 0
    # the batch path forgets, and judges against what it forgot, as the row path does (at any batch length)
    few, columnar.FEW_LINES = columnar.FEW_LINES, 1
    try:
        batched, again_auditor = _silent_run(s, arrival, looks, batches=True)
    finally:
        columnar.FEW_LINES = few
    assert [r.model_dump_json() for r in batched] == [r.model_dump_json() for r in out]
    assert again_auditor.to_state() == auditor.to_state()


def test_a_gpu_forgotten_and_back_is_billed_afresh_and_its_old_panes_stay_billed() -> None:
    """A GPU gone for the window past the timeout is forgotten; back hours later, its new panes bill as any
    new GPU's, and its old events, sent again, are late: not revised as never billed."""
    s = AuditSettings(lateness_s=0, window_h=1, idle_timeout_s=300, revision_horizon_s=1800, max_jump_s=86_400)
    auditor = Auditor(s)
    auditor.update(Price(gpu_model="H100", ts_ns=BASE_NS, usd_per_gpu_hour=Decimal("3")))
    old = [_sample("gone", t, 50.0) for t in range(0, 600, STEP_S)]
    out: list[Output] = []
    for e in old:
        out += auditor.update(e)
    for t in range(600, 3 * 3600, STEP_S):
        out += auditor.update(_sample("stays", t, 10.0))
        out += auditor.close_silent(auditor.panes.largest_watermark())  # type: ignore[arg-type]
    assert auditor.counts["forgotten_gpus"] == 1 and not auditor.panes.to_state()["max_ts"].keys() - {"stays"}
    first_bill = sum(r.cost_micro_usd for r in bills_of(out, "gone"))
    assert first_bill == 3_000_000 * 600 // 3600  # ten minutes of an H100 at $3/h, idle cost included
    back = [_sample("gone", t, 50.0) for t in range(3 * 3600, 3 * 3600 + 120, STEP_S)]
    for e in back:
        out += auditor.update(e)
    resent = [r for e in old for r in auditor.update(e)]
    assert [r.reason for r in resent if isinstance(r, DeadLetter)] == ["late"] * len(old) and all(
        isinstance(r, DeadLetter) for r in resent
    )
    out += auditor.finish()
    assert sum(r.cost_micro_usd for r in bills_of(out, "gone")) == first_bill + 3_000_000 * 120 // 3600


def bills_of(out: list[Output], gpu: str) -> list[CostRecord]:
    return [r for r in out if isinstance(r, CostRecord) and r.gpu_uuid == gpu]


def _tick(step_s: float) -> Callable[[], float]:
    """A clock that moves ``step_s`` each time it is read."""
    clock = [0.0]

    def monotonic() -> float:
        clock[0] += step_s
        return clock[0]

    return monotonic


def test_a_live_run_closes_and_forgets_a_gpu_gone_and_a_replay_of_file_after_file_forgets_nothing(
    tmp_path: Path,
) -> None:
    """The embedded run: a GPU silent in event time and on the clock has its panes billed as it goes, and is
    forgotten if the source is live; a replay reading one node's file after another's, whose second file
    lies back in time, is billed exactly as the same events in time order, with nothing refused."""
    s = AuditSettings(lateness_s=0, window_h=1, idle_timeout_s=300, revision_horizon_s=600, max_jump_s=86_400)
    price = Price(gpu_model="H100", ts_ns=BASE_NS - NS, usd_per_gpu_hour=Decimal("3"))
    gone = [_sample("gone", t, 50.0) for t in range(0, 600, STEP_S)]
    stays = [_sample("stays", t, 10.0, 5) for t in range(0, 4 * 3600, 5)]  # batches of 2,048: a look at each
    later = [_sample("later", t, 20.0, 5) for t in range(0, 4 * 3600, 5)]

    def costs(out: Path) -> Counter[tuple[str, int]]:
        return Counter(
            dict(
                ((gpu, start), c)
                for gpu, start, c in connect(out)
                .execute("SELECT gpu_uuid, pane_start_ns, sum(cost_micro_usd) FROM cost GROUP BY ALL")
                .fetchall()
            )
        )

    live = run_embedded(
        [(price, "x")] + [(e, "x") for e in sorted(gone + stays, key=lambda e: e.ts_ns)],
        s,
        tmp_path / "live",
        live=True,
        monotonic=_tick(s.idle_timeout_s),
    )
    assert live.counts["silent_closes"] > 0 and live.counts["forgotten_gpus"] == 1 and not live.dead_letters
    reference = run_embedded(
        [(price, "x")] + [(e, "x") for e in sorted(gone + stays, key=lambda e: e.ts_ns)],
        s,
        tmp_path / "reference",
        monotonic=lambda: 0.0,
    )
    assert reference.counts["silent_closes"] == 0
    assert costs(tmp_path / "live") == costs(tmp_path / "reference")

    files = run_embedded(
        [(price, "x")] + [(e, "a") for e in gone + stays] + [(e, "b") for e in later],
        s,
        tmp_path / "files",
        monotonic=_tick(s.idle_timeout_s),
    )
    assert files.counts["silent_closes"] > 0 and files.counts["forgotten_gpus"] == 0 and not files.dead_letters
    in_time = run_embedded(
        [(price, "x")] + [(e, "x") for e in sorted(gone + stays + later, key=lambda e: e.ts_ns)],
        s,
        tmp_path / "in-time",
        monotonic=lambda: 0.0,
    )
    assert costs(tmp_path / "files") == costs(tmp_path / "in-time") and not in_time.dead_letters


def _windows(addresses: list[MemAccess], width: int) -> list[tuple[int, int, int, float]]:
    """A process's MAE windows by brute force: (first_ts_ns, last_ts_ns, n, bits) of each run of ``width``
    addresses in order, the last one partial (every address here falls in the default range)."""
    out = []
    for lo in range(0, len(addresses), width):
        part = addresses[lo : lo + width]
        counts = Counter(a.address * 256 >> 32 for a in part)
        bits = -sum(c / len(part) * math.log2(c / len(part)) for c in counts.values())
        out.append((part[0].ts_ns, part[-1].ts_ns, len(part), bits))
    return out


def test_a_process_gone_silent_has_its_partial_mae_window_published_and_its_pid_reused_starts_afresh(
    tmp_path: Path,
) -> None:
    """A live run has no end of input, and a process that exits sends none: a process silent for
    ``idle_timeout_s`` in event time and on the clock has its partial MAE window published then, as at an end of
    input; a later process given the same pid starts a window of its own instead of filling the dead one's. The
    run's clock stopped, the same input cuts the two processes' addresses into windows as one stream."""
    s = AuditSettings(idle_timeout_s=300, mae_window=64)
    rng = random.Random(7)

    def access(pid: int, t_ms: int) -> MemAccess:
        return MemAccess(node_id="node-0", pid=pid, ts_ns=BASE_NS + t_ms * 1_000_000, address=rng.randrange(1 << 32))

    exited = [access(7, i * 1000) for i in range(100)]  # 100 s, then exits
    reused = [access(7, 7_200_000 + i * 1000) for i in range(40)]  # two hours later, another process: pid 7 again
    busy = [access(9, i * 500) for i in range(3 * 3600 * 2)]  # the node's clock: an address every 0.5 s for 3 h
    events = [(e, "ebpf") for e in sorted(exited + reused + busy, key=lambda e: e.ts_ns)]

    def windows(out: Path, pid: int) -> list[tuple[int, int, int, float]]:
        return [
            (first, last, n, round(bits, 9))
            for first, last, n, bits in connect(out)
            .execute("SELECT first_ts_ns, last_ts_ns, n, mae_bits FROM mae WHERE pid = ? ORDER BY first_ts_ns", [pid])
            .fetchall()
        ]

    def rounded(ws: list[tuple[int, int, int, float]]) -> list[tuple[int, int, int, float]]:
        return [(first, last, n, round(bits, 9)) for first, last, n, bits in ws]

    live = run_embedded(events, s, tmp_path / "live", live=True, monotonic=_tick(s.idle_timeout_s))
    assert windows(tmp_path / "live", 7) == rounded(_windows(exited, 64) + _windows(reused, 64))
    assert live.counts["mae_silent_closes"] == 2  # each of pid 7's last windows: the node went on without it
    stopped = run_embedded(events, s, tmp_path / "stopped", monotonic=lambda: 0.0)
    assert windows(tmp_path / "stopped", 7) == rounded(_windows(exited + reused, 64))
    assert stopped.counts["mae_silent_closes"] == 0
    assert windows(tmp_path / "live", 9) == windows(tmp_path / "stopped", 9) == rounded(_windows(busy, 64))


@pytest.mark.parametrize("batch", [False, True], ids=["rows", "batch"])
def test_a_silent_close_past_a_pending_jump_never_bills_a_pane_twice(batch: bool) -> None:
    """From a review: a sample an hour ahead is held as a pending jump; a silent close then moves the GPU's largest
    time past it; the next jump took the stale pending jump as the largest, the watermark moved back, and the pane the
    silent close had billed opened and was billed again as revision 0. Now that sample is a revision of it, on both
    paths, with the same records and state."""
    s = AuditSettings(pane_s=60, lateness_s=60, max_jump_s=600, idle_timeout_s=300)
    first = [
        Price(gpu_model="H100", ts_ns=BASE_NS - 3600 * NS, usd_per_gpu_hour=Decimal("3.6")),
        _sample("GPU-0", 893, 50.0, 10),
        _sample("GPU-0", 3915, 50.0, 10),  # an hour ahead: held as the pending jump
    ]
    second = [_sample("GPU-0", 101_160, 50.0, 10), _sample("GPU-0", 3930, 50.0, 10)]
    outs: list[list[Output]] = []
    states = []
    for by_batch in (False, batch):
        auditor, out = Auditor(s), []
        for part in (first, second):
            if by_batch:
                with closing_at(FEW_CLOSES, few_lines=0):
                    out += expand(auditor.ingest_lines([encode_event(e).encode() for e in part], str))
            else:
                out += [o for e in part for o in auditor.update(e)]
            if part is first:  # 3915 s is the pane of 3900 s, which this closes (the GPU's largest: 3960 + 60 s)
                out += auditor.close_silent(auditor.latest_ns() + 5000 * NS)
        outs.append(out + auditor.finish())
        states.append(auditor.to_state())
    assert [r.model_dump() for r in outs[0]] == [r.model_dump() for r in outs[1]] and states[0] == states[1]
    billed = Counter((r.pane_start_ns, r.revision) for r in outs[1] if isinstance(r, CostRecord))
    assert billed and max(billed.values()) == 1  # one record per pane and revision: one tenant here
    assert (BASE_NS + 3900 * NS, 1) in billed  # 3930 s came after the pane was billed: a revision


def _trace(gpu: str, t_s: int) -> EbpfTrace:
    return EbpfTrace(
        node_id="node-0",
        pid=7,
        gpu_uuid=gpu,
        ts_ns=BASE_NS + t_s * NS,
        sm_util_pct=50,
        flops_64b=10**12,
        trace_source="blas",
    )


@pytest.mark.parametrize("batch", [False, True], ids=["rows", "batch"])
def test_a_silent_close_drops_the_pending_jump_it_passes_on_both_paths(batch: bool) -> None:
    """From a second review: after a silent close past a pending jump, a batch of a refused sample (sent again) ran the
    jump rule on the batch path only, which dropped the jump there: the two paths kept different states. The silent
    close drops it itself now."""
    s = AuditSettings(pane_s=60, lateness_s=60, max_jump_s=600, idle_timeout_s=300)
    price = Price(gpu_model="H100", ts_ns=BASE_NS - 3600 * NS, usd_per_gpu_hour=Decimal("3.6"))
    # 3845 s: a pending jump; the trace opens the pane of 3780 s, which the silent close below closes
    first = [price, _sample("GPU-0", 893, 50.0, 10), _trace("GPU-0", 3830), _sample("GPU-0", 3845, 50.0, 10)]
    states, outs = [], []
    for by_batch in (False, batch):
        auditor = Auditor(s)
        out = [o for e in first for o in auditor.update(e)] + auditor.close_silent(BASE_NS + 4150 * NS)
        assert "pending" not in auditor.to_state()["panes"]
        again = [encode_event(_sample("GPU-0", 3845, 50.0, 10)).encode()]
        with closing_at(FEW_CLOSES, few_lines=0):
            out += expand(auditor.ingest_lines(again, str)) if by_batch else auditor.ingest(again[0], "0")
        states.append(auditor.to_state())
        outs.append([r.model_dump() for r in out])
    assert outs[0] == outs[1] and states[0] == states[1]


def test_a_gpu_of_traces_alone_keeps_the_floor_of_the_gpus_forgotten_through_a_silent_close() -> None:
    """From a second review: a GPU that sent only traces has no largest time of its own, and a silent close set its
    watermark from 0, below the floor of the GPUs forgotten: a sample of a pane the floor had passed (``late``
    before) was then billed."""
    s = AuditSettings(pane_s=60, lateness_s=60, max_jump_s=600, idle_timeout_s=300, revision_horizon_s=600, window_h=1)
    auditor = Auditor(s)
    price = Price(gpu_model="H100", ts_ns=BASE_NS - 3600 * NS, usd_per_gpu_hour=Decimal("3.6"))
    for e in [price, _trace("GPU-2", 44), *(_sample("GPU-0", t, 50.0, 10) for t in (0, 70, 6745))]:
        auditor.update(e)
    auditor.close_silent(BASE_NS + 20_000 * NS, {"GPU-0"})  # GPU-0 closed and forgotten: the floor
    floor = auditor.panes.watermark("GPU-2")
    assert floor is not None and floor > BASE_NS + 1060 * NS
    assert [o.reason for o in auditor.update(_sample("GPU-2", 1000, 50.0, 10)) if isinstance(o, DeadLetter)] == ["late"]
    auditor.close_silent(BASE_NS + 20_000 * NS, None, forget=False)  # closes the trace's pane
    assert auditor.panes.watermark("GPU-2") == floor
    late = auditor.update(_sample("GPU-2", 1005, 50.0, 10))
    assert [o.reason for o in late if isinstance(o, DeadLetter)] == ["late"]
