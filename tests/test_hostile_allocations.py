"""Allocations a hostile or broken producer sends (docs/definitions.md, "Allocation basis"): denominators whose
common multiple would outgrow the records' 38-digit integers, and hold after hold on one device. Each is refused
with a reason that says what to send, in the default configuration; what was taken still adds up to each pane's
cost."""

from __future__ import annotations

import json

import pytest

from gpucost.schemas.events import Allocation, Event, Price
from gpucost.schemas.records import AllocationRecord, DeadLetter, Output
from gpucost.streams import allocations
from gpucost.streams.audit import Auditor
from gpucost.streams.settings import AuditSettings
from tests.support.allocations import steady

NS = 10**9
T0 = 1_750_000_020 * NS - (1_750_000_020 * NS) % (60 * NS)
#: primes just under 10^6: any two have a common multiple under 10^12, any three one past it
PRIMES = (999_983, 999_979, 999_961)


def samples(minutes: int = 5) -> list[Event]:
    return [
        Price(gpu_model="M", ts_ns=T0 - 3600 * NS, usd_per_gpu_hour="3.141592"),
        *(steady("GPU-0", T0 + k * 10 * NS) for k in range(minutes * 6)),
    ]


def hold(i: int, den: int = 4) -> Allocation:
    return Allocation(
        node_id="n1",
        gpu_uuid="GPU-0",
        allocation_id=f"pod-{i}",
        ts_ns=T0 + i,
        fraction_num=1,
        fraction_den=den,
        sharing="mps",
        team="ads",
    )


def run(events: list[Event]) -> list[Output]:
    auditor = Auditor(AuditSettings())
    out = [r for e in events for r in auditor.update(e)]
    return out + auditor.finish()


def test_a_denominator_that_would_outgrow_the_records_is_refused_and_the_rest_adds_up() -> None:
    out = run([*(hold(i, p) for i, p in enumerate(PRIMES)), *samples()])
    letters = [r for r in out if isinstance(r, DeadLetter)]
    assert [(r.reason, json.loads(r.raw)["allocation_id"]) for r in letters] == [("out_of_range", "pod-2")]
    assert "common denominator" in letters[0].detail and "100 for percentages" in letters[0].detail
    records = [r for r in out if isinstance(r, AllocationRecord)]
    assert records and max(r.capacity_num for r in records) < 10**38
    panes: dict[int, list[AllocationRecord]] = {}
    for r in records:
        panes.setdefault(r.pane_start_ns, []).append(r)
    assert all(sum(r.cost_micro_usd for r in rs) == rs[0].pane_cost_micro_usd for rs in panes.values())
    assert all(r.allocations == 2 for r in records if r.team == "ads")


def test_hold_after_hold_on_one_device_stops_at_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allocations, "MAX_HOLDS", 5)
    out = run([*(hold(i) for i in range(8)), *samples(2)])
    assert [r.reason for r in out if isinstance(r, DeadLetter)] == ["out_of_range"] * 3
    assert {r.allocations for r in out if isinstance(r, AllocationRecord) and r.team == "ads"} == {5}
    # an end of a hold already taken is still taken at the bound: the bound is on new holds
    ended = hold(0).model_copy(update={"end_ts_ns": T0 + 30 * NS})
    out = run([*(hold(i) for i in range(5)), ended, *samples(2)])
    assert not [r for r in out if isinstance(r, DeadLetter)]


def test_the_bound_on_denominators_survives_a_snapshot() -> None:
    """The device's common denominator is restored with its holds: after a restore the same hold is refused."""
    first = Auditor(AuditSettings())
    for e in (hold(0, PRIMES[0]), hold(1, PRIMES[1])):
        assert first.update(e) == []
    again = Auditor.from_state(json.loads(json.dumps(first.to_state())), AuditSettings())
    assert [r.reason for r in again.update(hold(2, PRIMES[2])) if isinstance(r, DeadLetter)] == ["out_of_range"]


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"end_ts_ns": T0}, "must be after ts_ns"),
        ({"fraction_num": 3, "fraction_den": 2}, "more than the whole device"),
        ({"sharing": "exclusive", "fraction_num": 1, "fraction_den": 2}, "send the fraction with mps"),
        ({"sharing": "mig", "fraction_num": 3, "fraction_den": 7}, "a MIG instance is a device of its own"),
        ({"team": "unallocated"}, "reserved"),
        ({"team": "Unаllocated"}, "reserved"),  # a Cyrillic а: reads as the reserved name
        ({"fraction_den": 0}, "fraction_den"),
    ],
)
def test_an_allocation_that_cannot_be_true_is_invalid_and_says_what_to_send(change: dict, says: str) -> None:
    line = json.dumps({**hold(0).to_wire(), "ts_ns": T0 + 1, **change})
    (letter,) = Auditor(AuditSettings()).ingest(line, "f:1")
    assert isinstance(letter, DeadLetter) and letter.reason in ("invalid", "out_of_range") and says in letter.detail


def test_a_conflict_names_what_it_contradicts_and_a_second_end_keeps_the_first() -> None:
    first, ended = hold(0), hold(0).model_copy(update={"end_ts_ns": T0 + 60 * NS})
    sent = [first, ended, first.model_copy(update={"fraction_num": 3}), ended.model_copy(update={"team": "nlp"})]
    sent.append(ended.model_copy(update={"end_ts_ns": T0 + 90 * NS}))
    letters = [r for r in run([*sent, *samples(3)]) if isinstance(r, DeadLetter)]
    assert [r.reason for r in letters] == ["conflict"] * 3
    assert "its fraction is 3/4, taken as 1/4" in letters[0].detail
    assert "its tenant is nlp::::::, taken as ads::::::" in letters[1].detail
    assert (
        f"it already ended at ts_ns {T0 + 60 * NS}" in letters[2].detail and "the first end stays" in letters[2].detail
    )
