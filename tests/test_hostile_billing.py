"""Hostile input against the bill: nothing billed twice, nothing lost to one bad clock, no state that grows
without bound.

An input produced twice (and copied back), a second sampler of the same GPU out of phase, the largest price on
hour-long samples, one sample stamped far ahead, 2,000 GPU ids of one sample each, a state over the broker's message
limit, a binding re-sent every second: on the worker (driven without a broker, ``tests.fake_kafka``) and on the
operator's row and batch entries, each bill against the bill of one clean send. At the end of the session pytest
prints one line per attack.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
from aiokafka.errors import MessageSizeTooLargeError

from gpucost.kafka import state as state_module
from gpucost.kafka.owned import Owned
from gpucost.kafka.settings import KafkaSettings
from gpucost.kafka.state import restored
from gpucost.kafka.worker import Worker
from gpucost.schemas.blocks import expand
from gpucost.schemas.events import TenantBinding
from gpucost.schemas.records import CostRecord, IdleIndexRecord
from gpucost.schemas.topics import CONTROL_HEADER, END_OF_INPUT, SEQUENCE_HEADER
from gpucost.streams.audit import Auditor
from gpucost.streams.settings import AuditSettings
from tests.conftest import HOSTILE_LINES
from tests.fake_kafka import Message, RecordingProducer
from tests.support.hostile import (
    CONFIGS,
    KEY,
    TP,
    apply,
    billed,
    expected_micro_usd,
    letters,
    report,
)
from tests.support.worker_input import LINES

# --- nothing billed twice -----------------------------------------------------------------------------


@CONFIGS
def test_an_input_produced_twice_is_billed_once(audit: AuditSettings) -> None:
    """A second `produce` of the same file is a new producer session: after the first run's end of
    input its events are duplicates of those the revision horizon keeps (late beyond it), never a second
    bill (it once doubled the µ$)."""
    worker = Worker(KafkaSettings(), audit, group="g")
    end = [(CONTROL_HEADER, END_OF_INPUT)]
    runs = []
    for session in ("s1", "s2"):
        runs += [
            Message(KEY, b"\n".join(LINES[KEY]), len(runs), [(SEQUENCE_HEADER, f"{session}:1".encode())]),
            Message(KEY, b"", len(runs) + 1, [*end, (SEQUENCE_HEADER, f"{session}:2".encode())]),
        ]
    runs += runs[:2]  # and the first session's messages copied back into the topic
    out, _ = apply(worker, runs)
    ids = [r.record_id for r in out if isinstance(r, CostRecord)]
    want = expected_micro_usd(LINES[KEY], audit)
    report("the same input produced twice, then copied", 3 * len(LINES[KEY]), letters(out), billed(out), want, audit)
    assert billed(out) == want and len(ids) == len(set(ids))
    assert worker.counts["redelivered_messages"] == 2
    gpu_events = sum(
        1 for line in LINES[KEY] for kind in (b'"gpu_sample"', b'"process_sample"', b'"numa_event"') if kind in line
    )
    refused = Counter(d.reason for d in letters(out))
    # the second run, all of it: duplicates within the horizon, late beyond it (all of it, with revisions off)
    assert refused["duplicate"] + (0 if audit.revision_horizon_s else refused["late"]) >= gpu_events


def second_sampler(lines: list[bytes], shift_s: float) -> list[bytes]:
    """``lines`` with every GPU and process sample sent again by a second sampler ``shift_s`` later."""
    out = []
    for line in lines:
        out.append(line)
        event = json.loads(line)
        if event["kind"] in ("gpu_sample", "process_sample"):
            event["ts_ns"] += int(shift_s * 1e9)
            out.append(json.dumps(event).encode())
    return out


@pytest.mark.parametrize("shift_s", [5, 0.5, 0.74])
@CONFIGS
def test_two_samplers_of_one_gpu_bill_its_time_once(audit: AuditSettings, shift_s: float) -> None:
    """Two samplers out of phase gave covered_ms 120,024 in a 60 s pane and twice the bill. The second
    one's samples are ``overlap``, on both paths, and each pane covers at most its length."""
    lines = LINES[KEY]
    interval_ms = {json.loads(line)["interval_s"] * 1000 for line in lines if b'"gpu_sample"' in line}
    assert max(interval_ms) * 0.75 > shift_s * 1000  # so the second sampler's samples lie within 3/4 of it
    twice = second_sampler(lines, shift_s)
    worker = Worker(KafkaSettings(), audit, group="g")
    out, _ = apply(
        worker,
        [Message(KEY, b"\n".join(twice[k : k + 50]), k // 50) for k in range(0, len(twice), 50)]
        + [Message(KEY, b"", len(twice), [(CONTROL_HEADER, END_OF_INPUT)])],
    )
    want = expected_micro_usd(lines, audit)
    report(f"a second sampler {shift_s} s out of phase", len(twice), letters(out), billed(out), want, audit)
    samples = len(twice) - len(lines)
    assert Counter(d.reason for d in letters(out)) == Counter({"overlap": samples})
    assert billed(out) == want
    once = Auditor(audit)
    covered = {
        (r.pane_start_ns, r.covered_ms)
        for r in expand(once.ingest_lines(lines, str)) + once.finish()
        if isinstance(r, IdleIndexRecord)
    }
    for path in (
        lambda a: [o for k in range(0, len(twice), 7) for o in a.ingest_lines(twice[k : k + 7], str)],
        lambda a: a.ingest_lines(twice, str),
    ):  # the row path, the batch path
        auditor = Auditor(audit)
        records = expand(path(auditor)) + auditor.finish()
        assert billed(records) == want and auditor.counts["overlap"] == samples
        assert {(r.pane_start_ns, r.covered_ms) for r in records if isinstance(r, IdleIndexRecord)} == covered


@pytest.mark.parametrize("gpus", [1, 60])  # the row path (few lines), the batch path
@CONFIGS
def test_the_largest_price_on_hour_long_samples_bills_exactly(audit: AuditSettings, gpus: int) -> None:
    """A price of 999,999,999.999999 $/h with hour-long samples a second apart in one pane overflowed
    int64 in the batch path (replay exited 1, leaving idle_index but no cost). Each GPU's first sample
    bills an hour at that price; the rest are a second sampler (``overlap``)."""
    t0, price = 1767571200 * 10**9, "999999999.999999"
    lines = [
        json.dumps({"kind": "price", "gpu_model": "H100", "ts_ns": t0 - 10**9, "usd_per_gpu_hour": price}).encode()
    ]
    for g in range(gpus):
        for k in range(60):
            common = {
                "node_id": "n",
                "gpu_uuid": f"GPU-{g}",
                "ts_ns": t0 + k * 10**9,
                "interval_s": 3600,
                "mem_bw_util_pct": 100,
                "mem_used_bytes": 1,
            }
            lines.append(
                json.dumps(
                    {
                        "kind": "gpu_sample",
                        **common,
                        "gpu_model": "H100",
                        "sm_util_pct": 100,
                        "mem_total_bytes": 2,
                        "power_w": 700,
                        "temp_c": 60,
                    }
                ).encode()
            )
            lines += [
                json.dumps({"kind": "process_sample", **common, "pid": pid, "sm_util_pct": 100}).encode()
                for pid in (1, 2)
            ]
    auditor = Auditor(audit)
    out = expand(auditor.ingest_lines(lines, str)) + auditor.finish()
    want = gpus * int(Fraction(price) * 10**6)  # an hour at that price, in µ$, for each GPU
    report(f"price {price} $/h, hour-long samples, {gpus} GPU(s)", len(lines), letters(out), billed(out), want, audit)
    assert billed(out) == want
    assert Counter(d.reason for d in letters(out)) == Counter({"overlap": gpus * 59 * 3})


@pytest.mark.parametrize("ahead_s", [3600, 30 * 86_400])
@CONFIGS
def test_one_sample_far_ahead_does_not_make_its_gpus_later_events_late(audit: AuditSettings, ahead_s: int) -> None:
    """One gpu_sample stamped an hour ahead, early in a replay, made 1,428 later events of its GPU late and
    halved the bill. It is counted in its own pane, but moves the watermark only once a second event that
    far ahead confirms it (``max_jump_s``): the bill is the bill of the same events in event-time order."""
    lines = LINES[KEY]
    samples = [json.loads(line) for line in lines if b'"gpu_sample"' in line]
    bad = dict(samples[0], ts_ns=max(e["ts_ns"] for e in samples) + ahead_s * 10**9)
    hostile = lines[: len(lines) // 4] + [json.dumps(bad).encode()] + lines[len(lines) // 4 :]
    want = expected_micro_usd(lines + [json.dumps(bad).encode()], audit)
    worker = Worker(KafkaSettings(), audit, group="g")
    out, _ = apply(
        worker,
        [Message(KEY, b"\n".join(hostile[k : k + 40]), k // 40) for k in range(0, len(hostile), 40)]
        + [Message(KEY, b"", len(hostile), [(CONTROL_HEADER, END_OF_INPUT)])],
    )
    report(f"one gpu_sample {ahead_s:,} s ahead", len(hostile), letters(out), billed(out), want, audit)
    assert letters(out) == [] and billed(out) == want
    for path in (
        lambda a: [o for line in hostile for o in a.ingest(line, "x")],
        lambda a: a.ingest_lines(hostile, str),
    ):
        auditor = Auditor(audit)
        records = expand(path(auditor)) + auditor.finish()
        assert billed(records) == want and letters(records) == []


@CONFIGS
def test_many_gpu_ids_of_one_sample_each_keep_small_states(audit: AuditSettings) -> None:
    """200,000 GPU ids with one sample each took a replay to 8 GB: each GPU's idle window was a ring of
    4,320 slots (34 KiB) from its first pane. A GPU with few panes keeps a list of them."""
    t0, gpus = 1767571200 * 10**9, 2_000
    lines = [
        json.dumps(
            {
                "kind": "gpu_sample",
                "node_id": "n",
                "gpu_uuid": f"GPU-{g:06d}",
                "gpu_model": "H100",
                "ts_ns": t0 + g * 10**6,
                "interval_s": 10,
                "sm_util_pct": 50,
                "mem_bw_util_pct": 1,
                "mem_used_bytes": 1,
                "mem_total_bytes": 2,
                "power_w": 1,
                "temp_c": 1,
            }
        ).encode()
        for g in range(gpus)
    ]
    auditor = Auditor(audit)
    out = expand(auditor.ingest_lines(lines, str)) + auditor.finish()
    per_gpu = len(json.dumps(auditor.idle.to_state())) / gpus
    HOSTILE_LINES.append(
        f"{f'{gpus:,} GPU ids of one sample each':<44} sent {gpus:>6,} | idle state "
        f"{per_gpu:,.0f} bytes per GPU (as rings: about 46 KB)"
    )
    assert sum(isinstance(r, IdleIndexRecord) for r in out) == gpus and per_gpu < 200


@CONFIGS
def test_a_state_over_the_message_limit_is_split_and_a_refused_delivery_aborts(
    audit: AuditSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key's state over the broker's limit was refused while the transaction committed without it."""
    bindings = [
        json.dumps(
            {
                "kind": "tenant_binding",
                "node_id": "node-000",
                "pid": pid,
                "ts_ns": 1736121600000000000,
                "team": "t" * 200,
                "env": "e",
                "app": "a",
                "tier": "x",
                "sla": "Gold",
            }
        ).encode()
        for pid in range(40_000, 44_000)
    ]
    worker = Worker(KafkaSettings(), audit, group="g")
    producer = RecordingProducer(max_message_bytes=300 << 10)
    owned = worker.owned[TP] = Owned(producer, {}, {}, 0)  # type: ignore[arg-type]
    asyncio.run(worker.process(TP, [Message(KEY, b"\n".join(bindings + LINES[KEY][:200]), 0)]))
    latest = {key: value for _, key, value in producer.transactions[-1]}
    assert max(len(v or b"") for v in latest.values()) <= 300 << 10 < sum(len(v or b"") for v in latest.values())
    assert restored(audit, latest).auditors[KEY.decode()].to_state() == owned.auditors[KEY.decode()].to_state()
    # a record the broker refuses aborts the transaction and stops the worker, offsets uncommitted
    monkeypatch.setattr(state_module, "STATE_CHUNK_BYTES", 4 << 20)
    with pytest.raises(MessageSizeTooLargeError):
        asyncio.run(worker.process(TP, [Message(KEY, b"\n".join(LINES[KEY][200:400]), 1)]))
    assert producer.aborted == 1 and len(producer.transactions) == 1


@CONFIGS
def test_bindings_resent_every_second_cost_nothing(audit: AuditSettings) -> None:
    """dcgm's pod binding at every scrape grew the table, and each store scanned it: O(n²)."""
    auditor = Auditor(audit)
    t0 = 1736121600000000000
    for k in range(3600):
        assert (
            auditor.update(
                TenantBinding(node_id="n", pid=7, ts_ns=t0 + k * 10**9, team="ml", env="", app="", tier="", sla="Gold")
            )
            == []
        )
    assert len(auditor.bindings.lookup_many("n", 7, np.array([], np.int64))[0]) == 1  # one binding kept
    assert auditor.counts["binding_unchanged"] == 3599
