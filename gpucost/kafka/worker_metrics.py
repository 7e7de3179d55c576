"""What a worker serves at ``gpucost worker --metrics-address`` (docs/operations.md, "Metrics"): the work its
transactions committed, counted by the transaction loop (``gpucost.kafka.worker``), and what the partitions it owns
hold now.

Apart from the worker because it only reads it: some eighty lines of metric names and help texts that say nothing
of ownership or transactions, which the worker module is about.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Protocol

from aiokafka import AIOKafkaConsumer, TopicPartition
from prometheus_client.core import Metric

from gpucost.kafka.assignor import Balancer
from gpucost.kafka.owned import Owned
from gpucost.metrics import counter, gauge

__all__ = ["Observed", "worker_metrics"]


class Observed(Protocol):
    """What of a worker (``gpucost.kafka.worker.Worker``, which says what each holds) its metrics read; a protocol
    rather than that class, which imports this module."""

    owned: dict[TopicPartition, Owned]
    consumer: AIOKafkaConsumer | None
    processed: int
    events_in: Counter[str]
    records_out: Counter[str]
    dead_letters: Counter[str]
    counts: Counter[str]
    transactions: Counter[str]
    markers_sent: int
    state_bytes_written: int
    taken: Counter[str]
    applied: dict[str, tuple[float, int]]
    balancer: Balancer


def worker_metrics(worker: Observed) -> list[Metric]:
    """The worker's metrics now: counters of committed work, gauges of its partitions and their keys."""
    owned = dict(worker.owned)
    now_ns = time.time_ns()
    lag_s, behind, panes, gpus = {}, {}, 0, 0
    final = {
        f"{tp.topic}[{tp.partition}]": o.closed_through / 1e9 for tp, o in owned.items() if o.closed_through is not None
    }
    for tp, o in owned.items():
        auditors = list(o.auditors.values())
        marks = [m for m in (a.largest_watermark() for a in auditors) if m is not None]
        name = f"{tp.topic}[{tp.partition}]"
        if marks:
            lag_s[name] = (now_ns - max(marks)) / 1e9
        panes += sum(a.open_panes() for a in auditors)
        gpus += len(auditors)
        high = worker.consumer.highwater(tp) if worker.consumer is not None else None
        if high is not None:
            behind[name] = max(0, high - o.next_offset)
    return [
        counter("gpucost_worker_input_messages", "input messages applied and committed", worker.processed),
        counter(
            "gpucost_worker_events",
            "events taken (counted in a pane, a window or a table), by kind",
            worker.events_in,
            "kind",
        ),
        counter("gpucost_worker_records", "records published, by kind", worker.records_out, "kind"),
        counter("gpucost_worker_dead_letters", "dead letters published, by reason", worker.dead_letters, "reason"),
        counter(
            "gpucost_worker_refused_messages",
            "messages refused before any auditor (and re-deliveries skipped), by reason",
            dict(worker.counts),
            "reason",
        ),
        counter("gpucost_worker_transactions", "transactions, by outcome", worker.transactions, "outcome"),
        counter(
            "gpucost_worker_closed_markers",
            "closed markers committed (one per cost partition each time an input partition's final hour moves on)",
            worker.markers_sent,
        ),
        counter(
            "gpucost_worker_state_bytes_written",
            "bytes of state written to the state topics",
            worker.state_bytes_written,
        ),
        counter(
            "gpucost_worker_partitions_taken",
            "input partitions taken, by how: state restored from its topic, or kept across a rebalance",
            worker.taken,
            "how",
        ),
        counter(
            "gpucost_worker_assignments",
            "assignments this worker made as the group's leader, by how: by measured work, or by count",
            worker.balancer.assignments,
            "how",
        ),
        gauge(
            "gpucost_worker_seconds_per_message",
            "seconds applying a message took this worker, per input topic (what the assignor weighs)",
            {topic: s / n for topic, (s, n) in worker.applied.items() if n},
            "topic",
        ),
        gauge("gpucost_worker_partitions", "input partitions owned", len(owned)),
        gauge(
            "gpucost_worker_owns",
            "1 for each input partition this worker owns",
            {f"{tp.topic}[{tp.partition}]": 1 for tp in owned},
            "partition",
        ),
        gauge("gpucost_worker_keys", "keys (GPUs, processes) held", gpus),
        gauge("gpucost_worker_open_panes", "panes open, not yet billed", panes),
        gauge(
            "gpucost_worker_event_time_lag_seconds",
            "wall clock minus the largest watermark, per partition",
            lag_s,
            "partition",
        ),
        gauge(
            "gpucost_worker_consumer_lag_messages",
            "input messages not yet applied, per partition",
            behind,
            "partition",
        ),
        gauge(
            "gpucost_worker_final_through_seconds",
            "the last closed marker committed, per input partition: "
            "records of panes ending at or before it are final (Unix seconds)",
            final,
            "partition",
        ),
    ]
