"""Hostile input, money and records: re-sent input, in the configuration users run (a 6 h revision horizon) and
with revisions off.

Re-sent input is a duplicate at any delay, never late data (docs/definitions.md, "Re-sent input"): two sends give
exactly the records, revisions and µ$ of one, on the Kafka worker (where each send ends with an end of input and
a second ``produce`` is a new producer session) and on the embedded operator's row and batch entries. Each check
compares against one clean send, recomputed by the same operator on the clean input, and per team by a
brute-force sum; the property test re-sends any suffix, at any point, after any number of ends of input.
Another node's GPU is in tests/test_hostile_gpu_claims.py, late bindings and addresses in
tests/test_hostile_lateness.py.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpucost.kafka.routing import Router
from gpucost.kafka.settings import KafkaSettings
from gpucost.kafka.worker import Worker
from gpucost.producers.simulate import FleetSpec, simulate
from gpucost.schemas.blocks import expand
from gpucost.schemas.codec import encode_event
from gpucost.schemas.records import CostRecord, DeadLetter, MaeRecord
from gpucost.schemas.topics import CONTROL_HEADER, END_OF_INPUT, SEQUENCE_HEADER
from gpucost.streams.audit import Auditor
from gpucost.streams.settings import AuditSettings
from tests.fake_kafka import Message
from tests.support.hostile import CONFIGS, apply, billed, letters, report
from tests.support.team_totals import by_team

__all__: list[str] = []


def _routed(spec: FleetSpec) -> dict[bytes, list[bytes]]:
    """A simulated fleet's input as the router keys it for the worker: each GPU's stream (its samples, traces,
    NUMA events, its node's bindings and the prices) and each process's addresses."""
    router, out = Router(), defaultdict(list)
    for ev in simulate(spec):
        for topic, key, routed in router.route(ev):
            if topic in ("events", "mem_access"):
                out[key.encode()].append(encode_event(routed).encode())
    return dict(out)


#: four GPUs of one node for an hour: 7 teams, half the jobs' bindings late (46 records revise), NUMA events,
#: and addresses enough for 20 MAE windows
FLEET = _routed(
    FleetSpec(
        gpus=4,
        hours=1.0,
        interval_s=10,
        seed=3,
        late_binding_fraction=0.5,
        late_binding_max_s=900,
        addresses_per_hour=6000,
    )
)
#: two GPUs for half an hour, for the property test: a late binding (6 records revise), a blas trace, NUMA
#: events and 3 MAE windows
SMALL = _routed(
    FleetSpec(
        gpus=2,
        hours=0.5,
        interval_s=10,
        seed=0,
        late_binding_fraction=0.5,
        late_binding_max_s=600,
        addresses_per_hour=12_000,
    )
)


def records(out: list) -> list[str]:
    """Everything published but the dead letters, each as its JSON, sorted: a multiset to compare."""
    return sorted(r.model_dump_json() for r in out if not isinstance(r, DeadLetter))


def sessions(inputs: dict[bytes, list[bytes]], sends: list[dict[bytes, list[bytes]]]) -> list[Message]:
    """Each send as a producer session of its own (its own sequence numbers), every key ended at its end."""
    messages: list[Message] = []
    for n, send in enumerate(sends):
        for key in inputs:
            if send.get(key):
                messages.append(
                    Message(key, b"\n".join(send[key]), len(messages), [(SEQUENCE_HEADER, f"session{n}:1".encode())])
                )
            messages.append(
                Message(
                    key,
                    b"",
                    len(messages),
                    [(CONTROL_HEADER, END_OF_INPUT), (SEQUENCE_HEADER, f"session{n}:2".encode())],
                )
            )
    return messages


@CONFIGS
def test_an_input_produced_twice_gives_the_records_of_one(audit: AuditSettings) -> None:
    """Two `produce` runs of one file billed every team twice over revisions 1-4 (a re-sent binding met the empty
    binding table of the key's successor, was taken as new, and moved every logged pane of its process) and
    wrote every MAE window twice. Now the second send changes no record, revision or µ$, whatever its kind."""
    once, _ = apply(Worker(KafkaSettings(), audit, group="g"), sessions(FLEET, [FLEET]))
    twice, _ = apply(Worker(KafkaSettings(), audit, group="g"), sessions(FLEET, [FLEET, FLEET]))
    assert not audit.revision_horizon_s or any(isinstance(r, CostRecord) and r.revision > 0 for r in once)
    assert sum(isinstance(r, MaeRecord) for r in once) >= 4
    report(
        "the same fleet produced twice",
        2 * sum(map(len, FLEET.values())),
        letters(twice),
        billed(twice),
        billed(once),
        audit,
    )
    assert by_team(twice) == by_team(once)
    assert records(twice) == records(once)
    refused = Counter(d.reason for d in letters(twice)) - Counter(d.reason for d in letters(once))
    assert set(refused) <= {"duplicate", "late"} and refused.total() >= sum(map(len, FLEET.values())) - 10


@CONFIGS
@pytest.mark.parametrize("entry", ["row", "batch"])
def test_the_embedded_replay_of_one_input_twice_gives_the_records_of_one(audit: AuditSettings, entry: str) -> None:
    """A replay of the same events twice wrote 9 MAE windows for 5: addresses had no duplicate check."""
    lines = [line for key in FLEET for line in FLEET[key]]

    def run(data: list[bytes]) -> list:
        auditor = Auditor(audit)
        if entry == "row":
            return [o for i, line in enumerate(data) for o in auditor.ingest(line, str(i))] + auditor.finish()
        return expand(auditor.ingest_lines(data, str)) + auditor.finish()

    once, twice = run(lines), run(lines + lines)
    report(
        f"one input replayed twice ({entry} entry)", 2 * len(lines), letters(twice), billed(twice), billed(once), audit
    )
    assert records(twice) == records(once) and by_team(twice) == by_team(once)
    refused = Counter(d.reason for d in letters(twice)) - Counter(d.reason for d in letters(once))
    assert set(refused) <= {"duplicate", "late"} and refused.total() == len(lines)  # every line of the second copy


@pytest.mark.slow
@CONFIGS
@settings(max_examples=25, deadline=None)
@given(st.data())
def test_resending_any_suffix_at_any_point_changes_nothing(audit: AuditSettings, data: st.DataObject) -> None:
    """Property, on the worker and on both operator entries: send a prefix, send again any suffix of it, send the
    rest, end the input, then any number of times send again any suffix of the whole and end it: the records are
    those of one send."""
    keys = list(SMALL)
    cut = {k: data.draw(st.integers(0, len(SMALL[k])), label=f"cut {k!r}") for k in keys}
    back = {k: data.draw(st.integers(0, cut[k]), label=f"resend from {k!r}") for k in keys}
    later = data.draw(st.lists(st.fixed_dictionaries({k: st.integers(0, len(SMALL[k])) for k in keys}), max_size=2))
    first = {k: SMALL[k][: cut[k]] + SMALL[k][back[k] : cut[k]] + SMALL[k][cut[k] :] for k in keys}
    again = [{k: SMALL[k][at[k] :] for k in keys} for at in later]

    want, _ = apply(Worker(KafkaSettings(), audit, group="g"), sessions(SMALL, [SMALL]))
    got, _ = apply(Worker(KafkaSettings(), audit, group="g"), sessions(SMALL, [first, *again]))
    assert records(got) == records(want)
    for entry in ("row", "batch"):
        outputs = []
        for key in keys:  # one auditor per key, as the worker keeps them, ended and succeeded as it does
            auditor = Auditor(audit)
            for send in [first, *again]:
                lines = send[key]
                outputs += (
                    [o for i, line in enumerate(lines) for o in auditor.ingest(line, str(i))]
                    if entry == "row"
                    else expand(auditor.ingest_lines(lines, str))
                )
                outputs += auditor.finish()
                auditor = auditor.successor()
        assert records(outputs) == records(want), entry
