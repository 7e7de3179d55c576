"""The allocation basis (docs/definitions.md, "Allocation basis"): each pane's cost split by what each tenant
held of the device (a scheduler's allocation), beside the usage split of what it used.

Two parts on the audit's two operator shapes (``gpucost.streams.operator``):

- ``AllocationTable``, an event operator over ``allocation`` events: each device's holds by ``allocation_id``,
  and the time its first hold began (from then on its panes are split on this basis too, so a pane that no
  allocation reaches shows its whole cost ``unallocated`` rather than nothing);
- ``AllocationSplit``, a pane operator: at each close, the pane's cost (the usage split's own figure, so both
  bases reconcile to the same C) split by largest remainder over ``unallocated`` then the tenants by key.

Why a table of holds rather than samples: an allocation is a fact of the scheduler with a start and an end, not
a measurement; whether anything ran on it is the usage basis's question, and the gap between the two is what
a reclaim saves.
"""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

import numpy as np

from gpucost.schemas.blocks import Emitted
from gpucost.schemas.events import Allocation
from gpucost.schemas.records import AllocationRecord, Output
from gpucost.streams.allocation_split import Hold, split, split_many_panes
from gpucost.streams.operator import Closing, ClosingMany
from gpucost.streams.pane_totals import PaneTotals
from gpucost.streams.settings import AuditSettings
from gpucost.streams.tables import Tenant

__all__ = ["AllocationTable", "AllocationSplit", "Hold", "MAX_DENOMINATOR", "MAX_HOLDS"]

#: the most holds a device keeps (ended ones until pruned): what one pane's close reads and a device's state holds,
#: bounded against a producer that sends hold after hold (a real node's churn is a few hundred within the horizon)
MAX_HOLDS = 10_000
#: the largest common denominator of a device's fractions: its capacity ``D × pane ns`` then stays far below the
#: 38 digits a record's exact integers are stored in, whatever denominators the holds bring (primes near 10^6, five
#: of them, would pass it)
MAX_DENOMINATOR = 10**12


