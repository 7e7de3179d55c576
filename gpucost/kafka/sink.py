"""Output topics → the same Parquet layout as the embedded run, each record written once.

Offsets are committed only after the files holding the records are durably renamed into
place. Only the records after the last commit can arrive again (a sink that died between a
rename and the commit, a rebalance); those already written, in the files of the journal at
start-up or seen since the last commit, are dropped by each kind's natural key. So a restart
never writes a row twice, and the keys held stay bounded by what one flush interval brings.

A flush makes a file per kind and date, so after a commit, with the journal empty, a folder
that has gained ``compact_min_files`` files is compacted (``gpucost.sinks.compact``) in a thread while
the loop waits: nothing is written into a folder while it is swapped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError
from prometheus_client.core import Metric
from pydantic import BaseModel, ValidationError

from gpucost.cost_metrics import CostMetrics
from gpucost.kafka.clients import start
from gpucost.kafka.closing import is_control
from gpucost.kafka.signing import Keyring, Verdict
from gpucost.metrics import Health, counter
from gpucost.schemas.records import OUTPUT_KINDS, DeadLetter
from gpucost.sinks.compact import CompactError, compact, part_files, partition_folders
from gpucost.sinks.lock import OutputLock
from gpucost.sinks.parquet import Journal, ParquetSink, SinkWriteError, remove_stale_temporaries

__all__ = [
    "DEDUPE_KEYS",
    "JOURNAL",
    "Resumed",
    "SinkStats",
    "resume",
    "written_keys",
    "output_record",
    "output_refusal",
    "run_kafka_sink",
]

log = logging.getLogger("gpucost.sink")

#: the natural key of each output kind: the same key means the same record
DEDUPE_KEYS: dict[str, tuple[str, ...]] = {
    "cost": ("record_id",),
    "allocation": ("record_id",),
    "idle_index": ("gpu_uuid", "pane_start_ns", "revision"),
    "mae": ("node_id", "pid", "first_ts_ns"),
    "health": ("gpu_uuid", "window_start_ns"),
    "quota": ("gpu_uuid", "pane_start_ns", "tenant_key"),
    "reclaim": ("trigger_id",),
    "efficiency": ("gpu_uuid", "pane_start_ns", "pid"),
    "kernel_cost": ("record_id",),
    "range_cost": ("record_id",),
    "dlq": ("source", "reason"),
}


@dataclass
class SinkStats:
    consumed: int = 0
    written: Counter[str] = field(default_factory=Counter)
    duplicates: Counter[str] = field(default_factory=Counter)
    undecodable: int = 0
    unverified: int = 0  # records whose signature did not verify: dead-lettered, never written as their kind
    compacted_files: int = 0  # small files merged away
    compactions: int = 0  # partition folders compacted
    files_written: int = 0  # Parquet files flushed (before compaction)
    health: Health = field(default_factory=Health)
    cost: CostMetrics | None = None  # the cost written, for Prometheus (None: not served, not counted)

    def metrics(self) -> list[Metric]:
        """What ``gpucost sink --metrics-address`` serves (docs/operations.md, "Metrics")."""
        return [
            counter("gpucost_sink_records_consumed", "records read from the output topics", self.consumed),
            counter("gpucost_sink_records_written", "records written to Parquet, by kind", self.written, "kind"),
            counter(
                "gpucost_sink_duplicates",
                "records read again and dropped (written once), by kind",
                self.duplicates,
                "kind",
            ),
            counter(
                "gpucost_sink_records_unverified",
                "records whose signature did not verify (dead-lettered)",
                self.unverified,
            ),
            counter(
                "gpucost_sink_records_undecodable",
                "records that are no record of their kind (dead-lettered)",
                self.undecodable,
            ),
            counter("gpucost_sink_files_written", "Parquet files flushed (before compaction)", self.files_written),
            counter("gpucost_sink_compactions", "partition folders compacted", self.compactions),
            counter("gpucost_sink_files_merged", "small files merged away by compaction", self.compacted_files),
            *(self.cost.metrics() if self.cost is not None else []),
        ]


JOURNAL = ".sink-journal"  # under the output directory
# a folder's files merged at one go at most, and the seconds of compaction begun after one commit: the consumer
# polls again well inside Kafka's max.poll.interval even where a sink meets a day of files flushed by an old one
COMPACT_MAX_FILES = 1024
COMPACT_BUDGET_S = 20.0


def written_keys(out_dir: Path, files: list[Path]) -> dict[str, set[tuple[object, ...]]]:
    """The natural keys of the records in ``files`` (Parquet files under ``out_dir``), by kind."""
    con = duckdb.connect()
    keys: dict[str, set[tuple[object, ...]]] = {}
    for kind, cols in DEDUPE_KEYS.items():
        of_kind = [str(f) for f in files if f.relative_to(out_dir).parts[0] == kind]
        keys[kind] = (
            set(con.execute(f"SELECT {', '.join(cols)} FROM read_parquet(?)", [of_kind]).fetchall())
            if of_kind
            else set()
        )
    return keys


@dataclass
class Resumed:
    """What a sink starting on an output directory takes from the sinks before it: only what the
    journal lists, so its start-up and memory follow the last flush, not all the output."""

    journal: Journal
    #: per partition, the offset below which the journal's records may be read again
    again: dict[str, int]
    #: the natural keys of the records in the journal's files, by kind: dropped if read again
    seen: dict[str, set[tuple[object, ...]]]
    #: files per partition folder since it was last compacted (what earlier sinks left counts too)
    fresh: Counter[Path]


def resume(out_dir: Path, offsets: Callable[[], dict[str, int]]) -> Resumed:
    """Start on ``out_dir``: remove what a sink that died mid-write left hidden, and read what it may have
    written and not committed. ``offsets`` gives the offsets read so far, for the journal's new entries."""
    if stale := remove_stale_temporaries(out_dir):
        log.info("removed %d temporary file(s) of a sink that died mid-write", stale)
    journal = Journal(out_dir / JOURNAL, offsets)
    files, again = journal.pending()
    return Resumed(
        journal,
        again,
        written_keys(out_dir, files),
        Counter({f: len(part_files(f.iterdir())) for f in partition_folders(out_dir)}),
    )


