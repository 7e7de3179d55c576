"""Recorded events: JSON Lines files (plain or gzip) or Parquet files, in file-name order, event by event."""
from __future__ import annotations

import gzip
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

__all__ = ["SUFFIXES", "input_files", "read_inputs"]

SUFFIXES = (".jsonl", ".ndjson", ".json", ".jsonl.gz", ".ndjson.gz", ".parquet")


def input_files(paths: list[Path]) -> list[Path]:
    """The files to replay: each file as given, each directory's event files by name (recursive).

    Raises FileNotFoundError naming the first path that does not exist.
    """
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = [p for p in path.rglob("*") if p.is_file() and p.name.endswith(SUFFIXES)]
            files.extend(sorted(found, key=lambda p: p.relative_to(path).as_posix()))
        elif path.is_file():
            files.append(path)
        else:
            raise FileNotFoundError(f"input path {path} does not exist")
    return files


def read_inputs(files: list[Path]) -> Iterator[tuple[bytes | dict[str, Any], str]]:
    """Every non-blank line as raw bytes, labelled ``file:line``, and every Parquet row (``EVENT_SCHEMA``)
    as a dict of its non-null fields, labelled ``file#row``; decoding is the consumer's job."""
    for path in files:
        if path.name.endswith(".parquet"):
            yield from _parquet_rows(path)
            continue
        opener = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "rb") as fh:
            for lineno, line in enumerate(fh, 1):
                if line.strip():
                    yield line.rstrip(b"\r\n"), f"{path}:{lineno}"


def _parquet_rows(path: Path) -> Iterator[tuple[dict[str, Any], str]]:
    n = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=65_536):
        for row in batch.to_pylist():
            n += 1
            yield {k: v for k, v in row.items() if v is not None}, f"{path}#{n}"
