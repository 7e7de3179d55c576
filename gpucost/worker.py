"""The Kafka worker: input topics → the same ``Auditor`` as the embedded run → output topics.

Exactly once, with Kafka transactions: each input partition a worker owns gets its own
transactional producer (``transactional.id`` = group-topic-partition). Every batch read
from that partition is processed in one transaction holding (1) the output records, (2)
the new state of every key the batch touched, written to a compacted state topic on the
same partition number, and (3) the consumer offsets. A worker that dies mid-batch leaves
an open transaction; the partition's next owner fences it (aborting it) when it starts
its producer, restores the state committed with the last offsets, and resumes there. A
``read_committed`` consumer therefore sees every record exactly once.

(An earlier version ran Faust agents; under SIGKILL it lost and corrupted records in both
of Faust's processing guarantees. See the README, "Why not Faust".)
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from bisect import bisect_right
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import accumulate
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.partitioner import murmur2

from gpucost.kafka_settings import KafkaSettings
from gpucost.sequences import SeenSequences, parse_sequence
from gpucost.signing import Keyring
from schemas.blocks import expand
from schemas.codec import Rejected, raw_text
from schemas.topics import CONTROL_HEADER, END_OF_INPUT, SEQUENCE_HEADER, output_key
from sinks.parquet import kind_of
from streams.audit import Auditor, Output
from streams.settings import AuditSettings

__all__ = ["INPUTS", "state_topic_suffix", "Worker"]

log = logging.getLogger("gpucost.worker")
INPUTS = ("events", "mem_access")
#: key of the record, beside the per-key states, holding the partition's next input offset: it is
#: committed in the same transaction as the states, so the two never disagree
PROGRESS_KEY = b"\x00next_offset"
#: prefix of the key of a key's idle windows, which are written apart from the rest of its state
IDLE_PREFIX = b"\x00idle\x00"


@lru_cache(maxsize=1 << 16)
def _key_slot(key: bytes, partitions: int) -> int:
    """The default partitioner's choice among ``partitions`` for a key (murmur2, as Java clients
    choose): memoised, since the pure-Python hash cost half of what sending did."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def state_topic_suffix(input_suffix: str) -> str:
    return f"state.{input_suffix}"


@dataclass
class _Owned:
    """An input partition this worker owns: its producer and the auditors of its keys."""

    producer: AIOKafkaProducer
    auditors: dict[str, Auditor]
    sequences: dict[str, SeenSequences]  # per key: the producers' message numbers already applied
    next_offset: int  # the first input offset not yet applied (inputs are contiguous: no transactions)
    #: per key: the auditor and its ``idle.rolls`` as its idle windows were last written
    idle_written: dict[str, tuple[Auditor, int]] = field(default_factory=dict)


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _state_records(owned: _Owned, key: str) -> list[tuple[bytes, bytes | None]]:
    """The state records of a key a batch touched: its state, and its idle windows only when a pane
    closed since they were last written. The windows are most of a key's state (46 of 54 KB for a
    GPU with 72 h of panes) and change once a pane, while a live worker writes the rest at every
    poll. A finished key: tombstones."""
    k, auditor = key.encode(), owned.auditors.get(key)
    if auditor is None:
        owned.idle_written.pop(key, None)
        return [(k, None), (IDLE_PREFIX + k, None)]
    out: list[tuple[bytes, bytes | None]] = [
        (k, _json({"audit": auditor.to_state(idle=False),
                   "seq": owned.sequences.get(key, SeenSequences()).to_state()}))]
    written = owned.idle_written.get(key)
    if written is None or written[0] is not auditor or written[1] != auditor.idle.rolls:
        out.append((IDLE_PREFIX + k, _json(auditor.idle.to_state())))
        owned.idle_written[key] = (auditor, auditor.idle.rolls)
    return out


