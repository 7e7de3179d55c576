"""The batch path's size thresholds, set for a test: small generated batches would otherwise go row by row."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from gpucost.streams import batch, columnar


@contextmanager
def closing_at(few_closes: int, few_lines: int = 0) -> Iterator[None]:
    """Panes closed as blocks from ``few_closes`` a batch, and JSON batches of any size down to
    ``few_lines`` through the batch path (0: all of them, as these tests' batches are small)."""
    default = batch.FEW_CLOSES, columnar.FEW_LINES
    batch.FEW_CLOSES, columnar.FEW_LINES = few_closes, few_lines
    try:
        yield
    finally:
        batch.FEW_CLOSES, columnar.FEW_LINES = default
