"""Parquet output: one folder per output kind, hive-partitioned by UTC date.

Files are written under a hidden temporary name, fsynced, then renamed into place, so a
reader (DuckDB globbing ``*.parquet``) never sees half a file.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel

from gpucost.schemas.arrow import to_table
from gpucost.schemas.blocks import ClosedPanes
from gpucost.schemas.records import (
    OUTPUT_KINDS,
    AllocationRecord,
    CostRecord,
    DeadLetter,
    EfficiencyRecord,
    HealthRecord,
    IdleIndexRecord,
    KernelCostRecord,
    MaeRecord,
    QuotaRecord,
    RangeCostRecord,
    ReclaimRecord,
    kind_of,
)

__all__ = [
    "PART_RE",
    "Journal",
    "ParquetSink",
    "SinkWriteError",
    "Staged",
    "fsync_dir",
    "partition_date",
    "remove_stale_temporaries",
]

PART_RE = re.compile(r"part-(\d+)\.parquet$")
UNKNOWN_DATE = "unknown"
_NS_PER_DAY = 86_400_000_000_000
_CORES = os.cpu_count() or 1


class SinkWriteError(OSError):
    """A Parquet file could not be written; nothing partial is visible and its records stay buffered."""


def remove_stale_temporaries(out_dir: Path) -> int:
    """Delete the temporary files of a writer that died mid-file (never visible to readers): ``.part-N.parquet.tmp``,
    or ``.part-N.parquet.P.tmp`` of a run's publication ``P`` (``ParquetSink.stage_all``)."""
    stale = list(out_dir.glob("*/date=*/.part-*.parquet.tmp")) + list(out_dir.glob("*/date=*/.part-*.parquet.*.tmp"))
    for path in stale:
        path.unlink(missing_ok=True)
    return len(stale)


