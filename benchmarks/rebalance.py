"""9. Restore, rebalance and scale-out of Kafka workers on a local broker.

- **Restore time against state size.** Each input partition's state topic partition holds the state
  of its keys (a GPU with 72 h of panes is about 47 KB); a worker that takes the partition reads it
  all. Timed for a partition of N such GPUs, written straight to the state topic.
- **A rebalance that leaves a worker its partitions.** aiokafka revokes every partition at each
  rebalance. Worker A owns all four partitions (N GPUs each); worker B, a process of its own,
  joins; A gets two back. A's pause (revoked until it owns its two again), and the part of it A
  spent taking them, are timed with the state kept, and with the state read again, as every
  rebalance did before (``_Rereading``: the same worker, its parked state dropped).
- **Scale-out.** The same input messages through one worker process and through two (topics and
  a consumer group of their own each run, 4 partitions per topic), alternated: input events/s from
  the group's first commit to its last, polled from the group's committed offsets, and the CPU
  the workers and the broker used meanwhile.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer, TopicPartition

from benchmarks.common import Result, events_in
from benchmarks.scale_out import (
    PARTITIONS,
    ROOT,
    SCALE_RUNS,
    ScaleRun,
    copy_input,
    read_input,
    scale_out,
    worker_process,
)
from benchmarks.state_memory import NS, T0, samples
from gpucost.kafka.owned import read_state
from gpucost.kafka.publish import create_topics, publish
from gpucost.kafka.sequences import SeenSequences
from gpucost.kafka.settings import KafkaSettings
from gpucost.kafka.state import PROGRESS_KEY, progress_record, restored, state_records
from gpucost.kafka.worker import INPUTS, Worker, state_topic_suffix
from gpucost.producers.simulate import FleetSpec, simulate
from gpucost.streams.audit import Auditor
from gpucost.streams.settings import AuditSettings

KEY = "GPU-000000"


def gpu_state() -> list[tuple[bytes, bytes | None]]:
    """The state records of one GPU with 72 h of panes (one process on it), keyed ``KEY``."""
    auditor = Auditor(AuditSettings())
    for k in range(72 * 60 + 3):
        for event in samples(1, T0 + k * 60 * NS, 60.0):
            auditor.update(event)
    return state_records(KEY, auditor, SeenSequences(), None, {})


async def write_state(
    kafka: KafkaSettings, partition: int, gpus: int, records: list[tuple[bytes, bytes | None]], first: int = 0
) -> int:
    """``gpus`` copies of ``records`` (GPUs ``first``…) in the events state partition ``partition``, and the
    progress of an input never applied; the bytes written."""
    producer = AIOKafkaProducer(**kafka.producer_options(), max_request_size=8 << 20, linger_ms=20)
    await producer.start()
    written = 0
    try:
        topic = kafka.topic(state_topic_suffix("events"))
        for g in range(first, first + gpus):
            name = f"GPU-{g:06d}".encode()
            for key, value in records:
                k = key.replace(KEY.encode(), name)
                written += len(k) + len(value or b"")
                await producer.send(topic, value, key=k, partition=partition)
        await producer.send(topic, progress_record(0), key=PROGRESS_KEY, partition=partition)
        await producer.flush()
    finally:
        await producer.stop()
    return written


async def restore_s(kafka: KafkaSettings, partition: int) -> tuple[float, int]:
    """Seconds to read the events state partition ``partition`` and rebuild its keys, as a new owner does."""
    worker = Worker(kafka, AuditSettings(), group="bench-restore")
    start = time.perf_counter()
    latest, _, _ = await read_state(kafka, worker.state_partition(TopicPartition(kafka.topic("events"), partition)))
    keys = len(restored(worker.audit, latest).auditors)
    return time.perf_counter() - start, keys


class _Paused(Worker):
    """A worker that notes how long each rebalance kept it from its partitions: from the revocation
    to owning what it was assigned."""

    revoked_at: float | None = None
    taken_at: float | None = None
    pauses: list[float]  # revoked until owning again
    takes: list[float]  # taking the partitions assigned (producers, state), within each pause

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        self.revoked_at = time.perf_counter()
        await super().on_partitions_revoked(revoked)

    async def _take(self, assigned: list[TopicPartition]) -> None:
        started = time.perf_counter()
        await super()._take(assigned)
        self.taken_at = time.perf_counter()
        self.takes.append(self.taken_at - started)
        if self.revoked_at is not None:
            self.pauses.append(self.taken_at - self.revoked_at)


class _Rereading(_Paused):
    """As every rebalance did before: a revoked partition's state is dropped and read again."""

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        await super().on_partitions_revoked(revoked)
        self._parked.clear()


