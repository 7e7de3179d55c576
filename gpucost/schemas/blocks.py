"""Many closed panes' records as Arrow columns: what the batch path hands to its sinks.

Why: one pydantic object per record, turned back into columns by the Parquet sink, cost the
batch path more than everything else it does. A block keeps the columns; ``records()`` gives
the very records the row path builds, in its order, for whoever needs objects (the Kafka
worker's JSON, the tests).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import pyarrow as pa

from gpucost.schemas.computed import R, computed_from
from gpucost.schemas.records import OUTPUT_KINDS, IdleIndexRecord, Output

__all__ = ["ClosedPanes", "Emitted", "Outputs", "expand"]


@dataclass(frozen=True)
class Emitted:
    """One pane operator's records of many closed panes, as its batch entry returns them
    (``gpucost.streams.operator``): those it keeps as columns, ``table`` in the schema of output kind
    ``kind`` with ``rows[j]`` of them for pane ``j``, and those it keeps as records, ``tagged`` each with
    its pane (ascending, stably: one pane's records in the row entry's order).

    ``given`` holds columns whose record values are taken as given rather than read back from the table:
    the cost records' ``usd_per_gpu_hour`` as the price events gave them (Arrow's decimal column holds the
    same values at six places, whose JSON would differ).
    """

    kind: str | None = None
    table: pa.Table | None = None
    rows: np.ndarray | None = None
    given: dict[str, list[Any]] = field(default_factory=dict)
    tagged: list[tuple[int, Output]] = field(default_factory=list)

    def slice(self, lo: int, hi: int) -> Emitted:
        """The records of panes ``lo`` to ``hi``."""
        tagged = [(j - lo, r) for j, r in self.tagged if lo <= j < hi]
        if self.table is None or self.rows is None:
            return Emitted(tagged=tagged)
        at = np.concatenate([[0], np.cumsum(self.rows)]).tolist()
        return Emitted(
            self.kind,
            self.table.slice(at[lo], at[hi] - at[lo]),
            self.rows[lo:hi],
            {name: values[at[lo] : at[hi]] for name, values in self.given.items()},
            tagged,
        )

    def per_pane(self, n: int) -> list[list[Output]]:
        """Each of the ``n`` panes' records as the row entry returns them: its table rows, then its tagged ones."""
        out: list[list[Output]] = [[] for _ in range(n)]
        if self.table is not None and self.rows is not None and self.kind is not None:
            # OUTPUT_KINDS maps each kind to one of the types ``Output`` unites
            records = cast(list[Output], _records(OUTPUT_KINDS[self.kind], self.table, self.given))
            at = 0
            for j, count in enumerate(self.rows.tolist()):
                out[j] += records[at : at + count]
                at += count
        for j, record in self.tagged:
            out[j].append(record)
        return out


@dataclass(frozen=True)
class ClosedPanes:
    """The records of many closed panes: their idle-index records (one per pane, ``idle``), then what each
    pane operator emitted for them (``emitted``, in the operators' order)."""

    idle: pa.Table
    emitted: tuple[Emitted, ...]

    def slice(self, lo: int, hi: int) -> ClosedPanes:
        """The records of panes ``lo`` to ``hi`` (in idle-index records)."""
        return ClosedPanes(self.idle.slice(lo, hi - lo), tuple(e.slice(lo, hi) for e in self.emitted))

    def tables(self) -> list[tuple[str, pa.Table]]:
        """Each output kind kept as columns, with its table: the idle index first."""
        return [
            ("idle_index", self.idle),
            *((e.kind, e.table) for e in self.emitted if e.kind is not None and e.table is not None),
        ]

    def tagged(self) -> list[Output]:
        """The records kept as records (reclaim triggers, health records), operator by operator."""
        return [record for e in self.emitted for _, record in e.tagged]

    def records(self) -> list[Output]:
        """The records in the row path's order: each pane's idle index, then each operator's records of it
        (``Emitted.per_pane``) in the operators' order."""
        n = self.idle.num_rows
        by_operator = [e.per_pane(n) for e in self.emitted]
        out: list[Output] = []
        for j, record in enumerate(_records(IdleIndexRecord, self.idle, {})):
            out.append(record)
            for records in by_operator:
                out += records[j]
        return out


#: what the batch path returns: records, and blocks of closed panes' records (``expand`` gives the records)
Outputs = list[Output | ClosedPanes]


def _records(cls: type[R], table: pa.Table, given: Mapping[str, Sequence[Any]]) -> list[R]:
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