def partition_date(record: BaseModel) -> str:
    """UTC date of the record's event time (a dead letter without a valid time: ``unknown``)."""
    if isinstance(record, (IdleIndexRecord, CostRecord, AllocationRecord)):
        ts_ns: int | None = record.pane_start_ns
    elif isinstance(record, MaeRecord):
        ts_ns = record.first_ts_ns
    elif isinstance(record, HealthRecord):
        ts_ns = record.window_start_ns
    elif isinstance(record, (QuotaRecord, EfficiencyRecord, KernelCostRecord, RangeCostRecord)):
        ts_ns = record.pane_start_ns
    elif isinstance(record, ReclaimRecord):
        ts_ns = record.trigger_ns
    elif isinstance(record, DeadLetter):
        ts_ns = record.ts_ns
    else:
        raise TypeError(f"not an output record: {type(record).__name__}")
    if ts_ns is None:
        return UNKNOWN_DATE
    return _date(ts_ns // _NS_PER_DAY)


@lru_cache(maxsize=4096)
def _date(day: int) -> str:
    return (dt.date(1970, 1, 1) + dt.timedelta(days=day)).isoformat()


class Journal:
    """The files written since the offsets that produced them were committed, with those offsets.

    A sink that dies between renaming a file and committing its offsets reads the file's
    records again, from its last commit up to the offsets the journal holds. To drop them it
    needs only these files' records, not every record ever written. Each entry, a file's name
    and the offsets read so far (``topic:partition`` → next offset), is on disk, fsynced,
    before its file is renamed into place.
    """

    def __init__(self, path: Path, offsets: Callable[[], dict[str, int]]) -> None:
        self.path = path
        self.offsets = offsets  # the offsets read so far, taken when a file is added

    def _entries(self) -> list[dict[str, Any]]:
        try:
            lines = self.path.read_text().splitlines()
        except FileNotFoundError:
            return []
        entries = []
        for line in lines:
            try:
                entry = json.loads(line)
            except ValueError:  # a line a full disk or a kill cut short: its file was never renamed
                continue
            if isinstance(entry, dict) and isinstance(entry.get("file"), str) and isinstance(entry.get("upto"), dict):
                entries.append(entry)
        return entries

    def pending(self) -> tuple[list[Path], dict[str, int]]:
        """The files listed that exist (a name whose rename never happened is left out), and per
        partition the offset below which their records were read."""
        entries = self._entries()
        names = dict.fromkeys(e["file"] for e in entries)
        upto: dict[str, int] = {}
        for entry in entries:
            for part, offset in entry["upto"].items():
                upto[part] = max(upto.get(part, 0), int(offset))
        return [f for name in names if (f := self.path.parent / name).is_file()], upto

    def add(self, name: Path) -> None:
        line = json.dumps({"file": name.as_posix(), "upto": self.offsets()}, separators=(",", ":"))
        with open(self.path, "a") as fh:
            fh.write(f"\n{line}\n")  # the newline first ends a line a full disk cut short
            fh.flush()
            os.fsync(fh.fileno())

    def clear(self) -> None:
        with open(self.path, "w") as fh:
            os.fsync(fh.fileno())


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Staged:
    """A file written and fsynced under its hidden temporary name, not yet renamed into place."""

    kind: str
    table: pa.Table
    tmp: Path
    final: Path


class ParquetSink:
    """Buffers records per (kind, date) and writes a file when a buffer fills or on flush.

    Takes records one by one (``write``) or closed panes' blocks of columns (``write_block``,
    the batch path's, which never become objects); a file holds them in the order they came.
    """

    # one row group per file of up to 1 Mi rows: a month × 1,000 GPUs of cost records is queried per team and
    # day in 0.5 s instead of 0.9 s with 128 Ki-row groups (BENCHMARKS.md, benchmark 4)
    def __init__(
        self,
        out_dir: Path,
        file_rows: int = 1 << 20,
        row_group_rows: int = 1 << 20,
        journal: Journal | None = None,
        first_part: int = 0,
        on_published: Callable[[str, pa.Table], None] | None = None,
        hold: bool = False,
    ) -> None:
        self.out_dir = out_dir
        #: buffer until ``stage_all``, never writing a file when a buffer fills: a checkpointed run publishes
        #: only files its checkpoint names (``gpucost.checkpoint``)
        self.hold = hold
        self.on_published = on_published  # each file's rows (kind, table) once it is in place: cost metrics
        self.first_part = first_part  # no file gets a lower number
        self.file_rows = file_rows
        self.row_group_rows = row_group_rows
        self.journal = journal
        # per (kind, date): runs of records and tables, in the order they came, and their rows
        self._buffers: dict[tuple[str, str], list[list[BaseModel] | pa.Table]] = defaultdict(list)
        self._rows: dict[tuple[str, str], int] = defaultdict(int)
        self.rows_written: dict[str, int] = {k: 0 for k in OUTPUT_KINDS}
        self.files_written: list[Path] = []

    def write(self, record: BaseModel) -> None:
        key = (kind_of(record), partition_date(record))
        parts = self._buffers[key]
        if parts and isinstance(parts[-1], list):
            parts[-1].append(record)
        else:
            parts.append([record])
        self._rows[key] += 1
        self._write_full(key)

    def write_block(self, block: ClosedPanes) -> None:
        """All of the block buffered first, then any file it fills written: a file that cannot be
        written leaves every record of the block buffered."""
        keys = []
        for kind, table in block.tables():
            day = table.column("pane_start_ns").to_numpy() // _NS_PER_DAY
            days = np.unique(day).tolist()
            for d in days:
                key = (kind, _date(d))
                part = table if len(days) == 1 else table.filter(pa.array(day == d))
                self._buffers[key].append(part)
                self._rows[key] += part.num_rows
                keys.append(key)
        for key in keys:
            self._write_full(key)
        for record in block.tagged():
            self.write(record)

    def write_table(self, kind: str, date: str, table: pa.Table) -> None:
        """Rows of one partition as they are, in ``kind``'s schema (compaction's merged files)."""
        self._buffers[(kind, date)].append(table)
        self._rows[(kind, date)] += table.num_rows
        self._write_full((kind, date))

    def _write_full(self, key: tuple[str, str]) -> None:
        while not self.hold and self._rows.get(key, 0) >= self.file_rows:
            self._write_file(*key)

    @property
    def buffered_rows(self) -> int:
        return sum(self._rows.values())

    @property
    def buffered_partitions(self) -> list[tuple[str, str]]:
        """The (kind, date) partitions holding buffered rows, in the order a flush writes them. A flush that
        failed part way leaves exactly those from the file that failed on: public so that a caller can say which
        partitions a failed flush left unwritten, and a retry writes them."""
        return sorted(key for key, parts in self._buffers.items() if parts)

    def stage_all(self, publication: int) -> list[Staged]:
        """Every buffered row into fsynced temporaries, files of at most ``file_rows`` rows, and the buffers
        emptied: what a checkpoint names before ``publish`` renames them into place. The temporaries' names hold
        ``publication``, so that those of a publication killed before its checkpoint are never taken for those
        an earlier checkpoint names (compaction may have freed the same part number meanwhile). If one cannot
        be written, none is kept and every row stays buffered."""
        staged: list[Staged] = []
        numbers: dict[Path, int] = {}  # the next part number of each folder, past the files staged here
        try:
            for kind, date in self.buffered_partitions:
                whole = self._whole(kind, date)
                for lo in range(0, whole.num_rows, self.file_rows):
                    folder = self.out_dir / kind / f"date={date}"
                    table = whole.slice(lo, self.file_rows)
                    tmp, final = self._stage_file(folder, table, numbers.get(folder), f".{publication}")
                    numbers[folder] = int(PART_RE.search(final.name).group(1)) + 1  # type: ignore[union-attr]
                    staged.append(Staged(kind, table, tmp, final))
        except SinkWriteError:
            for done in staged:
                done.tmp.unlink(missing_ok=True)
            raise
        self._buffers.clear()
        self._rows.clear()
        return staged

    def publish(self, staged: list[Staged]) -> None:
        """Staged files renamed into place, in order, and counted. A rename that fails leaves its temporary (and
        those after it) where it is: the checkpoint that names them renames them on the next start."""
        for done in staged:
            try:
                os.replace(done.tmp, done.final)
            except OSError as exc:
                raise self._error(done.final.parent, exc) from exc
            self._published(done.kind, done.table, done.final)
        for folder in {done.final.parent for done in staged}:
            fsync_dir(folder)

    def flush(self) -> None:
        """Every buffer to files. Arrow encodes and compresses them side by side (it lets go of the
        GIL; half the time on two cores); then they are renamed into place one by one, in order. A
        file that cannot be written stops the flush there: the files after it are not published,
        and their records stay buffered for the next one."""
        keys = self.buffered_partitions
        with ThreadPoolExecutor(max_workers=min(len(keys), _CORES) or 1) as pool:
            staged = [pool.submit(self._stage, *key) for key in keys]
        try:
            for key, done in zip(keys, staged):
                self._publish(*key, *done.result())
        finally:
            for done in staged:  # those not published: give the space back (readers never saw them)
                if done.exception() is None and done.result()[1].exists():
                    done.result()[1].unlink(missing_ok=True)

    def _write_file(self, kind: str, date: str) -> None:
        """The buffer's first ``file_rows`` rows (all, if fewer) to a new file; the rest stays buffered."""
        if self._buffers.get((kind, date)):
            self._publish(kind, date, *self._stage(kind, date))

    def _whole(self, kind: str, date: str) -> pa.Table:
        return pa.concat_tables([to_table(kind, p) if isinstance(p, list) else p for p in self._buffers[(kind, date)]])

    def _stage(self, kind: str, date: str) -> tuple[pa.Table, Path, Path]:
        """The buffer's first ``file_rows`` rows written and fsynced under a hidden temporary name;
        returns the whole buffer as one table, that name and the file's final name."""
        whole = self._whole(kind, date)
        return whole, *self._stage_file(self.out_dir / kind / f"date={date}", whole.slice(0, self.file_rows))

    def _stage_file(self, folder: Path, table: pa.Table, number: int | None = None, tag: str = "") -> tuple[Path, Path]:
        """``table`` written and fsynced as the temporary of the folder's next part (``number``, or past the
        highest file there and ``first_part``); returns the temporary and the final name."""
        tmp: Path | None = None
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if number is None:
                taken = [int(m.group(1)) for p in folder.iterdir() if (m := PART_RE.match(p.name))]
                number = max(max(taken, default=-1) + 1, self.first_part)
            final = folder / f"part-{number:05d}.parquet"
            tmp = folder / f".{final.name}{tag}.tmp"
            pq.write_table(table, tmp, row_group_size=self.row_group_rows, compression="zstd")
            with open(tmp, "rb+") as fh:
                os.fsync(fh.fileno())
        except OSError as exc:
            if tmp is not None:
                tmp.unlink(missing_ok=True)  # give the space back; readers never saw it
            raise self._error(folder, exc) from exc
        return tmp, final

    def _publish(self, kind: str, date: str, whole: pa.Table, tmp: Path, final: Path) -> None:
        """A staged file into place (its journal entry first), and its rows out of the buffer."""
        try:
            if self.journal is not None:
                self.journal.add(final.relative_to(self.out_dir))  # before the file can be seen
            os.replace(tmp, final)
            fsync_dir(final.parent)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise self._error(final.parent, exc) from exc
        rest = whole.slice(self.file_rows)
        self._published(kind, whole.slice(0, self.file_rows), final)
        if rest.num_rows:
            self._buffers[(kind, date)] = [rest]
            self._rows[(kind, date)] = rest.num_rows
        else:
            del self._buffers[(kind, date)]
            del self._rows[(kind, date)]

    def _published(self, kind: str, table: pa.Table, final: Path) -> None:
        if self.on_published is not None:
            self.on_published(kind, table)
        self.rows_written[kind] += table.num_rows
        self.files_written.append(final)

    @staticmethod
    def _error(folder: Path, exc: OSError) -> SinkWriteError:
        return SinkWriteError(
            f"cannot write Parquet under {folder}: {exc.strerror or exc} (free space, fix "
            "the permissions, or choose another output directory)"
        )
