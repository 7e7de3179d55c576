"""The Kafka worker: input topics → the same ``Auditor`` as the embedded run → output topics.

Exactly once, with Kafka transactions: each input partition a worker owns gets its own
transactional producer (``transactional.id`` = group-topic-partition). Every batch read
from that partition is processed in one transaction holding (1) the output records, (2)
the new state of every key the batch touched, written to a compacted state topic on the
same partition number, and (3) the consumer offsets. A worker that dies mid-batch leaves
an open transaction; the partition's next owner fences it (aborting it) when it starts
its producer, restores the state committed with the last offsets, and resumes there. A
``read_committed`` consumer therefore sees every record exactly once.

The worker is plain ``aiokafka`` around the pure operators (``gpucost.streams.audit.Auditor``, one
per message key): it owns the transactions, the state topic and the clock that holds silent closes
back; what is billed, and how, is the operators'.
"""
from __future__ import annotations

import asyncio
import logging
import time
from bisect import bisect_right
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import accumulate
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.partitioner import murmur2
from prometheus_client.core import Metric

from gpucost.kafka.closing import moved_on, send_markers
from gpucost.kafka.sequences import MalformedSequence, SeenSequences, parse_sequence
from gpucost.kafka.settings import KafkaSettings
from gpucost.kafka.signing import Keyring, Signer, SigningKey, Verdict
from gpucost.kafka.state import PROGRESS_KEY, progress_record, restored, state_records
from gpucost.metrics import Health, counter, gauge
from gpucost.schemas.blocks import expand
from gpucost.schemas.codec import raw_text
from gpucost.schemas.events import EVENT_MODELS
from gpucost.schemas.records import DeadLetter, Output, kind_of
from gpucost.schemas.topics import CONTROL_HEADER, END_OF_INPUT, SEQUENCE_HEADER, output_key
from gpucost.streams.audit import Auditor
from gpucost.streams.scope import Scope, claimed_node
from gpucost.streams.settings import AuditSettings
from gpucost.streams.silence import close_partition

__all__ = ["INPUTS", "state_topic_suffix", "Worker"]

log = logging.getLogger("gpucost.kafka.worker")
INPUTS = ("events", "mem_access")
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
    #: per key: the node that owns it (its first single-node signer); only that node's keys may speak for it
    owners: dict[str, str] = field(default_factory=dict)
    #: per key: the auditor and its ``idle.rolls`` as its idle windows were last written
    idle_written: dict[str, tuple[Auditor, int]] = field(default_factory=dict)
    #: per key: when (``Worker.monotonic``) a message of it was last applied; a key restored, or not yet
    #: seen, counts as seen at ``since``
    heard: dict[str, float] = field(default_factory=dict)
    since: float = field(default_factory=time.monotonic)
    #: the offset of the partition's state partition just past the last record this owner knows it holds
    #: (restored, or written by its own committed transactions): any record from there on is another owner's
    state_end: int = 0
    #: the ``final_through_ns`` of the last closed marker this owner committed (None: none yet)
    closed_through: int | None = None


#: a Kafka key gpucost writes is a GPU UUID or ``node_id/pid``; a gpucost header is a short token
MAX_KEY_BYTES = 512
MAX_HEADER_BYTES = 256


def _message_problem(key: bytes | None, headers: dict[str, bytes]) -> str | None:
    """Why a message cannot be filed under any key, or None. Checked before anything else: a key
    that is not UTF-8 once stopped the worker, at every restart, on the same message."""
    if not key:
        return "the message has no key (gpucost producers key every message by GPU or by node/pid)"
    if len(key) > MAX_KEY_BYTES:
        return f"its key has {len(key):,} bytes (at most {MAX_KEY_BYTES})"
    try:
        key.decode()
    except UnicodeDecodeError:
        return f"its key {key[:64]!r} is not UTF-8"
    for name, value in headers.items():
        if name.startswith("gpucost-") and len(value) > MAX_HEADER_BYTES:
            return f"its header {name[:64]!r} has {len(value):,} bytes (at most {MAX_HEADER_BYTES})"
    return None


