"""Hostile input: each attack a review of main reproduced, against the worker, the sink and the CLI.

Driven without a broker (``tests.fake_kafka``): the worker's own message handling and transactions,
the sink's record check, the CLI's query. At the end of the session pytest prints one line per
attack: what was sent, what was refused and why, and the µ$ billed against the µ$ expected.
"""
from __future__ import annotations

import asyncio
import json
from collections import Counter
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from aiokafka import TopicPartition
from aiokafka.errors import MessageSizeTooLargeError
from hypothesis import given
from hypothesis import strategies as st

from gpucost.cli import main
from gpucost.kafka import state as state_module
from gpucost.kafka.owned import Owned
from gpucost.kafka.publish import split_batch
from gpucost.kafka.settings import KafkaSettings
from gpucost.kafka.signing import Keyring, Signer, parse_keys
from gpucost.kafka.sink import output_record
from gpucost.kafka.state import restored
from gpucost.kafka.worker import Worker
from gpucost.report import format_table
from gpucost.schemas.blocks import expand
from gpucost.schemas.codec import decode_line
from gpucost.schemas.events import Price, TenantBinding
from gpucost.schemas.records import OUTPUT_KINDS, CostRecord, DeadLetter, IdleIndexRecord
from gpucost.schemas.topics import CONTROL_HEADER, END_OF_INPUT, SEQUENCE_HEADER
from gpucost.streams.audit import Auditor
from gpucost.streams.scope import price_mac
from gpucost.streams.settings import AuditSettings
from tests.conftest import HOSTILE_LINES, horizon_label
from tests.fake_kafka import Message, RecordingProducer
from tests.support.worker_input import LINES

#: every attack runs in the default configuration (a 6 h revision horizon) and with revisions off: a guarantee that
#: holds only with a feature off does not hold
CONFIGS = pytest.mark.parametrize("audit", [AuditSettings(), AuditSettings(revision_horizon_s=0)],
                                  ids=["revisions-default", "revisions-off"])
TP = TopicPartition("gpucost.events", 3)
KEY = next(iter(LINES))  # one GPU's stream: prices, bindings, samples
SECRET_A, SECRET_B, SECRET_P = b"a" * 32, b"b" * 32, b"p" * 32
KEYRING = f"node-a {SECRET_A.hex()} node-000\nnode-b {SECRET_B.hex()} node-001\nprices {SECRET_P.hex()} @prices\n"


def report(attack: str, sent: int, letters: list[DeadLetter], billed: int, expected: int, audit: AuditSettings
           ) -> None:
    reasons = dict(sorted(Counter(d.reason for d in letters).items()))
    HOSTILE_LINES.append(f"{horizon_label(audit):<5} {attack:<44} sent {sent:>6,} | refused {len(letters):>5,} "
                         f"{reasons or ''} | "
                         f"µ$ billed {billed:,} vs expected {expected:,} {'OK' if billed == expected else 'MISMATCH'}")


def expected_micro_usd(lines: list[bytes], audit: AuditSettings) -> int:
    """The embedded run's bill for ``lines`` sent once."""
    auditor = Auditor(audit)
    out = expand(auditor.ingest_lines(lines, str)) + auditor.finish()
    return sum(r.cost_micro_usd for r in out if isinstance(r, CostRecord))


def apply(worker: Worker, messages: list[Message], owned: Owned | None = None) -> tuple[list, Owned]:
    owned = owned or Owned(RecordingProducer(), {}, {}, 0)  # type: ignore[arg-type]
    return worker._apply(owned, messages, set(), Counter()), owned


def billed(out: list) -> int:
    return sum(r.cost_micro_usd for r in out if isinstance(r, CostRecord))


def letters(out: list) -> list[DeadLetter]:
    return [r for r in out if isinstance(r, DeadLetter)]


def signed(key: bytes, value: bytes, secret: bytes, key_id: str, headers: list[tuple[str, bytes]] | None = None,
           offset: int = 0) -> Message:
    signer = Signer(parse_keys(f"{key_id} {secret.hex()}", "test")[key_id])
    headers = list(headers or [])
    return Message(key, value, offset, headers + signer.headers(key, value, dict(headers)))