class AllocationTable:
    """Each device's holds, by ``allocation_id``; an event operator (``admit``, ``take``, ``to_state``).

    An allocation's start, fraction, sharing and tenant are fixed by its first event; a later event of the same
    id may only set its end, once. The same event again is a ``duplicate``; one that contradicts what was taken
    is a ``conflict`` (two schedulers, or a reused id): the first one stays in force, as for every other kind. A new
    hold past ``MAX_HOLDS`` on its device, or whose denominator takes the device's past ``MAX_DENOMINATOR``, is
    ``out_of_range``.

    Holds that ended before the revision horizon of their own device's watermark are dropped (``prune``) whenever
    the device takes a sample or an allocation (``AuditState.prune_holds``): in event order, so every path, every
    batch and every restart keeps the same ones. Each leaves its id as a tombstone, so that one sent again (a
    second ``produce`` of a file) is ``late``, never a new hold billed again. The tombstones are bounded as the
    holds are, the earliest ended going first."""

    def __init__(self) -> None:
        self._holds: dict[str, dict[str, Hold]] = {}
        #: each device's first hold's start: the device is split on the allocation basis from then on. Kept
        #: when its holds are pruned, so that pruning changes no pane's records
        self._since: dict[str, int] = {}
        #: each device's common denominator over the holds it keeps (what ``admit`` bounds), kept as they change
        self._den: dict[str, int] = {}
        #: each device's holds dropped past the horizon: their id and end (a tombstone)
        self._gone: dict[str, dict[str, int]] = {}

    def admit(self, a: Allocation) -> str | None:
        """``duplicate``, ``conflict``, ``late`` (a hold dropped past the horizon, sent again), ``out_of_range`` or
        None (taken), changing nothing."""
        holds = self._holds.get(a.gpu_uuid, {})
        held = holds.get(a.allocation_id)
        if held is None and a.allocation_id in self._gone.get(a.gpu_uuid, {}):
            return "late"
        if held is None:
            if len(holds) >= MAX_HOLDS or math.lcm(a.fraction_den, self._den.get(a.gpu_uuid, 1)) > MAX_DENOMINATOR:
                return "out_of_range"
            return None
        new = Hold.of(a)
        if held._replace(end_ns=None) != new._replace(end_ns=None):
            return "conflict"
        if new.end_ns is None or new.end_ns == held.end_ns:
            return "duplicate"  # the start again (before or after its end came), or the end again
        return "conflict" if held.end_ns is not None else None

    def contradiction(self, a: Allocation) -> str:
        """What a ``conflict`` contradicts, in words: the first field that differs from the hold taken, both values."""
        held, new = self._holds[a.gpu_uuid][a.allocation_id], Hold.of(a)
        if held._replace(end_ns=None) == new._replace(end_ns=None):
            return f"it already ended at ts_ns {held.end_ns}, and an end is sent once: the first end stays"
        name, was, now = next(
            field
            for field in (
                ("ts_ns", held.start_ns, new.start_ns),
                ("fraction", f"{held.num}/{held.den}", f"{new.num}/{new.den}"),
                ("sharing", held.sharing, new.sharing),
                ("tenant", held.tenant.key, new.tenant.key),
            )
            if field[1] != field[2]
        )
        return (
            f"its {name} is {now}, taken as {was}: a hold's start, fraction, sharing and tenant are fixed by its "
            "first event; send another hold with its own allocation_id"
        )

    def gone_at(self, a: Allocation) -> int:
        """When the dropped hold ``a`` names ended (``admit`` said ``late``)."""
        return self._gone[a.gpu_uuid][a.allocation_id]

    def known(self, a: Allocation) -> bool:
        """Whether ``a`` is the end of a hold taken (not a new hold)."""
        return a.allocation_id in self._holds.get(a.gpu_uuid, {})

    def changes_from(self, a: Allocation) -> int:
        """The earliest time whose split an admitted allocation changes: a new hold's start, or the end it adds."""
        return a.end_ts_ns if self.known(a) and a.end_ts_ns is not None else a.ts_ns

    def take(self, a: Allocation) -> None:
        """Take an admitted allocation: a new hold, or the end of one."""
        gpu = a.gpu_uuid
        self._holds.setdefault(gpu, {})[a.allocation_id] = Hold.of(a)
        self._since[gpu] = min(self._since.get(gpu, a.ts_ns), a.ts_ns)
        self._den[gpu] = math.lcm(self._den.get(gpu, 1), a.fraction_den)

    def prune(self, gpu_uuid: str, floor_ns: int | None) -> None:
        """Drop the device's holds that ended at or before ``floor_ns`` (its watermark less the revision horizon and
        a pane: no pane they cover can be closed or revised any more), each to a tombstone. Idempotent, and the
        same whether run once against a watermark or at every step up to it (the tombstones kept are the latest
        ended either way), which is what lets the batch path run it once per batch."""
        holds = self._holds.get(gpu_uuid)
        if floor_ns is None or not holds:
            return
        if not any(h.end_ns is not None and h.end_ns <= floor_ns for h in holds.values()):
            return
        gone = self._gone.setdefault(gpu_uuid, {})
        for key, h in list(holds.items()):
            if h.end_ns is not None and h.end_ns <= floor_ns:
                gone[key] = h.end_ns
                del holds[key]
        if len(gone) > MAX_HOLDS:  # the earliest ended first: in event order, as everything here
            for key, _ in sorted(gone.items(), key=lambda item: (item[1], item[0]))[: len(gone) - MAX_HOLDS]:
                del gone[key]
        self._den[gpu_uuid] = math.lcm(1, *(h.den for h in holds.values()))

    def state_of(self, gpu_uuid: str, allocation_id: str) -> str | None:
        """What the device keeps of ``allocation_id``: ``open`` (a hold with no end yet), ``ended`` (a hold with its
        end, or its tombstone) or None (nothing: a new hold). The batch path asks it of the rows it may take on
        time (``gpucost.streams.columnar.revising_rows``)."""
        held = self._holds.get(gpu_uuid, {}).get(allocation_id)
        if held is not None:
            return "open" if held.end_ns is None else "ended"
        return "ended" if allocation_id in self._gone.get(gpu_uuid, {}) else None

    def has_room(self, gpu_uuid: str, holds: int, den: int) -> bool:
        """Whether the device takes ``holds`` new holds whose denominators' lcm is ``den`` without one of them being
        ``out_of_range``, whatever it drops before them (dropping only makes room)."""
        kept = self._holds.get(gpu_uuid, {})
        return len(kept) + holds <= MAX_HOLDS and math.lcm(self._den.get(gpu_uuid, 1), den) <= MAX_DENOMINATOR

    def since(self, gpu_uuid: str) -> int | None:
        """When the device's first hold began (None: it never had one)."""
        return self._since.get(gpu_uuid)

    def held(self, gpu_uuid: str) -> list[Hold]:
        """The device's holds, in the order they were taken."""
        return list(self._holds.get(gpu_uuid, {}).values())

    def holds(self, gpu_uuid: str, start_ns: int, end_ns: int) -> list[Hold]:
        """The device's holds that cover part of ``[start_ns, end_ns)``."""
        return [h for h in self._holds.get(gpu_uuid, {}).values() if h.overlap_ns(start_ns, end_ns) > 0]

    def drop(self, gpu_uuid: str) -> None:
        """Forget what a device gone silent (``GpuPanes.forget``) ended: its open holds stay, with when it came on
        this basis, since no pod released it; should it come back, its panes are split by them."""
        held = {k: h for k, h in self._holds.pop(gpu_uuid, {}).items() if h.end_ns is None}
        self._gone.pop(gpu_uuid, None)
        self._den.pop(gpu_uuid, None)
        if held:
            self._holds[gpu_uuid] = held
            self._den[gpu_uuid] = math.lcm(1, *(h.den for h in held.values()))
        else:
            self._since.pop(gpu_uuid, None)

    def to_state(self) -> dict[str, Any]:
        return {
            "holds": {
                gpu: {key: [*h[:5], list(h.tenant)] for key, h in holds.items()} for gpu, holds in self._holds.items()
            },
            "since": dict(self._since),
            "gone": {gpu: dict(gone) for gpu, gone in self._gone.items()},
        }

    @classmethod
    def from_state(cls, state: dict[str, Any], settings: AuditSettings) -> AllocationTable:
        table = cls()
        table._holds = {
            gpu: {key: Hold(h[0], h[1], h[2], h[3], h[4], Tenant.restored(h[5])) for key, h in holds.items()}
            for gpu, holds in state["holds"].items()
        }
        table._since = dict(state["since"])
        table._gone = {gpu: dict(gone) for gpu, gone in state.get("gone", {}).items()}
        table._den = {gpu: math.lcm(1, *(h.den for h in holds.values())) for gpu, holds in table._holds.items()}
        return table


