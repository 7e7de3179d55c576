"""The embedded transport: a source thread → bounded in-process queue → operators → Parquet.

The same ``Auditor`` the Kafka workers run; the queue gives the source back-pressure.
"""

from __future__ import annotations

import contextlib
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
from gpucost.publication import Publication
from gpucost.schemas.blocks import ClosedPanes, Outputs
from gpucost.schemas.events import EVENT_MODELS, Event
from gpucost.schemas.records import DeadLetter
from gpucost.sinks.parquet import ParquetSink
from gpucost.streams.audit import Auditor
from gpucost.streams.settings import AuditSettings
from gpucost.streams.silence import RunSilence

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
    #: inputs taken before a restart (from the checkpoint this run went on from): in ``inputs``, not in ``seconds``
    resumed_inputs: int = 0
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
            counter(
                "gpucost_run_events",
                "events taken, by kind",
                {k: v for k, v in dict(self.counts).items() if k in EVENT_MODELS},
                "kind",
            ),
            counter("gpucost_run_dead_letters", "dead letters, by reason", self.dead_letters, "reason"),
            counter("gpucost_run_rows_written", "rows written to Parquet, by kind", dict(self.rows), "kind"),
            source_counts(self.source),
            *(self.cost.metrics() if self.cost is not None else []),
        ]


def _feed(
    items: Iterable[Item], q: queue.Queue[object], failure: list[BaseException], stopped: threading.Event
) -> None:
    """The source's thread: each item into the queue as it comes (the queue's bound is the back-pressure), until
    the input ends or the run has ``stopped`` (an interrupted run's thread once died at interpreter exit inside
    native code, and the process aborted)."""
    try:
        for item in items:
            while not stopped.is_set():
                try:
                    q.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if stopped.is_set():
                return
    except BaseException as exc:  # handed to the consumer, which re-raises it
        failure.append(exc)
    finally:
        with contextlib.suppress(queue.Full):
            q.put(_DONE, timeout=0.1 if stopped.is_set() else None)


def _drain(q: queue.Queue[object], wait_s: Callable[[], float | None]) -> Iterator[list[Item]]:
    """The items in batches of up to ``_BATCH``, a batch handed on once ``_BATCH_S`` passes with it unfilled
    (a live source's few events a second are taken as they come, and a source gone quiet holds back none);
    a Parquet or JSON Lines batch alone; and an empty batch whenever ``wait_s()`` (None: no limit) passes with
    nothing, so that a run whose publication is due publishes however quiet its source."""
    carried: object = None  # an item taken past a full batch: the next one's first
    while True:
        item, carried = carried, None
        if item is None:
            try:
                item = q.get(timeout=wait_s())
            except queue.Empty:
                yield []
                continue
        batch: list[Item] = []
        limit = wait_s()
        deadline = time.monotonic() + (_BATCH_S if limit is None else min(_BATCH_S, limit))
        while item is not _DONE and not isinstance(item, (RowBatch, LineBatch)) and len(batch) < _BATCH:
            batch.append(item)  # type: ignore[arg-type]
            try:
                item = q.get_nowait()
            except queue.Empty:
                try:
                    item = q.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    item = None
                    break
        if batch:
            yield batch
        if item is _DONE:
            return
        if isinstance(item, (RowBatch, LineBatch)):
            yield [item]
        else:
            carried = item


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
        out += (
            auditor.ingest(payload, label)
            if isinstance(payload, (str, bytes, dict))
            else auditor.update(payload, None, label)
        )
    return len(batch), out


def run_embedded(
    items: Iterable[Item],
    settings: AuditSettings,
    out_dir: Path,
    on_batch: Callable[[list[Item]], None] | None = None,
    stats: RunStats | None = None,
    audit_key: bytes | None = None,
    live: bool = False,
    monotonic: Callable[[], float] = time.monotonic,
    publication: Publication | None = None,
    auditor: Auditor | None = None,
) -> RunStats:
    """Run every item through the audit and write the records; returns what happened (``stats``, if given,
    is the one kept up to date as it runs). ``audit_key`` signs the health records. The panes of GPUs gone
    silent close as they go, on ``monotonic`` (``gpucost.streams.silence.RunSilence``: the rule both transports
    share); a ``live`` source's GPUs gone for good are forgotten too, as are those of a run with a
    ``publication`` (a continuous run reads in event-time order, as a live source). With a
    ``publication``, records are published as it says, each time with a checkpoint, and the run goes on from
    ``auditor`` (restored from one) after ``stats.inputs`` inputs; without, they are written at the end (or as
    files fill), as a replay wants."""
    start = time.perf_counter()
    q: queue.Queue[object] = queue.Queue(maxsize=4 * _BATCH)
    failure: list[BaseException] = []
    stopped = threading.Event()
    producer = threading.Thread(target=_feed, args=(items, q, failure, stopped), name="source", daemon=True)
    producer.start()
    try:
        auditor = auditor if auditor is not None else Auditor(settings, time.time_ns, audit_key)
        stats = stats if stats is not None else RunStats()
        sink = ParquetSink(
            out_dir, on_published=None if stats.cost is None else stats.cost.observe, hold=publication is not None
        )
        stats.counts, stats.rows = auditor.counts, sink.rows_written  # live, while it runs
        silence = RunSilence(settings.idle_timeout_s, forget=live or publication is not None)
        for batch in _drain(q, lambda: None if publication is None else publication.wait_s()):
            stats.health.beat()
            n, records = _audit(auditor, batch) if batch else (0, [])
            records += silence.close(auditor, monotonic())
            stats.inputs += n
            for record in records:
                if isinstance(record, ClosedPanes):
                    sink.write_block(record)
                    continue
                if isinstance(record, DeadLetter):
                    stats.dead_letters[record.reason] += 1
                sink.write(record)
            if publication is not None and publication.due(sink):
                publication.publish(sink, auditor, stats.inputs)
            if on_batch is not None:
                on_batch(batch)  # an empty one too: progress lines go on while a source is quiet
        producer.join()
        if failure:
            raise failure[0]
        for record in auditor.finish():
            sink.write(record)
        if publication is None:
            sink.flush()
        else:  # a live source stopped goes on, as a Kafka key after its end of input, above what it closed
            publication.publish(sink, auditor.successor() if live else auditor, stats.inputs, finished=not live)
        stats.rows = dict(sink.rows_written)
        stats.seconds = time.perf_counter() - start
        return stats
    finally:  # an interrupted run stops its source thread before the interpreter exits
        stopped.set()
        producer.join(timeout=2.0)
