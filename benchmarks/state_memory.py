"""3. Operator state per GPU: resident memory after 72 h of panes, as the fleet grows.

Each size runs in a fresh process: it feeds the auditor one GPU sample and one process
sample per GPU per 60 s pane for 72 h (the window full, three panes open), then reports how
much its resident memory grew. Bytes per GPU is the slope between the sizes.

Beside it, what a Kafka worker writes to its state topic for such GPUs when they are live:
one message per GPU per poll, each a second's samples, against the size of a GPU's whole
state (what every poll wrote before the idle windows became a record of their own).
"""

from __future__ import annotations

import asyncio
import gc
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import Result, rss_bytes

ROOT = Path(__file__).resolve().parent.parent
NS = 1_000_000_000
T0 = 1_736_121_600 * NS


def samples(gpus: int, ts_ns: int, interval_s: float) -> list[Any]:
    """One GPU sample and one process sample per GPU at ``ts_ns`` (built without validation: millions
    of them, all valid)."""
    from gpucost.schemas.events import GpuSample, ProcessSample

    util = float((ts_ns - T0) // (60 * NS) % 100)
    out: list[Any] = []
    for g in range(gpus):
        node, gpu = f"node-{g // 8}", f"GPU-{g:06d}"
        out += [
            GpuSample.model_construct(
                node_id=node,
                gpu_uuid=gpu,
                gpu_model="H100",
                ts_ns=ts_ns,
                interval_s=interval_s,
                sm_util_pct=util,
                mem_bw_util_pct=10.0,
                mem_used_bytes=1,
                mem_total_bytes=2,
                power_w=300.0,
                temp_c=50.0,
            ),
            ProcessSample.model_construct(
                node_id=node,
                gpu_uuid=gpu,
                pid=1000 + g,
                ts_ns=ts_ns,
                interval_s=interval_s,
                sm_util_pct=util,
                mem_bw_util_pct=10.0,
                mem_used_bytes=1,
            ),
        ]
    return out


def child(gpus: int, panes: int = 72 * 60 + 3) -> int:
    """Build the state of ``gpus`` GPUs over ``panes`` panes; the growth of resident memory, in bytes."""
    from gpucost.schemas.events import TenantBinding
    from gpucost.streams.audit import Auditor
    from gpucost.streams.settings import AuditSettings

    gc.collect()
    before = rss_bytes()
    auditor = Auditor(AuditSettings())
    for g in range(gpus):
        auditor.update(
            TenantBinding(
                node_id=f"node-{g // 8}",
                pid=1000 + g,
                ts_ns=T0,
                team="team",
                env="prod",
                app="app",
                tier="online",
                sla="Gold",
            )
        )
    for k in range(panes):
        for event in samples(gpus, T0 + k * 60 * NS, 60.0):
            auditor.update(event)
    gc.collect()
    return rss_bytes() - before


def _lines(gpus: int, ts_ns: int, interval_s: float) -> dict[bytes, list[bytes]]:
    """``samples`` as JSON lines, by GPU: what a worker reads."""
    from gpucost.schemas.codec import encode_event

    out: dict[bytes, list[bytes]] = {}
    for event in samples(gpus, ts_ns, interval_s):
        out.setdefault(event.gpu_uuid.encode(), []).append(encode_event(event).encode())
    return out


def live_state_writes(gpus: int = 8, hours: int = 72, polls: int = 600) -> tuple[int, float, float]:
    """(bytes of one GPU's whole state, bytes the worker wrote per GPU per live poll, CPU ms per poll)."""
    from aiokafka import TopicPartition

    from gpucost.kafka.owned import Owned
    from gpucost.kafka.settings import KafkaSettings
    from gpucost.kafka.worker import Worker
    from gpucost.streams.settings import AuditSettings
    from tests.fake_kafka import Message, RecordingProducer

    worker, producer = Worker(KafkaSettings(), AuditSettings(), group="bench"), RecordingProducer()
    tp = TopicPartition("gpucost.events", 0)
    owned = worker.owned[tp] = Owned(producer, {}, {}, 0)  # type: ignore[arg-type]
    offset = 0

    def poll(lines: dict[bytes, list[bytes]]) -> None:
        nonlocal offset
        messages = [
            Message(key, b"\n".join(v), offset + i, topic=tp.topic, partition=0)
            for i, (key, v) in enumerate(lines.items())
        ]
        offset += len(messages)
        runner.run(worker.process(tp, messages))

    runner = asyncio.Runner()  # one event loop, as a worker has: making one per poll was 8 % of a poll's CPU
    for hour in range(hours):  # the window filled an hour at a time, at a sample a minute
        batch: dict[bytes, list[bytes]] = {}
        for k in range(60):
            for key, lines in _lines(gpus, T0 + (hour * 60 + k) * 60 * NS, 60.0).items():
                batch.setdefault(key, []).extend(lines)
        poll(batch)
    live = T0 + hours * 3600 * NS
    whole = max(len(json.dumps({"audit": a.to_state()}, separators=(",", ":"))) for a in owned.auditors.values())
    sent = len(producer.transactions)
    seconds = [_lines(gpus, live + second * NS, 1.0) for second in range(polls)]  # a producer's work: not timed
    start = time.process_time()
    for lines in seconds:  # live: each GPU's second of samples, one message each, in one poll
        poll(lines)
    cpu = time.process_time() - start
    runner.close()
    written = sum(len(v or b"") for t in producer.transactions[sent:] for _, _, v in t)
    return whole, written / polls / gpus, cpu / polls * 1000


def _grown(gpus: int, panes: int) -> int:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.state_memory", str(gpus), str(panes)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    )
    return int(json.loads(out.stdout))


def run(sizes: tuple[int, ...] = (100, 400), few: tuple[int, int] = (2_000, 20_000)) -> Result:
    grown = {n: _grown(n, 72 * 60 + 3) for n in sizes}
    lo, hi = min(sizes), max(sizes)
    per_gpu = (grown[hi] - grown[lo]) / (hi - lo)
    rows = [(f"{n:,} GPUs", f"{grown[n] / 2**20:,.1f} MiB more resident memory") for n in sizes]
    rows.append(("per GPU (slope)", f"{per_gpu / 1024:,.1f} KiB"))
    # a fleet of short-lived GPU ids (or a forged flood of them): ten panes each, seven closed
    short = {n: _grown(n, 10) for n in few}
    rows.append(
        (
            f"per GPU with 10 panes (slope, {few[0]:,} to {few[1]:,} GPUs)",
            f"{(short[few[1]] - short[few[0]]) / (few[1] - few[0]) / 1024:,.1f} KiB",
        )
    )
    whole, written, cpu_ms = live_state_writes()
    rows += [
        (
            "a GPU's whole state as JSON, 72 h of panes (what every poll wrote per GPU before the split)",
            f"{whole:,} bytes",
        ),
        (
            "state a worker writes per GPU per live poll (8 GPUs, 600 polls of a second's samples each)",
            f"{written:,.0f} bytes ({written / whole:.0%} of the whole), {cpu_ms:.1f} ms of CPU per poll",
        ),
    ]
    return Result(
        "3. State memory per GPU",
        "≤ 64 KiB per GPU with 72 h windows",
        per_gpu <= 64 * 1024,
        rows,
        [
            "Resident memory (RSS) of a process holding only the operators' state, measured after "
            "garbage collection: Python's allocator keeps some freed memory, so this errs high.",
            "The state records are a worker's, driven without a broker (tests/fake_kafka.py); a GPU's idle "
            "windows are written again only in the polls where one of its panes closed, one in 60 here.",
        ],
    )


if __name__ == "__main__":
    print(json.dumps(child(*map(int, sys.argv[1:3]))))