def restored(audit: AuditSettings, latest: dict[bytes, bytes | None]
             ) -> tuple[dict[str, Auditor], dict[str, SeenSequences], int | None]:
    """Every key's auditor and seen sequences, and the next offset to apply, from the latest value
    of each state record (a compacted state topic's view)."""
    latest = dict(latest)
    progress = latest.pop(PROGRESS_KEY, None)
    idle = {k[len(IDLE_PREFIX):].decode(): v for k, v in latest.items() if k.startswith(IDLE_PREFIX)}
    states = {k.decode(): json.loads(v) for k, v in latest.items() if v is not None and not k.startswith(IDLE_PREFIX)}
    for key, st in states.items():
        if "idle" not in st["audit"]:  # written apart (a state written before that holds its own)
            windows = idle.get(key)
            if windows is None:
                raise RuntimeError(f"the state of key {key!r} has no idle windows; the state topic is incomplete "
                                   "(was it written by another program, or compacted by hand?)")
            st["audit"]["idle"] = json.loads(windows)
    auditors = {k: Auditor.from_state(audit, st["audit"], time.time_ns) for k, st in states.items()}
    sequences = {k: SeenSequences.from_state(st["seq"]) for k, st in states.items()}
    return auditors, sequences, None if progress is None else int(progress)


