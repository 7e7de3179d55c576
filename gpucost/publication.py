"""When a live run's records reach the Parquet, and how a run killed on the way goes on.

``gpucost run`` once buffered its Parquet until a million rows or exit: a small node wrote nothing for weeks,
its cost metrics appeared only at exit, and a crash lost everything. A ``Publication`` publishes every
``delay_s`` of the clock (and whenever a buffer fills a file), each time with a checkpoint of the operators'
state (``gpucost.sinks.checkpoint``: the files, then the checkpoint naming them, then the renames), and
compacts the partition folders that gained ``compact_min_files`` files, so that a year of minutes stays a
bounded number of files per partition. A record therefore reaches the Parquet at most ``delay_s`` (plus the
time one publication takes) after the input that closed its pane was taken; the same ``delay_s`` bounds what
a kill loses: the input taken since the last publication.
"""
from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpucost.sinks.checkpoint import Checkpoint, CheckpointError, load, resume, save
from gpucost.sinks.compact import CompactError, compact
from gpucost.sinks.parquet import ParquetSink
from gpucost.streams.audit import Auditor
from gpucost.streams.settings import AuditSettings

__all__ = ["COMPACT_MAX_FILES", "Publication", "resumed"]

log = logging.getLogger("gpucost.publication")

#: a folder's files merged at one go at most, so that one publication's compaction stays short
COMPACT_MAX_FILES = 1024


@dataclass
class Publication:
    """The publication and checkpoint cadence of one run over ``out_dir`` (its only writer)."""

    out_dir: Path
    delay_s: float
    settings: dict[str, Any]  # the audit settings, as the checkpoint records them
    source: dict[str, Any]  # what the run reads, as the checkpoint records it
    prices_sha256: str | None = None
    compact_min_files: int = 64  # 0: never
    monotonic: Callable[[], float] = time.monotonic
    last: float = field(default=0.0)
    fresh: Counter[Path] = field(default_factory=Counter)  # files published per folder since it was compacted
    published: int = 0  # publications done

    def __post_init__(self) -> None:
        self.last = self.monotonic()

    def wait_s(self) -> float:
        """How long the run may wait for input before a publication is due."""
        return max(0.0, self.last + self.delay_s - self.monotonic())

    def due(self, sink: ParquetSink) -> bool:
        return self.monotonic() - self.last >= self.delay_s or sink.buffered_rows >= sink.file_rows

    def publish(self, sink: ParquetSink, auditor: Auditor, inputs: int, finished: bool = False) -> None:
        """Every record buffered into place with a checkpoint of ``auditor`` after ``inputs`` inputs (the
        module's three steps), then the compaction that became due."""
        staged = sink.stage_all()
        auditor.prune()  # bindings nothing can reach any more: the state stays bounded, as a worker's does
        save(self.out_dir, Checkpoint(self.settings, self.source, inputs, finished, auditor.to_state(),
                                      self.prices_sha256).staging(self.out_dir, staged))
        sink.publish(staged)
        self.last = self.monotonic()
        self.published += 1
        self.fresh.update(s.final.parent for s in staged)
        sink.files_written.clear()  # counted in ``fresh``: kept, the list grew by a few paths a publication, for a year
        self._compact(sink)

    def _compact(self, sink: ParquetSink) -> None:
        if not self.compact_min_files:
            return
        for folder in [f for f, n in self.fresh.items() if n >= self.compact_min_files]:
            try:
                done = compact(self.out_dir, self.compact_min_files, sink.file_rows, [folder], (), COMPACT_MAX_FILES)
            except CompactError as exc:
                log.error("%s. Compaction is off until the run restarts", exc)
                self.compact_min_files = 0
                return
            except OSError as exc:  # a full disk, say: the files stay as they are; tried at the next publication
                log.warning("compaction failed, the files are unchanged: %s", exc)
                return
            self.fresh[folder] = done.small_left.get(folder, 0)


def resumed(publication: Publication, settings: AuditSettings, audit_key: bytes | None,
            clock: Callable[[], int]) -> tuple[Auditor, Checkpoint] | None:
    """The auditor and checkpoint a run over ``publication.out_dir`` goes on from (its publication finished, its
    stray temporaries removed), or None where the output has no checkpoint. Raises ``CheckpointError`` where the
    checkpoint's run finished, or read another source or billed with other settings: going on would mix two
    runs in one output."""
    checkpoint = load(publication.out_dir)
    if checkpoint is None:
        return None
    where = publication.out_dir
    if checkpoint.finished:
        raise CheckpointError(f"the run whose output {where} holds has finished (its input ended); pass "
                              "--overwrite to start again, or choose another --out")
    if checkpoint.source != publication.source:
        raise CheckpointError(f"the run whose output {where} holds read {checkpoint.source}, not "
                              f"{publication.source}; run with the same source to go on, or pass --overwrite")
    if checkpoint.settings != publication.settings:
        changed = sorted(k for k in checkpoint.settings.keys() | publication.settings.keys()
                         if checkpoint.settings.get(k) != publication.settings.get(k))
        raise CheckpointError(f"the run whose output {where} holds billed with other settings ({', '.join(changed)} "
                              "differ); run with the same settings to go on, or pass --overwrite")
    resume(where, checkpoint)
    return Auditor.from_state(settings, checkpoint.state, clock, audit_key), checkpoint
