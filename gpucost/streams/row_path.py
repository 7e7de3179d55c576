"""What the batch path (``gpucost.streams.columnar``, ``gpucost.streams.batch``) needs of the auditor: its row
entry, for the rows the batch path hands back, its dead letters, worded once, its close entries, and the
settling of the panes late kernels left pending. A protocol, so that the batch path need not import the auditor,
which imports it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Container, Sequence
from decimal import Decimal
from typing import Any, Protocol

import numpy as np

from gpucost.schemas.blocks import ClosedPanes
from gpucost.schemas.codec import Rejected
from gpucost.schemas.events import Event
from gpucost.schemas.kernels import KernelActivity
from gpucost.schemas.records import DeadLetter, Output
from gpucost.streams.allocations import AllocationSplit
from gpucost.streams.mae import Mae
from gpucost.streams.pane_totals import PaneColumns, PaneTotals
from gpucost.streams.panes import GpuPanes
from gpucost.streams.revisions import Revisions
from gpucost.streams.scope import Scope
from gpucost.streams.settings import AuditSettings
from gpucost.streams.tables import BindingTable

__all__ = ["RowPath"]


class RowPath(Protocol):
    """What the batch path asks of the row path (``gpucost.streams.audit.Auditor``), named here so that
    this module does not import it (audit calls this one): the operators whose state both paths keep,
    and the row entries used for what is rare in a batch (tables, dead letters, closing panes)."""

    settings: AuditSettings
    clock: Callable[[], int] | None
    counts: Counter[str]
    panes: GpuPanes
    mae: Mae
    bindings: BindingTable
    revisions: Revisions
    allocations: AllocationSplit

    def ingest(self, line: str | bytes | dict[str, Any], source: str, scope: Scope | None = None) -> list[Output]: ...

    def update(self, event: Event, raw: str | bytes | None = None, source: str = "") -> list[Output]: ...

    def late_kernel(
        self, event: KernelActivity, raw: str | bytes | None, source: str, watermark_ns: int | None
    ) -> list[Output]: ...

    def reject(self, why: Rejected, raw: str, source: str) -> DeadLetter: ...

    def prune_gpu(self, gpu_uuid: str) -> None: ...

    def kernel_revisions_pending(self) -> frozenset[str]: ...

    def settle_kernels(self, only: Container[str | tuple[str, int]] | None = None) -> list[Output]: ...

    def future_letter(self, event: Event, raw: str | bytes | None, source: str, now: int) -> DeadLetter: ...

    def late_letter(self, event: Any, raw: str | bytes | None, source: str, watermark: int | None) -> DeadLetter: ...

    def duplicate_letter(self, event: Any, raw: str | bytes | None, source: str) -> DeadLetter: ...

    def overlap_letter(self, event: Any, raw: str | bytes | None, source: str) -> DeadLetter: ...

    def address_letter(
        self, event: Any, raw: str | bytes | None, source: str, reason: str, latest_ns: int | None
    ) -> DeadLetter: ...

    def close(self, panes: list[PaneTotals], prices: list[Decimal | None] | None = None) -> list[Output]: ...

    def prices_now(self, gpu_models: np.ndarray, pane_starts_ns: np.ndarray) -> list[Decimal | None]: ...

    def close_many(
        self, panes: PaneColumns, prices: list[Decimal | None], cuts: Sequence[int] = ()
    ) -> list[ClosedPanes | None]: ...
