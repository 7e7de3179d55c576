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

from gpucost.sinks.checkpoint import CHECKPOINT, Checkpoint, CheckpointError, load, resume, save
from gpucost.sinks.compact import CompactError, compact
from gpucost.sinks.parquet import ParquetSink, SinkWriteError
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
        module's three steps), then the compaction that became due. A checkpoint that cannot be written (a full
        disk) is a ``SinkWriteError``: nothing of this publication is visible, and the previous checkpoint
        stands."""
        self.published += 1
        staged = sink.stage_all(self.published)
        auditor.prune()  # bindings nothing can reach any more: the state stays bounded, as a worker's does
        checkpoint = Checkpoint(
            self.settings,
            self.source,
            inputs,
            finished,
            auditor.to_state(),
            self.prices_sha256,
            publication=self.published,
        ).staging(self.out_dir, staged)
        try:
            save(self.out_dir, checkpoint)
        except OSError as exc:
            for done in staged:
                done.tmp.unlink(missing_ok=True)
            raise SinkWriteError(
                f"cannot write the checkpoint in {self.out_dir}: {exc.strerror or exc} (free "
                "space or fix the permissions, then start the run again: it goes on from the "
                "last checkpoint)"
            ) from None
        sink.publish(staged)
        self.last = self.monotonic()
        self.fresh.update(s.final.parent for s in staged)
        sink.files_written.clear()  # counted in ``fresh``: kept, the list grew by a few paths a publication, for a year
        self._compact(sink)

    def count_files(self) -> None:
        """Each partition folder's files as they are (a run started again goes on counting toward compaction
        from what earlier lives left: a run restarted more often than it compacts once piled files up)."""
        for folder in self.out_dir.glob("*/date=*"):
            if folder.is_dir():
                self.fresh[folder] = sum(1 for _ in folder.glob("part-*.parquet"))

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


def resumed(
    publication: Publication, settings: AuditSettings, audit_key: bytes | None, clock: Callable[[], int]
) -> tuple[Auditor, Checkpoint] | None:
    """The auditor and checkpoint a run over ``publication.out_dir`` goes on from (its publication finished, its
    stray temporaries removed), or None where the output has no checkpoint. Raises ``CheckpointError`` where the
    checkpoint cannot be read (nothing is changed then), or where its run finished, read another source or
    billed with other settings (its own publication is finished first): going on would mix two runs in one
    output."""
    where = publication.out_dir
    checkpoint = load(where)
    if checkpoint is None:
        return None
    try:
        auditor = Auditor.from_state(checkpoint.state, settings, clock, audit_key)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise CheckpointError(
            f"the checkpoint {where / CHECKPOINT} holds a state this gpucost cannot read ({exc!r}); "
            "pass --overwrite to start the run afresh"
        ) from None
    resume(where, checkpoint)
    publication.published = checkpoint.publication
    publication.count_files()
    if checkpoint.finished:
        raise CheckpointError(
            f"the run whose output {where} holds has finished (its input ended); pass "
            "--overwrite to start again, or choose another --out"
        )
    if checkpoint.source != publication.source:
        changed = sorted(
            k
            for k in checkpoint.source.keys() | publication.source.keys()
            if checkpoint.source.get(k) != publication.source.get(k)
        )
        raise CheckpointError(
            f"the run whose output {where} holds read another source ({', '.join(changed)} "
            "differ); run with the same source to go on, or pass --overwrite"
        )
    changed = _settings_changed(checkpoint.settings, settings)
    if changed:
        raise CheckpointError(
            f"the run whose output {where} holds billed with other settings ({', '.join(changed)} "
            "differ); run with the same settings to go on, or pass --overwrite"
        )
    return auditor, checkpoint


#: settings that change no record (the opex rate is added by the ``unit_cost`` view, at query time)
_NOT_BILLED = {"opex_usd_per_gpu_hour"}


def _settings_changed(recorded: dict[str, Any], settings: AuditSettings) -> list[str]:
    """The settings that bill otherwise than the recorded ones: compared as values (0.60 is 0.6), not as text."""
    try:
        before = AuditSettings.model_validate(recorded)
    except ValueError:
        return ["all"]
    return sorted(
        k for k in AuditSettings.model_fields if k not in _NOT_BILLED and getattr(before, k) != getattr(settings, k)
    )