class AllocationSplit:
    """The allocation basis on the pane-operator shape: its state is the table of holds it splits by."""

    def __init__(self, settings: AuditSettings) -> None:
        self.table = AllocationTable()

    def records(
        self,
        pane: PaneTotals,
        usd_per_gpu_hour: Decimal | None,
    ) -> list[AllocationRecord]:
        """The pane's allocation records (revision 0), ``unallocated`` first, then the tenants by key; none for a
        pane without covered time or before its device's first hold."""
        if not self._billed(pane.gpu_uuid, pane.pane_end_ns, pane.covered_ms):
            return []
        assert pane.node_id is not None and pane.gpu_model is not None
        return split(
            pane.gpu_uuid,
            pane.node_id,
            pane.gpu_model,
            pane.pane_start_ns,
            pane.pane_end_ns,
            pane.covered_ms,
            usd_per_gpu_hour,
            self.table.holds(pane.gpu_uuid, pane.pane_start_ns, pane.pane_end_ns),
        )

    def _billed(self, gpu_uuid: str, pane_end_ns: int, covered_ms: int) -> bool:
        return self._billed_since(self.table.since(gpu_uuid), pane_end_ns, covered_ms)

    @staticmethod
    def _billed_since(since: int | None, pane_end_ns: int, covered_ms: int) -> bool:
        """Whether a pane is split on the allocation basis: it has covered time and ends after its device's first
        hold (``since``) began."""
        return since is not None and since < pane_end_ns and covered_ms > 0

    def on_close(self, closing: Closing) -> list[Output]:
        return list(self.records(closing.pane, closing.price))

    def close_many(self, closing: ClosingMany) -> Emitted:
        """``on_close`` of each pane at once (``split_many_panes``): devices without holds (most, in a fleet that
        sends no allocations) cost one lookup a pane."""
        panes = closing.panes
        since = {gpu: self.table.since(gpu) for gpu in set(panes.gpu_uuid.tolist())}
        billed = np.array(
            [
                self._billed_since(since[gpu], end, covered)
                for gpu, end, covered in zip(
                    panes.gpu_uuid.tolist(), panes.pane_end_ns.tolist(), panes.covered_ms.tolist()
                )
            ],
            bool,
        )
        if not billed.any():
            return Emitted()
        held = {gpu: self.table.held(gpu) for gpu, start in since.items() if start is not None}
        table, prices, rows = split_many_panes(panes, billed, closing.prices, held)
        return Emitted("allocation", table, rows, {"usd_per_gpu_hour": prices})

    def to_state(self) -> dict[str, Any]:
        return self.table.to_state()

    @classmethod
    def from_state(cls, state: dict[str, Any], settings: AuditSettings) -> AllocationSplit:
        split_ = cls(settings)
        split_.table = AllocationTable.from_state(state, settings)
        return split_
