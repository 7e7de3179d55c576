"""The embedded transport: a source thread → bounded in-process queue → operators → Parquet.

The same ``Auditor`` the Kafka workers run; the queue gives the source back-pressure.
"""
from __future__ import annotations

import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpucost.producers.replay import LineBatch, RowBatch
from gpucost.schemas.blocks import ClosedPanes, Outputs
from gpucost.schemas.events import Event
from gpucost.schemas.records import DeadLetter
from gpucost.sinks.parquet import ParquetSink
from gpucost.streams.audit import Auditor
from gpucost.streams.settings import AuditSettings

__all__ = ["Item", "RunStats", "run_embedded"]

#: a source yields decoded events, or raw lines or Parquet rows (decoded here, as a worker would), with a
#: label; or batches of Parquet rows or JSON lines, which take the batch path
Item = tuple[Event | str | bytes | dict[str, Any], str] | RowBatch | LineBatch
_BATCH = 2048
_DONE = object()


@dataclass
class RunStats:
    inputs: int = 0
    dead_letters: Counter[str] = field(default_factory=Counter)
    counts: Counter[str] = field(default_factory=Counter)
    rows: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0


def _batches(items: Iterable[Item], q: "queue.Queue[object]", failure: list[BaseException]) -> None:
    try:
        batch: list[Item] = []
        for item in items:
            if isinstance(item, (RowBatch, LineBatch)):  # already a batch: sent alone
                if batch:
                    q.put(batch)
                q.put([item])
                batch = []
                continue
            batch.append(item)
            if len(batch) == _BATCH:
                q.put(batch)
                batch = []
        q.put(batch)
    except BaseException as exc:  # handed to the consumer, which re-raises it
        failure.append(exc)
    finally:
        q.put(_DONE)


def _drain(q: "queue.Queue[object]") -> Iterator[list[Item]]:
    while (batch := q.get()) is not _DONE:
        yield batch  # type: ignore[misc]


def _audit(auditor: Auditor, batch: list[Item]) -> tuple[int, Outputs]:
    """The inputs a batch holds, and its outputs: a batch of JSON lines or Parquet rows takes the batch path."""
    if len(batch) == 1 and isinstance(batch[0], RowBatch):
        return batch[0].batch.num_rows, auditor.ingest_batch(batch[0].batch, batch[0].label)
    if len(batch) == 1 and isinstance(batch[0], LineBatch):
        return len(batch[0].lines), auditor.ingest_lines(batch[0].lines, batch[0].label)
    if all(isinstance(item[0], bytes) for item in batch):
        lines, labels = zip(*batch) if batch else ((), ())
        return len(batch), auditor.ingest_lines(lines, labels.__getitem__)  # type: ignore[arg-type]
    out: Outputs = []
    for payload, label in batch:  # type: ignore[misc]
        out += (auditor.ingest(payload, label) if isinstance(payload, (str, bytes, dict))
                else auditor.update(payload, None, label))
    return len(batch), out


def run_embedded(items: Iterable[Item], settings: AuditSettings, out_dir: Path,
                 on_batch: Callable[[list[Item]], None] | None = None) -> RunStats:
    """Run every item through the audit and write the records; returns what happened."""
    start = time.perf_counter()
    q: "queue.Queue[object]" = queue.Queue(maxsize=4)
    failure: list[BaseException] = []
    producer = threading.Thread(target=_batches, args=(items, q, failure), name="source", daemon=True)
    producer.start()
    auditor = Auditor(settings, time.time_ns)
    sink = ParquetSink(out_dir)
    stats = RunStats()
    for batch in _drain(q):
        n, records = _audit(auditor, batch)
        stats.inputs += n
        for record in records:
            if isinstance(record, ClosedPanes):
                sink.write_block(record)
                continue
            if isinstance(record, DeadLetter):
                stats.dead_letters[record.reason] += 1
            sink.write(record)
        if on_batch is not None:
            on_batch(batch)
    producer.join()
    if failure:
        raise failure[0]
    for record in auditor.finish():
        sink.write(record)
    sink.flush()
    stats.counts = auditor.counts
    stats.rows = dict(sink.rows_written)
    stats.seconds = time.perf_counter() - start
    return stats