@pytest.fixture
def keyring(tmp_path: Path) -> Keyring:
    path = tmp_path / "ring"
    path.write_text(KEYRING)
    return Keyring(path)


def sign_prices(lines: list[bytes]) -> list[bytes]:
    """The stream with each price signed by the price authority, as `gpucost prices sign` writes it."""
    out = []
    for line in lines:
        event = decode_line(line)
        if isinstance(event, Price):
            event = event.model_copy(update={"key_id": "prices", "signature": price_mac(SECRET_P, event)})
            line = json.dumps(event.to_wire()).encode()
        out.append(line)
    return out


# --- one message must never stop the pipeline ------------------------------------------------------

@pytest.mark.parametrize("key", [None, b"", b"\xff\xfeGPU", b"G" * 600])
@pytest.mark.parametrize("signing", [False, True])
@CONFIGS
def test_a_message_without_a_usable_key_is_refused_and_the_next_one_applied(audit: AuditSettings, key: bytes | None,
                                                                           signing: bool,
                                                                           keyring: Keyring) -> None:
    worker = Worker(KafkaSettings(), audit, group="g", keyring=keyring if signing else None)
    good = LINES[KEY]
    bad = Message(key, b"\n".join(good), 0)  # type: ignore[arg-type]
    then = Message(KEY, b"\n".join(good), 1)
    end = Message(KEY, b"", 2, [(CONTROL_HEADER, END_OF_INPUT)])
    if signing:
        good = sign_prices(good)
        then = signed(KEY, b"\n".join(good), SECRET_A, "node-a", offset=1)
        end = signed(KEY, b"", SECRET_A, "node-a", [(CONTROL_HEADER, END_OF_INPUT)], offset=2)
    out, owned = apply(worker, [bad, then, end])
    refused = [d for d in letters(out) if d.reason == "bad_message"]
    assert len(refused) == 1 and refused[0].source.endswith("@0") and "skipped" in refused[0].detail
    assert list(owned.auditors) == [KEY.decode()]  # the bad message created no state
    report(f"key {key!r:.20}{' signed' if signing else ''}", 2 * len(good), letters(out), billed(out),
           expected_micro_usd(good, audit), audit)
    assert billed(out) == expected_micro_usd(good, audit)


@pytest.mark.parametrize("header", [b"s:" + b"9" * 5000, b"s:0", b"x" * 70 + b":1", b"s:1e3"])
@CONFIGS
def test_a_malformed_sequence_header_refuses_its_message(audit: AuditSettings, header: bytes) -> None:
    worker = Worker(KafkaSettings(), audit, group="g")
    out, owned = apply(worker, [Message(KEY, b"\n".join(LINES[KEY]), 0, [(SEQUENCE_HEADER, header)])])
    assert [d.reason for d in letters(out)] == ["bad_message"] and not owned.auditors
    assert worker.counts["bad_message"] == 1
    report(f"gpucost-seq {header[:12]!r}…", len(LINES[KEY]), letters(out), billed(out), 0, audit)


@CONFIGS
def test_a_huge_key_id_header_gives_one_bounded_dead_letter(audit: AuditSettings, keyring: Keyring) -> None:
    """0.8 MB of key id on a 500-line message once wrote 400 MB of dead letters (the id in each)."""
    worker = Worker(KafkaSettings(), audit, group="g", keyring=keyring)
    value = b"\n".join(LINES[KEY][:500])
    out, owned = apply(worker, [Message(KEY, value, 0, [("gpucost-key-id", b"k" * 800_000),
                                                        ("gpucost-signature", b"00")])])
    assert [d.reason for d in letters(out)] == ["bad_message"] and not owned.auditors
    assert sum(len(d.model_dump_json()) for d in out) < 2 * len(value) + 4096
    report("key-id header of 800,000 bytes", len(LINES[KEY][:500]), letters(out), 0, 0, audit)


@CONFIGS
def test_unsigned_messages_create_no_state(audit: AuditSettings, keyring: Keyring) -> None:
    worker = Worker(KafkaSettings(), audit, group="g", keyring=keyring)
    messages = [Message(f"GPU-{i}".encode(), LINES[KEY][0], i) for i in range(1000)]
    out, owned = apply(worker, messages)
    assert not owned.auditors and not owned.sequences
    assert Counter(d.reason for d in letters(out)) == {"unsigned": 1000}
    report("1,000 unsigned keys", 1000, letters(out), 0, 0, audit)


