"""Opening an input file whatever its name says about compression: gzip is told from its first two bytes
(1f 8b), as ``gzip`` itself tells it. A gzip file named ``events.jsonl`` was read as text, and each of its
2,093 "lines" dead-lettered as malformed JSON; a trace named ``.json`` that is gzip is read the same way."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import IO

__all__ = ["open_bytes"]

GZIP_MAGIC = b"\x1f\x8b"


def open_bytes(path: Path) -> IO[bytes]:
    """``path`` for reading bytes, decompressed if it is gzip (by content, not by name)."""
    with path.open("rb") as probe:
        magic = probe.read(2)
    return gzip.open(path, "rb") if magic == GZIP_MAGIC else path.open("rb")
