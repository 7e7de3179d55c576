"""Kafka side of the producers: create the topics, publish events in keyed batches."""
from __future__ import annotations

import asyncio
import threading
import time
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


def _pump(events: Iterable[Event], loop: asyncio.AbstractEventLoop, queue: "asyncio.Queue[object]",
          chunk_s: float) -> None:
    """Runs the (possibly blocking) source in a thread; hands events over in chunks."""
    chunk: list[Event] = []
    last = time.monotonic()
    try:
        for ev in events:
            chunk.append(ev)
            if len(chunk) >= 1024 or time.monotonic() - last >= chunk_s:
                asyncio.run_coroutine_threadsafe(queue.put(chunk), loop).result()
                chunk, last = [], time.monotonic()
        asyncio.run_coroutine_threadsafe(queue.put(chunk), loop).result()
        asyncio.run_coroutine_threadsafe(queue.put(_DONE), loop).result()
    except BaseException as exc:  # handed to the publisher, which re-raises it
        asyncio.run_coroutine_threadsafe(queue.put(exc), loop).result()


_DONE = object()


async def publish(events: Iterable[Event], kafka: KafkaSettings, end_of_input: bool = True,
                  flush_interval_s: float = 1.0) -> Counter[str]:
    """Route, batch and send every event; per key, order is kept. Returns messages sent per topic.

    A key's batch is sent when it holds ``batch_events`` events or has waited
    ``flush_interval_s``, so a live source (NVML every second) is published promptly and a
    replay in big batches. With ``end_of_input`` (a finite source), each input key ends with
    a control message, on which the worker closes that key's open panes and windows.
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

    async def flush(full_only: bool) -> None:
        for (topic, key), buf in buffers.items():
            if buf and (not full_only or len(buf) >= kafka.batch_events):
                await send(topic, key, encode_batch(buf))
                buf.clear()

    queue: "asyncio.Queue[object]" = asyncio.Queue(maxsize=64)
    pump = threading.Thread(target=_pump, args=(events, asyncio.get_running_loop(), queue, flush_interval_s / 2),
                            name="source", daemon=True)
    pump.start()
    try:
        router = Router()
        last_flush = time.monotonic()
        while True:
            try:
                item = await asyncio.wait_for(queue.get(), timeout=flush_interval_s)
            except TimeoutError:
                item = []
            if item is _DONE:
                break
            if isinstance(item, BaseException):
                raise item
            for ev in item:  # type: ignore[attr-defined]
                for topic, key, routed in router.route(ev):
                    line = encode_event(routed)
                    if topic in ("bindings", "prices"):
                        await send(topic, key, line.encode())
                    else:
                        buffers.setdefault((topic, key), []).append(line)
            await flush(full_only=True)
            if time.monotonic() - last_flush >= flush_interval_s:
                await flush(full_only=False)
                await asyncio.gather(*pending)
                pending.clear()
                last_flush = time.monotonic()
        await flush(full_only=False)
        if end_of_input:
            for topic, key in buffers:
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