class Worker(ConsumerRebalanceListener):
    def __init__(self, kafka: KafkaSettings, audit: AuditSettings, group: str, session_timeout_s: float = 30.0,
                 max_batch: int = 200, keyring: Keyring | None = None) -> None:
        self.kafka, self.audit, self.group = kafka, audit, group
        self.keyring = keyring  # when set, only messages signed by one of its keys are applied
        self.session_timeout_s = session_timeout_s
        self.max_batch = max_batch
        self.owned: dict[TopicPartition, _Owned] = {}
        self.consumer: AIOKafkaConsumer | None = None
        self.inputs = {kafka.topic(s): s for s in INPUTS}
        self.processed = 0
        self._partitions: dict[str, list[int]] = {}  # output topic → its partitions
        # a revocation waits for the batch in flight; ownership never changes mid-transaction
        self._lock = asyncio.Lock()

    # --- partition ownership -------------------------------------------------------------
    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        async with self._lock:
            for tp in revoked:
                owned = self.owned.pop(tp, None)
                if owned is not None:
                    await owned.producer.stop()

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        async with self._lock:
            await self._take(assigned)

    async def _take(self, assigned: list[TopicPartition]) -> None:
        """Own each newly assigned partition. Each takes a fencing producer and a state restore, a
        few broker round trips apiece, and a rebalance waits for all: they run side by side, and
        beside the one question of where the partitions begin (for those never processed)."""
        assert self.consumer is not None
        fresh = [tp for tp in assigned if tp not in self.owned]
        beginnings, *taken = await asyncio.gather(self.consumer.beginning_offsets(fresh),
                                                  *(self._own(tp) for tp in fresh), return_exceptions=True)
        failure = next((t for t in [beginnings, *taken] if isinstance(t, BaseException)), None)
        if failure is not None:
            for t in taken:
                if isinstance(t, _Owned):
                    await t.producer.stop()
            raise failure
        assert isinstance(beginnings, dict)
        for tp, owned in zip(fresh, taken):
            assert isinstance(owned, _Owned)
            if owned.next_offset < 0:  # never processed: from the beginning
                owned.next_offset = beginnings[tp]
            self.owned[tp] = owned
            self.consumer.seek(tp, owned.next_offset)
            log.info("owns %s[%d]: %d keys restored", tp.topic, tp.partition, len(owned.auditors))

    async def _own(self, tp: TopicPartition) -> _Owned:
        producer = AIOKafkaProducer(**self.kafka.producer_options(), acks="all",
                                    transactional_id=f"{self.group}-{tp.topic}-{tp.partition}",
                                    max_request_size=8 << 20, max_batch_size=1 << 20, linger_ms=5)
        await producer.start()  # init_transactions: fences the previous owner, aborts its open batch
        try:
            auditors, sequences, start = await self._restore(tp)
        except BaseException:
            await producer.stop()
            raise
        return _Owned(producer, auditors, sequences, -1 if start is None else start)  # -1: never processed

    async def _restore(self, tp: TopicPartition) -> tuple[dict[str, Auditor], dict[str, SeenSequences], int | None]:
        """The committed state of every key of this input partition, and the next offset to apply."""
        state_tp = TopicPartition(self.kafka.topic(state_topic_suffix(self.inputs[tp.topic])), tp.partition)
        reader = AIOKafkaConsumer(**self.kafka.client_options(), isolation_level="read_committed",
                                  enable_auto_commit=False)
        await reader.start()
        try:
            reader.assign([state_tp])
            # read_committed: the end is the last stable offset, so an open batch of a dead owner is never read
            end = (await reader.end_offsets([state_tp]))[state_tp]
            reader.seek(state_tp, (await reader.beginning_offsets([state_tp]))[state_tp])
            latest: dict[bytes, bytes | None] = {}
            idle_polls = 0
            while await reader.position(state_tp) < end:
                batches = await reader.getmany(state_tp, timeout_ms=1000)
                idle_polls = 0 if batches else idle_polls + 1
                if idle_polls >= 30:
                    raise RuntimeError(f"restoring {state_tp.topic}[{state_tp.partition}] stalled at offset "
                                       f"{await reader.position(state_tp)} of {end}; is the broker healthy?")
                for messages in batches.values():
                    for m in messages:
                        latest[m.key] = m.value
        finally:
            await reader.stop()
        return restored(self.audit, latest)

    # --- processing ----------------------------------------------------------------------
    def _apply(self, owned: _Owned, messages: list[Any], touched: set[str]) -> list[Output]:
        """The outputs of a partition's messages, each key's in the order of its messages.

        A key's data messages are queued and go through the batch path together when the
        batch ends, or before anything else of that key (a dead letter, the end of its input):
        the batch path's fixed costs are per call, and 400-line messages paid them ~40 %
        over. Keys are independent, each with its own auditor, so only outputs of different
        keys change places; a record's partition order within one key is what consumers see.
        """
        out: list[Output] = []
        queued: dict[str, list[tuple[str, list[tuple[int, bytes]]]]] = {}

        def flush(key: str) -> None:
            chunks = queued.pop(key, None)
            if not chunks:
                return
            ends = list(accumulate(len(numbered) for _, numbered in chunks))

            def label(i: int) -> str:
                c = bisect_right(ends, i)
                source, numbered = chunks[c]
                return f"{source}#{numbered[i - (ends[c - 1] if c else 0)][0]}"

            lines = [line for _, numbered in chunks for _, line in numbered]
            out.extend(expand(owned.auditors[key].ingest_lines(lines, label)))  # records, for their JSON

        for message in messages:
            key = message.key.decode()
            auditor = owned.auditors.get(key)
            if auditor is None:
                auditor = owned.auditors[key] = Auditor(self.audit, time.time_ns)
            touched.add(key)
            headers = dict(message.headers or ())
            source = f"{message.topic}[{message.partition}]@{message.offset}"
            lines = [(n, line) for n, line in enumerate((message.value or b"").split(b"\n")) if line.strip()]
            verdict = None if self.keyring is None else self.keyring.check(message.key, message.value or b"", headers)
            if verdict is not None:  # forged or unsigned: every line to the dead letters, nothing applied
                flush(key)
                why = Rejected(verdict.reason, verdict.detail, None)
                out += [auditor.reject(why, raw_text(line), f"{source}#{n}") for n, line in lines or [(0, b"")]]
                continue
            seq = parse_sequence(headers.get(SEQUENCE_HEADER))
            if seq is not None and not owned.sequences.setdefault(key, SeenSequences()).first_time(*seq):
                auditor.counts["redelivered_messages"] += 1  # the broker held it twice; applied the first time
                continue
            if headers.get(CONTROL_HEADER) == END_OF_INPUT:
                flush(key)
                del owned.auditors[key]  # finished: its state is deleted with a tombstone
                owned.sequences.pop(key, None)
                out += auditor.finish()
                continue
            queued.setdefault(key, []).append((source, lines))
        for key in list(queued):
            flush(key)
        return out

    async def _process(self, tp: TopicPartition, messages: list[Any]) -> None:
        owned = self.owned[tp]
        producer = owned.producer
        state_topic = self.kafka.topic(state_topic_suffix(self.inputs[tp.topic]))
        async with producer.transaction():
            touched: set[str] = set()
            await self._send_records(producer, self._apply(owned, messages, touched))
            for key in sorted(touched):
                for state_key, value in _state_records(owned, key):
                    await producer.send(state_topic, value, key=state_key, partition=tp.partition)
            next_offset = messages[-1].offset + 1
            await producer.send(state_topic, str(next_offset).encode(), key=PROGRESS_KEY, partition=tp.partition)
            # also committed to the group, for lag monitoring; restarts use the progress record
            await producer.send_offsets_to_transaction({tp: next_offset}, self.group)
        self.processed += len(messages)

    async def _send_records(self, producer: AIOKafkaProducer, records: list[Output]) -> None:
        """Each record to its topic, keyed as the topic contract says, in batches per partition:
        one ``send`` per record took a fifth of the worker's time. The partition is the one
        ``send(key=…)`` would choose (the default partitioner: murmur2 of the key; an output
        topic's partitions are read once), and each partition's records keep their order."""
        batches: dict[tuple[str, int], Any] = {}
        for record in records:
            topic, key = self.kafka.topic(kind_of(record)), output_key(record)
            partitions = self._partitions.get(topic)
            if partitions is None:
                partitions = self._partitions[topic] = sorted(await producer.partitions_for(topic))
            tp = (topic, partitions[_key_slot(key, len(partitions))])
            batch = batches.get(tp)
            value = record.model_dump_json().encode()
            if batch is None or batch.append(key=key, value=value, timestamp=None) is None:
                if batch is not None:
                    await producer.send_batch(batch, tp[0], partition=tp[1])
                batch = batches[tp] = producer.create_batch()
                batch.append(key=key, value=value, timestamp=None)  # an empty batch takes any record, as Kafka's do
        for (topic, partition), batch in batches.items():
            await producer.send_batch(batch, topic, partition=partition)

    async def _in_sequence(self, consumer: AIOKafkaConsumer, tp: TopicPartition, messages: list[Any]) -> None:
        """Apply exactly the next offsets: drop what was applied, seek back over a gap."""
        owned = self.owned[tp]
        fresh = [m for m in messages if m.offset >= owned.next_offset]
        if not fresh:
            return
        if fresh[0].offset != owned.next_offset:
            first = (await consumer.beginning_offsets([tp]))[tp]
            if first <= owned.next_offset:  # a stale prefetch: read the missing offsets again
                consumer.seek(tp, owned.next_offset)
                return
            log.warning("%s[%d]: offsets %d..%d were deleted by retention before they were processed",
                        tp.topic, tp.partition, owned.next_offset, fresh[0].offset - 1)
        await self._process(tp, fresh)
        owned.next_offset = fresh[-1].offset + 1

    async def _take_batch(self, consumer: AIOKafkaConsumer, tp: TopicPartition, messages: list[Any]) -> None:
        if tp in self.owned:
            await self._in_sequence(consumer, tp, messages)
        elif tp in consumer.assignment():  # fetched before this partition's state was restored: read it again
            consumer.seek(tp, messages[0].offset)

    async def run(self, stop: asyncio.Event) -> None:
        consumer = AIOKafkaConsumer(**self.kafka.client_options(), group_id=self.group, enable_auto_commit=False,
                                    auto_offset_reset="earliest", isolation_level="read_committed",
                                    session_timeout_ms=int(self.session_timeout_s * 1000),
                                    heartbeat_interval_ms=max(500, int(self.session_timeout_s * 100)),
                                    max_partition_fetch_bytes=16 << 20, fetch_max_bytes=64 << 20)
        await consumer.start()
        self.consumer = consumer
        consumer.subscribe(list(self.inputs), listener=self)
        try:
            while not stop.is_set():
                batches = await consumer.getmany(timeout_ms=500, max_records=self.max_batch)
                async with self._lock:
                    # partitions are independent (each has its own state and transactional producer), so
                    # their transactions run side by side: a batch waits on the broker's round trips, not
                    # on the other partitions'
                    done = await asyncio.gather(*(self._take_batch(consumer, tp, messages)
                                                  for tp, messages in batches.items() if messages),
                                                return_exceptions=True)
                    for failure in done:
                        if isinstance(failure, BaseException):
                            raise failure
        finally:
            await consumer.stop()
            for owned in self.owned.values():
                await owned.producer.stop()
