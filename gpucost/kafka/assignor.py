"""The worker group's partition assignor: ``gpucost.kafka.balance``'s rule on aiokafka's assignor interface.

aiokafka's group protocol asks each member for metadata to send with its join request (``metadata``), and the
member elected leader to assign every partition from all members' metadata (``assign``); both are synchronous.
So a member measures before it joins: the worker's rebalance listener runs before every join request, and
awaits ``Balancer.observe`` there (the input partitions' ends, starts and committed offsets, a few broker round
trips, bounded by ``OBSERVE_TIMEOUT_S``). A broker that does not answer in time leaves the member's last figures:
the assignment is a matter of speed, never of correctness, and never holds a rebalance up.

A worker offers one group protocol, this assignor or Kafka's round-robin (``protocols``), never both: aiokafka 0.14
sends a JoinGroup request for each protocol offered, the first with the first protocol alone (its
``perform_group_join`` loop; aio-libs/aiokafka PR #1168, open), so a second protocol made every join two rounds of
the group's rebalance, held two members' joins for minutes now and then, and made a group with a round-robin-only
member inconsistent to the broker. A group's workers run one ``--assignor`` (docs/operations.md, "How the group
spreads the partitions").
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.cluster import ClusterMetadata
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment, ConsumerProtocolMemberMetadata

from gpucost.kafka.balance import ASSIGNORS, Partition, Report, decode_report, encode_report, spread, works

__all__ = ["OBSERVE_TIMEOUT_S", "Balancer", "protocols"]

log = logging.getLogger("gpucost.kafka.assignor")

#: how long a member waits for the broker's figures before it joins with its last ones
OBSERVE_TIMEOUT_S = 2.0
#: how often a member looks whether its subscription's partitions are known, before its first join
METADATA_POLL_S = 0.02
#: how long a member waits for them before its first join: a topic still unknown then (not created yet) is left out of
#: its figures, and the topics known are measured within what remains of ``OBSERVE_TIMEOUT_S``
METADATA_WAIT_S = OBSERVE_TIMEOUT_S / 2


class Balancer(AbstractPartitionAssignor):
    """One worker's assignor: what it reports when it joins, and the spread it makes when it leads. ``owned``
    gives the input partitions whose state the worker holds; ``applied`` the seconds it spent applying messages
    and how many, per input topic; ``clock`` the monotonic seconds that time arrival rates."""

    name = "gpucost-balance"
    version = 0

    def __init__(
        self,
        owned: Callable[[], Iterable[TopicPartition]],
        applied: Callable[[], Mapping[str, tuple[float, int]]],
        clock: Callable[[], float],
    ) -> None:
        self._owned, self._applied, self._clock = owned, applied, clock
        self._backlog: dict[Partition, float] = {}
        self._rate: dict[Partition, float] = {}
        self._ends: tuple[float, dict[Partition, int]] | None = None  # when the last ends were read, and them
        self._waited = False  # whether it has waited for its subscription's partitions (before its first join)
        #: assignments made as leader, by how they were made (``measured`` or ``counted``), for the worker's metrics
        self.assignments: Counter[str] = Counter()

    async def observe(self, consumer: AIOKafkaConsumer, topics: Iterable[str]) -> None:
        """Read every partition of ``topics``: backlog = end − committed (start where never committed), arrival
        rate = the ends' growth since the last reading at least a second ago. Errors and a slow broker leave
        the last figures (logged)."""
        try:
            await asyncio.wait_for(self._observe(consumer, topics), OBSERVE_TIMEOUT_S)
        except Exception as exc:  # any failure (a broker error, a timeout, a consumer without a group) is a report's
            log.info("joins with its last partition figures: the broker did not give new ones (%r)", exc)

    async def _observe(self, consumer: AIOKafkaConsumer, topics: Iterable[str]) -> None:
        names = sorted(topics)
        # before a member's first join its subscription's partitions may not be known yet (aiokafka asks the broker
        # for them when the consumer subscribes): it waits for them, for ``METADATA_WAIT_S``, so that a group's first
        # assignment is measured too (joining without them, both members of a group started together were spread
        # by count, one run in eight). A topic unknown after that, or at a later join, does not exist yet: the
        # others are measured without it (waiting for every topic once cost each join the whole bound and dropped
        # the figures of those known)
        if not self._waited:
            deadline = asyncio.get_running_loop().time() + METADATA_WAIT_S
            while any(consumer.partitions_for_topic(topic) is None for topic in names):
                if asyncio.get_running_loop().time() >= deadline:
                    break
                await asyncio.sleep(METADATA_POLL_S)
            self._waited = True  # after the wait: one cancelled (a rebalance's stop) waits again at the next join
        known = {topic: consumer.partitions_for_topic(topic) for topic in names}
        tps = sorted(TopicPartition(topic, p) for topic, parts in known.items() for p in sorted(parts or ()))
        if not tps:
            return
        # every request runs to its end (or the timeout's cancel) before a failure is raised: none is left behind
        ends, starts, *committed = await asyncio.gather(
            consumer.end_offsets(tps),
            consumer.beginning_offsets(tps),
            *(consumer.committed(tp) for tp in tps),
            return_exceptions=True,
        )
        if failure := next((r for r in (ends, starts, *committed) if isinstance(r, BaseException)), None):
            raise failure
        now = self._clock()
        self._backlog = {
            (tp.topic, tp.partition): float(max(0, ends[tp] - (starts[tp] if done is None else max(done, starts[tp]))))
            for tp, done in zip(tps, committed)
        }
        reading = {(tp.topic, tp.partition): ends[tp] for tp in tps}
        if self._ends is None:
            self._ends = (now, reading)
        elif now - self._ends[0] >= 1.0:
            then, before = self._ends
            self._rate = {tp: max(0, n - before.get(tp, n)) / (now - then) for tp, n in reading.items()}
            self._ends = (now, reading)

    def report(self) -> Report:
        """What this member sends when it joins."""
        return Report(
            owned=frozenset((tp.topic, tp.partition) for tp in self._owned()),
            backlog=dict(self._backlog),
            rate=dict(self._rate),
            cost=dict(self._applied()),
        )

    def metadata(self, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:  # type: ignore[override]
        return ConsumerProtocolMemberMetadata(self.version, sorted(topics), encode_report(self.report()))

    def assign(  # type: ignore[override]
        self, cluster: ClusterMetadata, members: Mapping[str, ConsumerProtocolMemberMetadata]
    ) -> dict[str, ConsumerProtocolMemberAssignment]:
        subscriptions = {m: list(meta.subscription) for m, meta in members.items()}
        partitions = [
            (topic, p)
            for topic in sorted({t for topics in subscriptions.values() for t in topics})
            for p in sorted(cluster.partitions_for_topic(topic) or ())
        ]
        reports = {m: decode_report(meta.user_data) for m, meta in members.items()}
        unread = sorted(m for m, r in reports.items() if r is None)
        if unread:
            log.warning("assigns without the reports of %s, which could not be read", ", ".join(unread))
        readable = [r for r in reports.values() if r is not None]
        work, measured = works(partitions, readable)
        owners: dict[Partition, str] = {}
        for member in sorted(members):  # a partition two members claim (a stale claim): the first in order keeps it
            for tp in sorted(reports[member].owned if reports[member] is not None else ()):  # type: ignore[union-attr]
                owners.setdefault(tp, member)
        chosen = spread(work, subscriptions, owners)
        how = "measured" if measured else "counted"
        self.assignments[how] += 1
        log.info("assigned %d partitions to %d members, %s", len(partitions), len(members), how)
        return {
            member: ConsumerProtocolMemberAssignment(
                self.version, [(t, [p for tt, p in tps if tt == t]) for t in sorted({t for t, _ in tps})], b""
            )
            for member, tps in chosen.items()
        }

    def on_assignment(self, assignment: ConsumerProtocolMemberAssignment) -> None:  # type: ignore[override]
        """Nothing to keep: the worker's listener takes the partitions."""


def protocols(assignor: str, balancer: Balancer) -> tuple[Balancer] | tuple[type[RoundRobinPartitionAssignor]]:
    """The one group protocol a worker offers for its ``assignor`` (one of ``gpucost.kafka.balance.ASSIGNORS``):
    its ``balancer``, or Kafka's round-robin. One, never a list: aiokafka sends a JoinGroup for each (the module's
    docstring)."""
    if assignor == "balance":
        return (balancer,)
    if assignor == "roundrobin":
        return (RoundRobinPartitionAssignor,)
    raise ValueError(f"--assignor {assignor!r}: choose one of {', '.join(ASSIGNORS)}")
