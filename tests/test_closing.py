"""Closed markers on the cost topic: what each says is true, and is the time the definition gives.

The worker runs here on a recording producer (no broker): a simulated fleet's GPUs, 10 hours, cut into
messages and interleaved, with a late binding injected two hours behind its GPU's watermark, which revises
panes within the default 6 h horizon. Checked: no record for a pane ending at or before a marker's
``final_through_ns`` is published after the marker; and each marker's time is the one computed here from the
events sent, not from the worker's state.
"""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict

from aiokafka import TopicPartition

from gpucost.kafka.closing import is_control
from gpucost.kafka.owned import Owned
from gpucost.kafka.routing import Router
from gpucost.kafka.settings import KafkaSettings
from gpucost.kafka.worker import Worker
from gpucost.producers.simulate import FleetSpec, simulate
from gpucost.schemas.codec import encode_event
from gpucost.schemas.topics import CONTROL_HEADER, END_OF_INPUT
from gpucost.streams.settings import AuditSettings
from tests.fake_kafka import Message, RecordingProducer

HOUR_NS = 3600 * 10**9
GPU_KINDS = (b'"kind":"gpu_sample"', b'"kind":"process_sample"', b'"kind":"numa_event"')


def lines_by_gpu() -> dict[bytes, list[bytes]]:
    router, out = Router(), defaultdict(list)
    for ev in simulate(FleetSpec(gpus=3, hours=10, interval_s=30, seed=5)):
        for topic, key, routed in router.route(ev):
            if topic == "events":
                out[key.encode()].append(encode_event(routed).encode())
    return dict(out)


def hour_floor(ns: int) -> int:
    return ns - ns % HOUR_NS


def pane_end(record: dict, pane_ns: int) -> int:
    """The end of the pane or window a record belongs to."""
    for field in ("pane_end_ns", "window_end_ns", "trigger_ns"):  # a reclaim triggers at its pane's end
        if field in record:
            return record[field]
    return record["pane_start_ns"] + pane_ns


def test_no_record_of_a_closed_hour_follows_its_marker_and_each_marker_says_the_computed_time() -> None:
    audit = AuditSettings()
    assert audit.revision_horizon_ns == 6 * HOUR_NS, "the default configuration"
    lines = lines_by_gpu()

    # a process of the first GPU, sampled two hours before the end of the first two thirds of its input, gets a
    # binding then: it reaches back into closed panes, within the horizon
    def busy(key: bytes) -> dict | None:
        cut = 2 * len(lines[key]) // 3
        cut_max = max(json.loads(line)["ts_ns"] for line in lines[key][:cut] if any(k in line for k in GPU_KINDS))
        return next(
            (
                json.loads(line) | {"cut": cut}
                for line in lines[key][:cut]
                if b'"kind":"process_sample"' in line and json.loads(line)["ts_ns"] >= cut_max - 2 * HOUR_NS
            ),
            None,
        )

    key, victim = next((k, v) for k in lines if (v := busy(k)) is not None)
    cut = victim["cut"]
    late = json.dumps(
        {
            "kind": "tenant_binding",
            "node_id": victim["node_id"],
            "pid": victim["pid"],
            "ts_ns": victim["ts_ns"],
            "team": "late-team",
            "env": "prod",
            "app": "a",
            "tier": "t",
            "sla": "Gold",
        }
    ).encode()
    streams = {k: list(v) for k, v in lines.items()}
    streams[key].insert(cut, late)
    messages: list[Message] = []
    chunks = {k: [v[i : i + 100] for i in range(0, len(v), 100)] for k, v in streams.items()}
    for round_ in range(max(map(len, chunks.values()))):
        for k, cs in chunks.items():
            if round_ < len(cs):
                messages.append(Message(k, b"\n".join(cs[round_]), len(messages)))
    messages += [Message(k, b"", len(messages) + i, [(CONTROL_HEADER, END_OF_INPUT)]) for i, k in enumerate(lines)]

    worker, producer = Worker(KafkaSettings(), audit, group="g"), RecordingProducer()
    tp = TopicPartition("gpucost.events", 0)
    worker.owned[tp] = Owned(producer, {}, {}, 0)  # type: ignore[arg-type]
    sent_max: dict[bytes, int] = {}  # per GPU key, the largest event time sent so far: its watermark + lateness
    checked = revised_after = 0
    final = None
    for i in range(0, len(messages), 4):
        batch = messages[i : i + 4]
        published = len(producer.published)
        asyncio.run(worker.process(tp, batch))
        ended = any(m.headers for m in batch)
        for m in batch:
            times = [json.loads(line)["ts_ns"] for line in m.value.split(b"\n") if any(k in line for k in GPU_KINDS)]
            if times:
                sent_max[m.key] = max(sent_max.get(m.key, 0), *times)
        for m in producer.published[published:]:
            if is_control(m.headers):
                marker = json.loads(m.value)
                assert m.topic == "gpucost.cost" and marker["input_partition"] == 0 and marker["kind"] == "closed"
                assert final is None or marker["final_through_ns"] >= final
                final = marker["final_through_ns"]
                if not ended and len(sent_max) == len(lines):
                    # W = the smallest max event time less the lateness; final: pane end ≤ W − R − 1, whole hours
                    want = hour_floor(min(sent_max.values()) - audit.lateness_ns - audit.revision_horizon_ns - 1)
                    assert final == want
                    checked += 1
                continue
            record = json.loads(m.value)
            if final is not None and m.topic != "gpucost.dlq":
                assert pane_end(record, audit.pane_ns) > final, f"{m.topic} record after the marker {final}"
                revised_after += record.get("revision", 0) > 0
    assert checked >= 2 and revised_after > 0, "the test saw no marker mid-stream, or no revision after one"
    # after every key's end of input, each GPU's watermark is the end of its last pane
    last_end = min(hour_floor(0) + (t // audit.pane_ns + 1) * audit.pane_ns for t in sent_max.values())
    assert final == hour_floor(last_end - audit.revision_horizon_ns - 1)
    assert worker.markers_sent == sum(is_control(m.headers) for m in producer.published)
