"""2. The Kafka path vs a bare consumer: input events/s through one worker, against the rate
at which a bare aiokafka consumer reads the same input topics from the same local broker."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from benchmarks.common import Result, events_in
from gpucost.kafka.publish import create_topics, publish
from gpucost.kafka.settings import KafkaSettings
from gpucost.kafka.worker import INPUTS, Worker
from gpucost.producers.simulate import FleetSpec, simulate
from gpucost.streams.settings import AuditSettings

ROOT = Path(__file__).resolve().parent.parent


async def _partitions(kafka: KafkaSettings) -> list[TopicPartition]:
    return [TopicPartition(kafka.topic(t), p) for t in INPUTS for p in range(kafka.partitions)]


async def raw_read(kafka: KafkaSettings, messages: int) -> tuple[float, int]:
    """Read every input message once, counting the events in each batch; (seconds, events)."""
    consumer = AIOKafkaConsumer(
        **kafka.client_options(),
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=16 << 20,
        fetch_max_bytes=64 << 20,
    )
    await consumer.start()
    try:
        consumer.assign(await _partitions(kafka))
        events, seen, start = 0, 0, time.perf_counter()
        while seen < messages:
            for batch in (await consumer.getmany(timeout_ms=500, max_records=5000)).values():
                seen += len(batch)
                events += sum(events_in(m) for m in batch)
        return time.perf_counter() - start, events
    finally:
        await consumer.stop()


@dataclass
class Through:
    """One worker's run over the input, in seconds from its first poll."""

    owned_s: float  # every input partition owned: group joined, producers fenced, state restored
    began_s: float  # the first batch begun
    first_s: float  # the first batch applied
    end_s: float  # every input message applied
    after_first: float  # the share of the messages applied after the first batch


class _Timed(Worker):
    """A worker that notes when it owned every input partition and when it applied its first batch:
    its event loop is busy while a batch runs, so a watcher beside it would note both late."""

    owned_at: float | None = None
    began_at: float | None = None
    first_at: float | None = None
    first_messages = 0

    async def _take(self, assigned: list[TopicPartition]) -> None:
        await super()._take(assigned)
        if self.owned_at is None and len(self.owned) == len(INPUTS) * self.kafka.partitions:
            self.owned_at = time.perf_counter()

    async def process(self, tp: TopicPartition, messages: list[Any]) -> None:
        self.began_at = self.began_at or time.perf_counter()
        await super().process(tp, messages)
        if self.first_at is None:
            self.first_at, self.first_messages = time.perf_counter(), self.processed


async def through_worker(kafka: KafkaSettings, messages: int) -> Through:
    """One worker until it has applied every input message."""
    worker = _Timed(kafka, AuditSettings(), group=f"bench-{time.time_ns()}", session_timeout_s=10)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    start = time.perf_counter()
    while worker.processed < messages:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    end = time.perf_counter()
    stop.set()
    await task
    owned, began, first = worker.owned_at or end, worker.began_at or end, worker.first_at or end
    return Through(
        owned - start, began - start, first - start, end - start, (messages - worker.first_messages) / messages
    )


async def _input_messages(kafka: KafkaSettings) -> int:
    consumer = AIOKafkaConsumer(**kafka.client_options())
    await consumer.start()
    try:
        return sum((await consumer.end_offsets(await _partitions(kafka))).values())
    finally:
        await consumer.stop()


def run(gpus: int, hours: float, interval_s: float, port: int = 19700) -> Result:
    data = Path(tempfile.mkdtemp(prefix="gpucost-bench-kafka-"))
    env = {**os.environ, "GPUCOST_KAFKA_PORT": str(port), "GPUCOST_KAFKA_DATA": str(data)}
    subprocess.run(["bash", str(ROOT / "scripts" / "kafka.sh"), "start"], env=env, check=True, capture_output=True)
    try:
        kafka = KafkaSettings(bootstrap=f"127.0.0.1:{port}", topic_prefix="bench.", partitions=4)

        async def one(run: str) -> tuple[float, int, Through, int]:
            """The same fleet produced in the run's encoding to topics of its own, read bare, then by a worker; a
            ``-samples`` run leaves out the simulated profilers' kernels (each batch with more than 64 late ones went
            through the row path, which hides the encoding's share)."""
            encoding, samples_only = run.removesuffix("-samples"), run.endswith("-samples")
            settings = kafka.model_copy(update={"topic_prefix": f"bench-{run}.", "event_encoding": encoding})
            await create_topics(settings)
            fleet = simulate(FleetSpec(gpus=gpus, hours=hours, interval_s=interval_s))
            await publish(
                (e for e in fleet if not (samples_only and e.kind == "kernel_activity")),
                settings,
                spool=data / f"spool-{run}",
            )
            messages = await _input_messages(settings)
            raw_s, lines = await raw_read(settings, messages)
            return raw_s, lines, await through_worker(settings, messages), messages

        async def scenario() -> dict[str, tuple[float, int, Through, int]]:
            return {run: await one(run) for run in ("json", "arrow", "json-samples", "arrow-samples")}

        runs = asyncio.run(scenario())
        events, sampled = runs["json"][1], runs["json-samples"][1]
        rows: list[tuple[str, str]] = [
            (
                "input",
                f"{gpus} GPUs × {hours:g} h at {interval_s:g} s: {events:,} events, 4 partitions per topic, local "
                f"broker, zstd (as gpucost produces); JSON Lines in {runs['json'][3]:,} messages, Arrow IPC in "
                f"{runs['arrow'][3]:,}; without the simulated profilers' kernels (the -samples runs), "
                f"{sampled:,} events",
            )
        ]
        ratios = {}
        for encoding, (raw_s, n, w, _messages) in runs.items():
            ratios[encoding] = raw_s / w.end_s
            steady_s = w.end_s - w.first_s
            rows += [
                (f"{encoding}: bare aiokafka consumer", f"{raw_s:.2f} s, {n / raw_s:,.0f} events/s"),
                (
                    f"{encoding}: one worker (decode, operators, transactions, state)",
                    f"{w.end_s:.2f} s, {n / w.end_s:,.0f} events/s",
                ),
                (
                    f"{encoding}: … of which start-up (group join, a fencing producer and a state restore per "
                    "input partition)",
                    f"{w.owned_s:.2f} s",
                ),
                (
                    f"{encoding}: … after its first applied batch (steady state)",
                    f"{steady_s:.2f} s for {w.after_first:.0%} of the messages, about "
                    f"{n * w.after_first / steady_s:,.0f} events/s",
                ),
                (f"{encoding}: ratio (worker / bare), the target's measure", f"{ratios[encoding]:.3f}"),
            ]
        for suffix in ("", "-samples"):
            json_s, arrow_s = runs[f"json{suffix}"][2].end_s, runs[f"arrow{suffix}"][2].end_s
            rows.append((f"worker{suffix}, Arrow IPC / JSON Lines (events/s)", f"{json_s / arrow_s:.2f}×"))
        default = KafkaSettings().event_encoding
        return Result(
            "2. Kafka worker vs a bare consumer",
            "worker ≥ 50 % of the bare consumer's events/s",
            ratios[default] >= 0.5,
            rows,
            [
                "The worker's time runs from its first poll (group join and state restore included) to the last "
                "input message applied; the bare consumer only reads and counts.",
                f"Each encoding's topics hold the same events; the target is judged on the default ({default}).",
            ],
        )
    finally:
        subprocess.run(["bash", str(ROOT / "scripts" / "kafka.sh"), "stop"], env=env, capture_output=True)
        shutil.rmtree(data, ignore_errors=True)
