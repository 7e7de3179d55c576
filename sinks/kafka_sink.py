"""Output topics → the same Parquet layout as the embedded run, each record written once.

Offsets are committed only after the files holding the records are durably renamed into
place. Only the records after the last commit can arrive again (a sink that died between a
rename and the commit, a rebalance); those already written, in the files of the journal at
start-up or seen since the last commit, are dropped by each kind's natural key. So a restart
never writes a row twice, and the keys held stay bounded by what one flush interval brings.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
from aiokafka import AIOKafkaConsumer, TopicPartition
from pydantic import BaseModel, ValidationError

from schemas.records import DeadLetter, OUTPUT_KINDS
from sinks.parquet import Journal, ParquetSink, SinkWriteError, remove_stale_temporaries

__all__ = ["DEDUPE_KEYS", "JOURNAL", "SinkStats", "written_keys", "run_kafka_sink"]

log = logging.getLogger("gpucost.sink")

#: the natural key of each output kind: the same key means the same record
DEDUPE_KEYS: dict[str, tuple[str, ...]] = {
    "cost": ("record_id",),
    "idle_index": ("gpu_uuid", "pane_start_ns"),
    "mae": ("node_id", "pid", "first_ts_ns"),
    "dlq": ("source", "reason"),
}


@dataclass
class SinkStats:
    consumed: int = 0
    written: Counter[str] = field(default_factory=Counter)
    duplicates: Counter[str] = field(default_factory=Counter)
    undecodable: int = 0


JOURNAL = ".sink-journal"  # under the output directory


def written_keys(out_dir: Path, files: list[Path]) -> dict[str, set[tuple[object, ...]]]:
    """The natural keys of the records in ``files`` (Parquet files under ``out_dir``), by kind."""
    con = duckdb.connect()
    keys: dict[str, set[tuple[object, ...]]] = {}
    for kind, cols in DEDUPE_KEYS.items():
        of_kind = [str(f) for f in files if f.relative_to(out_dir).parts[0] == kind]
        keys[kind] = set(con.execute(f"SELECT {', '.join(cols)} FROM read_parquet(?)", [of_kind]).fetchall()
                         ) if of_kind else set()
    return keys


def _part(tp: TopicPartition) -> str:
    return f"{tp.topic}:{tp.partition}"


def _record(kind: str, value: bytes, source: str) -> BaseModel:
    try:
        return OUTPUT_KINDS[kind].model_validate_json(value)
    except ValidationError as exc:
        return DeadLetter(reason="bad_output", detail=f"not a {kind} record: {exc.error_count()} error(s)",
                          kind=kind, source=source, raw=value.decode("utf-8", "backslashreplace"),
                          ts_ns=None, gpu_uuid=None)


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


async def run_kafka_sink(consumer_options: dict[str, object], topics: dict[str, str], out_dir: Path,
                         group_id: str, stop: asyncio.Event, flush_interval_s: float = 2.0,
                         retry_s: float = 5.0) -> SinkStats:
    """Consume ``topics`` (kind → topic name) until ``stop`` is set; flush, then commit.

    If the output cannot be written (disk full, permissions), nothing more is consumed and
    no offset is committed; the write is retried every ``retry_s`` until it succeeds. A
    sink stopped meanwhile raises ``SinkWriteError``: its records are read again on restart.
    """
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SinkWriteError(f"cannot create the output directory {out_dir}: {exc.strerror}") from None
    if stale := remove_stale_temporaries(out_dir):
        log.info("removed %d temporary file(s) of a sink that died mid-write", stale)
    read: dict[str, int] = {}  # "topic:partition" → the next offset, of what this sink has read
    journal = Journal(out_dir / JOURNAL, lambda: dict(read))
    # what a sink that died may have written and not committed, and up to where it will be read again
    files, again = journal.pending()
    seen = written_keys(out_dir, files)
    kind_of_topic = {t: k for k, t in topics.items()}
    sink = ParquetSink(out_dir, journal=journal)
    stats = SinkStats()
    consumer = AIOKafkaConsumer(*topics.values(), **consumer_options, group_id=group_id, enable_auto_commit=False,
                                auto_offset_reset="earliest", isolation_level="read_committed")

    async def commit() -> None:
        await consumer.commit()  # what the journal lists is now behind the committed offsets …
        mine = {_part(tp) for tp in consumer.assignment()}
        if all(read.get(part, 0) >= offset for part, offset in again.items() if part in mine):
            again.clear()  # … and, once past what was read twice, neither it nor the keys are needed
            journal.clear()
            for keys in seen.values():
                keys.clear()

    await consumer.start()
    try:
        last_flush, dirty = time.monotonic(), False
        while not stop.is_set():
            batches = await consumer.getmany(timeout_ms=200, max_records=5000)
            for tp, messages in batches.items():
                for m in messages:
                    read[_part(tp)] = m.offset + 1
                    stats.consumed += 1
                    dirty = True
                    source = f"{tp.topic}[{tp.partition}]@{m.offset}"
                    kind = kind_of_topic[tp.topic]
                    rec = _record(kind, m.value or b"", source)
                    if isinstance(rec, DeadLetter) and rec.reason == "bad_output":
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
                last_flush, dirty = time.monotonic(), False
        await _flush(sink, stop, retry_s)
        await commit()
    finally:
        await consumer.stop()
    return stats