class Worker(ConsumerRebalanceListener):
    def __init__(self, kafka: KafkaSettings, audit: AuditSettings, group: str, session_timeout_s: float = 30.0,
                 max_batch: int = 200, keyring: Keyring | None = None, output_signer: Signer | None = None,
                 audit_key: bytes | None = None) -> None:
        self.kafka, self.audit, self.group = kafka, audit, group
        self.audit_key = audit_key  # signs the health records' snapshot hashes
        self.keyring = keyring  # when set, only messages signed by one of its keys are applied
        #: when set, every published record is signed with it, for sinks and billing consumers to verify
        self.output_signer = output_signer
        self.session_timeout_s = session_timeout_s
        self.max_batch = max_batch
        self.owned: dict[TopicPartition, _Owned] = {}
        #: partitions revoked by the rebalance under way, with their state: aiokafka's eager protocol revokes
        #: every partition, and most come back to the member that had them
        self._parked: dict[TopicPartition, _Owned] = {}
        #: partitions taken, by how: ``restored`` from the state topic, or ``kept`` across a rebalance
        self.taken: Counter[str] = Counter()
        self.consumer: AIOKafkaConsumer | None = None
        self.inputs = {kafka.topic(s): s for s in INPUTS}
        self.processed = 0
        #: the processing clock that tells a GPU gone silent from one whose messages are only behind
        #: another's in event time (a replay batches each key's events); seconds, monotonic
        self.monotonic = time.monotonic
        #: messages refused before they reached a key's auditor, by reason, and re-deliveries skipped
        self.counts: Counter[str] = Counter()
        self._partitions: dict[str, list[int]] = {}  # output topic → its partitions
        # a revocation waits for the batch in flight; ownership never changes mid-transaction
        self._lock = asyncio.Lock()
        #: why taking assigned partitions failed (a state it cannot restore…); without this the worker
        #: would fetch those partitions for ever, never owning them
        self._failed: Exception | None = None
        #: committed work, for ``metrics``: records published by kind, dead letters by reason, transactions
        #: committed and aborted, bytes of state written
        self.records_out: Counter[str] = Counter()
        self.dead_letters: Counter[str] = Counter()
        self.events_in: Counter[str] = Counter()  # events taken by the auditors, by kind, once committed
        self.transactions: Counter[str] = Counter()
        self.state_bytes_written = 0
        self.markers_sent = 0  # closed markers committed to the cost topic's partitions
        self.ends_applied = 0  # ends of input applied: a finite input's end, for ``gpucost.kafka.lag``
        self.health = Health()

    # --- partition ownership -------------------------------------------------------------
    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        async with self._lock:
            for tp in revoked:
                owned = self.owned.pop(tp, None)
                if owned is not None:
                    await owned.producer.stop()
                    self._parked[tp] = owned  # its state, until the assignment says whether it comes back

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        async with self._lock:
            try:
                await self._take(assigned)
            except Exception as exc:  # aiokafka only logs a listener's error: ``run`` raises it
                self._failed = exc
                raise

    async def _take(self, assigned: list[TopicPartition]) -> None:
        """Own each newly assigned partition. Each takes a fencing producer and a state restore, a
        few broker round trips apiece, and a rebalance waits for all: they run side by side, and
        beside the one question of where the partitions begin (for those that may never have been
        processed; not for those kept, whose next offset is known, since the consumer's connection
        answers it only after the fetch it holds open)."""
        assert self.consumer is not None
        parked, self._parked = self._parked, {}
        fresh = [tp for tp in assigned if tp not in self.owned]
        unknown = [tp for tp in fresh if tp not in parked]

        async def where_unknown_begin() -> dict[TopicPartition, int]:
            assert self.consumer is not None
            return await self.consumer.beginning_offsets(unknown) if unknown else {}

        beginnings, *taken = await asyncio.gather(where_unknown_begin(),
                                                  *(self._own(tp, parked.get(tp)) for tp in fresh),
                                                  return_exceptions=True)
        failure = next((t for t in [beginnings, *taken] if isinstance(t, BaseException)), None)
        if failure is None:
            assert isinstance(beginnings, dict)
            # a kept partition read again, its state gone (a state topic made anew): rare, asked on its own
            if missing := [tp for tp, o in zip(fresh, taken) if isinstance(o, _Owned) and o.next_offset < 0
                           and tp not in beginnings]:
                try:
                    beginnings.update(await self.consumer.beginning_offsets(missing))
                except Exception as exc:
                    failure = exc
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
            log.info("owns %s[%d]: %d keys %s", tp.topic, tp.partition, len(owned.auditors),
                     "kept" if tp in parked else "restored")

    async def _own(self, tp: TopicPartition, parked: _Owned | None = None) -> _Owned:
        """Own ``tp``: a producer that fences any earlier owner, and the partition's state. The state of
        ``parked`` (this worker's own, from before the rebalance) is kept if no record was written to the
        state partition since its last: each applied batch writes one, so nobody else applied any."""
        producer = AIOKafkaProducer(**self.kafka.producer_options(), acks="all",
                                    transactional_id=f"{self.group}-{tp.topic}-{tp.partition}",
                                    max_request_size=8 << 20, max_batch_size=1 << 20, linger_ms=5)
        # init_transactions: fences the previous owner and settles its open batch, so that what the state
        # partition holds is final when it is read below
        await producer.start()
        try:
            if parked is not None:
                newer, first, end = await self._read_state(tp, parked.state_end)
                # nothing written since, nor deleted by retention (nor the topic made again)
                if not newer and first <= parked.state_end <= end:
                    self.taken["kept"] += 1
                    parked.producer = producer
                    return parked
                log.info("%s[%d] was written by another owner since this worker had it: its state is read again",
                         tp.topic, tp.partition)
            latest, _, end = await self._read_state(tp)
            state = restored(self.audit, latest, self.audit_key)
        except BaseException:
            await producer.stop()
            raise
        self.taken["restored"] += 1
        next_offset = -1 if state.next_offset is None else state.next_offset  # -1: never processed
        return _Owned(producer, state.auditors, state.sequences, next_offset, state.owners, state_end=end)

    async def _read_state(self, tp: TopicPartition, since: int = 0) -> tuple[dict[bytes, bytes | None], int, int]:
        """The latest committed value of each key in the state partition of input partition ``tp``, from
        offset ``since`` (or its first, if later) to its end; and its first and end offsets."""
        state_tp = TopicPartition(self.kafka.topic(state_topic_suffix(self.inputs[tp.topic])), tp.partition)
        # fetch.max.wait.ms short: the reader stops once at the end, and stopping waits for the fetch in flight,
        # which the broker holds that long where there is nothing to read (the default 0.5 s, per partition taken)
        reader = AIOKafkaConsumer(**self.kafka.client_options(), isolation_level="read_committed",
                                  enable_auto_commit=False, fetch_max_wait_ms=10)
        await reader.start()
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
                    raise RuntimeError(f"restoring {state_tp.topic}[{state_tp.partition}] stalled at offset "
                                       f"{await reader.position(state_tp)} of {end}; is the broker healthy?")
                for messages in batches.values():
                    for m in messages:
                        latest[m.key] = m.value
        finally:
            await reader.stop()
        return latest, first, end

    # --- processing ----------------------------------------------------------------------
    def _apply(self, owned: _Owned, messages: list[Any], touched: set[str], taken: Counter[str]) -> list[Output]:
        """The outputs of a partition's messages, each key's in the order of its messages.

        A key's data messages are queued and go through the batch path together when the
        batch ends, or before anything else of that key (a dead letter, the end of its input,
        a message of another signer): the batch path's fixed costs are per call, and 400-line
        messages paid them ~40 % over. Keys are independent, each with its own auditor, so only
        outputs of different keys change places; a record's partition order within one key is
        what consumers see.

        What a message may do is decided before its key gets an auditor: one without a usable
        key or with a malformed header is refused whole (``bad_message``), one not signed by a
        key of the keyring, or signed by a node that does not own the key's GPU, is refused line
        by line; a refused message creates no state.
        """
        out: list[Output] = []
        queued: dict[str, tuple[Scope | None, list[tuple[str, list[tuple[int, bytes]]]]]] = {}

        def flush(key: str) -> None:
            scope, chunks = queued.pop(key, (None, []))
            if not chunks:
                return
            ends = list(accumulate(len(numbered) for _, numbered in chunks))

            def label(i: int) -> str:
                c = bisect_right(ends, i)
                source, numbered = chunks[c]
                return f"{source}#{numbered[i - (ends[c - 1] if c else 0)][0]}"

            lines = [line for _, numbered in chunks for _, line in numbered]
            auditor = owned.auditors[key]
            before = [auditor.counts[kind] for kind in EVENT_MODELS]
            out.extend(expand(auditor.ingest_lines(lines, label, scope)))  # records, for their JSON
            taken.update({kind: auditor.counts[kind] - n for kind, n in zip(EVENT_MODELS, before)})

        for message in messages:
            source = f"{message.topic}[{message.partition}]@{message.offset}"
            value = message.value or b""
            headers = {name: v or b"" for name, v in message.headers or ()}
            problem = _message_problem(message.key, headers)
            seq = None
            if problem is None:
                try:
                    seq = parse_sequence(headers.get(SEQUENCE_HEADER))
                except MalformedSequence as exc:
                    problem = str(exc)
            if problem is not None:  # no key to file it under, or a header no producer writes: refused whole
                out.append(self._refused("bad_message", f"{problem}; the message is skipped", source, value))
                continue
            key = message.key.decode()
            lines = [(n, line) for n, line in enumerate(value.split(b"\n")) if line.strip()]
            signer = None if self.keyring is None else self.keyring.check(message.key, value, headers)
            if isinstance(signer, SigningKey):
                owner = owned.owners.get(key)
                if owner is not None and signer.nodes is not None and owner not in signer.nodes:
                    signer = Verdict("wrong_key", f"key {key[:256]!r} belongs to node {owner[:256]!r}, and key "
                                                  f"{signer.key_id!r} may not speak for it")
            if isinstance(signer, Verdict):  # forged, unsigned or foreign: every line to the dead letters
                flush(key)
                out += [self._refused(signer.reason, signer.detail, f"{source}#{n}", line)
                        for n, line in lines or [(0, b"")]]
                continue
            sequences = owned.sequences.setdefault(key, SeenSequences())
            if seq is not None and not sequences.first_time(*seq):
                self.counts["redelivered_messages"] += 1  # the broker held it twice; applied the first time
                continue
            touched.add(key)
            owned.heard[key] = self.monotonic()
            auditor = owned.auditors.get(key)
            if auditor is None:
                auditor = owned.auditors[key] = Auditor(self.audit, time.time_ns, self.audit_key)
            if signer is None:
                scope = Scope(key)
            else:
                if owned.owners.get(key) is None and signer.nodes is not None and len(signer.nodes) == 1 and \
                        claimed_node(key, node := next(iter(signer.nodes)), (line for _, line in lines)):
                    owned.owners[key] = node  # the first node whose own events of the key it signs owns it
                assert self.keyring is not None
                price_keys = self.keyring.price_keys
                scope = Scope(key, signer.nodes, price_keys, signer.key_id in price_keys)
            if headers.get(CONTROL_HEADER) == END_OF_INPUT:
                self.ends_applied += 1
                flush(key)
                # finished: its panes close, and what follows starts afresh above the watermark it reached, so
                # that the same input produced again is late, never billed twice
                out += auditor.finish()
                owned.auditors[key] = auditor.successor()
                continue
            if key in queued and queued[key][0] != scope:
                flush(key)
            queued.setdefault(key, (scope, []))[1].append((source, lines))
        for key in list(queued):
            flush(key)
        return out + self._close_silent(owned, touched)

    def _close_silent(self, owned: _Owned, touched: set[str]) -> list[Output]:
        """Close the panes of the partition's silent GPUs, and the MAE windows of its silent processes, by the rule
        the embedded run shares (``gpucost.streams.silence``): each key judged against the largest event time of
        any key of the partition, and held back until no message of it was applied for ``idle_timeout_s`` of this
        worker's clock. The keys whose state a close changed join ``touched``."""
        out, changed = close_partition(owned.auditors, owned.heard, owned.since, self.monotonic(), self.audit)
        touched |= changed
        return out

    def _refused(self, reason: str, detail: str, source: str, raw: bytes) -> DeadLetter:
        """The dead letter of (a line of) a message refused before any auditor saw it, counted here."""
        self.counts[reason] += 1
        return DeadLetter(reason=reason, detail=detail, kind=None, source=source, raw=raw_text(raw), ts_ns=None,
                          gpu_uuid=None)

    async def _process(self, tp: TopicPartition, messages: list[Any]) -> None:
        try:
            await self._transaction(tp, messages)
        except BaseException:
            self.transactions["aborted"] += 1
            raise
        self.transactions["committed"] += 1

    async def _transaction(self, tp: TopicPartition, messages: list[Any]) -> None:
        owned = self.owned[tp]
        producer = owned.producer
        state_topic = self.kafka.topic(state_topic_suffix(self.inputs[tp.topic]))
        out: Counter[str] = Counter()
        letters: Counter[str] = Counter()
        taken: Counter[str] = Counter()  # events the auditors took, by kind
        state_bytes = 0
        async with producer.transaction():
            touched: set[str] = set()
            sent = await self._send_records(producer, self._apply(owned, messages, touched, taken), out, letters)
            final = None if self.inputs[tp.topic] != "events" else moved_on(
                owned.auditors.values(), self.audit.revision_horizon_ns, owned.closed_through)
            markers = [] if final is None else await send_markers(  # after the records: read after them
                producer, self.kafka.topic("cost"), tp.topic, tp.partition, final, self.audit.revision_horizon_ns,
                self.output_signer)
            sent += markers
            for key in sorted(touched):
                sequences = owned.sequences.get(key, SeenSequences())
                for state_key, value in state_records(key, owned.auditors[key], sequences, owned.owners.get(key),
                                                      owned.idle_written):
                    state_bytes += len(state_key) + len(value or b"")
                    sent.append(await producer.send(state_topic, value, key=state_key, partition=tp.partition))
            next_offset = messages[-1].offset + 1
            progress = await producer.send(state_topic, progress_record(next_offset), key=PROGRESS_KEY,
                                           partition=tp.partition)
            # every delivery is awaited inside the transaction: one the broker refused (a record over its
            # size limit, say) raises here, which aborts the transaction and stops the worker, rather
            # than committing the offsets without it
            await asyncio.gather(*sent, progress)
            # also committed to the group, for lag monitoring; restarts use the progress record
            await producer.send_offsets_to_transaction({tp: next_offset}, self.group)
        owned.state_end = progress.result().offset + 1  # the batch's last state record, now committed
        if final is not None:
            owned.closed_through = final
            self.markers_sent += len(markers)
        self.processed += len(messages)
        self.records_out.update(out)  # counted once committed: what consumers can read
        self.dead_letters.update(letters)
        self.events_in.update(+taken)
        self.state_bytes_written += state_bytes

    async def _send_records(self, producer: AIOKafkaProducer, records: list[Output], kinds: Counter[str],
                            reasons: Counter[str]) -> list[asyncio.Future[Any]]:
        """Each record to its topic, keyed as the topic contract says, in batches per partition:
        one ``send`` per record took a fifth of the worker's time. The partition is the one
        ``send(key=…)`` would choose (the default partitioner: murmur2 of the key; an output
        topic's partitions are read once), and each partition's records keep their order.
        ``kinds`` and ``reasons`` count what was sent, by kind and by dead-letter reason."""
        batches: dict[tuple[str, int], Any] = {}
        sent: list[asyncio.Future[Any]] = []
        for record in records:
            kind = kind_of(record)
            kinds[kind] += 1
            if kind == "dlq":
                reasons[record.reason] += 1  # type: ignore[union-attr]
            topic, key = self.kafka.topic(kind), output_key(record)
            partitions = self._partitions.get(topic)
            if partitions is None:
                partitions = self._partitions[topic] = sorted(await producer.partitions_for(topic))
            tp = (topic, partitions[_key_slot(key, len(partitions))])
            batch = batches.get(tp)
            value = record.model_dump_json().encode()
            headers = [] if self.output_signer is None else self.output_signer.headers(key, value)
            if batch is None or batch.append(key=key, value=value, timestamp=None, headers=headers) is None:
                if batch is not None:
                    sent.append(await producer.send_batch(batch, tp[0], partition=tp[1]))
                batch = batches[tp] = producer.create_batch()
                # an empty batch takes any record, as Kafka's do
                batch.append(key=key, value=value, timestamp=None, headers=headers)
        for (topic, partition), batch in batches.items():
            sent.append(await producer.send_batch(batch, topic, partition=partition))
        return sent

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
                self.health.beat()
                if self._failed is not None:
                    self.health.failure = f"cannot take its partitions: {self._failed}"
                    raise self._failed
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

    def metrics(self) -> list[Metric]:
        """What ``gpucost worker --metrics-address`` serves (docs/operations.md, "Metrics")."""
        owned = dict(self.owned)
        now_ns = time.time_ns()
        lag_s, behind, panes, gpus = {}, {}, 0, 0
        final = {f"{tp.topic}[{tp.partition}]": o.closed_through / 1e9 for tp, o in owned.items()
                 if o.closed_through is not None}
        for tp, o in owned.items():
            auditors = list(o.auditors.values())
            marks = [m for m in (a.panes.largest_watermark() for a in auditors) if m is not None]
            name = f"{tp.topic}[{tp.partition}]"
            if marks:
                lag_s[name] = (now_ns - max(marks)) / 1e9
            panes += sum(a.panes.open_count() for a in auditors)
            gpus += len(auditors)
            high = self.consumer.highwater(tp) if self.consumer is not None else None
            if high is not None:
                behind[name] = max(0, high - o.next_offset)
        return [
            counter("gpucost_worker_input_messages", "input messages applied and committed", self.processed),
            counter("gpucost_worker_events", "events taken (counted in a pane, a window or a table), by kind",
                    self.events_in, "kind"),
            counter("gpucost_worker_records", "records published, by kind", self.records_out, "kind"),
            counter("gpucost_worker_dead_letters", "dead letters published, by reason", self.dead_letters, "reason"),
            counter("gpucost_worker_refused_messages", "messages refused before any auditor (and re-deliveries "
                    "skipped), by reason", dict(self.counts), "reason"),
            counter("gpucost_worker_transactions", "transactions, by outcome", self.transactions, "outcome"),
            counter("gpucost_worker_closed_markers", "closed markers committed (one per cost partition each time an "
                    "input partition's final hour moves on)", self.markers_sent),
            counter("gpucost_worker_state_bytes_written", "bytes of state written to the state topics",
                    self.state_bytes_written),
            counter("gpucost_worker_partitions_taken", "input partitions taken, by how: state restored from its "
                    "topic, or kept across a rebalance", self.taken, "how"),
            gauge("gpucost_worker_partitions", "input partitions owned", len(owned)),
            gauge("gpucost_worker_owns", "1 for each input partition this worker owns", {
                f"{tp.topic}[{tp.partition}]": 1 for tp in owned}, "partition"),
            gauge("gpucost_worker_keys", "keys (GPUs, processes) held", gpus),
            gauge("gpucost_worker_open_panes", "panes open, not yet billed", panes),
            gauge("gpucost_worker_event_time_lag_seconds", "wall clock minus the largest watermark, per partition",
                  lag_s, "partition"),
            gauge("gpucost_worker_consumer_lag_messages", "input messages not yet applied, per partition", behind,
                  "partition"),
            gauge("gpucost_worker_final_through_seconds", "the last closed marker committed, per input partition: "
                  "records of panes ending at or before it are final (Unix seconds)", final, "partition"),
        ]