@given(st.integers(-(1 << 80), 1 << 80))
def test_the_sink_refuses_a_record_it_cannot_store(micro_usd: int) -> None:
    """A cost record of 2^70 µ$ on the cost topic stopped the sink at every restart (int64 columns)."""
    record = json.loads(b'{"record_id":"r","gpu_uuid":"g","node_id":"n","gpu_model":"m","pane_start_ns":0,'
                        b'"pane_end_ns":60,"tenant_key":"t","team":"t","env":null,"app":null,"tier":null,"sla":null,'
                        b'"git_commit":null,"ci_pipeline_id":null,"t_share":0,"b_share":0,"l_share":0,"weight":0,'
                        b'"busy_fraction":0,"usd_per_gpu_hour":null,"pane_cost_micro_usd":0,"cost_micro_usd":0,'
                        b'"unpriced":true,"revision":0,"t_num":0,"b_num":0,"l_num":0,"busy_num":0,"covered_ms":60}')
    record["cost_micro_usd"] = micro_usd
    got = output_record("cost", json.dumps(record).encode(), "t.cost[0]@0")
    fits = -(1 << 63) <= micro_usd < 1 << 63
    assert isinstance(got, CostRecord) == fits
    assert fits or (isinstance(got, DeadLetter) and got.reason == "bad_output")


# --- output topics ------------------------------------------------------------------------------------

