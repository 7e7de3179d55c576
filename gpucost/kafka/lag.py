"""The group's lag on every input partition, and the "caught up" signal at the end of a finite input.

A worker's own consumer knows only the partitions it owns, so a dead worker's partitions, waiting for the
group to notice (``--session-timeout-s``), showed no lag anywhere: the moment an operator most needs it.
Here each worker asks the broker, every ``interval_s``, for the group's committed offsets (what the workers'
transactions committed) and the end of every partition of the input topics, owned by anyone or by no one.

"Caught up" is when every one of those partitions is committed to its end. A worker that has applied an end
of input since it last said so then logs one line, ``caught up: …``: a finite input (``produce`` of a replay
or a simulation) is then processed in full, its records committed. A live input, which sends no end of input,
stays quiet; ``gpucost_worker_group_caught_up`` says the same at every scrape.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from prometheus_client.core import Metric

from gpucost.kafka.clients import stop_quietly
from gpucost.kafka.settings import KafkaSettings
from gpucost.metrics import gauge

__all__ = ["GroupLag"]

log = logging.getLogger("gpucost.kafka.lag")


class GroupLag:
    """The lag of ``group`` on every partition of ``topics``, asked every ``interval_s``; ``ends_applied`` tells
    how many ends of input this worker has applied (the worker's count)."""

    def __init__(
        self,
        kafka: KafkaSettings,
        group: str,
        topics: list[str],
        ends_applied: Callable[[], int],
        interval_s: float = 5.0,
    ) -> None:
        self.kafka, self.group, self.topics, self.interval_s = kafka, group, topics, interval_s
        self.ends_applied = ends_applied
        self.lag: dict[str, int] = {}  # "topic[partition]" → messages not yet committed by the group
        self.caught_up = False
        self._said_at = 0  # ends applied when "caught up" was last said

    async def refresh(self, admin: AIOKafkaAdminClient, reader: AIOKafkaConsumer) -> None:
        """Ask the broker once: committed offsets against ends (a partition never committed: against its start)."""
        partitions = sorted(
            TopicPartition(t["topic"], p["partition"])
            for t in await admin.describe_topics(self.topics)
            for p in t["partitions"]
        )
        if not partitions:
            return
        committed = await admin.list_consumer_group_offsets(self.group, partitions=partitions)
        ends = await reader.end_offsets(partitions)
        starts = await reader.beginning_offsets(partitions)
        lag = {}
        for tp in partitions:
            done = committed[tp].offset if tp in committed and committed[tp].offset >= 0 else starts[tp]
            lag[f"{tp.topic}[{tp.partition}]"] = max(0, ends[tp] - done)
        self.lag = lag
        self.caught_up = sum(ends.values()) > 0 and not any(lag.values())
        ends_applied = self.ends_applied()
        if self.caught_up and ends_applied > self._said_at:
            self._said_at = ends_applied
            log.info(
                "caught up: group %s has committed every input partition (%d) to its end, %d messages in all; "
                "a finite input is processed in full",
                self.group,
                len(partitions),
                sum(ends.values()),
            )

    async def run(self, stop: asyncio.Event) -> None:
        """Refresh until ``stop``. A broker that does not answer (or refuses: an ACL) leaves the last figures, is
        logged, and is asked again with new clients: the lag is a report, and never stops the worker."""
        clients: tuple[AIOKafkaAdminClient, AIOKafkaConsumer] | None = None
        try:
            while not stop.is_set():
                try:
                    if clients is None:
                        clients = (
                            AIOKafkaAdminClient(**self.kafka.client_options()),
                            AIOKafkaConsumer(**self.kafka.client_options(), enable_auto_commit=False),
                        )
                        await clients[0].start()
                        await clients[1].start()
                    await self.refresh(*clients)
                except (KafkaError, OSError) as exc:
                    log.warning("cannot read the group's lag (%s); asked again in %g s", exc, self.interval_s)
                    await _close(clients)
                    clients = None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.interval_s)
        finally:
            await _close(clients)

    def metrics(self) -> list[Metric]:
        return [
            gauge(
                "gpucost_worker_group_lag_messages",
                "input messages the group has not committed, per "
                "partition of the input topics, whoever owns it (a dead worker's included)",
                dict(self.lag),
                "partition",
            ),
            gauge(
                "gpucost_worker_group_caught_up",
                "1 when the group has committed every input partition to its end",
                int(self.caught_up),
            ),
        ]


async def _close(clients: tuple[AIOKafkaAdminClient, AIOKafkaConsumer] | None) -> None:
    """Close both clients, whatever state a failed start left them in."""
    for client in reversed(clients or ()):  # the consumer, then the admin client
        await stop_quietly(client)
