"""The worker's output records, sent to their topics inside a partition's transaction in batches per output
partition: one ``send`` per record took a fifth of the worker's time (``gpucost.kafka.worker``)."""

from __future__ import annotations

import asyncio
from collections import Counter
from functools import lru_cache
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import murmur2

from gpucost.kafka.settings import KafkaSettings
from gpucost.kafka.signing import Signer
from gpucost.schemas.records import Output, kind_of
from gpucost.schemas.topics import output_key

__all__ = ["key_slot", "send_records"]


@lru_cache(maxsize=1 << 16)
def key_slot(key: bytes, partitions: int) -> int:
    """The default partitioner's choice among ``partitions`` for a key (murmur2, as Java clients
    choose): memoised, since the pure-Python hash cost half of what sending did."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


async def send_records(
    producer: AIOKafkaProducer,
    records: list[Output],
    kafka: KafkaSettings,
    signer: Signer | None,
    partitions: dict[str, list[int]],
    kinds: Counter[str],
    reasons: Counter[str],
) -> list[asyncio.Future[Any]]:
    """Each record to its topic, keyed as the topic contract says, in batches per partition. The partition is
    the one ``send(key=…)`` would choose (the default partitioner: murmur2 of the key; an output topic's
    partitions are read once, into ``partitions``), and each partition's records keep their order. Each record
    is signed with ``signer``, if given. ``kinds`` and ``reasons`` count what was sent, by kind and by
    dead-letter reason."""
    batches: dict[tuple[str, int], Any] = {}
    sent: list[asyncio.Future[Any]] = []
    for record in records:
        kind = kind_of(record)
        kinds[kind] += 1
        if kind == "dlq":
            reasons[record.reason] += 1  # type: ignore[union-attr]
        topic, key = kafka.topic(kind), output_key(record)
        slots = partitions.get(topic)
        if slots is None:
            slots = partitions[topic] = sorted(await producer.partitions_for(topic))
        tp = (topic, slots[key_slot(key, len(slots))])
        batch = batches.get(tp)
        value = record.model_dump_json().encode()
        headers = [] if signer is None else signer.headers(key, value)
        if batch is None or batch.append(key=key, value=value, timestamp=None, headers=headers) is None:
            if batch is not None:
                sent.append(await producer.send_batch(batch, tp[0], partition=tp[1]))
            batch = batches[tp] = producer.create_batch()
            # an empty batch takes any record, as Kafka's do
            batch.append(key=key, value=value, timestamp=None, headers=headers)
    for (topic, partition), batch in batches.items():
        sent.append(await producer.send_batch(batch, topic, partition=partition))
    return sent
