"""Merging a partition's small Parquet files into few large ones, swapped in all at once.

The Kafka sink writes a file per kind and date at every flush: tens of thousands a day, and
DuckDB pays per file (BENCHMARKS.md, benchmark 4). A partition folder is rebuilt beside the
output (``OUT/.compact/KIND/date=D``: the merged files, plus hard links to every other entry)
and exchanged with the live folder in one ``renameat2(RENAME_EXCHANGE)``. What a compaction
that died leaves sits only under ``.compact``, which is invisible to the views and removed by
the next one.

A query listing a folder while it is swapped must read each row once or fail, never read part
of them. DuckDB lists a folder by ``readdir`` on the folder it opened, then ``stat``s each name
by path, skipping without a word a name that no longer resolves (its ``LocalFileSystem::ListFiles``),
and reads the files in name order. So a listing begun before a swap and stat-ed after it sees
the old names, of which only those still in the new folder count. The merged files therefore
take the names of the first small files they replace, in order: merged file ``i`` holds rows of
small files ``i`` and later only (each small file has fewer than ``file_rows`` rows), and a merge
is done only when it leaves fewer files, so the last small file's name is gone after the swap.
A listing that straddles the swap then reads the old folder whole, or reads a merged file (which
holds only rows of names it has not yet opened) and then fails opening a name that is gone
("No such file"), or skipped the gone names and reads the merged files, which hold their rows; a
name read at the size it was listed with, before the swap, fails on its footer. Numbering the
merged files after every old file instead (as this did until a test caught a wrong sum under
load) let a listing that skipped the gone names miss their rows.

The swapped-out folder is not deleted at once: it is moved to ``OUT/.compact-retired`` and
deleted by a compaction at least ``RETIRE_S`` later. A reader that opened the old folder just
before the swap is still listing it; deleting its files under it made such a listing return
only the files that survive the swap (hard links), whose paths the new folder also holds, so
the query read part of the rows without an error (seen once in the test suite, 515 of 782).

The caller must be the output directory's only writer (``gpucost.sinks.lock.OutputLock``).
"""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
import time
from collections import deque
from collections.abc import Collection, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from gpucost.schemas.arrow import ARROW_SCHEMAS
from gpucost.schemas.records import OUTPUT_KINDS
from gpucost.sinks.parquet import PART_RE, ParquetSink, fsync_dir

__all__ = [
    "STAGING",
    "RETIRED",
    "RETIRE_S",
    "CompactError",
    "CompactStats",
    "compact",
    "exchange_folders",
    "part_files",
    "partition_folders",
]

log = logging.getLogger("gpucost.compact")

STAGING = ".compact"  # under the output directory; outside every kind's folder, so no view globs it
RETIRED = ".compact-retired"  # swapped-out folders, until RETIRE_S has passed (outside every view too)
RETIRE_S = 10.0
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_CORES = os.cpu_count() or 1


class CompactError(OSError):
    """The output cannot be compacted at all here; nothing was changed."""


@dataclass
class CompactStats:
    partitions: int = 0  # partition folders rebuilt
    files_merged: int = 0  # small files that went into the merge
    files_written: int = 0  # merged files that replaced them
    rows: int = 0  # rows moved
    skipped: dict[str, str] = field(default_factory=dict)  # folder (relative) → why it was left as it was
    small_left: dict[Path, int] = field(default_factory=dict)  # folder → its files under file_rows rows, after


def exchange_folders(a: Path, b: Path) -> None:
    """Swap folders ``a`` and ``b`` in one ``renameat2(RENAME_EXCHANGE)``: the one step at which a partition changes
    for a reader. A name of its own, looked up when ``compact`` calls it, so that the tests can stop a compaction
    at exactly this step (killed mid-swap, or a query begun just before it) through a public name."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        raise CompactError(
            "this system's C library has no renameat2, so partition folders cannot be swapped "
            "atomically; nothing was compacted (Linux with glibc 2.28 or later is needed)"
        )
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno()
        raise CompactError(
            f"cannot swap {b} with its merged copy atomically: {os.strerror(err)}; that folder "
            "is unchanged (the filesystem must support renameat2 RENAME_EXCHANGE, as ext4, xfs, "
            "btrfs and tmpfs do)"
        )


def partition_folders(out_dir: Path) -> list[Path]:
    """Every ``KIND/date=D`` folder of the output, in a stable order."""
    return [f for kind in OUTPUT_KINDS for f in sorted((out_dir / kind).glob("date=*")) if f.is_dir()]


def _number(path: Path) -> int:
    m = PART_RE.fullmatch(path.name)
    return int(m.group(1)) if m else -1


def part_files(entries: Iterable[Path]) -> list[Path]:
    """The published files among a folder's ``entries``, by part number (the order they were written in)."""
    return sorted((p for p in entries if _number(p) >= 0), key=_number)


def _read(path: Path, schema: pa.Schema) -> pa.Table:
    """One file's rows, without the hive partitioning that reading by path would add."""
    table = pq.ParquetFile(path).read()
    if not table.schema.equals(schema):
        # a file of an earlier version: a nullable column added since (the tenant's ``labels``) is null in it, and
        # types widen losslessly, or ArrowInvalid
        for f in schema:
            if f.name not in table.column_names and f.nullable:
                table = table.append_column(f, pa.nulls(len(table), f.type))
        if set(table.column_names) <= set(schema.names):  # a column unknown to this version: cast refuses it
            table = table.select(schema.names)
        table = table.cast(schema)
    return table


