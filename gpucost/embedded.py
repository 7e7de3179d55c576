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

from prometheus_client.core import Metric

from gpucost.cost_metrics import CostMetrics
from gpucost.metrics import Health, counter, source_counts
from gpucost.producers.replay import LineBatch, RowBatch
from gpucost.schemas.blocks import ClosedPanes, Outputs
from gpucost.schemas.events import EVENT_MODELS, Event
from gpucost.schemas.records import DeadLetter
from gpucost.sinks.parquet import ParquetSink
from gpucost.streams.audit import Auditor
from gpucost.streams.settings import AuditSettings

__all__ = ["Item", "RunStats", "run_embedded"]

#: a source yields decoded events, or raw lines or Parquet rows (decoded here, as a worker would), with a
#: label; or batches of Parquet rows or JSON lines, which take the batch path
Item = tuple[Event | str | bytes | dict[str, Any], str] | RowBatch | LineBatch
_BATCH = 2048
#: a batch is handed over after this long even if not full: a live source's events (a few a second)
#: are then written, shown and counted as they come, not after minutes
_BATCH_S = 1.0
_DONE = object()


@dataclass
class RunStats:
    """What a run did; kept up to date while it runs (``run_embedded``), for ``--metrics-address``."""

    inputs: int = 0
    dead_letters: Counter[str] = field(default_factory=Counter)
    counts: Counter[str] = field(default_factory=Counter)  # the auditor's: events taken by kind, and more
    rows: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    source: Counter[str] = field(default_factory=Counter)  # a live source's own counters
    health: Health = field(default_factory=Health)
    cost: CostMetrics | None = None  # the cost written, for Prometheus (None: not served, not counted)

    def metrics(self) -> list[Metric]:
        """What ``gpucost run --metrics-address`` serves (docs/operations.md, "Metrics")."""
        return [
            counter("gpucost_run_inputs", "inputs read (events, lines or rows)", self.inputs),
            counter("gpucost_run_events", "events taken, by kind", {k: v for k, v in dict(self.counts).items()
                                                                    if k in EVENT_MODELS}, "kind"),
            counter("gpucost_run_dead_letters", "dead letters, by reason", self.dead_letters, "reason"),
            counter("gpucost_run_rows_written", "rows written to Parquet, by kind", dict(self.rows), "kind"),
            source_counts(self.source),
            *(self.cost.metrics() if self.cost is not None else []),
        ]


def _batches(items: Iterable[Item], q: "queue.Queue[object]", failure: list[BaseException]) -> None:
    try:
        batch: list[Item] = []
        since = time.monotonic()
        for item in items:
            if isinstance(item, (RowBatch, LineBatch)):  # already a batch: sent alone
                if batch:
                    q.put(batch)
                q.put([item])
                batch = []
                continue
            batch.append(item)
            if len(batch) == _BATCH or time.monotonic() - since >= _BATCH_S:
                q.put(batch)
                batch, since = [], time.monotonic()
        q.put(batch)
    except BaseException as exc:  # handed to the consumer, which re-raises it
        failure.append(exc)
    finally:
        q.put(_DONE)


def _drain(q: "queue.Queue[object]") -> Iterator[list[Item]]:
    while (batch := q.get()) is not _DONE:
        yield batch  # type: ignore[misc]


@dataclass
class _Silence:
    """The GPUs and processes a run has not heard from: ``Auditor.close_silent`` against the run's largest
    watermark, of the GPUs whose largest event time has not moved for ``settings.idle_timeout_s`` of the clock
    as well as of event time (the Kafka worker's two-clock rule, per GPU here as it is per key there: a replay
    reads one file after another, so a later file's GPUs lie far behind in event time while being read); and
    likewise of the processes whose open MAE window's last address has not moved, against the largest of the
    run's watermarks and addresses."""

    timeout_s: float
    forget: bool
    monotonic: Callable[[], float]
    #: each GPU's largest event time, or each process's last address, when last looked at
    latest: dict[str | tuple[str, int], int] = field(default_factory=dict)
    heard: dict[str | tuple[str, int], float] = field(default_factory=dict)  # when it last moved, by the clock
    looked: float = float("-inf")

    def close(self, auditor: Auditor) -> Outputs:
        now = self.monotonic()
        if now - self.looked < min(1.0, self.timeout_s):  # a look costs a pass over the GPUs: once a second
            return []
        self.looked = now
        latest: dict[str | tuple[str, int], int] = {**auditor.panes.latest_ns(), **auditor.mae.latest_ns()}
        for key, ts in latest.items():
            if self.latest.get(key) != ts:
                self.latest[key], self.heard[key] = ts, now
        for key in self.latest.keys() - latest.keys():  # forgotten, or its window closed
            del self.latest[key], self.heard[key]
        quiet = {key for key, at in self.heard.items() if now - at >= self.timeout_s}
        largest = auditor.panes.largest_watermark()  # None: no GPU, only processes' addresses
        largest = auditor.latest_ns() if largest is None else largest
        if not quiet or largest is None:
            return []
        return auditor.close_silent(largest, quiet, self.forget)  # type: ignore[return-value]


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
                 on_batch: Callable[[list[Item]], None] | None = None, stats: RunStats | None = None,
                 audit_key: bytes | None = None, live: bool = False,
                 monotonic: Callable[[], float] = time.monotonic) -> RunStats:
    """Run every item through the audit and write the records; returns what happened (``stats``, if given,
    is the one kept up to date as it runs). ``audit_key`` signs the health records. The panes of GPUs gone
    silent close as they go (``_Silence``); a ``live`` source's GPUs gone for good are forgotten too."""
    start = time.perf_counter()
    q: "queue.Queue[object]" = queue.Queue(maxsize=4)
    failure: list[BaseException] = []
    producer = threading.Thread(target=_batches, args=(items, q, failure), name="source", daemon=True)
    producer.start()
    auditor = Auditor(settings, time.time_ns, audit_key)
    stats = stats if stats is not None else RunStats()
    sink = ParquetSink(out_dir, on_published=None if stats.cost is None else stats.cost.observe)
    stats.counts, stats.rows = auditor.counts, sink.rows_written  # live, while it runs
    silence = _Silence(settings.idle_timeout_s, live, monotonic)
    for batch in _drain(q):
        stats.health.beat()
        n, records = _audit(auditor, batch)
        records += silence.close(auditor)
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
    stats.rows = dict(sink.rows_written)
    stats.seconds = time.perf_counter() - start
    return stats
