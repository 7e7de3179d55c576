"""The two shapes of the audit's operators: on events, and on closed panes; and the cost split on the second.

An event operator (``EventOperator``) owns the events of some kinds: ``GpuPanes`` the GPU-keyed ones,
``Mae`` memory accesses, ``Revisions`` the log a closed pane is recomputed from, ``BindingTable`` bindings,
``PriceTable`` prices (``Auditor.event_operators``). Its row entry is ``admit(event)``, why the event may not
be taken (the dead-letter reason: ``duplicate``, ``overlap``, ``late``) or None, changing nothing, then
``take(event)``, which takes it and returns what it completes; where events come in bulk (all but bindings
and prices) a batch entry ``take_many`` takes a batch's admitted rows as arrays, as ``take`` would one by one.
Re-sent input is refused by ``admit`` because ``take`` remembered it, so each operator is idempotent on its
own; ``tests/test_event_operators.py`` checks that, admit's purity and snapshot → restore for every one.

A closed pane is rolled into its GPU's idle window first (``IdleIndex``: an unbilled pane, without GPU
samples, stops there), then handed to each pane operator in ``Auditor.pane_operators``' order: the cost
split, the SLA tiers, the efficiency figures, the health audit. Each has two entries over one state:

- the row entry ``on_close(Closing)``: one pane, its records in the order they are published;
- the batch entry ``close_many(ClosingMany)``: many panes (each GPU's in ascending order), their records as
  one ``Emitted`` block whose ``per_pane`` gives, pane by pane, exactly what the row entry gives;

and ``to_state`` (JSON-serialisable), read back by the class's ``from_state(state, settings)``. The auditor
loops over the list on both paths, so an operator added to it is closed, snapshotted and checked like the
others: ``tests/test_operators.py`` runs every one through rows against batch and snapshot → restore.
Why one shape: the batch entries once returned five different tuples, unpacked by position in the auditor.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Protocol, TypeVar

import pyarrow as pa

from gpucost.schemas.blocks import Emitted
from gpucost.schemas.records import IdleIndexRecord, Output
from gpucost.streams.apportion import Weights, apportion, apportion_many
from gpucost.streams.pane_totals import PaneColumns, PaneTotals
from gpucost.streams.settings import AuditSettings

__all__ = ["Closing", "ClosingMany", "CostSplit", "EventOperator", "PaneOperator"]

E = TypeVar("E", contravariant=True)


class EventOperator(Protocol[E]):
    """An operator on the events of the kinds it owns (module docstring); ``from_state(state, settings)`` is its
    class's. ``take`` may take more than the event (``GpuPanes``: the tenant the auditor looked up)."""

    def admit(self, event: E) -> str | None: ...

    def take(self, event: E) -> Any: ...

    def to_state(self) -> Any: ...


@dataclass(frozen=True)
class Closing:
    """One closed pane with GPU samples, as every pane operator's row entry takes it: the pane, the price in
    force for it (None: unpriced), and its idle-index record (the 72 h sums the health grade reads)."""

    pane: PaneTotals
    price: Decimal | None
    idle: IdleIndexRecord


@dataclass(frozen=True)
class ClosingMany:
    """Many closed panes with GPU samples (each GPU's in ascending order), as the batch entries take them: the
    panes, one price each, and their idle-index records as a table (one row per pane, in order)."""

    panes: PaneColumns
    prices: list[Decimal | None]
    idle: pa.Table


class PaneOperator(Protocol):
    """An operator on closed panes (module docstring); ``from_state(state, settings)`` is its class's."""

    def on_close(self, closing: Closing) -> list[Output]: ...

    def close_many(self, closing: ClosingMany) -> Emitted: ...

    def to_state(self) -> Any: ...


class CostSplit:
    """The cost split (docs/definitions.md, "Cost split") on the pane-operator shape: no state of its own."""

    def __init__(self, settings: AuditSettings) -> None:
        self.weights = Weights(settings.alpha, settings.beta, settings.gamma)

    def on_close(self, closing: Closing) -> list[Output]:
        return list(apportion(closing.pane, closing.price, self.weights))

    def close_many(self, closing: ClosingMany) -> Emitted:
        table, prices, rows = apportion_many(closing.panes, closing.prices, self.weights)
        return Emitted("cost", table, rows, {"usd_per_gpu_hour": prices})

    def to_state(self) -> dict[str, Any]:
        return {}

    @classmethod
    def from_state(cls, state: dict[str, Any], settings: AuditSettings) -> CostSplit:
        return cls(settings)