def _tables(paths: list[Path], schema: pa.Schema) -> Iterator[pa.Table]:
    """The files' rows, in order, read side by side a few files ahead (Arrow lets go of the GIL)."""
    with ThreadPoolExecutor(_CORES) as pool:
        ahead: deque[Future[pa.Table]] = deque()
        for path in paths:
            ahead.append(pool.submit(_read, path, schema))
            if len(ahead) > 2 * _CORES:
                yield ahead.popleft().result()
        while ahead:
            yield ahead.popleft().result()


def _compact_folder(
    out_dir: Path, folder: Path, min_files: int, file_rows: int, max_files: int | None, stats: CompactStats
) -> None:
    kind, date = folder.parent.name, folder.name.removeprefix("date=")
    where = str(folder.relative_to(out_dir))
    entries = list(folder.iterdir())
    if any(not p.is_file() or p.is_symlink() for p in entries):
        stats.skipped[where] = "holds something other than plain files"
        return
    parts = part_files(entries)
    staged = out_dir / STAGING / kind / folder.name
    try:
        sizes = {p: pq.read_metadata(p).num_rows for p in parts}
        small = [p for p in parts if sizes[p] < file_rows]
        stats.small_left[folder] = len(small)
        if len(small) < min_files:
            return
        if max_files is not None:  # the oldest first; the rest wait for the next time
            small, later = small[:max_files], small[max_files:]
        else:
            later = []
        if -(-sum(sizes[p] for p in small) // file_rows) >= len(small):
            return  # merging would leave as many files, and keep the last one's name (see the module's docstring)
        shutil.rmtree(staged, ignore_errors=True)
        staged.mkdir(parents=True)
        for entry in sorted(set(entries) - set(small)):
            os.link(entry, staged / entry.name)  # full files and anything else stay, under their own names
        # numbered after every old file while written, so no name collides with a link; then named as the small
        # files they replace, in order (a listing that straddles the swap: see the module's docstring)
        writer = ParquetSink(out_dir / STAGING, file_rows=file_rows, first_part=_number(parts[-1]) + 1)
        for table in _tables(small, ARROW_SCHEMAS[kind]):
            writer.write_table(kind, date, table)  # written as each file fills: memory bounded by a file, not a folder
        writer.flush()
        for merged, replaced in zip(writer.files_written, small):
            os.rename(merged, staged / replaced.name)
    except (pa.ArrowException, ValueError) as exc:  # cut short, not Parquet, or columns of another kind
        stats.skipped[where] = f"a file is not a readable {kind} file: {exc}"
        return
    # checked from the files' own footers before anyone can see them
    if sum(pq.read_metadata(p).num_rows for p in part_files(staged.iterdir())) != sum(sizes.values()):
        raise CompactError(
            f"compacting {folder} would change its row count; it was left unchanged (a bug: please report it)"
        )
    exchange_folders(staged, folder)
    fsync_dir(folder.parent)
    fsync_dir(staged.parent)
    retired = out_dir / RETIRED / str(time.time_ns()) / kind
    retired.mkdir(parents=True)
    os.rename(staged, retired / folder.name)  # the old files, outside every view; deleted once no listing can hold them
    rows = sum(sizes[p] for p in small)
    stats.small_left[folder] = len(later) + (rows % file_rows > 0)
    stats.partitions += 1
    stats.files_merged += len(small)
    stats.files_written += len(writer.files_written)
    stats.rows += rows
    log.info("compacted %s: %d files → %d (%s rows)", where, len(small), len(writer.files_written), f"{rows:,}")


def compact(
    out_dir: Path,
    min_files: int = 2,
    file_rows: int = 1 << 20,
    folders: Iterable[Path] | None = None,
    exclude: Collection[Path] = (),
    max_files: int | None = None,
) -> CompactStats:
    """Merge the files under ``file_rows`` rows of every partition folder (or of ``folders``) that
    has at least ``min_files`` of them, at most ``max_files`` of them a folder (the oldest), which
    bounds the time one call takes. Folders holding a file of ``exclude`` (the sink's journal:
    written since its last commit, and needed as they are to drop what is read again) are left.
    Raises ``CompactError`` where folders cannot be swapped atomically, ``SinkWriteError`` where
    the merged files cannot be written; either way no folder is left half-done."""
    if min_files < 2:
        raise ValueError(f"min_files must be at least 2 (merging fewer files changes nothing), got {min_files}")
    shutil.rmtree(out_dir / STAGING, ignore_errors=True)  # what a compaction that died left, never visible
    _drop_retired(out_dir)
    held = {p.parent for p in exclude}
    stats = CompactStats()
    try:
        for folder in partition_folders(out_dir) if folders is None else folders:
            if folder in held:
                stats.skipped[str(folder.relative_to(out_dir))] = "holds files written since the sink's last commit"
            elif folder.is_dir():
                _compact_folder(out_dir, folder, min_files, file_rows, max_files, stats)
    finally:
        shutil.rmtree(out_dir / STAGING, ignore_errors=True)
    return stats


def _drop_retired(out_dir: Path) -> None:
    """Delete the swapped-out folders retired ``RETIRE_S`` or more ago."""
    now = time.time_ns()
    for batch in sorted((out_dir / RETIRED).glob("*")):
        if batch.name.isdigit() and now - int(batch.name) >= RETIRE_S * 1e9:
            shutil.rmtree(batch, ignore_errors=True)
