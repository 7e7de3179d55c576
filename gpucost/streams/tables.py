"""As-of tables joined in event time: tenant bindings per process, prices per GPU model."""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterable
from decimal import Decimal
from itertools import accumulate
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from gpucost.schemas.devices import platform_names
from gpucost.schemas.events import BLANK_TENANT_FIELDS, TENANT_FIELDS, Allocation, Price, TenantBinding, six_places
from gpucost.schemas.names import RESERVED_TEAMS
from gpucost.schemas.partitions import device_share

if TYPE_CHECKING:
    from gpucost.streams.settings import AuditSettings

__all__ = ["Tenant", "UNATTRIBUTED", "BindingTable", "PriceTable"]


_TenantFields = NamedTuple("_TenantFields", [(f, "str | None") for f in TENANT_FIELDS])  # type: ignore[misc]
#: ``labels``, the last field, is None where absent: a tenant read back from the state of a version without labels
_TenantFields.__new__.__defaults__ = (None,)


class Tenant(_TenantFields):
    """A binding's tenant fields (``gpucost.schemas.events.TENANT_FIELDS``, declared once, on the binding), its
    labels (canonical JSON text, ``gpucost.schemas.labels.labels_text``) last."""

    __slots__ = ()
    if TYPE_CHECKING:  # the fields as a type checker reads them (it cannot run the list above); never run,
        # and tests/test_bindings.py holds the names to TENANT_FIELDS
        team: str | None
        env: str | None
        app: str | None
        tier: str | None
        sla: str | None
        git_commit: str | None
        ci_pipeline_id: str | None
        labels: str | None

    @classmethod
    def of(cls, binding: TenantBinding | Allocation) -> Tenant:
        """The tenant a binding, or an allocation, names."""
        return cls.canonical(getattr(binding, f) for f in TENANT_FIELDS)

    @classmethod
    def canonical(cls, values: Iterable[str | None]) -> Tenant:
        """The tenant of ``values`` (in ``TENANT_FIELDS`` order) in its one form: ``BLANK_TENANT_FIELDS`` not given
        are ``""``, any other field given as ``""`` is None. The key writes both as empty, and a record's id hashes
        the key, so two forms of one key were two parties with one id a pane where a path kept them apart (the
        batch entry, the allocation basis), and one a sink keeping the first copy of an id dropped. Every tenant an
        event names is made here (``of``), and read back so from a state (``restored``); the pipeline's own parties
        (``named``: ``idle``, ``unattributed``, ``unallocated``) keep their fields None."""
        return cls(
            *(
                ("" if value is None else value) if field in BLANK_TENANT_FIELDS else (None if value == "" else value)
                for field, value in zip(TENANT_FIELDS, values)
            )
        )

    @classmethod
    def restored(cls, values: Iterable[str | None]) -> Tenant:
        """A tenant read back from a state: the pipeline's own parties as ``named`` makes them, any other in its one
        form (``canonical``), so that a state written before the one form continues as an uninterrupted run would."""
        fields = list(values)
        return cls(*fields) if fields and fields[0] in RESERVED_TEAMS else cls.canonical(fields)

    @classmethod
    def named(cls, team: str) -> Tenant:
        """The pipeline's own tenants (``idle``, ``unattributed``): a team and nothing else."""
        # one starred tuple: mypy sees none of the fields the class line builds at run time, so it counts
        # ``team`` as an argument too many
        return cls(*(team, *(None for _ in TENANT_FIELDS[1:])))

    @property
    def key(self) -> str:
        """The values joined by ``:``, missing values empty, and the labels' text after one more ``:`` where there
        are labels (docs/definitions.md, "Tenants and prices"): a tenant without labels keeps the key it had
        before labels were carried, so its records' ids do not change."""
        values: tuple[str | None, ...] = self  # what mypy cannot read from the class line (it sees no fields)
        if values[-1] is None:
            values = values[:-1]
        return ":".join("" if v is None else v for v in values)


UNATTRIBUTED = Tenant.named("unattributed")


