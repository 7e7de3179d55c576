"""Hostile input, one message at a time: no message may stop the pipeline, and the sink stores only what a worker
signed.

A key that is missing, not UTF-8 or too long, a malformed sequence header, a key id of 800,000 bytes, a thousand
unsigned keys: each is refused whole, with one bounded dead letter, and the next message is applied. A record the
sink cannot store, and a forged, altered or mis-signed record on an output topic, are dead-lettered; a batch is cut
to fit the broker's message limit. Driven without a broker (``tests.fake_kafka``); at the end of the session pytest
prints one line per attack: what was sent, what was refused and why, and the µ$ billed against the µ$ expected.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path

import pytest
from aiokafka import TopicPartition
from hypothesis import given
from hypothesis import strategies as st

from gpucost.kafka.encoding import split_batch
from gpucost.kafka.owned import Owned
from gpucost.kafka.settings import KafkaSettings
from gpucost.kafka.signing import Keyring, Signer, parse_keys
from gpucost.kafka.sink import output_record
from gpucost.kafka.worker import Worker
from gpucost.schemas.records import OUTPUT_KINDS, CostRecord, DeadLetter
from gpucost.schemas.topics import CONTROL_HEADER, END_OF_INPUT, SEQUENCE_HEADER
from gpucost.streams.settings import AuditSettings
from tests.fake_kafka import Message, RecordingProducer
from tests.support.hostile import (
    CONFIGS,
    KEY,
    SECRET_A,
    TP,
    apply,
    billed,
    expected_micro_usd,
    keyring,  # noqa: F401 (a fixture)
    letters,
    report,
    sign_prices,
    signed,
)
from tests.support.worker_input import LINES

# --- one message must never stop the pipeline ------------------------------------------------------


@pytest.mark.parametrize("key", [None, b"", b"\xff\xfeGPU", b"G" * 600])
@pytest.mark.parametrize("signing", [False, True])
@CONFIGS
def test_a_message_without_a_usable_key_is_refused_and_the_next_one_applied(
    audit: AuditSettings, key: bytes | None, signing: bool, keyring: Keyring
) -> None:
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
    report(
        f"key {key!r:.20}{' signed' if signing else ''}",
        2 * len(good),
        letters(out),
        billed(out),
        expected_micro_usd(good, audit),
        audit,
    )
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
    out, owned = apply(
        worker, [Message(KEY, value, 0, [("gpucost-key-id", b"k" * 800_000), ("gpucost-signature", b"00")])]
    )
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
    record = json.loads(
        b'{"record_id":"r","gpu_uuid":"g","node_id":"n","gpu_model":"m","pane_start_ns":0,'
        b'"pane_end_ns":60,"tenant_key":"t","team":"t","env":null,"app":null,"tier":null,"sla":null,'
        b'"git_commit":null,"ci_pipeline_id":null,"t_share":0,"b_share":0,"l_share":0,"weight":0,'
        b'"busy_fraction":0,"usd_per_gpu_hour":null,"pane_cost_micro_usd":0,"cost_micro_usd":0,'
        b'"unpriced":true,"revision":0,"t_num":0,"b_num":0,"l_num":0,"busy_num":0,"covered_ms":60}'
    )
    record["cost_micro_usd"] = micro_usd
    got = output_record("cost", json.dumps(record).encode(), "t.cost[0]@0")
    fits = -(1 << 63) <= micro_usd < 1 << 63
    assert isinstance(got, CostRecord) == fits
    assert fits or (isinstance(got, DeadLetter) and got.reason == "bad_output")


# --- output topics ------------------------------------------------------------------------------------


@CONFIGS
def test_the_sink_writes_only_what_a_worker_signed(
    audit: AuditSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One unsigned cost record on the cost topic reached the Parquet as $1,000,000.07. A worker with an
    output key signs every record it publishes; a sink with that keyring dead-letters anything else."""
    import gpucost.kafka.sink
    from gpucost.kafka.closing import is_control
    from gpucost.kafka.sink import run_kafka_sink
    from tests.fake_kafka import ScriptedConsumer

    output_key = f"worker-out {(b'w' * 32).hex()}"
    (tmp_path / "out.key").write_text(output_key + "\n")
    worker = Worker(
        KafkaSettings(), audit, group="g", output_signer=Signer(parse_keys(output_key, "test")["worker-out"])
    )
    owned = worker.owned[TP] = Owned(RecordingProducer(), {}, {}, 0)  # type: ignore[arg-type]
    asyncio.run(
        worker.process(
            TP, [Message(KEY, b"\n".join(LINES[KEY]), 0), Message(KEY, b"", 1, [(CONTROL_HEADER, END_OF_INPUT)])]
        )
    )
    published = owned.producer.published  # type: ignore[attr-defined]
    cost = KafkaSettings().topic("cost")
    costs = [m for m in published if m.topic == cost and not is_control(m.headers)]  # not the markers
    want = sum(json.loads(m.value)["cost_micro_usd"] for m in costs)
    forged = json.loads(costs[0].value) | {"record_id": "forged", "cost_micro_usd": 1_000_000_070_000}
    tampered = json.loads(costs[1].value) | {"cost_micro_usd": json.loads(costs[1].value)["cost_micro_usd"] * 1000}
    cost_topic = costs[0].topic
    hostile = [
        Message(costs[0].key, json.dumps(forged).encode(), 0, [], cost_topic, 0),  # unsigned
        Message(costs[1].key, json.dumps(tampered).encode(), 0, costs[1].headers, cost_topic, 0),  # altered
        Message(
            costs[2].key,
            costs[2].value,
            0,
            signed(costs[2].key, costs[2].value, SECRET_A, "worker-out").headers,
            cost_topic,
            0,
        ),
    ]  # wrong secret
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
        return await run_kafka_sink(
            {},
            topics,
            tmp_path / "pq",
            "g",
            ScriptedConsumer.done,
            flush_interval_s=0,
            compact_min_files=0,
            keyring=Keyring(tmp_path / "out.key"),
        )

    stats = asyncio.run(sink())
    import duckdb

    con = duckdb.connect()
    got = con.execute(
        f"SELECT sum(cost_micro_usd), count(*) FROM read_parquet('{tmp_path}/pq/cost/**/*.parquet')"
    ).fetchone()
    refused = con.execute(
        f"SELECT reason FROM read_parquet('{tmp_path}/pq/dlq/**/*.parquet') WHERE kind = 'cost'"
    ).fetchall()
    report(
        "forged, altered, mis-signed cost records",
        len(hostile),
        [
            DeadLetter(reason=r, detail="", kind="cost", source="", raw="", ts_ns=None, gpu_uuid=None)
            for (r,) in refused
        ],
        got[0],
        want,
        audit,
    )
    assert got == (want, len(costs)) and stats.unverified == 3
    assert sorted(r for (r,) in refused) == ["bad_signature", "bad_signature", "unsigned"]


# --- batches ------------------------------------------------------------------------------------------


@given(st.lists(st.text(min_size=0, max_size=300), max_size=60), st.integers(4096, 20_000))
def test_batches_are_cut_to_fit_the_message_limit(lines: list[str], limit: int) -> None:
    runs = split_batch(lines, limit)
    assert [line for run in runs for line in run] == lines
    for run in runs:
        assert len("\n".join(run).encode()) <= limit or len(run) == 1
