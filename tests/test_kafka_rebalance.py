"""A worker's partitions across a rebalance, against the real broker: two workers of one group driven in this
process, the partition handed between them, its state kept or read again from the state topic.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

pytestmark = [pytest.mark.slow, pytest.mark.kafka]


def test_a_partition_kept_across_a_rebalance_is_not_read_again_unless_another_owner_wrote_to_it(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """aiokafka revokes every partition at each rebalance and most come back: their state is kept, not read
    again from the state topic, unless another owner applied a batch meanwhile (a member the group dropped
    misses a generation). Either way the state owned equals what the state topic holds."""
    from gpucost.kafka.owned import read_state
    from gpucost.kafka.publish import create_topics, publish
    from gpucost.kafka.settings import KafkaSettings
    from gpucost.kafka.state import restored
    from gpucost.kafka.worker import Worker
    from gpucost.producers.simulate import FleetSpec, simulate
    from gpucost.streams.settings import AuditSettings

    kafka = KafkaSettings(bootstrap=kafka_bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:8]}.", partitions=4)
    group = f"app-{uuid.uuid4().hex[:8]}"

    async def committed(w: Worker, tp: TopicPartition) -> dict[str, Any]:
        """What the state topic holds for ``tp``, restored: what a new owner would start from."""
        latest, _, _ = await read_state(w.kafka, w.state_partition(tp))
        return {k: a.to_state() for k, a in restored(w.audit, latest).auditors.items()}

    async def scenario() -> None:
        await create_topics(kafka)
        await publish(simulate(FleetSpec(gpus=4, hours=2, interval_s=20)), kafka, spool=tmp_path / "spool")
        reader = AIOKafkaConsumer(**kafka.client_options(), enable_auto_commit=False)
        await reader.start()
        tps = [TopicPartition(kafka.topic("events"), p) for p in range(4)]
        ends = await reader.end_offsets(tps)
        tp = max(tps, key=lambda t: ends[t])
        reader.assign([tp])
        reader.seek(tp, 0)
        messages: list[Any] = []
        while len(messages) < ends[tp]:
            messages += (await reader.getmany(tp, timeout_ms=1000)).get(tp, [])
        await reader.stop()
        assert len(messages) >= 3, "too few messages to apply in three batches"
        thirds = [
            messages[: len(messages) // 3],
            messages[len(messages) // 3 : 2 * len(messages) // 3],
            messages[2 * len(messages) // 3 :],
        ]
        a, b = (Worker(kafka, AuditSettings(), group=group) for _ in range(2))
        for w in (a, b):
            w.consumer = AIOKafkaConsumer(
                **kafka.client_options(), isolation_level="read_committed", enable_auto_commit=False
            )
            await w.consumer.start()
            w.consumer.assign([tp])
        try:
            await a.on_partitions_assigned([tp])
            await a.process(tp, thirds[0])
            await a.on_partitions_revoked([tp])
            await a.on_partitions_assigned([tp])  # back to the member that had it
            assert a.taken == {"restored": 1, "kept": 1}
            assert {k: o.to_state() for k, o in a.owned[tp].auditors.items()} == await committed(a, tp)
            await a.process(tp, thirds[1])
            await a.on_partitions_revoked([tp])
            await b.on_partitions_assigned([tp])  # a generation that a missed
            assert b.taken == {"restored": 1} and b.owned[tp].next_offset == thirds[1][-1].offset + 1
            await b.process(tp, thirds[2])
            await b.on_partitions_revoked([tp])
            await a.on_partitions_assigned([tp])
            assert a.taken == {"restored": 2, "kept": 1}
            assert a.owned[tp].next_offset == messages[-1].offset + 1
            assert {k: o.to_state() for k, o in a.owned[tp].auditors.items()} == await committed(a, tp)
        finally:
            for w in (a, b):
                for owned in w.owned.values():
                    await owned.producer.stop()
                assert w.consumer is not None
                await w.consumer.stop()

    asyncio.run(scenario())