def _part(tp: TopicPartition) -> str:
    return f"{tp.topic}:{tp.partition}"


def output_record(kind: str, value: bytes, source: str, refused: Verdict | None = None) -> BaseModel:
    """The record a message of ``kind``'s topic holds, or the dead letter saying why it is not one:
    ``refused`` (its signature did not verify), or ``bad_output`` (not a record of its kind)."""
    raw = value.decode("utf-8", "backslashreplace")
    if refused is not None:
        return DeadLetter(
            reason=refused.reason,
            detail=f"{refused.detail}; not written as {kind}",
            kind=kind,
            source=source,
            raw=raw,
            ts_ns=None,
            gpu_uuid=None,
        )
    try:
        return OUTPUT_KINDS[kind].model_validate_json(value)
    except ValidationError as exc:
        return DeadLetter(
            reason="bad_output",
            detail=f"not a {kind} record: {exc.error_count()} error(s)",
            kind=kind,
            source=source,
            raw=raw,
            ts_ns=None,
            gpu_uuid=None,
        )


def output_refusal(keyring: Keyring | None, message: Any) -> Verdict | None:
    """Why a message of an output topic is not the worker's (None: it is, or nothing is verified)."""
    if keyring is None:
        return None
    headers = {name: v or b"" for name, v in message.headers or ()}
    verdict = keyring.check(message.key or b"", message.value or b"", headers)
    return verdict if isinstance(verdict, Verdict) else None


async def _flush(sink: ParquetSink, stop: asyncio.Event, retry_s: float) -> None:
    """Write every buffered record, retrying while the disk refuses; raise if stopped before it worked."""
    failing = False
    while True:
        try:
            sink.flush()
        except SinkWriteError as exc:
            if not failing:
                log.error("%s. Offsets are not committed; retrying every %.0f s", exc, retry_s)
                failing = True
            if stop.is_set():
                raise
            await asyncio.sleep(retry_s)
            continue
        if failing:
            log.warning("Parquet output writable again; %s records written", f"{sum(sink.rows_written.values()):,}")
        return


async def run_kafka_sink(
    consumer_options: dict[str, object],
    topics: dict[str, str],
    out_dir: Path,
    group_id: str,
    stop: asyncio.Event,
    flush_interval_s: float = 2.0,
    retry_s: float = 5.0,
    compact_min_files: int = 64,
    keyring: Keyring | None = None,
    stats: SinkStats | None = None,
) -> SinkStats:
    """Consume ``topics`` (kind → topic name) until ``stop`` is set; flush, then commit.

    If the output cannot be written (disk full, permissions), nothing more is consumed and
    no offset is committed; the write is retried every ``retry_s`` until it succeeds. A
    sink stopped meanwhile raises ``SinkWriteError``: its records are read again on restart.
    ``compact_min_files`` 0 leaves every file as flushed. With ``keyring``, only records signed by
    one of its keys (the workers' output keys) are written as their kind; any other is
    dead-lettered with the reason (``unsigned``, ``unknown_key``, ``bad_signature``): an output
    topic anyone can write to must not reach the bill. Raises ``OutputBusyError`` while another
    process writes to ``out_dir``. ``stats`` (a fresh one if not given) is kept up to date as it runs,
    for ``--metrics-address``.
    """
    with OutputLock(out_dir, "gpucost sink"):
        return await _run(
            consumer_options,
            topics,
            out_dir,
            group_id,
            stop,
            flush_interval_s,
            retry_s,
            compact_min_files,
            keyring,
            stats if stats is not None else SinkStats(),
        )