class BindingTable:
    """Bindings of ``(node_id, pid)``, looked up as of an event time: the latest binding at or before it,
    whatever order the bindings arrived in.

    ``_by_proc`` holds each process's change points, the lookups read only these. A binding that repeats,
    later, the tenant of its process's latest one changes no lookup when it arrives (a source that re-sends a
    pod's binding at every scrape would otherwise grow what each lookup reads); it is kept apart, as a time in
    ``_repeats`` (8 bytes), because a binding that arrives later but falls before it makes it a change point
    again: bindings ``search`` at t0 and t2 and ``ads`` at t1, in that order of arrival, leave ``search`` in
    force from t2, as they do in any other order. ``prune`` bounds both.
    """

    def __init__(self) -> None:
        self._by_proc: dict[tuple[str, int], list[tuple[int, Tenant]]] = {}
        self._repeats: dict[tuple[str, int], dict[Tenant, array[int]]] = {}

    def admit(self, b: TenantBinding) -> str | None:
        """The event operator's verdict (``gpucost.streams.operator.EventOperator``): ``duplicate`` if the
        process has a change point or a repeat from the same instant (the first one stays in force), else None:
        ``take`` takes it, as a change point or as a repeat (``verdict`` tells which)."""
        return "duplicate" if self.verdict(b) == "duplicate" else None

    def verdict(self, b: TenantBinding) -> str:
        """What ``take`` would make of a binding, changing no lookup: ``taken``; ``duplicate`` if the process
        has a change point or a repeat from the same instant; ``unchanged`` if it repeats, later, the tenant of the
        process's latest change point (kept as a repeat). A bisect in each of the process's repeat arrays (one per
        tenant it has repeated), then O(1) for a binding later than the process's last change point, as most are."""
        history = self._by_proc.get((b.node_id, b.pid))
        if self._is_repeat((b.node_id, b.pid), b.ts_ns):
            return "duplicate"  # a repeat sent again: the first one is kept
        if not history or b.ts_ns > history[-1][0]:
            return "unchanged" if history and history[-1][1] == Tenant.of(b) else "taken"
        at = bisect_right(history, b.ts_ns, key=lambda h: h[0])
        return "duplicate" if at and history[at - 1][0] == b.ts_ns else "taken"  # the first one wins

    def take(self, b: TenantBinding) -> str:
        """The row entry: take a binding as ``verdict`` says; returns the verdict. A change point taken before a
        repeat of its process promotes the first repeat after it (before the next change point) to a change point."""
        verdict = self.verdict(b)
        key = (b.node_id, b.pid)
        if verdict == "unchanged":
            times = self._repeats.setdefault(key, {}).setdefault(self._by_proc[key][-1][1], array("q"))
            insort(times, b.ts_ns)
        elif verdict == "taken":
            history = self._by_proc.setdefault(key, [])
            insort(history, (b.ts_ns, Tenant.of(b)), key=lambda h: h[0])
            self._promote(key, b.ts_ns)
        return verdict

    def _is_repeat(self, key: tuple[str, int], ts_ns: int) -> bool:
        for times in self._repeats.get(key, {}).values():
            at = bisect_left(times, ts_ns)
            if at < len(times) and times[at] == ts_ns:
                return True
        return False

    def _first_repeat(self, key: tuple[str, int], ts_ns: int) -> tuple[int, Tenant] | None:
        """The process's first repeat after ``ts_ns``, with its tenant (None: none)."""
        found: tuple[int, Tenant] | None = None
        for tenant, times in self._repeats.get(key, {}).items():
            at = bisect_right(times, ts_ns)
            if at < len(times) and (found is None or times[at] < found[0]):
                found = (times[at], tenant)
        return found

    def _promote(self, key: tuple[str, int], ts_ns: int) -> None:
        """The first repeat after a change point taken at ``ts_ns``, if it comes before the next change point:
        it brings its tenant back from its time on, so it becomes a change point itself."""
        repeat = self._first_repeat(key, ts_ns)
        ends = self._next_change(key, ts_ns)
        if repeat is not None and (ends is None or repeat[0] < ends):
            times = self._repeats[key][repeat[1]]
            del times[bisect_left(times, repeat[0])]
            insort(self._by_proc[key], repeat, key=lambda h: h[0])

    def _next_change(self, key: tuple[str, int], ts_ns: int) -> int | None:
        history = self._by_proc.get(key, [])
        at = bisect_right(history, ts_ns, key=lambda h: h[0])
        return history[at][0] if at < len(history) else None

    def next_after(self, node_id: str, pid: int, ts_ns: int) -> int | None:
        """The ``ts_ns`` of the process's first binding kept after ``ts_ns``, a repeat included (None: none),
        which ends the span a binding at ``ts_ns`` governs (``Auditor._binding`` asks whether that span lies
        beyond the horizon)."""
        repeat = self._first_repeat((node_id, pid), ts_ns)
        ends = [t for t in (self._next_change((node_id, pid), ts_ns), repeat and repeat[0]) if t is not None]
        return min(ends, default=None)

    def prune(self, floor_ns: int) -> None:
        """Forget what no lookup at or after ``floor_ns`` can return: each process's change points before
        its last one at or before the floor, and likewise its repeats (of each tenant)."""
        for key, history in self._by_proc.items():
            at = bisect_right(history, floor_ns, key=lambda h: h[0])
            if at > 1:
                self._by_proc[key] = history[at - 1 :]
        for by_tenant in self._repeats.values():
            for times in by_tenant.values():
                at = bisect_right(times, floor_ns)
                if at > 1:
                    del times[: at - 1]

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
        """Each process as ``[node, pid, change points]``, and where it has repeats a fourth item: per tenant,
        its repeats' first time and the steps between them (a re-send every second writes ten digits a time)."""
        out: list[Any] = []
        for key, h in self._by_proc.items():
            row: list[Any] = [key[0], key[1], [[ts, list(t)] for ts, t in h]]
            repeats = [
                [list(t), times[0], np.diff(times).tolist()] for t, times in self._repeats.get(key, {}).items() if times
            ]
            if repeats:
                row.append(repeats)
            out.append(row)
        return out

    @classmethod
    def from_state(cls, state: list[Any], settings: AuditSettings | None = None) -> BindingTable:
        """A state written before repeats were kept has none: its processes' repeats were dropped. (``settings``:
        the shape every operator's ``from_state`` has; the table has none of its own.)"""
        table = cls()
        for n, p, h, *repeats in state:
            table._by_proc[(n, p)] = [(ts, Tenant.restored(t)) for ts, t in h]
            for t, first, steps in repeats[0] if repeats else []:
                # a state from before the one form may hold two forms of a tenant: their repeats are one tenant's
                held = table._repeats.setdefault((n, p), {})
                times = sorted({*held.get(Tenant.restored(t), ()), *accumulate([first, *steps])})
                held[Tenant.restored(t)] = array("q", times)
        return table


