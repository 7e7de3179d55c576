"""Kafka side of the producers: create the topics, publish events in keyed batches."""
from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from gpucost.kafka_settings import KafkaSettings
from gpucost.routing import Router
from schemas.codec import encode_event
from schemas.codec import Rejected
from schemas.events import Event
from schemas.records import DeadLetter
from schemas.topics import CONTROL_HEADER, END_OF_INPUT, encode_batch, topic_specs

__all__ = ["create_topics", "publish", "publish_dead_letters"]


async def create_topics(kafka: KafkaSettings) -> list[str]:
    """Create every topic of the contract that is missing; returns the names created."""
    admin = AIOKafkaAdminClient(**kafka.client_options())
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        new = []
        for spec in topic_specs():
            name = kafka.topic(spec.suffix)
            if name in existing:
                continue
            config = {"cleanup.policy": "compact"} if spec.compacted else {"cleanup.policy": "delete"}
            new.append(NewTopic(name, 1 if spec.single_partition else kafka.partitions, kafka.replication,
                                topic_configs=config))
        if new:
            try:
                await admin.create_topics(new)
            except TopicAlreadyExistsError:
                pass  # created meanwhile by another process
        return [t.name for t in new]
    finally:
        await admin.close()


async def publish(events: Iterable[Event], kafka: KafkaSettings, end_of_input: bool = True) -> Counter[str]:
    """Route, batch and send every event; per key, order is kept. Returns messages sent per topic.

    With ``end_of_input`` (a finite source), each input key ends with a control message, on
    which the worker closes that key's open panes and windows, as the embedded run does.
    """
    producer = AIOKafkaProducer(**kafka.client_options(), enable_idempotence=True, acks="all",
                                compression_type="gzip", linger_ms=20, max_batch_size=1 << 20,
                                max_request_size=8 << 20)
    await producer.start()
    sent: Counter[str] = Counter()
    buffers: dict[tuple[str, str], list[str]] = {}
    pending: list[asyncio.Future[object]] = []

    async def send(topic: str, key: str, value: bytes, headers: list[tuple[str, bytes]] | None = None) -> None:
        pending.append(await producer.send(kafka.topic(topic), value, key=key.encode(), headers=headers))
        sent[topic] += 1
        if len(pending) >= 10_000:
            await asyncio.gather(*pending)
            pending.clear()

    try:
        router = Router()
        for ev in events:
            for topic, key, routed in router.route(ev):
                line = encode_event(routed)
                if topic in ("bindings", "prices"):
                    await send(topic, key, line.encode())
                    continue
                buf = buffers.setdefault((topic, key), [])
                buf.append(line)
                if len(buf) >= kafka.batch_events:
                    await send(topic, key, encode_batch(buf))
                    buf.clear()
        for (topic, key), buf in buffers.items():
            if buf:
                await send(topic, key, encode_batch(buf))
            if end_of_input:
                await send(topic, key, b"", headers=[(CONTROL_HEADER, END_OF_INPUT)])
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    return sent


async def publish_dead_letters(rejected: list[tuple[Rejected, str, str]], kafka: KafkaSettings) -> None:
    """Lines a producer could not decode: to the dead-letter topic, keyed by where they came from."""
    producer = AIOKafkaProducer(**kafka.client_options(), enable_idempotence=True, acks="all")
    await producer.start()
    try:
        for rej, source, raw in rejected:
            letter = DeadLetter(reason=rej.reason, detail=rej.detail, kind=rej.kind, source=source, raw=raw,
                                ts_ns=None, gpu_uuid=None)
            await producer.send(kafka.topic("dlq"), letter.model_dump_json().encode(), key=source.encode())
        await producer.flush()
    finally:
        await producer.stop()
