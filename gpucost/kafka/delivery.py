"""The producer's delivery loop: the outbox's messages sent to the broker, oldest first, until the broker has
acknowledged each; an outage is ridden out by starting a new idempotent producer and sending again from the first
message not acknowledged.

Apart from ``gpucost.kafka.publish``, which routes and batches events into the outbox, because the two share only
the outbox and the producer's counts (``ProducerStats``): what reaches the broker, and how an outage is logged,
can be read here without the source thread and the batching around it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from typing import Protocol

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from gpucost.kafka.clients import start, stop_quietly
from gpucost.kafka.outbox import Outbox
from gpucost.kafka.settings import KafkaSettings

__all__ = ["DeliveryCounts", "deliver"]

#: publish's logger: its outage lines were always under that name, which operators filter on
log = logging.getLogger("gpucost.kafka.publish")


class DeliveryCounts(Protocol):
    """What of the producer's counts (``gpucost.kafka.publish.ProducerStats``) the loop reads and keeps; a protocol
    rather than that class, which publish defines and this module cannot import back."""

    sent: Counter[str]  # messages acknowledged, by topic suffix
    outage_since: float | None  # monotonic time of the first failed delivery of an ongoing outage
    input_ended: bool  # the source was read to its end: said when an outage begins


async def deliver(
    outbox: Outbox, kafka: KafkaSettings, wake: asyncio.Event, done: asyncio.Event, stats: DeliveryCounts
) -> None:
    """Send the outbox's oldest messages, in order, until ``done`` and empty; ride out broker outages.

    After a failed attempt the producer is replaced (a new idempotent session) and everything
    from the first unacknowledged message on is sent again, in order; a copy that did arrive
    the first time is a duplicate the workers dead-letter, never a second bill.
    """
    producer: AIOKafkaProducer | None = None
    backoff = 0.5
    try:
        while True:
            head = outbox.head(2000)
            if not head:
                if done.is_set():
                    return
                await wake.wait()
                wake.clear()
                continue
            try:
                if producer is None:
                    producer = AIOKafkaProducer(
                        **kafka.producer_options(),
                        enable_idempotence=True,
                        acks="all",
                        linger_ms=20,
                        max_batch_size=1 << 20,
                        max_request_size=8 << 20,
                        request_timeout_ms=15_000,
                    )
                    await start(producer)
                futures = [
                    await producer.send(m.topic, m.value, key=m.key, headers=list(m.headers) or None) for m in head
                ]
                results = await asyncio.gather(*futures, return_exceptions=True)
            except KafkaError as exc:
                results = [exc]
            ok = next((i for i, r in enumerate(results) if isinstance(r, BaseException)), len(head))
            for m in head[:ok]:
                stats.sent[m.topic.removeprefix(kafka.topic_prefix)] += 1
            outbox.pop(ok)
            if ok == len(head):
                if stats.outage_since is not None:
                    log.warning(
                        "broker reachable again after %.0f s; %d message(s) still waiting",
                        time.monotonic() - stats.outage_since,
                        len(outbox),
                    )
                backoff, stats.outage_since = 0.5, None
                continue
            if stats.outage_since is None:
                stats.outage_since = time.monotonic()
                log.warning(
                    "cannot deliver to %s (%s); buffering: %d message(s) waiting, %d bytes in memory, retrying%s",
                    kafka.bootstrap,
                    results[ok],
                    len(outbox),
                    outbox.memory_bytes,
                    "; input read to its end" if stats.input_ended else "",
                )
            if producer is not None:
                await stop_quietly(producer)
                producer = None
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)
    finally:
        if producer is not None:
            await stop_quietly(producer)