async def _run(
    consumer_options: dict[str, object],
    topics: dict[str, str],
    out_dir: Path,
    group_id: str,
    stop: asyncio.Event,
    flush_interval_s: float,
    retry_s: float,
    compact_min_files: int,
    keyring: Keyring | None,
    stats: SinkStats,
) -> SinkStats:
    read: dict[str, int] = {}  # "topic:partition" → the next offset, of what this sink has read
    resumed = resume(out_dir, lambda: dict(read))
    journal, again, seen, fresh = resumed.journal, resumed.again, resumed.seen, resumed.fresh
    kind_of_topic = {t: k for k, t in topics.items()}
    sink = ParquetSink(out_dir, journal=journal, on_published=None if stats.cost is None else stats.cost.observe)
    consumer = AIOKafkaConsumer(
        *topics.values(),
        **consumer_options,
        group_id=group_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
    )

    async def commit() -> None:
        await consumer.commit()  # what the journal lists is now behind the committed offsets …
        mine = set()
        for tp in consumer.assignment():
            mine.add(part := _part(tp))
            try:  # a partition with nothing new since the last commit: its position is that commit
                read[part] = max(read.get(part, 0), await consumer.position(tp))
            except IllegalStateError:  # taken away by a rebalance meanwhile
                mine.discard(part)
        if mine and all(read.get(part, 0) >= offset for part, offset in again.items() if part in mine):
            again.clear()  # … and, once past what was read twice, neither it nor the keys are needed
            journal.clear()
            for keys in seen.values():
                keys.clear()

    def take_written() -> None:
        """The files flushed since last asked: counted, and each one more in its folder."""
        fresh.update(f.parent for f in sink.files_written)
        stats.files_written += len(sink.files_written)
        sink.files_written.clear()

    async def compact_fresh() -> None:
        """Compact the folders that gained enough files, once the journal needs none of them."""
        nonlocal compact_min_files
        take_written()
        if not compact_min_files or again:
            return
        started = time.monotonic()
        for folder in [f for f, n in fresh.items() if n >= compact_min_files]:
            if time.monotonic() - started >= COMPACT_BUDGET_S:
                return  # the rest after the next commit
            try:
                done = await asyncio.to_thread(
                    compact, out_dir, compact_min_files, sink.file_rows, [folder], (), COMPACT_MAX_FILES
                )
            except CompactError as exc:
                log.error("%s. Compaction is off until the sink restarts", exc)
                compact_min_files = 0
                return
            except OSError as exc:  # a full disk, say: the files stay as they are; tried again after the next commit
                log.warning("compaction failed, the files are unchanged: %s", exc)
                return
            fresh[folder] = done.small_left.get(folder, 0)  # its small files left: due again if still too many
            stats.compacted_files += done.files_merged
            stats.compactions += 1

    await start(consumer)
    try:
        last_flush, dirty = time.monotonic(), False
        while not stop.is_set():
            batches = await consumer.getmany(timeout_ms=200, max_records=5000)
            stats.health.beat()
            for tp, messages in batches.items():
                for m in messages:
                    read[_part(tp)] = m.offset + 1
                    stats.consumed += 1
                    dirty = True
                    source = f"{tp.topic}[{tp.partition}]@{m.offset}"
                    kind = kind_of_topic[tp.topic]
                    if is_control(m.headers):  # a closed marker, for billing consumers: not a record
                        continue
                    refused = output_refusal(keyring, m)
                    rec = output_record(kind, m.value or b"", source, refused)
                    if refused is not None:
                        stats.unverified += 1
                        kind = "dlq"
                    elif isinstance(rec, DeadLetter) and rec.reason == "bad_output":
                        stats.undecodable += 1
                        kind = "dlq"
                    key = tuple(getattr(rec, c) for c in DEDUPE_KEYS[kind])
                    if key in seen[kind]:
                        stats.duplicates[kind] += 1
                        continue
                    seen[kind].add(key)
                    stats.written[kind] += 1
                    try:
                        sink.write(rec)  # kept buffered even if the file it completes cannot be written
                    except SinkWriteError:
                        await _flush(sink, stop, retry_s)
            if dirty and time.monotonic() - last_flush >= flush_interval_s:
                await _flush(sink, stop, retry_s)  # files renamed into place and fsynced …
                await commit()  # … before the offsets that produced them are committed
                await compact_fresh()
                last_flush, dirty = time.monotonic(), False
            elif again and not dirty and consumer.assignment():
                # what the journal lists may already be behind the commit on quiet partitions: it would
                # otherwise wait for each of them to bring a record (and compaction with it)
                try:
                    await commit()
                except (CommitFailedError, IllegalStateError) as exc:  # a rebalance: tried again on the next poll
                    log.info("commit while past the journal failed, tried again: %s", exc)
        await _flush(sink, stop, retry_s)
        await commit()
        take_written()
    finally:
        await consumer.stop()
    return stats
