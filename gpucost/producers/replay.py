"""Recorded events: JSON Lines files (plain or gzip, told by content) or Parquet files, in file-name order, event by
event."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.parquet as pq

from gpucost.producers.compressed import open_bytes
from gpucost.schemas.arrow import wire_rows
from gpucost.schemas.records import OUTPUT_KINDS

__all__ = ["SUFFIXES", "RowBatch", "LineBatch", "input_files", "read_inputs", "read_batches"]

SUFFIXES = (".jsonl", ".ndjson", ".json", ".jsonl.gz", ".ndjson.gz", ".parquet")


def _is_output(relative: Path) -> bool:
    """A path inside gpucost's own output (``KIND/date=…/…``), or hidden (a temporary, a lock):
    never input, though an output directory may sit inside an input one."""
    parts = relative.parts
    return any(part.startswith(".") for part in parts) or any(
        kind in OUTPUT_KINDS and following.startswith("date=") for kind, following in zip(parts, parts[1:])
    )


def input_files(paths: list[Path]) -> list[Path]:
    """The files to replay: each file as given, each directory's event files by name (recursive),
    leaving out gpucost's own output found inside one (an earlier run's ``--out`` under the input
    was read as events: every record a dead letter).

    Raises FileNotFoundError naming the first path that does not exist.
    """
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = [
                p
                for p in path.rglob("*")
                if p.is_file() and p.name.endswith(SUFFIXES) and not _is_output(p.relative_to(path))
            ]
            files.extend(sorted(found, key=lambda p: p.relative_to(path).as_posix()))
        elif path.is_file():
            files.append(path)
        else:
            raise FileNotFoundError(f"input path {path} does not exist")
    return files


class RowBatch(NamedTuple):
    """Consecutive rows of an events Parquet file, for the batch path (``Auditor.ingest_batch``)."""

    batch: pa.RecordBatch
    path: Path
    first: int  # file row number (from 1) of the batch's first row
    nbytes: int  # its share of the file's size, for progress

    def label(self, i: int) -> str:
        return f"{self.path}#{self.first + i}"


class LineBatch(NamedTuple):
    """Consecutive non-blank lines of a JSON Lines file, for the batch path (``Auditor.ingest_lines``)."""

    lines: list[bytes]
    path: Path
    linenos: list[int]  # file line number (from 1) of each
    nbytes: int  # bytes read from the file (blank lines included), for progress

    def label(self, i: int) -> str:
        return f"{self.path}:{self.linenos[i]}"


def read_batches(files: list[Path], lines_per_batch: int = 65_536) -> Iterator[RowBatch | LineBatch]:
    """The files in batches: Parquet (``EVENT_SCHEMA``) rows, each labelled ``file#row``, and JSON
    Lines' non-blank lines as raw bytes, each labelled ``file:line``. Decoding is the consumer's job."""
    for path in files:
        if path.name.endswith(".parquet"):
            parquet = pq.ParquetFile(path)
            size, rows, first = path.stat().st_size, max(parquet.metadata.num_rows, 1), 1
            for batch in parquet.iter_batches(batch_size=65_536):
                # its share of the size, as the difference of two cumulative floors: the shares sum to the size
                done = first - 1
                yield RowBatch(batch, path, first, size * (done + batch.num_rows) // rows - size * done // rows)
                first += batch.num_rows
            continue
        with open_bytes(path) as fh:  # gzip by content: a compressed file's name need not end .gz
            lines: list[bytes] = []
            linenos: list[int] = []
            nbytes = 0
            for lineno, line in enumerate(fh, 1):
                nbytes += len(line)
                if line.strip():
                    lines.append(line.rstrip(b"\r\n"))
                    linenos.append(lineno)
                    if len(lines) == lines_per_batch:
                        yield LineBatch(lines, path, linenos, nbytes)
                        lines, linenos, nbytes = [], [], 0
            if lines:
                yield LineBatch(lines, path, linenos, nbytes)


def read_inputs(files: list[Path]) -> Iterator[tuple[bytes | dict[str, Any], str]]:
    """``read_batches`` one input at a time: a Parquet row as a dict of its non-null fields."""
    for item in read_batches(files):
        if isinstance(item, RowBatch):
            yield from ((row, item.label(i)) for i, row in enumerate(wire_rows(item.batch)))
        else:
            yield from ((line, item.label(i)) for i, line in enumerate(item.lines))
