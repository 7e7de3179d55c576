"""Kafka side of the producers: create the topics, publish events in keyed batches.

Events are routed and batched here into an outbox; ``gpucost.kafka.delivery`` sends the outbox to the broker.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError
from prometheus_client.core import Metric

from gpucost.kafka.clients import start
from gpucost.kafka.delivery import deliver
from gpucost.kafka.encoding import Oversized, message_values
from gpucost.kafka.outbox import Message, Outbox
from gpucost.kafka.retention import topic_config
from gpucost.kafka.routing import Router, duplicate_letter
from gpucost.kafka.settings import KafkaSettings
from gpucost.kafka.signing import Signer
from gpucost.local_state import state_dir
from gpucost.metrics import Health, counter, gauge, source_counts
from gpucost.schemas.codec import Rejected, encode_event, raw_text
from gpucost.schemas.events import Event
from gpucost.schemas.records import DeadLetter
from gpucost.schemas.topics import CONTROL_HEADER, END_OF_INPUT, SEQUENCE_HEADER, topic_specs

__all__ = [
    "ProducerStats",
    "Stopped",
    "create_topics",
    "default_spool",
    "publish",
    "publish_dead_letters",
]

log = logging.getLogger("gpucost.kafka.publish")


async def create_topics(kafka: KafkaSettings) -> list[str]:
    """Create every topic of the contract that is missing; returns the names created."""
    admin = AIOKafkaAdminClient(**kafka.client_options())
    await start(admin)
    try:
        existing = set(await admin.list_topics())
        new = []
        for spec in topic_specs():
            name = kafka.topic(spec.suffix)
            if name in existing:
                continue
            new.append(
                NewTopic(
                    name,
                    1 if spec.single_partition else kafka.partitions,
                    kafka.replication,
                    topic_configs=topic_config(spec, kafka),
                )
            )
        if new:
            with contextlib.suppress(TopicAlreadyExistsError):  # created meanwhile by another process
                await admin.create_topics(new)
        return [t.name for t in new]
    finally:
        await admin.close()


def _pump(
    events: Iterable[Event],
    loop: asyncio.AbstractEventLoop,
    queue: asyncio.Queue[object],
    chunk_s: float,
    halt: threading.Event,
) -> None:
    """Runs the (possibly blocking) source in a thread; hands events over in chunks, until ``halt``."""

    def hand(item: object) -> bool:
        """False once the publisher stopped listening (its loop closed, or the put was cancelled with it)."""
        if halt.is_set():
            return False
        try:
            asyncio.run_coroutine_threadsafe(queue.put(item), loop).result()
        except (RuntimeError, concurrent.futures.CancelledError):
            return False
        return True

    chunk: list[Event] = []
    last = time.monotonic()
    try:
        for ev in events:
            chunk.append(ev)
            if len(chunk) >= 1024 or time.monotonic() - last >= chunk_s:
                if not hand(chunk):
                    return
                chunk, last = [], time.monotonic()
        if hand(chunk):
            hand(_DONE)
    except BaseException as exc:  # handed to the publisher, which re-raises it
        hand(exc)


_DONE = object()


@dataclass
class ProducerStats:
    """What ``publish`` has done so far, kept up to date as it runs: for ``--metrics-address``."""

    sent: Counter[str] = field(default_factory=Counter)  # messages acknowledged, by topic suffix
    outbox: Outbox | None = None  # the messages waiting for the broker
    source: Counter[str] = field(default_factory=Counter)  # the live source's own counters
    health: Health = field(default_factory=Health)
    input_ended: bool = False  # the source was read to its end (a replay; a live source never ends)
    events_read: int = 0  # events taken from the source so far, for the progress line
    outage_since: float | None = None  # monotonic time of the first failed delivery of an ongoing outage

    def metrics(self) -> list[Metric]:
        """What ``gpucost produce --metrics-address`` serves (docs/operations.md, "Metrics")."""
        box = self.outbox
        spool = box.spool.stat().st_size if box is not None and box.spool.exists() else 0
        return [
            counter("gpucost_producer_messages_sent", "messages the broker acknowledged, by topic", self.sent, "topic"),
            gauge(
                "gpucost_producer_outbox_messages", "messages waiting for the broker", 0 if box is None else len(box)
            ),
            gauge(
                "gpucost_producer_outbox_memory_bytes",
                "bytes of waiting messages held in memory",
                0 if box is None else box.memory_bytes,
            ),
            gauge("gpucost_producer_spool_bytes", "bytes of the spool file (waiting messages on disk)", spool),
            gauge("gpucost_producer_input_ended", "1 once the source was read to its end", int(self.input_ended)),
            source_counts(self.source),
        ]


class Stopped(Exception):
    """``publish`` was told to stop before its input ended or the broker acknowledged everything; what
    is not acknowledged is in the spool, and the next run sends it first."""


def default_spool(kafka: KafkaSettings, source: str) -> Path:
    return state_dir() / f"{kafka.topic_prefix}{source}.spool"


async def publish(
    events: Iterable[Event],
    kafka: KafkaSettings,
    end_of_input: bool = True,
    flush_interval_s: float = 1.0,
    signer: Signer | None = None,
    spool: Path | None = None,
    buffer_bytes: int = 64 << 20,
    stop: asyncio.Event | None = None,
    stats: ProducerStats | None = None,
) -> Counter[str]:
    """Route, batch and send every event; per key, order is kept. Returns messages sent per topic.

    A key's batch is sent when it holds ``batch_events`` events or has waited
    ``flush_interval_s``, so a live source (NVML every second) is published promptly and a
    replay in big batches. With ``end_of_input`` (a finite source), each input key ends with
    a control message, on which the worker closes that key's open panes and windows.
    Messages wait in an outbox (``buffer_bytes`` in memory, then ``spool`` on disk) until
    the broker acknowledges them, so a broker outage delays events but loses none.

    Setting ``stop`` ends it within ``flush_interval_s``, raising :class:`Stopped` once the
    outbox is in the spool. It is an event, not a task cancellation, because Python 3.11's
    ``asyncio.wait_for`` returns normally, and the cancellation is lost, when the cancel lands
    just as the awaited ``queue.get()`` completes: a busy replay then ignored SIGTERM and waited
    for an unreachable broker for ever.
    """
    stop = stop if stop is not None else asyncio.Event()
    stats = stats if stats is not None else ProducerStats()
    spool = spool if spool is not None else default_spool(kafka, "produce")
    spool.parent.mkdir(parents=True, exist_ok=True)
    outbox = stats.outbox = Outbox(spool, buffer_bytes)
    sent = stats.sent
    buffers: dict[tuple[str, str], list[Event]] = {}
    wake, done = asyncio.Event(), asyncio.Event()
    session, numbers = uuid.uuid4().hex[:16], Counter[tuple[str, str]]()

    def send(topic: str, key: str, value: bytes, given: Sequence[tuple[str, bytes]] = ()) -> None:
        numbers[(topic, key)] += 1  # per key and session: a copy the broker holds twice is applied once
        headers = [*given, (SEQUENCE_HEADER, f"{session}:{numbers[(topic, key)]}".encode())]
        if signer is not None:
            headers += signer.headers(key.encode(), value, dict(headers))
        outbox.append(Message(kafka.topic(topic), key.encode(), value, tuple(headers)))
        wake.set()

    def oversized(topic: str, key: str, line: str) -> None:
        """An event no message can hold: to the dead letters, with its head, instead of a message the
        broker refuses (which the outbox took for an outage and retried for ever)."""
        letter = DeadLetter(
            reason="oversized",
            kind=None,
            source=f"producer:{key}",
            raw=raw_text(line),
            ts_ns=None,
            gpu_uuid=None,
            detail=f"an event of {len(line.encode()):,} bytes for {topic} key {key[:256]!r} is over "
            f"the {kafka.max_message_bytes:,}-byte message limit (max_message_bytes); not sent",
        )
        send("dlq", key, letter.model_dump_json().encode())

    def flush(full_only: bool) -> None:
        for (topic, key), buf in buffers.items():
            if buf and (not full_only or len(buf) >= kafka.batch_events):
                for value in message_values(buf, kafka.event_encoding, kafka.max_message_bytes):
                    if isinstance(value, Oversized):
                        oversized(topic, key, value)
                    else:
                        send(topic, key, *value)
                buf.clear()

    queue: asyncio.Queue[object] = asyncio.Queue(maxsize=64)
    halt = threading.Event()
    pump = threading.Thread(
        target=_pump,
        args=(events, asyncio.get_running_loop(), queue, flush_interval_s / 2, halt),
        name="source",
        daemon=True,
    )
    deliverer = asyncio.create_task(deliver(outbox, kafka, wake, done, stats))
    pump.start()
    try:
        router = Router()
        last_flush = time.monotonic()
        while True:
            if stop.is_set():
                raise Stopped
            try:
                item = await asyncio.wait_for(queue.get(), timeout=flush_interval_s)
                stats.health.beat()
            except TimeoutError:
                stats.health.beat()
                item = []
            if item is _DONE:
                break
            if isinstance(item, BaseException):
                raise item
            if deliverer.done():
                deliverer.result()  # re-raise what stopped it
            stats.events_read += len(item)  # type: ignore[arg-type]
            for ev in item:  # type: ignore[attr-defined]
                for topic, key, routed in router.route(ev):
                    if topic == "dlq":
                        letter = duplicate_letter(routed, f"producer:{key}")  # type: ignore[arg-type]
                        send(topic, key, letter.model_dump_json().encode())
                        continue
                    if topic in ("bindings", "prices"):  # durable records: one JSON event a message
                        line = encode_event(routed)
                        value = line.encode()
                        if len(value) > kafka.max_message_bytes:
                            oversized(topic, key, line)
                        else:
                            send(topic, key, value)
                    else:
                        buffers.setdefault((topic, key), []).append(routed)
            flush(full_only=True)
            if time.monotonic() - last_flush >= flush_interval_s:
                flush(full_only=False)
                last_flush = time.monotonic()
        flush(full_only=False)
        if end_of_input:
            for topic, key in buffers:
                send(topic, key, b"", [(CONTROL_HEADER, END_OF_INPUT)])
        done.set()
        wake.set()
        stats.input_ended = True
        if stats.outage_since is not None:  # said, so an operator knows stopping now loses nothing: it is spooled
            log.warning(
                "input read to its end; %d message(s) wait for %s, still unreachable (stopped now, they "
                "are kept in the spool)",
                len(outbox),
                kafka.bootstrap,
            )
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait([deliverer, stopped], return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if not deliverer.done():
            raise Stopped
        deliverer.result()
    finally:
        halt.set()
        if not deliverer.done():
            deliverer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await deliverer
        kept = outbox.close()
        if kept:
            log.warning("%d message(s) not yet acknowledged are kept in %s; the next run sends them first", kept, spool)
    return sent


async def publish_dead_letters(rejected: list[tuple[Rejected, str, str]], kafka: KafkaSettings) -> None:
    """Lines a producer could not decode: to the dead-letter topic, keyed by where they came from."""
    producer = AIOKafkaProducer(**kafka.producer_options(), enable_idempotence=True, acks="all")
    await start(producer)
    try:
        for rej, source, raw in rejected:
            letter = DeadLetter(
                reason=rej.reason, detail=rej.detail, kind=rej.kind, source=source, raw=raw, ts_ns=None, gpu_uuid=None
            )
            await producer.send(kafka.topic("dlq"), letter.model_dump_json().encode(), key=source.encode())
        await producer.flush()
    finally:
        await producer.stop()