class PriceTable:
    """USD per GPU-hour by model, as of a time; model ``default`` stands in for unpriced models."""

    def __init__(self) -> None:
        self._by_model: dict[str, list[tuple[int, Decimal]]] = {}

    def admit(self, p: Price) -> str | None:
        """``duplicate`` if the model already has a price from the same instant (a correction comes with a later
        ``ts_ns``), else None."""
        return "duplicate" if any(ts == p.ts_ns for ts, _ in self._by_model.get(p.gpu_model, ())) else None

    def take(self, p: Price) -> None:
        """The row entry: a price ``admit`` let in is in force from its ``ts_ns`` until the model's next."""
        insort(self._by_model.setdefault(p.gpu_model, []), (p.ts_ns, p.usd_per_gpu_hour))

    def _as_of(self, model: str, ts_ns: np.ndarray) -> np.ndarray:
        history = self._by_model.get(model, [])
        at = np.searchsorted(np.array([ts for ts, _ in history], np.int64), ts_ns, "right") - 1
        return np.array([price for _, price in history] + [None], object)[np.where(at >= 0, at, len(history))]

    def lookup(self, gpu_model: str, ts_ns: int) -> Decimal | None:
        price: Decimal | None = self.lookup_many(np.array([gpu_model], object), np.array([ts_ns], np.int64))[0]
        return price

    def lookup_many(self, gpu_models: np.ndarray, ts_ns: np.ndarray) -> np.ndarray:
        """``lookup`` of each model (None: no price) as of each time, a model's times at once: its own price, else
        the first name of its platform row with one (``platform_names``), else ``default``'s. A partition's model
        (``MI300X 1/8``) takes its whole device's price, which its cost then takes its share of
        (``gpucost.schemas.partitions``)."""
        out = np.full(len(ts_ns), None, object)
        for model in set(gpu_models.tolist()) - {None}:
            unpriced = np.flatnonzero(gpu_models == model)
            device = device_share(model)[0]
            for name in (device, *(n for n in platform_names(device) if n != device), "default"):
                out[unpriced] = self._as_of(name, ts_ns[unpriced])
                # numpy compares with None as with an object scalar; its stubs take no None as an operand
                unpriced = unpriced[np.equal(out[unpriced], None)]  # type: ignore[call-overload]
                if not len(unpriced):
                    break
        return out

    def to_state(self) -> dict[str, list[list[Any]]]:
        return {m: [[ts, str(p)] for ts, p in h] for m, h in self._by_model.items()}

    @classmethod
    def from_state(cls, state: dict[str, list[list[Any]]], settings: AuditSettings | None = None) -> PriceTable:
        """The table ``to_state`` wrote (``settings``: the shape every operator's ``from_state`` has)."""
        table = cls()
        table._by_model = {m: [(ts, six_places(Decimal(p))) for ts, p in h] for m, h in state.items()}
        return table
