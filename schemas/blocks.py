"""Many closed panes' records as Arrow columns: what the batch path hands to its sinks.

Why: one pydantic object per record, turned back into columns by the Parquet sink, cost the
batch path more than everything else it does. A block keeps the columns; ``records()`` gives
the very records the row path builds, in its order, for whoever needs objects (the Kafka
worker's JSON, the tests).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa

from gpucost.schemas.records import CostRecord, DeadLetter, IdleIndexRecord, MaeRecord, Output, R, computed_from

__all__ = ["ClosedPanes", "Outputs", "expand"]


@dataclass(frozen=True)
class ClosedPanes:
    """Idle-index records (one per pane) and cost records (``cost_rows[j]`` of them for pane ``j``).

    ``prices`` are the cost records' ``usd_per_gpu_hour`` as the price events gave them:
    Arrow's decimal column holds the same values at six places, whose JSON would differ.
    """

    idle: pa.Table
    cost: pa.Table
    prices: list[Decimal | None]
    cost_rows: np.ndarray

    def slice(self, lo: int, hi: int) -> "ClosedPanes":
        """The records of panes ``lo`` to ``hi`` (in idle-index records)."""
        at = np.concatenate([[0], np.cumsum(self.cost_rows)]).tolist()
        return ClosedPanes(self.idle.slice(lo, hi - lo), self.cost.slice(at[lo], at[hi] - at[lo]),
                           self.prices[at[lo]:at[hi]], self.cost_rows[lo:hi])

    def records(self) -> list[IdleIndexRecord | CostRecord]:
        """The records in the row path's order: each pane's idle index, then its cost records."""
        idle = _records(IdleIndexRecord, self.idle, {})
        cost = _records(CostRecord, self.cost, {"usd_per_gpu_hour": self.prices})
        out: list[IdleIndexRecord | CostRecord] = []
        at = 0
        for record, n in zip(idle, self.cost_rows.tolist()):
            out.append(record)
            out += cost[at:at + n]
            at += n
        return out


#: what the batch path returns: records, and blocks of closed panes' records (``expand`` gives the records)
Outputs = list[Output | ClosedPanes]


def _records(cls: type[R], table: pa.Table, given: dict[str, Sequence[Any]]) -> list[R]:
    names = list(cls.model_fields)
    columns = [given[n] if n in given else table.column(n).to_pylist() for n in names]
    return [computed_from(cls, dict(zip(names, values))) for values in zip(*columns)]


def expand(outputs: Iterable[IdleIndexRecord | MaeRecord | CostRecord | DeadLetter | ClosedPanes]
           ) -> list[IdleIndexRecord | MaeRecord | CostRecord | DeadLetter]:
    """Outputs with every block replaced by its records, in place."""
    out: list[IdleIndexRecord | MaeRecord | CostRecord | DeadLetter] = []
    for item in outputs:
        if isinstance(item, ClosedPanes):
            out += item.records()
        else:
            out.append(item)
    return out