async def _until(check: Any, tasks: list[asyncio.Task[None]], timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        for task in tasks:
            if task.done():
                task.result()
        if time.monotonic() > deadline:
            raise TimeoutError("the workers did not settle")
        await asyncio.sleep(0.02)


async def rebalance_pause(kafka: KafkaSettings, cls: type[_Paused]) -> tuple[float, float, dict[str, int]]:
    """A owns every partition; B (a process of its own, as in a deployment) joins. A's pause at that
    rebalance, the part of it A took to own its partitions, and how A took its partitions."""
    group = f"bench-rebalance-{time.time_ns()}"
    a = cls(kafka, AuditSettings(), group, session_timeout_s=10)
    a.pauses, a.takes = [], []
    stop = asyncio.Event()
    tasks = [asyncio.create_task(a.run(stop))]
    total = len(INPUTS) * PARTITIONS
    await _until(lambda: len(a.owned) == total, tasks)
    b = worker_process(kafka, group)
    try:
        await _until(lambda: bool(a.pauses) and len(a.owned) == total // 2, tasks)
    finally:
        b.terminate()
        b.wait(timeout=60)
        stop.set()
        await asyncio.gather(*tasks)
    return a.pauses[-1], a.takes[-1], dict(a.taken)


def run(
    sizes: tuple[int, ...], rebalance_gpus: int, gpus: int, hours: float, pairs: int = 2, port: int = 19710
) -> Result:
    data = Path(tempfile.mkdtemp(prefix="gpucost-bench-rebalance-"))
    env = {**os.environ, "GPUCOST_KAFKA_PORT": str(port), "GPUCOST_KAFKA_DATA": str(data)}
    subprocess.run(["bash", str(ROOT / "scripts" / "kafka.sh"), "start"], env=env, check=True, capture_output=True)
    try:
        bootstrap = f"127.0.0.1:{port}"
        broker = int((data / "kafka.pid").read_text())
        records = gpu_state()
        per_gpu = sum(len(k) + len(v or b"") for k, v in records)

        async def restores() -> list[tuple[int, float, int]]:
            out = []
            for n in sizes:
                kafka = KafkaSettings(bootstrap=bootstrap, topic_prefix=f"restore{n}.", partitions=PARTITIONS)
                await create_topics(kafka)
                await write_state(kafka, 0, n, records)
                times = [await restore_s(kafka, 0) for _ in range(3)]
                out.append((n, statistics.median(t for t, _ in times), times[0][1]))
            return out

        async def rebalances() -> list[tuple[str, float, float, dict[str, int]]]:
            kafka = KafkaSettings(bootstrap=bootstrap, topic_prefix="rebalance.", partitions=PARTITIONS)
            await create_topics(kafka)
            for p in range(PARTITIONS):
                await write_state(kafka, p, rebalance_gpus, records, first=p * rebalance_gpus)
            out = []
            for _ in range(pairs):
                for name, cls in (("kept", _Paused), ("read again", _Rereading)):
                    out.append((name, *await rebalance_pause(kafka, cls)))
            return out

        async def scaling() -> tuple[int, int, list[int], list[ScaleRun]]:
            source = KafkaSettings(bootstrap=bootstrap, topic_prefix="scale.", partitions=PARTITIONS)
            await create_topics(source)
            await publish(simulate(FleetSpec(gpus=gpus, hours=hours, interval_s=10)), source, spool=data / "spool")
            inputs = await read_input(source)
            messages = sum(map(len, inputs.values()))
            by_partition = [
                sum(events_in(m) for m in inputs[TopicPartition(source.topic(t), p)])
                for t in INPUTS
                for p in range(PARTITIONS)
            ]
            runs = []
            for i in range(pairs):
                for workers, assignor in SCALE_RUNS:
                    kafka = KafkaSettings(
                        bootstrap=bootstrap, topic_prefix=f"scale{i}x{workers}{assignor}.", partitions=PARTITIONS
                    )
                    await copy_input(inputs, source, kafka)
                    per_message = {
                        TopicPartition(kafka.topic(t), p): [
                            events_in(m) for m in inputs[TopicPartition(source.topic(t), p)]
                        ]
                        for t in INPUTS
                        for p in range(PARTITIONS)
                    }
                    runs.append(await scale_out(kafka, workers, assignor, messages, per_message, broker))
            return messages, sum(by_partition), by_partition, runs

        restored_by_size = asyncio.run(restores())
        pauses = asyncio.run(rebalances())
        messages, events, by_partition, runs = asyncio.run(scaling())
    finally:
        subprocess.run(["bash", str(ROOT / "scripts" / "kafka.sh"), "stop"], env=env, capture_output=True)
        shutil.rmtree(data, ignore_errors=True)

    (n0, t0, _), (n1, t1, _) = restored_by_size[0], restored_by_size[-1]
    slope_ms = (t1 - t0) / (n1 - n0) * 1000
    kept, again = (statistics.median(p for name, p, _, _ in pauses if (name == "kept") == k) for k in (True, False))
    kept_take, again_take = (
        statistics.median(t for name, _, t, _ in pauses if (name == "kept") == k) for k in (True, False)
    )

    def rate(workers: int, assignor: str) -> float:
        return statistics.median(r.rate for r in runs if (r.workers, r.assignor) == (workers, assignor))

    one = rate(1, "balance")
    speedup = rate(2, "balance") / one
    rows = [
        (
            f"restore of a partition of {n:,} GPUs with 72 h of panes ({n * per_gpu / 1e6:,.1f} MB of state)",
            f"{t:.2f} s ({keys:,} keys; median of 3)",
        )
        for n, t, keys in restored_by_size
    ]
    rows += [
        ("restore time per GPU (slope)", f"{slope_ms:.2f} ms, {per_gpu / 1e3 / slope_ms:,.0f} MB/s of state"),
        (
            f"rebalance: A's pause when B joins, A keeping 2 of its 4 partitions of {rebalance_gpus:,} GPUs each "
            f"(median of {pairs}, alternated)",
            f"kept: {kept:.2f} s; read again (before): {again:.2f} s",
        ),
        (
            "… of which A's taking its partitions (fencing producers, state)",
            f"kept: {kept_take:.3f} s; read again (before): {again_take:.3f} s ({again_take / kept_take:.1f}×)",
        ),
        (
            "… how A took its partitions, over all runs",
            "; ".join(f"{name}: {dict(taken)}" for name, _, _, taken in pauses),
        ),
        (
            f"scale-out input: {gpus} GPUs × {hours:g} h at 10 s",
            f"{events:,} events in {messages:,} messages, {PARTITIONS} partitions per input topic",
        ),
        ("… events per input partition (events, then mem_access)", ", ".join(f"{n:,}" for n in by_partition)),
    ]
    for workers, assignor in SCALE_RUNS:
        of_n = [r for r in runs if (r.workers, r.assignor) == (workers, assignor)]
        rows.append(
            (
                f"{workers} worker process{'es' if workers > 1 else ''}"
                + (f", --assignor {assignor}" if workers > 1 else "")
                + ": events/s from the group's settling to the last commit; speed-up over 1; the busiest "
                "worker's share of the events left at the settling; the protocol the group agreed on",
                f"{rate(workers, assignor):,.0f} ({rate(workers, assignor) / one:.2f}×; runs: "
                + ", ".join(f"{r.rate:,.0f}" for r in of_n)
                + "); "
                + ", ".join(f"{r.busiest:.1%}" for r in of_n)
                + "; "
                + ", ".join(sorted({r.protocol for r in of_n})),
            )
        )
    rows.append(("speed-up of two workers, --assignor balance (the target's measure)", f"{speedup:.2f}×"))
    for workers, assignor in SCALE_RUNS:
        of_n = [r for r in runs if (r.workers, r.assignor) == (workers, assignor)]
        rows.append(
            (
                f"… {workers} worker process{'es' if workers > 1 else ''}"
                + (f", {assignor}" if workers > 1 else "")
                + ": settled after; cores busy, workers + broker",
                "; ".join(f"{r.settled_s:.1f} s, {r.workers_cores:.2f} + {r.broker_cores:.2f}" for r in of_n),
            )
        )
    return Result(
        "9. Restore, rebalance and scale-out",
        "a worker keeping a partition across a rebalance does not read it "
        "again; two workers on 4 partitions ≥ 1.7× one",
        speedup >= 1.7 and kept_take < again_take,
        rows,
        [
            f"{os.cpu_count()} cores run the broker, the workers and this harness together.",
            "Restores read the state partition from its first offset to its end (read_committed) and rebuild every "
            "key's operators from the latest value of each of its records.",
        ],
    )
