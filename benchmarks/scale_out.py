"""9's scale-out half: the same input messages through 1, 2 and 4 worker processes, each group started with one
``--assignor``, timed from the group's settling to its last commit (``benchmarks.rebalance`` runs and reports it).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment

from gpucost.kafka.publish import create_topics
from gpucost.kafka.settings import KafkaSettings
from gpucost.kafka.worker import INPUTS

ROOT = Path(__file__).resolve().parent.parent
PARTITIONS = 4
#: the scale-out runs, alternated in this order each pair: worker processes and the ``--assignor`` they run
SCALE_RUNS = ((1, "balance"), (2, "roundrobin"), (2, "balance"), (4, "roundrobin"), (4, "balance"))


def worker_process(kafka: KafkaSettings, group: str, assignor: str = "balance") -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "GPUCOST_KAFKA_BOOTSTRAP": kafka.bootstrap,
        "GPUCOST_KAFKA_PARTITIONS": str(PARTITIONS),
        "GPUCOST_KAFKA_TOPIC_PREFIX": kafka.topic_prefix,
    }
    return subprocess.Popen(
        [
            sys.executable,
            *("-m", "gpucost.cli", "worker", "--group", group),
            *("--session-timeout-s", "10", "--assignor", assignor),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def _committed(admin: AIOKafkaAdminClient, group: str) -> int:
    return sum(o.offset for o in (await admin.list_consumer_group_offsets(group)).values() if o.offset > 0)


def _cpu_s(pid: int) -> float:
    """CPU seconds (user and system) a process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class ScaleRun:
    workers: int
    assignor: str  # what the workers were started with
    protocol: str  # what the group agreed on
    busiest: float  # the busiest member's share of the events left when the group settled, by its assignment
    rate: float  # input events/s from the group's settling (every worker a member) to its last commit
    settled_s: float  # from the processes' start to the group's settling
    workers_cores: float  # the workers' CPU seconds per second, from the settling to the last commit
    broker_cores: float  # the broker's


async def _settled(
    admin: AIOKafkaAdminClient, group: str, members: int
) -> tuple[str, list[list[TopicPartition]]] | None:
    """``group``'s protocol and each member's partitions once it is stable with ``members`` members (no rebalance
    under way or to come); None before."""
    (response,) = await admin.describe_consumer_groups([group])
    state, protocol, joined = response.groups[0][2], response.groups[0][4], response.groups[0][5]
    if state != "Stable" or len(joined) != members:
        return None
    return protocol, [ConsumerProtocolMemberAssignment.decode(m[-1]).partitions() for m in joined]


async def _left(
    admin: AIOKafkaAdminClient, group: str, per_message: dict[TopicPartition, list[int]]
) -> dict[TopicPartition, int]:
    """The events ``group`` has not committed, per partition: what is left to split when the group settles."""
    committed = await admin.list_consumer_group_offsets(group, partitions=list(per_message))
    return {tp: sum(n[max(0, committed[tp].offset) if tp in committed else 0 :]) for tp, n in per_message.items()}


async def scale_out(
    kafka: KafkaSettings,
    workers: int,
    assignor: str,
    messages: int,
    per_message: dict[TopicPartition, list[int]],
    broker: int,
) -> ScaleRun:
    """``workers`` worker processes started with ``--assignor assignor`` in a new group until every input message
    is committed, timed from the moment the group holds them all: the first worker to join would otherwise run
    alone until the others' join, and the rebalance that follows would count against them. ``per_message``: the
    input events of each message, by partition (of ``kafka``'s topics; a message's offset is its index)."""
    group = f"bench-scale-{workers}-{time.time_ns()}"
    admin = AIOKafkaAdminClient(**kafka.client_options())
    await admin.start()
    procs = [worker_process(kafka, group, assignor) for _ in range(workers)]
    events, spread = sum(map(sum, per_message.values())), None

    def cpu() -> tuple[float, float]:
        return sum(_cpu_s(p.pid) for p in procs), _cpu_s(broker)

    try:
        start, settled = time.perf_counter(), None
        spawned = start, 0, cpu()
        while (done := await _committed(admin, group)) < messages:
            if time.perf_counter() - start > 600:
                raise TimeoutError(f"{workers} worker(s) committed {done:,} of {messages:,} input messages in 600 s")
            if settled is None and (spread := await _settled(admin, group, workers)):
                settled = time.perf_counter(), done, cpu()
                at_settling = await _left(admin, group, per_message)
            if any(p.poll() is not None for p in procs):
                raise RuntimeError("a worker process exited")
            await asyncio.sleep(0.05)
        end, (w1, b1) = time.perf_counter(), cpu()
        # an input applied before the group settled (--quick's) is timed from the processes' start
        at, first, (w0, b0) = settled or spawned
        protocol, members = spread or ("", [list(per_message)])
        left = at_settling if spread else {tp: sum(n) for tp, n in per_message.items()}
        return ScaleRun(
            workers,
            assignor,
            protocol,
            max(sum(left.get(tp, 0) for tp in tps) for tps in members) / max(1, sum(left.values())),
            events * (messages - first) / messages / (end - at),
            at - start,
            (w1 - w0) / (end - at),
            (b1 - b0) / (end - at),
        )
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=60)
        await admin.close()


async def read_input(kafka: KafkaSettings) -> dict[TopicPartition, list[Any]]:
    """Every message of the input topics, by partition."""
    consumer = AIOKafkaConsumer(**kafka.client_options(), enable_auto_commit=False, auto_offset_reset="earliest")
    await consumer.start()
    try:
        tps = [TopicPartition(kafka.topic(t), p) for t in INPUTS for p in range(PARTITIONS)]
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        out: dict[TopicPartition, list[Any]] = {tp: [] for tp in tps}
        while sum(map(len, out.values())) < sum(ends.values()):
            for tp, batch in (await consumer.getmany(timeout_ms=500, max_records=5000)).items():
                out[tp] += batch
        return out
    finally:
        await consumer.stop()


async def copy_input(messages: dict[TopicPartition, list[Any]], source: KafkaSettings, to: KafkaSettings) -> None:
    """The input topics' messages, as they are, into ``to``'s: each run gets topics of its own, since the
    state topics are named by the prefix, not by the group (a new group would find the input applied)."""
    await create_topics(to)
    producer = AIOKafkaProducer(**to.producer_options(), max_request_size=8 << 20, linger_ms=20)
    await producer.start()
    try:
        for tp, batch in messages.items():
            topic = to.topic(tp.topic.removeprefix(source.topic_prefix))
            for m in batch:
                await producer.send(topic, m.value, key=m.key, partition=tp.partition, headers=list(m.headers))
        await producer.flush()
    finally:
        await producer.stop()
