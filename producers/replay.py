"""Recorded events: JSON Lines files (plain or gzip), in file-name order, line by line."""
from __future__ import annotations

import gzip
from collections.abc import Iterator
from pathlib import Path

__all__ = ["SUFFIXES", "input_files", "read_lines"]

SUFFIXES = (".jsonl", ".ndjson", ".json", ".jsonl.gz", ".ndjson.gz")


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


def read_lines(files: list[Path]) -> Iterator[tuple[bytes, str]]:
    """Every non-blank line as raw bytes, labelled ``file:line``; decoding is the consumer's job."""
    for path in files:
        opener = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "rb") as fh:
            for lineno, line in enumerate(fh, 1):
                if line.strip():
                    yield line.rstrip(b"\r\n"), f"{path}:{lineno}"
