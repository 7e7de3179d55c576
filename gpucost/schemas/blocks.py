"""Many closed panes' records as Arrow columns: what the batch path hands to its sinks.

Why: one pydantic object per record, turned back into columns by the Parquet sink, cost the
batch path more than everything else it does. A block keeps the columns; ``records()`` gives
the very records the row path builds, in its order, for whoever needs objects (the Kafka
worker's JSON, the tests).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa

from gpucost.schemas.records import (
    CostRecord,
    EfficiencyRecord,
    HealthRecord,
    IdleIndexRecord,
    Output,
    QuotaRecord,
    R,
    ReclaimRecord,
    computed_from,
)

__all__ = ["ClosedPanes", "Outputs", "expand"]


@dataclass(frozen=True)
class ClosedPanes:
    """Idle-index records (one per pane), cost records (``cost_rows[j]`` of them for pane ``j``), quota
    records (``quota_rows[j]``), efficiency records (``efficiency_rows[j]``), reclaim triggers (``reclaim``: each
    with its pane ``j``, ascending) and the
    health records whose windows the panes close (``health``: the pane ``j`` that closes each, ascending).

    ``prices`` are the cost records' ``usd_per_gpu_hour`` as the price events gave them:
    Arrow's decimal column holds the same values at six places, whose JSON would differ.
    """

    idle: pa.Table
    cost: pa.Table
    prices: list[Decimal | None]
    cost_rows: np.ndarray
    quota: pa.Table
    quota_rows: np.ndarray
    efficiency: pa.Table
    efficiency_rows: np.ndarray
    reclaim: list[tuple[int, ReclaimRecord]] = field(default_factory=list)
    health: list[tuple[int, HealthRecord]] = field(default_factory=list)

    def slice(self, lo: int, hi: int) -> ClosedPanes:
        """The records of panes ``lo`` to ``hi`` (in idle-index records)."""
        at = np.concatenate([[0], np.cumsum(self.cost_rows)]).tolist()
        qt = np.concatenate([[0], np.cumsum(self.quota_rows)]).tolist()
        et = np.concatenate([[0], np.cumsum(self.efficiency_rows)]).tolist()
        return ClosedPanes(self.idle.slice(lo, hi - lo), self.cost.slice(at[lo], at[hi] - at[lo]),
                           self.prices[at[lo]:at[hi]], self.cost_rows[lo:hi], self.quota.slice(qt[lo], qt[hi] - qt[lo]),
                           self.quota_rows[lo:hi], self.efficiency.slice(et[lo], et[hi] - et[lo]),
                           self.efficiency_rows[lo:hi], [(j - lo, r) for j, r in self.reclaim if lo <= j < hi],
                           [(j - lo, record) for j, record in self.health if lo <= j < hi])

    def records(self) -> list[Output]:
        """The records in the row path's order: each pane's idle index, its cost records, its quota records,
        its efficiency records, the reclaim triggers it fires, then the health records of the windows it closes."""
        idle = _records(IdleIndexRecord, self.idle, {})
        cost = _records(CostRecord, self.cost, {"usd_per_gpu_hour": self.prices})
        quota = _records(QuotaRecord, self.quota, {})
        efficiency = _records(EfficiencyRecord, self.efficiency, {})
        after: dict[int, list[Output]] = {}
        pending: list[tuple[int, Output]] = [*self.reclaim, *self.health]
        for j, record in pending:  # sorted by pane, stably: each pane's triggers first
            after.setdefault(j, []).append(record)
        out: list[Output] = []
        at = qt = et = 0
        for j, (record, n, q, e) in enumerate(zip(idle, self.cost_rows.tolist(), self.quota_rows.tolist(),
                                                  self.efficiency_rows.tolist())):
            out.append(record)
            out += cost[at:at + n]
            out += quota[qt:qt + q]
            out += efficiency[et:et + e]
            out += after.get(j, [])
            at, qt, et = at + n, qt + q, et + e
        return out


#: what the batch path returns: records, and blocks of closed panes' records (``expand`` gives the records)
Outputs = list[Output | ClosedPanes]


def _records(cls: type[R], table: pa.Table, given: dict[str, Sequence[Any]]) -> list[R]:
    names = list(cls.model_fields)
    columns = [given[n] if n in given else _values(table.column(n)) for n in names]
    return [computed_from(cls, dict(zip(names, values))) for values in zip(*columns)]


def _values(column: pa.ChunkedArray) -> list[Any]:
    """A column's values as the record holds them: a wide integer (DECIMAL(38, 0)) as an ``int``."""
    values: list[Any] = column.to_pylist()
    if pa.types.is_decimal(column.type) and column.type.scale == 0:
        return [None if v is None else int(v) for v in values]
    return values


def expand(outputs: Iterable[Output | ClosedPanes]) -> list[Output]:
    """Outputs with every block replaced by its records, in place."""
    out: list[Output] = []
    for item in outputs:
        if isinstance(item, ClosedPanes):
            out += item.records()
        else:
            out.append(item)
    return out
