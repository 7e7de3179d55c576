"""The allocation basis (docs/definitions.md, "Allocation basis"): each pane's cost split by what tenants held,
recomputed here by brute force with exact fractions from the allocation events alone, on the row and the batch
path, in the default configuration (revisions on), whatever order the allocations and their ends arrive in."""

from __future__ import annotations

import random
from collections import defaultdict
from fractions import Fraction

import pytest

from gpucost.schemas.blocks import expand
from gpucost.schemas.codec import encode_event
from gpucost.schemas.events import SHARING_MODES, Allocation, Event, GpuSample, Price
from gpucost.schemas.records import AllocationRecord, CostRecord, DeadLetter, Output
from gpucost.streams.audit import Auditor
from gpucost.streams.settings import AuditSettings
from tests.support.batch_path import closing_at
from tests.support.split import largest_remainder

NS = 10**9
PANE_NS = 60 * NS
T0 = 1_750_000_020 * NS - (1_750_000_020 * NS) % PANE_NS
TEAMS = ("search", "ads", "vision", "nlp")


def fleet(seed: int, gpus: int = 3, minutes: int = 40) -> tuple[list[Event], list[Allocation]]:
    """Samples every 10 s of ``gpus`` devices for ``minutes`` (some of them late), and random holds on them (whole
    devices, MPS percentages, time-slicing replicas, HAMi cores; some still held at the end), each hold's start and
    end sent as two events at random places in the arrival order, some of them long after their time: events in
    arrival order, and the final allocations."""
    rng = random.Random(seed)
    events: list[Event] = [Price(gpu_model="M", ts_ns=T0 - 3600 * NS, usd_per_gpu_hour="2.718281")]
    for k in range(minutes * 6):
        for g in range(gpus):
            events.append(
                GpuSample(
                    node_id="n1",
                    gpu_uuid=f"GPU-{g}",
                    gpu_model="M",
                    ts_ns=T0 + k * 10 * NS + g * 1000,
                    interval_s=10.0,
                    sm_util_pct=rng.uniform(0, 100),
                    mem_bw_util_pct=rng.uniform(0, 100),
                    power_w=100,
                    mem_used_bytes=1,
                    mem_total_bytes=2,
                    temp_c=40,
                )
            )
    for _ in range(len(events) // 40):  # some samples arrive minutes late: their closed panes' cost C is revised
        at = rng.randrange(1, len(events))
        events.insert(min(len(events), at + rng.randrange(30, 300)), events.pop(at))
    final: list[Allocation] = []
    for i in range(rng.randint(4, 12)):
        sharing = rng.choice(SHARING_MODES)
        num, den = {
            "exclusive": (1, 1),
            "mig": (1, 1),
            "mps": (rng.randint(1, 100), 100),
            "time_slicing": (1, rng.randint(2, 7)),
            "hami": (rng.randint(1, 100), 100),
        }[sharing]
        start = T0 + rng.randrange(0, minutes * 60) * NS + rng.randrange(NS)
        end = None if rng.random() < 0.3 else start + rng.randrange(1, 20 * 60) * NS
        hold = dict(
            node_id="n1",
            gpu_uuid=f"GPU-{rng.randrange(gpus)}",
            allocation_id=f"pod-{i}",
            ts_ns=start,
            sharing=sharing,
            fraction_num=num,
            fraction_den=den,
            team=rng.choice(TEAMS),
            env=rng.choice(("prod", None, "")),  # "" and None: one tenant key, one party
        )
        final.append(Allocation(**hold, end_ts_ns=end))
        at = rng.randrange(len(events) + 1)
        events.insert(at, Allocation(**hold))
        if end is not None:
            events.insert(rng.randrange(at + 1, len(events) + 1), final[-1])
    return events, final


def by_rows(events: list[Event], s: AuditSettings) -> list[Output]:
    auditor = Auditor(s)
    out = [r for e in events for r in auditor.update(e)]
    return out + auditor.finish()


def by_batches(events: list[Event], s: AuditSettings, seed: int) -> list[Output]:
    auditor, rng, out, lo = Auditor(s), random.Random(seed), [], 0
    lines = [encode_event(e).encode() for e in events]
    with closing_at(0):
        while lo < len(lines):
            hi = lo + rng.randint(1, 400)
            out += expand(auditor.ingest_lines(lines[lo:hi], lambda i: "test"))
            lo = hi
    return out + auditor.finish()


def recomputed(final: list[Allocation], pane_costs: dict[tuple[str, int], int]) -> dict[tuple[str, int, str], int]:
    """Each (device, pane, party)'s µ$ on the allocation basis, from the final holds and each pane's cost."""
    out: dict[tuple[str, int, str], int] = {}
    for (gpu, start), cost in pane_costs.items():
        holds = [a for a in final if a.gpu_uuid == gpu]
        if not holds or min(a.ts_ns for a in holds) >= start + PANE_NS:
            continue
        held: dict[str, Fraction] = defaultdict(Fraction)
        for a in holds:
            end = start + PANE_NS if a.end_ts_ns is None else min(start + PANE_NS, a.end_ts_ns)
            overlap = end - max(start, a.ts_ns)
            if overlap > 0:
                key = ":".join(v or "" for v in (a.team, a.env, None, None, None, None, None))
                held[key] += Fraction(a.fraction_num, a.fraction_den) * overlap
        keys = sorted(held)
        free = max(Fraction(PANE_NS), sum(held.values())) - sum(held.values())
        for key, share in zip(["unallocated", *keys], largest_remainder(cost, [free, *(held[k] for k in keys)])):
            out[(gpu, start, key)] = share
    return out


def summed(out: list[Output]) -> dict[tuple[str, int, str], int]:
    total: dict[tuple[str, int, str], int] = defaultdict(int)
    for r in out:
        if isinstance(r, AllocationRecord):
            total[(r.gpu_uuid, r.pane_start_ns, r.tenant_key)] += r.cost_micro_usd
    return dict(total)


def pane_costs(out: list[Output]) -> dict[tuple[str, int], int]:
    """Each pane's cost C as the usage basis last published it."""
    latest: dict[tuple[str, int], tuple[int, int]] = {}
    for r in out:
        if isinstance(r, CostRecord):
            key = (r.gpu_uuid, r.pane_start_ns)
            if r.revision >= latest.get(key, (-1, 0))[0]:
                latest[key] = (r.revision, r.pane_cost_micro_usd)
    return {k: c for k, (_, c) in latest.items()}


@pytest.mark.parametrize("seed", range(12))
def test_the_allocation_basis_equals_a_brute_force_split_of_each_pane_on_both_paths(seed: int) -> None:
    events, final = fleet(seed)
    s = AuditSettings()  # the default configuration: a 6 h revision horizon
    rows = by_rows(events, s)
    assert not [r for r in rows if isinstance(r, DeadLetter)]
    got = summed(rows)
    want = recomputed(final, pane_costs(rows))
    assert {k: v for k, v in got.items() if v} == {k: v for k, v in want.items() if v}
    assert {k for k, v in got.items() if v == 0} >= {k for k, v in want.items() if v == 0} - got.keys()
    # Σ parties = C for every pane, on both bases, and every record's pane cost is the usage basis's own
    per_pane: dict[tuple[str, int], int] = defaultdict(int)
    for (gpu, start, _), v in got.items():
        per_pane[(gpu, start)] += v
    assert per_pane == {k: c for k, c in pane_costs(rows).items() if k in per_pane}
    allocated = [r for r in rows if isinstance(r, AllocationRecord)]
    assert {r.record_id for r in allocated}.isdisjoint(r.record_id for r in rows if isinstance(r, CostRecord))
    assert len({r.record_id for r in allocated}) == len(allocated)
    # the batch path: the same records, in the same order
    assert [r for r in by_batches(events, s, seed) if isinstance(r, AllocationRecord)] == allocated


@pytest.mark.parametrize("seed", range(6))
def test_every_revision_of_a_pane_sums_to_its_cost(seed: int) -> None:
    """Σ of a pane's records through each revision = its cost as of that revision: a late hold or end moves µ$
    between parties and never adds or loses one."""
    rows = by_rows(fleet(seed)[0], AuditSettings())
    records: dict[tuple[str, int], list[AllocationRecord]] = defaultdict(list)
    for r in rows:
        if isinstance(r, AllocationRecord):
            records[(r.gpu_uuid, r.pane_start_ns)].append(r)
    revised = 0
    for pane in records.values():
        for rev in sorted({r.revision for r in pane}):
            through = [r for r in pane if r.revision <= rev]
            assert sum(r.cost_micro_usd for r in through) == max(through, key=lambda r: r.revision).pane_cost_micro_usd
            revised += rev > 0
    assert revised, "no late allocation revised a pane: the test would not see a revision go wrong"


def test_a_resent_or_contradicting_allocation_is_dead_lettered_and_changes_nothing() -> None:
    events, _ = fleet(3)
    hold = next(e for e in events if isinstance(e, Allocation))
    s = AuditSettings()
    clean = by_rows(events, s)
    hostile = [*events, hold, hold.model_copy(update={"fraction_num": 1, "fraction_den": 3, "sharing": "mps"})]
    ended = hold.model_copy(update={"end_ts_ns": hold.ts_ns + 5 * NS})
    hostile += [ended, ended.model_copy(update={"end_ts_ns": hold.ts_ns + 7 * NS})]
    out = by_rows(hostile, s)
    letters = [r for r in out if isinstance(r, DeadLetter)]
    reasons = [r.reason for r in letters]
    final_end = next(
        (
            e.end_ts_ns
            for e in events
            if isinstance(e, Allocation) and e.allocation_id == hold.allocation_id and e.end_ts_ns
        ),
        None,
    )
    if final_end is None:
        # the hold had no end: the first end is taken (a revision), the second contradicts it
        assert reasons == ["duplicate", "conflict", "conflict"]
    else:
        assert reasons == ["duplicate", "conflict", "conflict", "conflict"]
        assert summed(out) == summed(clean)
    assert all(hold.allocation_id in r.detail for r in letters)


def test_a_hold_wholly_in_panes_closed_beyond_the_horizon_is_late() -> None:
    s = AuditSettings(revision_horizon_s=0)
    events, _ = fleet(5, minutes=30)
    late = Allocation(
        node_id="n1", gpu_uuid="GPU-0", allocation_id="old", ts_ns=T0, end_ts_ns=T0 + 120 * NS, team="ads"
    )
    out = by_rows([*events, late], s)
    assert [r.reason for r in out if isinstance(r, DeadLetter) and "'old'" in r.detail] == ["late"]
    assert summed(out) == summed(by_rows(events, s))
    # with the default horizon the same hold revises the panes it covers
    out = by_rows([*events, late], AuditSettings())
    assert not [r for r in out if isinstance(r, DeadLetter)]
    assert any(isinstance(r, AllocationRecord) and r.team == "ads" and r.revision > 0 for r in out)


def test_a_snapshot_keeps_the_holds() -> None:
    import json

    events, _ = fleet(7)
    s = AuditSettings()
    whole = by_rows(events, s)
    first, out = Auditor(s), []
    half = len(events) // 2
    for e in events[:half]:
        out += first.update(e)
    second = Auditor.from_state(json.loads(json.dumps(first.to_state())), s)
    for e in events[half:]:
        out += second.update(e)
    out += second.finish()
    assert [r for r in out if isinstance(r, AllocationRecord)] == [r for r in whole if isinstance(r, AllocationRecord)]


def test_holds_from_a_state_before_the_one_form_read_back_as_one_tenant() -> None:
    """Holds written before tenants had one form (an allocation's ``env`` left out: None; another's ``""``) read
    back as one tenant, so their pane's split has one party for the key, not two records of one id."""
    from gpucost.streams.allocations import AllocationTable

    holds = {
        f"pod-{i}": [T0, None, 1, 2, "time_slicing", ["a", env, None, None, None, "", None, None]]
        for i, env in enumerate((None, ""))
    }
    table = AllocationTable.from_state({"holds": {"GPU-0": holds}, "since": {"GPU-0": T0}, "gone": {}}, AuditSettings())
    tenants = {tuple(h[5]) for h in table.to_state()["holds"]["GPU-0"].values()}
    assert tenants == {("a", "", "", "", None, None, None, None)}
