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
back; what is billed, and how, is the operators'. This module holds the partitions' ownership across
rebalances and the transaction loop; its parts are ``gpucost.kafka.owned`` (a partition's keys and
their state, read back when it is taken), ``gpucost.kafka.apply`` (a poll's messages checked and applied),
``gpucost.kafka.outputs`` (records sent in batches per partition), ``gpucost.streams.silence`` (when a
silent key's panes close, the rule the embedded run shares) and ``gpucost.kafka.worker_metrics`` (what
``--metrics-address`` serves).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from prometheus_client.core import Metric

from gpucost.kafka.apply import Poll
from gpucost.kafka.assignor import Balancer, protocols
from gpucost.kafka.clients import start
from gpucost.kafka.closing import moved_on, send_markers
from gpucost.kafka.outputs import send_records
from gpucost.kafka.owned import Owned, take_partition
from gpucost.kafka.sequences import SeenSequences
from gpucost.kafka.settings import KafkaSettings
from gpucost.kafka.signing import Keyring, Signer
from gpucost.kafka.state import PROGRESS_KEY, progress_record, state_records
from gpucost.kafka.worker_metrics import worker_metrics
from gpucost.metrics import Health
from gpucost.schemas.records import Output
from gpucost.streams.settings import AuditSettings
from gpucost.streams.silence import close_partition

__all__ = ["INPUTS", "state_topic_suffix", "Worker"]

log = logging.getLogger("gpucost.kafka.worker")
INPUTS = ("events", "mem_access")


def state_topic_suffix(input_suffix: str) -> str:
    return f"state.{input_suffix}"


class Worker(ConsumerRebalanceListener):
    def __init__(
        self,
        kafka: KafkaSettings,
        audit: AuditSettings,
        group: str,
        session_timeout_s: float = 30.0,
        max_batch: int = 200,
        keyring: Keyring | None = None,
        output_signer: Signer | None = None,
        audit_key: bytes | None = None,
        assignor: str = "balance",
    ) -> None:
        self.kafka, self.audit, self.group = kafka, audit, group
        self.audit_key = audit_key  # signs the health records' snapshot hashes
        self.keyring = keyring  # when set, only messages signed by one of its keys are applied
        #: when set, every published record is signed with it, for sinks and billing consumers to verify
        self.output_signer = output_signer
        self.session_timeout_s = session_timeout_s
        self.max_batch = max_batch
        self.owned: dict[TopicPartition, Owned] = {}
        #: partitions revoked by the rebalance under way, with their state: aiokafka's eager protocol revokes
        #: every partition, and most come back to the member that had them
        self._parked: dict[TopicPartition, Owned] = {}
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
        #: seconds spent applying messages, and how many, per input topic: what a message costs, for the assignor
        self.applied: dict[str, tuple[float, int]] = {}
        self.balancer = Balancer(
            lambda: [*self.owned, *self._parked], lambda: dict(self.applied), lambda: self.monotonic()
        )
        #: the one group protocol offered (``gpucost.kafka.assignor.protocols``: a group's workers run one
        #: ``--assignor``, docs/operations.md)
        self.assignors: tuple[Any, ...] = protocols(assignor, self.balancer)

    # --- partition ownership -------------------------------------------------------------
    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        async with self._lock:
            for tp in revoked:
                owned = self.owned.pop(tp, None)
                if owned is not None:
                    await owned.producer.stop()
                    self._parked[tp] = owned  # its state, until the assignment says whether it comes back
        if self.consumer is not None:  # runs before every join request: what the balancer reports when it joins
            await self.balancer.observe(self.consumer, self.inputs)

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

        beginnings, *taken = await asyncio.gather(
            where_unknown_begin(), *(self._own(tp, parked.get(tp)) for tp in fresh), return_exceptions=True
        )
        failure = next((t for t in [beginnings, *taken] if isinstance(t, BaseException)), None)
        if failure is None:
            assert isinstance(beginnings, dict)
            # a kept partition read again, its state gone (a state topic made anew): rare, asked on its own
            if missing := [
                tp for tp, o in zip(fresh, taken) if isinstance(o, Owned) and o.next_offset < 0 and tp not in beginnings
            ]:
                try:
                    beginnings.update(await self.consumer.beginning_offsets(missing))
                except Exception as exc:
                    failure = exc
        if failure is not None:
            for t in taken:
                if isinstance(t, Owned):
                    await t.producer.stop()
            raise failure
        assert isinstance(beginnings, dict)
        for tp, owned in zip(fresh, taken):
            assert isinstance(owned, Owned)
            if owned.next_offset < 0:  # never processed: from the beginning
                owned.next_offset = beginnings[tp]
            self.owned[tp] = owned
            self.consumer.seek(tp, owned.next_offset)
            log.info(
                "owns %s[%d]: %d keys %s",
                tp.topic,
                tp.partition,
                len(owned.auditors),
                "kept" if tp in parked else "restored",
            )

    async def _own(self, tp: TopicPartition, parked: Owned | None = None) -> Owned:
        """``tp`` taken (``take_partition``: its producer, and ``parked``'s state or the state topic's), counted."""
        owned, how = await take_partition(
            self.kafka,
            self.audit,
            tp,
            self.state_partition(tp),
            f"{self.group}-{tp.topic}-{tp.partition}",
            parked,
            self.audit_key,
        )
        self.taken[how] += 1
        return owned

    def state_partition(self, tp: TopicPartition) -> TopicPartition:
        """The state partition of input partition ``tp``: where each transaction commits the state of the keys it
        touched and the partition's progress, and what the partition's next owner restores. Public for what reads
        a partition's committed state without owning it (``gpucost.kafka.owned.read_state``): a check of what a
        restart would resume from, a benchmark of restores."""
        return TopicPartition(self.kafka.topic(state_topic_suffix(self.inputs[tp.topic])), tp.partition)

    # --- processing ----------------------------------------------------------------------
    def apply(self, owned: Owned, messages: list[Any], touched: set[str], taken: Counter[str]) -> list[Output]:
        """The outputs of a partition's messages, each key's in the order of its messages (``Poll``), then those
        of its keys gone silent. The keys applied to, or whose state a silent close changed, join ``touched``;
        the events the auditors took, by kind, ``taken``. Nothing is sent or committed: ``process`` does that
        with what this gives. Public as the worker's pure half, so that what a poll bills can be computed, and
        checked, on any partition's state (``owned``: one this worker owns, or one built by the caller) without
        a producer or a broker."""
        poll = Poll(owned, self.audit, self.audit_key, self.keyring, self.counts, self.monotonic, touched, taken)
        out = poll.apply(messages)
        self.ends_applied += poll.ends
        return out + self._close_silent(owned, touched)

    def _close_silent(self, owned: Owned, touched: set[str]) -> list[Output]:
        """Close the panes of the partition's silent GPUs, and the MAE windows of its silent processes, by the rule
        the embedded run shares (``gpucost.streams.silence``): each key judged against the largest event time of
        any key of the partition, and held back until no message of it was applied for ``idle_timeout_s`` of this
        worker's clock. The keys whose state a close changed join ``touched``."""
        out, changed = close_partition(owned.auditors, owned.heard, owned.since, self.monotonic(), self.audit)
        touched |= changed
        return out

    async def process(self, tp: TopicPartition, messages: list[Any]) -> None:
        """One poll's messages of owned partition ``tp`` applied in one transaction: their records, the state of
        the keys they touched and the partition's progress are committed together or not at all, and the
        partition's next offset moves past them. The step ``run``'s poll loop takes for each partition once the
        offsets already applied are dropped (``_in_sequence``); public because it is the worker's unit of
        exactly-once work, which a caller holding the messages itself (a test with a recording producer, a
        benchmark, a replay of a partition) drives as the loop does, without a consumer."""
        try:
            await self._transaction(tp, messages)
        except BaseException:
            self.transactions["aborted"] += 1
            raise
        self.transactions["committed"] += 1

    async def _transaction(self, tp: TopicPartition, messages: list[Any]) -> None:
        owned = self.owned[tp]
        producer = owned.producer
        state_topic = self.state_partition(tp).topic
        out: Counter[str] = Counter()
        letters: Counter[str] = Counter()
        taken: Counter[str] = Counter()  # events the auditors took, by kind
        state_bytes = 0
        async with producer.transaction():
            touched: set[str] = set()
            began = time.perf_counter()
            records = self.apply(owned, messages, touched, taken)
            spent = time.perf_counter() - began
            sent = await send_records(
                producer,
                records,
                self.kafka,
                self.output_signer,
                self._partitions,
                out,
                letters,
            )
            final = (
                None
                if self.inputs[tp.topic] != "events"
                else moved_on(owned.auditors.values(), self.audit.revision_horizon_ns, owned.closed_through)
            )
            markers = (
                []
                if final is None
                else await send_markers(  # after the records: read after them
                    producer,
                    self.kafka.topic("cost"),
                    tp.topic,
                    tp.partition,
                    final,
                    self.audit.revision_horizon_ns,
                    self.output_signer,
                )
            )
            sent += markers
            for key in sorted(touched):
                sequences = owned.sequences.get(key, SeenSequences())
                for state_key, value in state_records(
                    key, owned.auditors[key], sequences, owned.owners.get(key), owned.idle_written
                ):
                    state_bytes += len(state_key) + len(value or b"")
                    sent.append(await producer.send(state_topic, value, key=state_key, partition=tp.partition))
            next_offset = messages[-1].offset + 1
            progress = await producer.send(
                state_topic, progress_record(next_offset), key=PROGRESS_KEY, partition=tp.partition
            )
            # every delivery is awaited inside the transaction: one the broker refused (a record over its
            # size limit, say) raises here, which aborts the transaction and stops the worker, rather
            # than committing the offsets without it
            await asyncio.gather(*sent, progress)
            # also committed to the group, for lag monitoring; restarts use the progress record
            await producer.send_offsets_to_transaction({tp: next_offset}, self.group)
        owned.state_end = progress.result().offset + 1  # the batch's last state record, now committed
        owned.next_offset = next_offset
        if final is not None:
            owned.closed_through = final
            self.markers_sent += len(markers)
        self.processed += len(messages)
        seconds, count = self.applied.get(tp.topic, (0.0, 0))
        self.applied[tp.topic] = (seconds + spent, count + len(messages))
        self.records_out.update(out)  # counted once committed: what consumers can read
        self.dead_letters.update(letters)
        self.events_in.update(+taken)
        self.state_bytes_written += state_bytes

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
            log.warning(
                "%s[%d]: offsets %d..%d were deleted by retention before they were processed",
                tp.topic,
                tp.partition,
                owned.next_offset,
                fresh[0].offset - 1,
            )
        await self.process(tp, fresh)

    async def _take_batch(self, consumer: AIOKafkaConsumer, tp: TopicPartition, messages: list[Any]) -> None:
        if tp in self.owned:
            await self._in_sequence(consumer, tp, messages)
        elif tp in consumer.assignment():  # fetched before this partition's state was restored: read it again
            consumer.seek(tp, messages[0].offset)

    async def run(self, stop: asyncio.Event) -> None:
        consumer = AIOKafkaConsumer(
            **self.kafka.client_options(),
            group_id=self.group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            session_timeout_ms=int(self.session_timeout_s * 1000),
            heartbeat_interval_ms=max(500, int(self.session_timeout_s * 100)),
            max_partition_fetch_bytes=16 << 20,
            fetch_max_bytes=64 << 20,
            partition_assignment_strategy=self.assignors,
        )
        await start(consumer)
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
                    done = await asyncio.gather(
                        *(self._take_batch(consumer, tp, messages) for tp, messages in batches.items() if messages),
                        return_exceptions=True,
                    )
                    for failure in done:
                        if isinstance(failure, BaseException):
                            raise failure
        finally:
            await consumer.stop()
            for owned in self.owned.values():
                await owned.producer.stop()

    def metrics(self) -> list[Metric]:
        """What ``gpucost worker --metrics-address`` serves (``gpucost.kafka.worker_metrics``)."""
        return worker_metrics(self)
