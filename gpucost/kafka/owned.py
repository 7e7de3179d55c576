"""An input partition a worker owns: its transactional producer and the state of its keys, and how that state is
read back from the partition's state partition when the worker takes it (``take_partition``, which
``gpucost.kafka.worker`` calls for each partition a rebalance assigns it).

Apart from the worker so that what a partition holds can be read, built in a test and restored without the
transaction loop around it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from gpucost.kafka.clients import start
from gpucost.kafka.sequences import SeenSequences
from gpucost.kafka.settings import KafkaSettings
from gpucost.kafka.state import restored
from gpucost.streams.audit import Auditor
from gpucost.streams.settings import AuditSettings

__all__ = ["Owned", "read_state", "take_partition"]

#: the worker's logger: the lines on taking a partition were always under that name, which operators filter on
log = logging.getLogger("gpucost.kafka.worker")


@dataclass
class Owned:
    """An input partition this worker owns: its producer and the auditors of its keys."""

    producer: AIOKafkaProducer
    auditors: dict[str, Auditor]
    sequences: dict[str, SeenSequences]  # per key: the producers' message numbers already applied
    next_offset: int  # the first input offset not yet applied (inputs are contiguous: no transactions)
    #: per key: the node that owns it (its first single-node signer); only that node's keys may speak for it
    owners: dict[str, str] = field(default_factory=dict)
    #: per key: the auditor and its ``idle.rolls`` as its idle windows were last written
    idle_written: dict[str, tuple[Auditor, int]] = field(default_factory=dict)
    #: per key: when (``Worker.monotonic``) a message of it was last applied; a key restored, or not yet
    #: seen, counts as seen at ``since`` (the silent rule's clock: ``gpucost.streams.silence``)
    heard: dict[str, float] = field(default_factory=dict)
    since: float = field(default_factory=time.monotonic)
    #: the offset of the partition's state partition just past the last record this owner knows it holds
    #: (restored, or written by its own committed transactions): any record from there on is another owner's
    state_end: int = 0
    #: the ``final_through_ns`` of the last closed marker this owner committed (None: none yet)
    closed_through: int | None = None


async def read_state(
    kafka: KafkaSettings, state_tp: TopicPartition, since: int = 0
) -> tuple[dict[bytes, bytes | None], int, int]:
    """The latest committed value of each key in the state partition ``state_tp``, from offset ``since`` (or
    its first, if later) to its end; and its first and end offsets."""
    # fetch.max.wait.ms short: the reader stops once at the end, and stopping waits for the fetch in flight,
    # which the broker holds that long where there is nothing to read (the default 0.5 s, per partition taken)
    reader = AIOKafkaConsumer(
        **kafka.client_options(), isolation_level="read_committed", enable_auto_commit=False, fetch_max_wait_ms=10
    )
    await start(reader)
    try:
        # assigned first, which asks for the topic's metadata (an offset asked before it is known is asked
        # again after retry.backoff.ms), and positioned at once: an assigned partition with no position is
        # fetched at its end, a fetch the broker holds for fetch.max.wait.ms before a later seek takes effect
        reader.assign([state_tp])
        await reader.seek_to_beginning(state_tp)
        first = await reader.position(state_tp)
        # read_committed: the end is the last stable offset, so an open batch of a dead owner is never read
        end = (await reader.end_offsets([state_tp]))[state_tp]
        if since > first:
            reader.seek(state_tp, since)
        latest: dict[bytes, bytes | None] = {}
        idle_polls = 0
        while await reader.position(state_tp) < end:
            batches = await reader.getmany(state_tp, timeout_ms=1000)
            idle_polls = 0 if batches else idle_polls + 1
            if idle_polls >= 30:
                raise RuntimeError(
                    f"restoring {state_tp.topic}[{state_tp.partition}] stalled at offset "
                    f"{await reader.position(state_tp)} of {end}; is the broker healthy?"
                )
            for messages in batches.values():
                for m in messages:
                    latest[m.key] = m.value
    finally:
        await reader.stop()
    return latest, first, end


async def take_partition(
    kafka: KafkaSettings,
    audit: AuditSettings,
    tp: TopicPartition,
    state_tp: TopicPartition,
    transactional_id: str,
    parked: Owned | None = None,
    audit_key: bytes | None = None,
) -> tuple[Owned, str]:
    """Own input partition ``tp``: a producer (``transactional_id``) that fences any earlier owner, and the
    partition's state, from its state partition ``state_tp``; returns them and how the state was had, ``kept`` or
    ``restored``. The state of ``parked`` (this worker's own, from before the rebalance) is kept if no record was
    written to the state partition since its last: each applied batch writes one, so nobody else applied any.
    ``audit_key`` signs the health records' snapshot hashes of the auditors restored."""
    producer = AIOKafkaProducer(
        **kafka.producer_options(),
        acks="all",
        transactional_id=transactional_id,
        max_request_size=8 << 20,
        max_batch_size=1 << 20,
        linger_ms=5,
    )
    # init_transactions: fences the previous owner and settles its open batch, so that what the state
    # partition holds is final when it is read below
    await start(producer)
    try:
        if parked is not None:
            newer, first, end = await read_state(kafka, state_tp, parked.state_end)
            # nothing written since, nor deleted by retention (nor the topic made again)
            if not newer and first <= parked.state_end <= end:
                parked.producer = producer
                return parked, "kept"
            log.info(
                "%s[%d] was written by another owner since this worker had it: its state is read again",
                tp.topic,
                tp.partition,
            )
        latest, _, end = await read_state(kafka, state_tp)
        state = restored(audit, latest, audit_key)
    except BaseException:
        await producer.stop()
        raise
    next_offset = -1 if state.next_offset is None else state.next_offset  # -1: never processed
    return Owned(producer, state.auditors, state.sequences, next_offset, state.owners, state_end=end), "restored"