@CONFIGS
def test_the_sink_writes_only_what_a_worker_signed(audit: AuditSettings, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """One unsigned cost record on the cost topic reached the Parquet as $1,000,000.07. A worker with an
    output key signs every record it publishes; a sink with that keyring dead-letters anything else."""
    import gpucost.kafka.sink
    from gpucost.kafka.closing import is_control
    from gpucost.kafka.sink import run_kafka_sink
    from tests.fake_kafka import ScriptedConsumer

    output_key = f"worker-out {(b'w' * 32).hex()}"
    (tmp_path / "out.key").write_text(output_key + "\n")
    worker = Worker(KafkaSettings(), audit, group="g",
                    output_signer=Signer(parse_keys(output_key, "test")["worker-out"]))
    owned = worker.owned[TP] = Owned(RecordingProducer(), {}, {}, 0)  # type: ignore[arg-type]
    asyncio.run(worker._process(TP, [Message(KEY, b"\n".join(LINES[KEY]), 0),
                                     Message(KEY, b"", 1, [(CONTROL_HEADER, END_OF_INPUT)])]))
    published = owned.producer.published  # type: ignore[attr-defined]
    costs = [m for m in published if m.topic.endswith("cost") and not is_control(m.headers)]  # not the markers
    want = sum(json.loads(m.value)["cost_micro_usd"] for m in costs)
    forged = json.loads(costs[0].value) | {"record_id": "forged", "cost_micro_usd": 1_000_000_070_000}
    tampered = json.loads(costs[1].value) | {"cost_micro_usd": json.loads(costs[1].value)["cost_micro_usd"] * 1000}
    cost_topic = costs[0].topic
    hostile = [Message(costs[0].key, json.dumps(forged).encode(), 0, [], cost_topic, 0),  # unsigned
               Message(costs[1].key, json.dumps(tampered).encode(), 0, costs[1].headers, cost_topic, 0),  # altered
               Message(costs[2].key, costs[2].value, 0, signed(costs[2].key, costs[2].value, SECRET_A,
                                                               "worker-out").headers, cost_topic, 0)]  # wrong secret
    polls = {}
    for m in published + hostile:
        polls.setdefault(TopicPartition(m.topic, m.partition), []).append(m)
    for _tp, messages in polls.items():
        for offset, m in enumerate(messages):
            m.offset = offset
    monkeypatch.setattr(ScriptedConsumer, "polls", [polls])
    monkeypatch.setattr(gpucost.kafka.sink, "AIOKafkaConsumer", ScriptedConsumer)

    async def sink() -> gpucost.kafka.sink.SinkStats:
        ScriptedConsumer.done = asyncio.Event()
        topics = {kind: KafkaSettings().topic(kind) for kind in OUTPUT_KINDS}
        return await run_kafka_sink({}, topics, tmp_path / "pq", "g", ScriptedConsumer.done, flush_interval_s=0,
                                    compact_min_files=0, keyring=Keyring(tmp_path / "out.key"))
    stats = asyncio.run(sink())
    import duckdb
    con = duckdb.connect()
    got = con.execute(f"SELECT sum(cost_micro_usd), count(*) FROM read_parquet('{tmp_path}/pq/cost/**/*.parquet')"
                      ).fetchone()
    refused = con.execute(f"SELECT reason FROM read_parquet('{tmp_path}/pq/dlq/**/*.parquet') WHERE kind = 'cost'"
                          ).fetchall()
    report("forged, altered, mis-signed cost records", len(hostile),
           [DeadLetter(reason=r, detail="", kind="cost", source="", raw="", ts_ns=None, gpu_uuid=None)
            for (r,) in refused], got[0], want, audit)
    assert got == (want, len(costs)) and stats.unverified == 3
    assert sorted(r for (r,) in refused) == ["bad_signature", "bad_signature", "unsigned"]


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
        runs += [Message(KEY, b"\n".join(LINES[KEY]), len(runs), [(SEQUENCE_HEADER, f"{session}:1".encode())]),
                 Message(KEY, b"", len(runs) + 1, [*end, (SEQUENCE_HEADER, f"{session}:2".encode())])]
    runs += runs[:2]  # and the first session's messages copied back into the topic
    out, _ = apply(worker, runs)
    ids = [r.record_id for r in out if isinstance(r, CostRecord)]
    want = expected_micro_usd(LINES[KEY], audit)
    report("the same input produced twice, then copied", 3 * len(LINES[KEY]), letters(out), billed(out), want, audit)
    assert billed(out) == want and len(ids) == len(set(ids))
    assert worker.counts["redelivered_messages"] == 2
    gpu_events = sum(1 for line in LINES[KEY] for kind in (b'"gpu_sample"', b'"process_sample"', b'"numa_event"')
                     if kind in line)
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
    out, _ = apply(worker, [Message(KEY, b"\n".join(twice[k:k + 50]), k // 50) for k in range(0, len(twice), 50)]
                   + [Message(KEY, b"", len(twice), [(CONTROL_HEADER, END_OF_INPUT)])])
    want = expected_micro_usd(lines, audit)
    report(f"a second sampler {shift_s} s out of phase", len(twice), letters(out), billed(out), want, audit)
    samples = len(twice) - len(lines)
    assert Counter(d.reason for d in letters(out)) == Counter({"overlap": samples})
    assert billed(out) == want
    once = Auditor(audit)
    covered = {(r.pane_start_ns, r.covered_ms) for r in expand(once.ingest_lines(lines, str)) + once.finish()
               if isinstance(r, IdleIndexRecord)}
    for path in (lambda a: [o for k in range(0, len(twice), 7) for o in a.ingest_lines(twice[k:k + 7], str)],
                 lambda a: a.ingest_lines(twice, str)):  # the row path, the batch path
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
    lines = [json.dumps({"kind": "price", "gpu_model": "H100", "ts_ns": t0 - 10**9,
                         "usd_per_gpu_hour": price}).encode()]
    for g in range(gpus):
        for k in range(60):
            common = {"node_id": "n", "gpu_uuid": f"GPU-{g}", "ts_ns": t0 + k * 10**9, "interval_s": 3600,
                      "mem_bw_util_pct": 100, "mem_used_bytes": 1}
            lines.append(json.dumps({"kind": "gpu_sample", **common, "gpu_model": "H100", "sm_util_pct": 100,
                                     "mem_total_bytes": 2, "power_w": 700, "temp_c": 60}).encode())
            lines += [json.dumps({"kind": "process_sample", **common, "pid": pid, "sm_util_pct": 100}).encode()
                      for pid in (1, 2)]
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
    hostile = lines[:len(lines) // 4] + [json.dumps(bad).encode()] + lines[len(lines) // 4:]
    want = expected_micro_usd(lines + [json.dumps(bad).encode()], audit)
    worker = Worker(KafkaSettings(), audit, group="g")
    out, _ = apply(worker, [Message(KEY, b"\n".join(hostile[k:k + 40]), k // 40) for k in range(0, len(hostile), 40)]
                   + [Message(KEY, b"", len(hostile), [(CONTROL_HEADER, END_OF_INPUT)])])
    report(f"one gpu_sample {ahead_s:,} s ahead", len(hostile), letters(out), billed(out), want, audit)
    assert letters(out) == [] and billed(out) == want
    for path in (lambda a: [o for line in hostile for o in a.ingest(line, "x")],
                 lambda a: a.ingest_lines(hostile, str)):
        auditor = Auditor(audit)
        records = expand(path(auditor)) + auditor.finish()
        assert billed(records) == want and letters(records) == []


@CONFIGS
def test_many_gpu_ids_of_one_sample_each_keep_small_states(audit: AuditSettings) -> None:
    """200,000 GPU ids with one sample each took a replay to 8 GB: each GPU's idle window was a ring of
    4,320 slots (34 KiB) from its first pane. A GPU with few panes keeps a list of them."""
    t0, gpus = 1767571200 * 10**9, 2_000
    lines = [json.dumps({"kind": "gpu_sample", "node_id": "n", "gpu_uuid": f"GPU-{g:06d}", "gpu_model": "H100",
                         "ts_ns": t0 + g * 10**6, "interval_s": 10, "sm_util_pct": 50, "mem_bw_util_pct": 1,
                         "mem_used_bytes": 1, "mem_total_bytes": 2, "power_w": 1, "temp_c": 1}).encode()
             for g in range(gpus)]
    auditor = Auditor(audit)
    out = expand(auditor.ingest_lines(lines, str)) + auditor.finish()
    per_gpu = len(json.dumps(auditor.idle.to_state())) / gpus
    HOSTILE_LINES.append(f"{f'{gpus:,} GPU ids of one sample each':<44} sent {gpus:>6,} | idle state "
                         f"{per_gpu:,.0f} bytes per GPU (as rings: about 46 KB)")
    assert sum(isinstance(r, IdleIndexRecord) for r in out) == gpus and per_gpu < 200


@CONFIGS
def test_a_state_over_the_message_limit_is_split_and_a_refused_delivery_aborts(audit: AuditSettings,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A key's state over the broker's limit was refused while the transaction committed without it."""
    bindings = [json.dumps({"kind": "tenant_binding", "node_id": "node-000", "pid": pid, "ts_ns": 1736121600000000000,
                            "team": "t" * 200, "env": "e", "app": "a", "tier": "x", "sla": "Gold"}).encode()
                for pid in range(40_000, 44_000)]
    worker = Worker(KafkaSettings(), audit, group="g")
    producer = RecordingProducer(max_message_bytes=300 << 10)
    owned = worker.owned[TP] = Owned(producer, {}, {}, 0)  # type: ignore[arg-type]
    asyncio.run(worker._process(TP, [Message(KEY, b"\n".join(bindings + LINES[KEY][:200]), 0)]))
    latest = {key: value for _, key, value in producer.transactions[-1]}
    assert max(len(v or b"") for v in latest.values()) <= 300 << 10 < sum(len(v or b"") for v in latest.values())
    assert restored(audit, latest).auditors[KEY.decode()].to_state() == owned.auditors[KEY.decode()].to_state()
    # a record the broker refuses aborts the transaction and stops the worker, offsets uncommitted
    monkeypatch.setattr(state_module, "STATE_CHUNK_BYTES", 4 << 20)
    with pytest.raises(MessageSizeTooLargeError):
        asyncio.run(worker._process(TP, [Message(KEY, b"\n".join(LINES[KEY][200:400]), 1)]))
    assert producer.aborted == 1 and len(producer.transactions) == 1


@CONFIGS
def test_bindings_resent_every_second_cost_nothing(audit: AuditSettings) -> None:
    """dcgm's pod binding at every scrape grew the table, and each store scanned it: O(n²)."""
    auditor = Auditor(audit)
    t0 = 1736121600000000000
    for k in range(3600):
        assert auditor.update(TenantBinding(node_id="n", pid=7, ts_ns=t0 + k * 10**9, team="ml", env="", app="",
                                            tier="", sla="Gold")) == []
    assert len(auditor.bindings.lookup_many("n", 7, np.array([], np.int64))[0]) == 1  # one binding kept
    assert auditor.counts["binding_unchanged"] == 3599


# --- no node may speak for another --------------------------------------------------------------------

@CONFIGS
def test_a_node_key_cannot_forge_prices_end_other_gpus_or_sign_their_samples(audit: AuditSettings,
                                                                             keyring: Keyring) -> None:
    lines = sign_prices(LINES[KEY])
    want = expected_micro_usd(lines, audit)
    worker = Worker(KafkaSettings(), audit, group="g", keyring=keyring)
    forged_price = json.dumps({"kind": "price", "gpu_model": "default", "ts_ns": 1736035200000000001,
                               "usd_per_gpu_hour": "0"}).encode()
    other_gpu = next(line for line in LINES[list(LINES)[1]] if b'"gpu_sample"' in line)
    own_sample = next(line for line in lines if b'"process_sample"' in line)
    messages = [
        signed(KEY, b"\n".join(lines), SECRET_A, "node-a"),
        signed(KEY, forged_price, SECRET_A, "node-a", offset=1),  # a node's price: unsigned by the authority
        signed(KEY, other_gpu, SECRET_A, "node-a", offset=2),  # another GPU's sample under this key
        signed(KEY, own_sample.replace(b"node-000", b"node-001"), SECRET_B, "node-b", offset=3),  # node-b on a's GPU
        signed(KEY, b"", SECRET_B, "node-b", [(CONTROL_HEADER, END_OF_INPUT)], offset=4),  # node-b ends a's GPU
        signed(KEY, b"", SECRET_A, "node-a", [(CONTROL_HEADER, END_OF_INPUT)], offset=5),
    ]
    out, owned = apply(worker, messages)
    reasons = Counter(d.reason for d in letters(out))
    report("node key: price, other GPU, foreign node, end", len(lines) + 4, letters(out), billed(out), want, audit)
    assert billed(out) == want
    assert reasons == {"unsigned": 1, "wrong_key": 3}
    assert owned.owners == {KEY.decode(): "node-000"}


@CONFIGS
def test_unsigned_prices_are_refused_unless_the_signer_may_set_prices(audit: AuditSettings, keyring: Keyring,
                                                                      tmp_path: Path) -> None:
    worker = Worker(KafkaSettings(), audit, group="g", keyring=keyring)
    out, _ = apply(worker, [signed(KEY, b"\n".join(LINES[KEY]), SECRET_A, "node-a")])
    prices = sum(1 for line in LINES[KEY] if b'"price"' in line)
    assert Counter(d.reason for d in letters(out))["unsigned"] == prices > 0
    # a key of any node (``*``), as a single-key deployment has, vouches for the prices it carries
    (tmp_path / "admin").write_text(f"admin {SECRET_P.hex()} *\n")
    worker = Worker(KafkaSettings(), audit, group="g", keyring=Keyring(tmp_path / "admin"))
    out, _ = apply(worker, [signed(KEY, b"\n".join(LINES[KEY]), SECRET_P, "admin")])
    assert not letters(out)


@pytest.mark.parametrize("padding", [10, 200])  # the row path (few lines) and the batch path
@CONFIGS
def test_one_parser_decides_what_a_line_is(audit: AuditSettings, padding: int, keyring: Keyring) -> None:
    """A number of 4,400 digits: Python's json refuses the line, Arrow's reader took it; so 128+ padded
    lines once passed as another node's. Both paths now refuse it the same way."""
    huge = b'{"kind":"gpu_sample","pad":' + b"7" * 4400 + b',' + LINES[KEY][-1].split(b"{", 1)[1]
    lines = [huge.replace(b"node-000", b"node-001")] * padding
    row = Auditor(audit)
    want = [(d.reason, d.kind) for d in (row.ingest(line, "x")[0] for line in lines)]
    worker = Worker(KafkaSettings(), audit, group="g", keyring=keyring)
    out, _ = apply(worker, [signed(KEY, b"\n".join(lines), SECRET_A, "node-a")])
    assert [(d.reason, d.kind) for d in letters(out)] == want == [("malformed_json", None)] * padding
    report(f"4,400-digit numbers, {padding} lines", padding, letters(out), billed(out), 0, audit)


# --- names, queries, batches ---------------------------------------------------------------------------

@pytest.mark.parametrize("team", ["idle ", "Idle", "idle\u00a0", "ıdle", "unattributed\u200b", "ＩＤＬＥ",
                                  "іdle", "un\u0301attributed"])
def test_reserved_team_names_are_matched_as_they_read(team: str) -> None:
    line = json.dumps({"kind": "tenant_binding", "node_id": "n", "pid": 1, "ts_ns": 1736121600000000000,
                       "team": team, "env": "", "app": "", "tier": "", "sla": "Gold"})
    rejected = decode_line(line)
    assert not isinstance(rejected, TenantBinding) and rejected.reason == "invalid" and "reserved" in rejected.detail


def test_control_characters_never_reach_the_terminal() -> None:
    table = format_table(["team"], [["\x1b[2J\x1b[31mred"], ["zero\u200bwidth"]])
    assert "\x1b" not in table and "\u200b" not in table and "\\x1b[2J" in table


def test_query_is_read_only_and_confined_to_the_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert main(["simulate", "--gpus", "1", "--hours", "0.2", "--out", str(tmp_path / "events")]) == 0
    assert main(["replay", str(tmp_path / "events"), "--out", str(out)]) == 0
    capsys.readouterr()
    for sql in ("COPY (SELECT 1) TO '" + str(out / "x.csv") + "'", "SELECT * FROM read_text('/etc/passwd')",
                "ATTACH '" + str(tmp_path / "x.db") + "'", "SET enable_external_access = true"):
        assert main(["query", "--out", str(out), sql]) == 2, sql
        assert "gpucost: error" in capsys.readouterr().err
    assert not (out / "x.csv").exists() and not (tmp_path / "x.db").exists()
    assert main(["query", "--out", str(out), "SELECT count(*) FROM cost"]) == 0
    assert main(["query", "--unsafe", "--out", str(out), f"COPY (SELECT 1) TO '{tmp_path / 'y.csv'}'"]) == 0
    assert (tmp_path / "y.csv").exists()


@given(st.lists(st.text(min_size=0, max_size=300), max_size=60), st.integers(4096, 20_000))
def test_batches_are_cut_to_fit_the_message_limit(lines: list[str], limit: int) -> None:
    runs = split_batch(lines, limit)
    assert [line for run in runs for line in run] == lines
    for run in runs:
        assert len("\n".join(run).encode()) <= limit or len(run) == 1


@pytest.mark.slow
@given(st.lists(st.tuples(st.integers(0, len(LINES) - 1), st.integers(0, 10_000)), min_size=130, max_size=260),
       st.sampled_from([None, frozenset({"node-000"}), frozenset({"node-001"})]))
@CONFIGS
def test_both_paths_refuse_what_a_message_may_not_carry(audit: AuditSettings, picks: list[tuple[int, int]],
                                                        nodes: frozenset[str] | None) -> None:
    """Lines of several GPUs in a message of one: the batch path (here, 130+ lines) refuses exactly the
    lines, and for the reasons, the row path refuses (a mutation of either check fails this)."""
    from gpucost.streams.scope import Scope

    keys = list(LINES)
    lines = [LINES[keys[k]][i % len(LINES[keys[k]])] for k, i in picks]
    scope = Scope(KEY.decode(), nodes)
    row = Auditor(audit)
    want = [out for i, line in enumerate(lines) for out in row.ingest(line, str(i), scope)]
    batch = Auditor(audit)
    got = expand(batch.ingest_lines(lines, str, scope))
    assert [(d.reason, d.source) for d in letters(got)] == [(d.reason, d.source) for d in letters(want)]
    got, want = got + batch.finish(), want + row.finish()
    assert [r.model_dump() for r in got] == [r.model_dump() for r in want]
