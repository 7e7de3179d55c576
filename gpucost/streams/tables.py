"""As-of tables joined in event time: tenant bindings per process, prices per GPU model."""
from __future__ import annotations

from bisect import bisect_right, insort
from decimal import Decimal
from typing import Any, NamedTuple

import numpy as np

from gpucost.schemas.events import TENANT_FIELDS, Price, TenantBinding

__all__ = ["Tenant", "UNATTRIBUTED", "BindingTable", "PriceTable"]


class Tenant(NamedTuple("_Tenant", [(f, "str | None") for f in TENANT_FIELDS])):  # type: ignore[misc]
    """A binding's tenant fields (``gpucost.schemas.events.TENANT_FIELDS``, declared once, on the binding)."""

    __slots__ = ()

    @classmethod
    def of(cls, binding: TenantBinding) -> Tenant:
        return cls(*(getattr(binding, f) for f in TENANT_FIELDS))

    @classmethod
    def named(cls, team: str) -> Tenant:
        """The pipeline's own tenants (``idle``, ``unattributed``): a team and nothing else."""
        # one starred tuple: mypy sees none of the fields the class line builds at run time, so it counts
        # ``team`` as an argument too many
        return cls(*(team, *(None for _ in TENANT_FIELDS[1:])))

    @property
    def key(self) -> str:
        """The values joined by ``:``, missing values empty (docs/definitions.md, "Tenants and prices")."""
        values: tuple[str | None, ...] = self  # what mypy cannot read from the class line (it sees no fields)
        return ":".join("" if v is None else v for v in values)


UNATTRIBUTED = Tenant.named("unattributed")


class BindingTable:
    """Bindings of ``(node_id, pid)``, looked up as of an event time.

    The lookup sees the bindings that have arrived so far; a binding must arrive before the
    samples it covers (producers publish it when the process appears).
    """

    def __init__(self) -> None:
        self._by_proc: dict[tuple[str, int], list[tuple[int, Tenant]]] = {}

    def verdict(self, b: TenantBinding) -> str:
        """What ``update`` would make of a binding, changing nothing: ``taken``; ``duplicate`` if the process
        has one from the same instant; ``unchanged`` if it repeats, later, the tenant of the process's
        latest binding, which changes no lookup (a source that re-sends a pod's binding at every scrape
        would otherwise grow the table, and the state, by one entry a second). O(1) when bindings arrive
        in time order, as they do."""
        history = self._by_proc.get((b.node_id, b.pid))
        if not history or b.ts_ns > history[-1][0]:
            return "unchanged" if history and history[-1][1] == Tenant.of(b) else "taken"
        at = bisect_right(history, b.ts_ns, key=lambda h: h[0])
        return "duplicate" if at and history[at - 1][0] == b.ts_ns else "taken"  # the first one wins

    def update(self, b: TenantBinding) -> str:
        """Take a binding if ``verdict`` says ``taken``; returns the verdict (the other two change nothing)."""
        verdict = self.verdict(b)
        if verdict == "taken":
            history = self._by_proc.setdefault((b.node_id, b.pid), [])
            insort(history, (b.ts_ns, Tenant.of(b)), key=lambda h: h[0])
        return verdict

    def next_after(self, node_id: str, pid: int, ts_ns: int) -> int | None:
        """The ``ts_ns`` of the process's first binding kept after ``ts_ns`` (None: none), which ends the span a
        binding at ``ts_ns`` governs (``Auditor._binding`` asks whether that span lies beyond the horizon)."""
        history = self._by_proc.get((node_id, pid), [])
        at = bisect_right(history, ts_ns, key=lambda h: h[0])
        return history[at][0] if at < len(history) else None

    def prune(self, floor_ns: int) -> None:
        """Forget what no lookup at or after ``floor_ns`` can return: each process's bindings before
        its last one at or before the floor."""
        for key, history in self._by_proc.items():
            at = bisect_right(history, floor_ns, key=lambda h: h[0])
            if at > 1:
                self._by_proc[key] = history[at - 1:]

    def lookup(self, node_id: str, pid: int, ts_ns: int) -> Tenant:
        """The row entry: the process's tenant as of ``ts_ns`` (``UNATTRIBUTED`` before its first binding)."""
        history = self._by_proc.get((node_id, pid), [])
        i = bisect_right(history, ts_ns, key=lambda h: h[0])
        return history[i - 1][1] if i else UNATTRIBUTED

    def lookup_many(self, node_id: str, pid: int, ts_ns: np.ndarray) -> tuple[list[Tenant], np.ndarray]:
        """The batch entry: the process's tenants, in the order of its bindings, and for each of ``ts_ns``
        the index of the one in force then (-1: none yet, ``UNATTRIBUTED``), as ``lookup`` finds them."""
        history = self._by_proc.get((node_id, pid), [])
        starts = np.array([ts for ts, _ in history], np.int64)
        return [t for _, t in history], np.searchsorted(starts, ts_ns, "right") - 1

    def to_state(self) -> list[Any]:
        return [[n, p, [[ts, list(t)] for ts, t in h]] for (n, p), h in self._by_proc.items()]

    @classmethod
    def from_state(cls, state: list[Any]) -> BindingTable:
        table = cls()
        for n, p, h in state:
            table._by_proc[(n, p)] = [(ts, Tenant(*t)) for ts, t in h]
        return table


class PriceTable:
    """USD per GPU-hour by model, as of a time; model ``default`` stands in for unpriced models."""

    def __init__(self) -> None:
        self._by_model: dict[str, list[tuple[int, Decimal]]] = {}

    def update(self, p: Price) -> bool:
        """Take a price; False (and no change) if the model already has one from the same instant."""
        history = self._by_model.setdefault(p.gpu_model, [])
        if any(ts == p.ts_ns for ts, _ in history):
            return False
        insort(history, (p.ts_ns, p.usd_per_gpu_hour))
        return True

    def _as_of(self, model: str, ts_ns: np.ndarray) -> np.ndarray:
        history = self._by_model.get(model, [])
        at = np.searchsorted(np.array([ts for ts, _ in history], np.int64), ts_ns, "right") - 1
        return np.array([price for _, price in history] + [None], object)[np.where(at >= 0, at, len(history))]

    def lookup(self, gpu_model: str, ts_ns: int) -> Decimal | None:
        return self.lookup_many(np.array([gpu_model], object), np.array([ts_ns], np.int64))[0]  # type: ignore[no-any-return]

    def lookup_many(self, gpu_models: np.ndarray, ts_ns: np.ndarray) -> np.ndarray:
        """``lookup`` of each model (None: no price) as of each time, a model's times at once."""
        out = np.full(len(ts_ns), None, object)
        for model in set(gpu_models.tolist()) - {None}:
            at = np.flatnonzero(gpu_models == model)
            out[at] = self._as_of(model, ts_ns[at])
            # numpy compares with None as with an object scalar; its stubs take no None as an operand
            unpriced = at[np.equal(out[at], None)]  # type: ignore[call-overload]
            out[unpriced] = self._as_of("default", ts_ns[unpriced])
        return out

    def to_state(self) -> dict[str, list[list[Any]]]:
        return {m: [[ts, str(p)] for ts, p in h] for m, h in self._by_model.items()}

    @classmethod
    def from_state(cls, state: dict[str, list[list[Any]]]) -> PriceTable:
        table = cls()
        table._by_model = {m: [(ts, Decimal(p)) for ts, p in h] for m, h in state.items()}
        return table
