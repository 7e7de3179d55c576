"""Output topics → the same Parquet layout as the embedded run, each record written once.

Offsets are committed only after the files holding the records are durably renamed into
place. Records already written (found in the Parquet at start-up, or seen since) are
dropped, by each kind's natural key, so a restart, and a worker's re-sent records, never
write a row twice.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka import AIOKafkaConsumer
from pydantic import BaseModel, ValidationError

from schemas.records import DeadLetter, OUTPUT_KINDS
from sinks.parquet import ParquetSink, SinkWriteError, remove_stale_temporaries
from sinks.views import connect

__all__ = ["DEDUPE_KEYS", "SinkStats", "written_keys", "run_kafka_sink"]

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


def written_keys(out_dir: Path) -> dict[str, set[tuple[object, ...]]]:
    con = connect(out_dir)
    return {kind: set(con.execute(f"SELECT {', '.join(cols)} FROM {kind}").fetchall())
            for kind, cols in DEDUPE_KEYS.items()}


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
    seen = written_keys(out_dir)
    kind_of_topic = {t: k for k, t in topics.items()}
    sink = ParquetSink(out_dir)
    stats = SinkStats()
    consumer = AIOKafkaConsumer(*topics.values(), **consumer_options, group_id=group_id, enable_auto_commit=False,
                                auto_offset_reset="earliest", isolation_level="read_committed")
    await consumer.start()
    try:
        last_flush, dirty = time.monotonic(), False
        while not stop.is_set():
            batches = await consumer.getmany(timeout_ms=200, max_records=5000)
            for tp, messages in batches.items():
                for m in messages:
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
                await consumer.commit()  # … before the offsets that produced them are committed
                last_flush, dirty = time.monotonic(), False
        await _flush(sink, stop, retry_s)
        await consumer.commit()
    finally:
        await consumer.stop()
    return stats
