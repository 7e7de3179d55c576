"""One check suite over every operator on events (``gpucost.streams.operator.EventOperator``), taken from the
auditor's own list (``Auditor.event_operators``), so an operator added there fails here until it is given the
kinds it owns:

- ``admit`` changes nothing: the state is the same before and after it, whatever it answers;
- re-sent input is idempotent: an event taken once and sent again is refused, or changes nothing;
- snapshot → JSON → restore at any event, then the rest, gives what the uninterrupted run gives (the same
  verdicts, the same outputs of ``take``, the same state).

Each operator is fed the events of its kinds from one generated fleet's stream (``tests.strategies.streams``:
re-sends, delays and clock jumps included), its row entry as the auditor drives it. The batch entries are held
to these row entries in tests/test_operator_entries.py and tests/test_columnar.py.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from gpucost.schemas.events import (
    TENANT_FIELDS,
    Allocation,
    EbpfTrace,
    Event,
    GpuSample,
    MemAccess,
    NumaEvent,
    Price,
    ProcessSample,
    TenantBinding,
)
from gpucost.schemas.kernels import KernelActivity
from gpucost.streams.allocations import AllocationTable
from gpucost.streams.audit import Auditor
from gpucost.streams.kernel_log import KernelLog
from gpucost.streams.mae import Mae
from gpucost.streams.operator import EventOperator
from gpucost.streams.pane_totals import PaneColumns
from gpucost.streams.panes import GpuPanes
from gpucost.streams.revisions import Revisions
from gpucost.streams.settings import AuditSettings
from gpucost.streams.tables import BindingTable, PriceTable, Tenant
from tests.strategies import settings_st, streams

#: the event kinds each operator owns (the auditor routes them so)
KINDS: dict[type, tuple[type[Event], ...]] = {
    GpuPanes: (GpuSample, ProcessSample, NumaEvent, EbpfTrace),
    Mae: (MemAccess,),
    Revisions: (GpuSample, ProcessSample, NumaEvent),
    BindingTable: (TenantBinding,),
    PriceTable: (Price,),
    AllocationTable: (Allocation,),
    KernelLog: (KernelActivity,),
}


def tenant_of(pid: int) -> Tenant:
    """A tenant for a process sample or NUMA event, as the auditor's binding lookup would give one."""
    return Tenant.canonical(f"team-{pid % 3}" if f == "team" else None for f in TENANT_FIELDS)


def feed(operator: Any, event: Event) -> tuple[str, Any]:
    """The row entry as the auditor drives it: a late GPU-keyed event never reaches ``admit``; an admitted
    one is taken (with its tenant, for the panes), and the panes' watermark moved (what closes is the output)."""
    if isinstance(operator, GpuPanes) and operator.is_late(event.gpu_uuid, event.ts_ns):  # type: ignore[union-attr]
        return "late", None
    why = operator.admit(event)
    if why is not None:
        return why, None
    if isinstance(operator, GpuPanes):
        operator.take(event, tenant_of(event.pid) if isinstance(event, (ProcessSample, NumaEvent)) else tenant_of(0))
        if isinstance(event, EbpfTrace):
            return "taken", None
        return "taken", comparable(operator.advance(event.gpu_uuid, event.ts_ns))
    return "taken", comparable(operator.take(event))


def comparable(out: Any) -> Any:
    """An output as plain data (closed panes as their columns' lists; records as their dumps)."""
    if isinstance(out, list) and out and hasattr(out[0], "pane_start_ns") and hasattr(out[0], "tenants"):
        columns = PaneColumns.of(out)
        return {name: repr(getattr(columns, name).tolist()) for name in sorted(vars(columns))}
    if hasattr(out, "model_dump"):
        return out.model_dump()
    return out


def state(operator: Any) -> str:
    return json.dumps(operator.to_state(), sort_keys=True, default=str)


def operators(settings: AuditSettings) -> list[EventOperator[Any]]:
    return Auditor(settings).event_operators


def fresh(cls: type, settings: AuditSettings) -> Any:
    """A new operator of the auditor's, of class ``cls``."""
    return next(o for o in operators(settings) if type(o) is cls)


@st.composite
def cases(draw: st.DrawFn) -> tuple[AuditSettings, list[Event]]:
    """A fleet's stream, and bindings sent again later unchanged (a source that re-sends a pod's binding at
    every scrape): the table keeps those as repeats, which its snapshot must carry."""
    events = draw(streams(max_span_s=1800))
    bindings = [e for e in events if isinstance(e, TenantBinding)]
    for b in draw(st.lists(st.sampled_from(bindings), max_size=4)) if bindings else []:
        later = b.model_copy(update={"ts_ns": b.ts_ns + draw(st.integers(1, 600)) * 10**9})
        events.insert(draw(st.integers(0, len(events))), later)
    return draw(settings_st(revisions=True)), events


def test_every_operator_the_auditor_routes_events_to_is_checked_here() -> None:
    assert sorted(type(o).__name__ for o in operators(AuditSettings())) == sorted(k.__name__ for k in KINDS)


@given(cases(), st.data())
def test_admit_changes_nothing_and_input_sent_again_is_refused_or_changes_nothing(case, data) -> None:
    settings, events = case
    for operator in operators(settings):
        mine = [e for e in events if isinstance(e, KINDS[type(operator)])]
        for event in mine:
            before = state(operator)
            operator.admit(event)
            assert state(operator) == before, f"{type(operator).__name__}.admit changed the state"
            if feed(operator, event)[0] != "taken":
                continue
            taken = state(operator)
            again, _ = feed(operator, event)
            assert again != "taken" or state(operator) == taken, f"{type(operator).__name__} took {event} twice"


@given(cases(), st.data())
def test_snapshot_then_restore_then_the_rest_gives_the_uninterrupted_run(case, data) -> None:
    settings, events = case
    for operator in operators(settings):
        mine = [e for e in events if isinstance(e, KINDS[type(operator)])]
        at = data.draw(st.integers(0, len(mine)), label=type(operator).__name__)
        whole = [feed(operator, e) for e in mine]
        first = fresh(type(operator), settings)
        head = [feed(first, e) for e in mine[:at]]
        snapshot = json.loads(json.dumps(first.to_state()))
        restored = type(operator).from_state(snapshot, settings)  # type: ignore[attr-defined]
        assert state(restored) == state(first)
        tail = [feed(restored, e) for e in mine[at:]]
        assert head + tail == whole
        assert state(restored) == state(operator)
