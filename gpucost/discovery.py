"""``gpucost discovery``: the nodes in service as a Prometheus ``file_sd`` file, kept up to date.

From an output directory (the ``health`` view, once) or from the ``health`` topic (as it
grows): each GPU's latest breaker state decides its node (``gpucost.streams.discovery``). The
file is replaced atomically (written beside it, fsynced, renamed), so Prometheus never reads
half of one. From Kafka, each node whose entry changes is also published, keyed by node, to the
compacted ``discovery`` topic, and the file is first written only once the consumer has read
the topic up to where it stood at start: a half-read topic would list nodes that are out.

With audit keys, a record counts only if its seal holds (``gpucost.health.seal_refusal``, the
check ``gpucost health verify`` makes): a node's state comes from its GPUs' verified records
alone, so a forged "excellent" record cannot put a removed node back. Every record refused, and
every node whose name is no scrape target (``target_problem``), is counted by reason and said.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from gpucost.health import seal_refusal
from gpucost.kafka.clients import start, stop_quietly
from gpucost.kafka.settings import KafkaSettings
from gpucost.kafka.signing import Keyring
from gpucost.kafka.sink import output_record, output_refusal
from gpucost.output_files import write_whole
from gpucost.schemas.records import DeadLetter
from gpucost.sinks.views import view_records
from gpucost.streams.discovery import ServiceDiscovery

__all__ = ["write_file_sd", "from_output", "refusals", "run_kafka_discovery"]

log = logging.getLogger("gpucost.discovery")


def write_file_sd(path: Path, groups: list[dict[str, Any]]) -> None:
    """``groups`` as the file Prometheus reads, replacing it atomically."""
    write_whole(path, json.dumps(groups, indent=2) + "\n", "--file-sd")


def _refusal(fields: Mapping[str, Any], secrets: Mapping[str, bytes] | None, refused: Counter[str]) -> str | None:
    """Why a health record (its fields as written) may not move discovery, counted in ``refused`` (None: it
    may; without ``secrets`` every record may)."""
    why = None if secrets is None else seal_refusal(fields, secrets)
    if why is not None:
        refused[why] += 1
    return why


def from_output(
    out_dir: Path, secrets: Mapping[str, bytes] | None = None, refused: Counter[str] | None = None
) -> ServiceDiscovery:
    """Service discovery as of every GPU's latest ``health`` record under ``out_dir``; with ``secrets`` (the
    audit keys), as of its latest record that verifies, every record checked and each refused counted in
    ``refused`` by reason."""
    refused = refused if refused is not None else Counter()
    sd = ServiceDiscovery()
    latest = "QUALIFY row_number() OVER (PARTITION BY gpu_uuid ORDER BY window_start_ns DESC) = 1"
    for record in view_records(out_dir, "health", latest if secrets is None else "ORDER BY window_start_ns"):
        if _refusal(record.model_dump(mode="json"), secrets, refused) is None:
            sd.update(record)
    return sd


def refusals(refused: Mapping[str, int], sd: ServiceDiscovery) -> str | None:
    """One line saying what was refused, by reason (None: nothing was)."""
    targets = Counter(sd.refused_targets().values())
    parts = [
        f"{sum(counts.values()):,} {what} ({', '.join(f'{k} {v:,}' for k, v in sorted(counts.items()))})"
        for what, counts in (
            ("health record(s) that do not verify", refused),
            ("node(s) whose name is no scrape target", targets),
        )
        if counts
    ]
    return f"refused {' and '.join(parts)}; left out" if parts else None


async def run_kafka_discovery(
    kafka: KafkaSettings,
    file_sd: Path,
    port: int,
    labels: dict[str, str],
    stop: asyncio.Event,
    keyring: Keyring | None = None,
    counts: dict[str, int] | None = None,
    secrets: Mapping[str, bytes] | None = None,
    refused: Counter[str] | None = None,
) -> ServiceDiscovery:
    """Follow the ``health`` topic from its start until ``stop``; keep ``file_sd`` and the ``discovery``
    topic up to date. A message that is not a health record the workers signed (with ``keyring``) is
    counted under ``counts['refused']`` and logged with its reason, never applied; with ``secrets`` (the
    audit keys), a record whose seal does not verify likewise, counted in ``refused`` by reason."""
    counts = counts if counts is not None else {}
    refused = refused if refused is not None else Counter()
    counts.setdefault("records", 0)
    counts.setdefault("refused", 0)
    counts.setdefault("writes", 0)
    sd = ServiceDiscovery()
    topic = kafka.topic("health")
    consumer = AIOKafkaConsumer(**kafka.client_options(), enable_auto_commit=False, isolation_level="read_committed")
    await start(consumer)
    try:  # made once the consumer is up: a producer made and never started still warns "Unclosed" at exit
        producer = AIOKafkaProducer(**kafka.producer_options(), enable_idempotence=True)
        await start(producer)
    except BaseException:
        await stop_quietly(consumer)
        raise
    try:
        if topic not in await consumer.topics():  # also fetches the cluster's metadata
            raise RuntimeError(f"topic {topic} does not exist; create the topics first (gpucost topics create)")
        parts = [TopicPartition(topic, p) for p in sorted(await producer.partitions_for(topic))]
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        ends = await consumer.end_offsets(parts)
        caught_up, written = not any(ends.values()), None
        changed: set[str] = set()
        while not stop.is_set():
            batches = await consumer.getmany(timeout_ms=500)
            for tp, messages in batches.items():
                for m in messages:
                    source = f"{tp.topic}[{tp.partition}]@{m.offset}"
                    record = output_record("health", m.value or b"", source, output_refusal(keyring, m))
                    if isinstance(record, DeadLetter):
                        counts["refused"] += 1
                        log.warning("%s: %s (%s); not applied", source, record.reason, record.detail)
                        continue
                    if why := _refusal(json.loads(m.value), secrets, refused):  # the fields as written
                        log.warning("%s: the health record's seal does not verify (%s); not applied", source, why)
                        continue
                    counts["records"] += 1
                    changed |= sd.update(record)  # type: ignore[arg-type]
            if not caught_up:
                caught_up = all([await consumer.position(tp) >= ends[tp] for tp in parts])
            if changed and caught_up:
                for node in sorted(changed):
                    await producer.send_and_wait(
                        kafka.topic("discovery"), json.dumps(sd.entry(node)).encode(), key=node.encode()
                    )
                changed.clear()
            groups = sd.file_sd(port, labels)
            if caught_up and groups != written:
                write_file_sd(file_sd, groups)
                written = groups
                counts["writes"] += 1
                log.info("%s: %d node(s) in service of %d", file_sd, len(groups), len(sd.nodes()))
                if said := refusals(refused, sd):
                    log.warning("%s", said)
    finally:
        await consumer.stop()
        await producer.stop()
    return sd
