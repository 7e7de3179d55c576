"""The batch path's size thresholds, set for a test (small generated batches would otherwise go row by row); the
labels and the state its tests compare with the row path's."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from gpucost.streams import batch, columnar
from gpucost.streams.audit import Auditor


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


def label(i: int) -> str:
    return f"events#{i + 1}"


def normalised(auditor: Auditor) -> dict[str, Any]:
    """The state, with the lists whose order carries no meaning sorted."""
    state = json.loads(json.dumps(auditor.to_state()))
    for pane in state["panes"]["open"]:
        pane[8].sort(key=json.dumps)
    state["panes"]["open"].sort(key=lambda p: (p[0], p[1]))
    for window in state["mae"]["open"]:
        window[2].sort()
    state["mae"]["open"].sort(key=json.dumps)
    state["mae"]["taken"].sort(key=json.dumps)
    state["bindings"].sort(key=json.dumps)
    return state
