"""Fault injection against the real broker, on its secured listeners: forged, unsigned, tampered and re-sent
messages with producer, worker and sink all on TLS, and SCRAM credentials that reach every client (and wrong ones
that are refused, saying what to check).

At the end of the session pytest prints one line per fault: events sent, records in the output, events
dead-lettered (by reason), and µ$ billed against µ$ expected (tests/support/faults.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from gpucost.kafka.routing import Router
from gpucost.kafka.signing import Signer, parse_keys
from gpucost.kafka.worker import INPUTS
from gpucost.producers.replay import input_files
from gpucost.schemas.codec import Rejected, decode_line
from gpucost.schemas.events import Event
from gpucost.schemas.topics import CONTROL_HEADER, END_OF_INPUT
from gpucost.sinks.views import connect
from tests.conftest import Broker
from tests.support.deployment import (
    Deployment,
    assert_same_parquet,
    deployment,  # noqa: F401 (a fixture)
    run_to_completion,
)
from tests.support.faults import events_in, report

pytestmark = [pytest.mark.slow, pytest.mark.kafka]


async def _first_messages(bootstrap: str, topic: str) -> list[tuple[bytes, bytes, list[tuple[str, bytes]]]]:
    """The first message of each partition of ``topic``, headers and all."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(4)]
        consumer.assign(tps)
        copies = []
        for tp in tps:
            batch = (await consumer.getmany(tp, timeout_ms=5000, max_records=1)).get(tp, [])
            copies += [(m.key, m.value, list(m.headers)) for m in batch]
        return copies
    finally:
        await consumer.stop()


async def _inject(bootstrap: str, topic: str, messages: list[tuple[bytes, bytes, list[tuple[str, bytes]]]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for key, value, headers in messages:
            await producer.send_and_wait(topic, value, key=key, headers=headers)
    finally:
        await producer.stop()


def test_forged_events_over_tls(deployment: Deployment, kafka_broker: Broker, recorded: tuple[Path, Path]) -> None:
    """Producer, worker and sink all on the TLS listener; the worker verifies signatures."""
    events, embedded = recorded
    d = deployment
    old, new = (f"{kid} {secrets.token_hex(32)}" for kid in ("2026-11", "2026-12"))
    (d.tmp / "ring").write_text(f"{old}\n{new}\n")  # mid-rotation: both accepted
    (d.tmp / "producer.key").write_text(new + "\n")
    d.env.update(
        GPUCOST_KAFKA_BOOTSTRAP=kafka_broker.tls_bootstrap,
        GPUCOST_KAFKA_SECURITY_PROTOCOL="SSL",
        GPUCOST_KAFKA_SSL_CAFILE=str(kafka_broker.ca_file),
    )
    d.gpucost(
        "produce",
        "--source",
        "replay",
        str(events),
        "--signing-key-file",
        str(d.tmp / "producer.key"),
        "--no-end-of-input",
    )
    # what an attacker who can reach the broker sends: real-looking batches for a real GPU's key
    line = next(ln for f in input_files([events]) for ln in f.open("rb") if b'"gpu_sample"' in ln).strip()
    gpu = json.loads(line)["gpu_uuid"].encode()
    fake = json.dumps({**json.loads(line), "sm_util_pct": 100.0, "ts_ns": json.loads(line)["ts_ns"] + 1}).encode()
    stranger = Signer(parse_keys(f"evil {secrets.token_hex(32)}", "attacker")["evil"])
    honest = Signer(parse_keys(new, "ring")["2026-12"])
    forged = [
        (gpu, fake, []),
        (gpu, fake, stranger.headers(gpu, fake)),
        (gpu, fake + b"\n" + fake, honest.headers(gpu, fake)),
    ]  # a signed message with a line appended
    # then the end of the input, signed as the producer would (every key it wrote to)
    router = Router()
    keys = {(t, k) for ev in replay_events(events) for t, k, _ in router.route(ev) if t in INPUTS}
    end = {CONTROL_HEADER: END_OF_INPUT}
    ends = [(k.encode(), b"", [*end.items(), *honest.headers(k.encode(), b"", end)]) for _, k in keys]
    asyncio.run(_inject(d.bootstrap, f"{d.prefix}events", forged))
    # and copies of real signed messages, as a broker holds a re-sent message twice: applied once, and
    # for mem_access (addresses carry no identity) only the sequence header can tell
    copies = {topic: asyncio.run(_first_messages(d.bootstrap, d.prefix + topic)) for topic in INPUTS}
    assert all(copies.values())
    for topic, messages in copies.items():
        asyncio.run(_inject(d.bootstrap, f"{d.prefix}{topic}", messages))
    for topic in INPUTS:
        asyncio.run(_inject(d.bootstrap, f"{d.prefix}{topic}", [e for (t, _), e in zip(keys, ends) if t == topic]))
    d.spawn("worker", "worker", "--group", d.app_id, "--session-timeout-s", "6", "--verify-keys", str(d.tmp / "ring"))
    d.sink()
    run_to_completion(d, embedded)
    reasons = Counter(dict(connect(d.out).execute("SELECT reason, count(*) FROM dlq GROUP BY reason").fetchall()))
    assert reasons == Counter({"unsigned": 1, "unknown_key": 1, "bad_signature": 2})
    assert_same_parquet(d.out, embedded, dead_letters=4)
    report("forged events, over TLS", events_in(events) + 4, d, embedded)


def replay_events(folder: Path) -> Iterator[Event]:
    for f in input_files([folder]):
        for line in f.open("rb"):
            ev = decode_line(line)
            assert not isinstance(ev, Rejected)
            yield ev


def test_scram_credentials_reach_the_clients(kafka_broker: Broker, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "GPUCOST_KAFKA_BOOTSTRAP": kafka_broker.scram_bootstrap,
        "GPUCOST_KAFKA_TOPIC_PREFIX": f"s{secrets.token_hex(3)}.",
        "GPUCOST_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "GPUCOST_KAFKA_SASL_MECHANISM": "SCRAM-SHA-256",
        "GPUCOST_KAFKA_SASL_USERNAME": kafka_broker.scram_user,
        "GPUCOST_KAFKA_SASL_PASSWORD": kafka_broker.scram_password,
        "GPUCOST_SPOOL": str(tmp_path / "spool"),
    }
    gpucost = [sys.executable, "-m", "gpucost.cli"]
    ok = subprocess.run(
        [*gpucost, "produce", "--source", "simulate", "--gpus", "1", "--hours", "0.5"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0 and "events:" in ok.stdout, ok.stderr[-2000:]
    env["GPUCOST_KAFKA_SASL_PASSWORD"] = "not-the-password"
    refused = subprocess.run([*gpucost, "topics", "create"], env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 3 and "SaslAuthenticationFailed" in refused.stderr
    assert "GPUCOST_KAFKA_SECURITY_PROTOCOL" in refused.stderr  # and it says what to check
