"""Hostile input, money and records: re-sent input, another node's GPU, late bindings, in the configuration users
run (a 6 h revision horizon) and with revisions off.

Re-sent input is a duplicate at any delay, never late data (docs/definitions.md, "Re-sent input"): two sends give
exactly the records, revisions and µ$ of one, on the Kafka worker (where each send ends with an end of input and
a second ``produce`` is a new producer session) and on the embedded operator's row and batch entries. Each check
compares against one clean send, recomputed by the same operator on the clean input, and per team by a
brute-force sum; the property test re-sends any suffix, at any point, after any number of ends of input.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpucost.kafka.routing import Router
from gpucost.kafka.settings import KafkaSettings
from gpucost.kafka.signing import Keyring
from gpucost.kafka.worker import Worker
from gpucost.producers.simulate import FleetSpec, simulate
from gpucost.schemas.blocks import expand
from gpucost.schemas.codec import encode_event
from gpucost.schemas.records import CostRecord, DeadLetter, MaeRecord
from gpucost.schemas.topics import CONTROL_HEADER, END_OF_INPUT, SEQUENCE_HEADER
from gpucost.streams.audit import Auditor
from gpucost.streams.settings import AuditSettings
from tests.conftest import HOSTILE_LINES, horizon_label
from tests.fake_kafka import Message
from tests.support.hostile import (
    CONFIGS,
    KEY,
    KEYRING,
    SECRET_A,
    SECRET_B,
    apply,
    billed,
    letters,
    report,
    sign_prices,
    signed,
)
from tests.support.worker_input import LINES

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


def by_team(out: list) -> dict[str, int]:
    """µ$ per team, summed over every cost record and revision by hand (what a billing consumer sums)."""
    teams: Counter[str] = Counter()
    for r in out:
        if isinstance(r, CostRecord):
            teams[r.team] += r.cost_micro_usd
    return dict(teams)


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


@CONFIGS
def test_a_node_key_cannot_take_another_nodes_gpu_with_a_message_that_names_no_node(
    audit: AuditSettings, tmp_path: Path
) -> None:
    """node-001's key signed a price-only message on a node-000 GPU's key first: the first key limited to one node
    that signed a message of a GPU made that node its owner, and node-000's own events were then refused as
    ``wrong_key`` (its bill lost). A message naming no node of its key now establishes nothing."""
    (tmp_path / "ring").write_text(KEYRING)
    lines = sign_prices(LINES[KEY])
    price = next(line for line in lines if b'"price"' in line)
    worker = Worker(KafkaSettings(), audit, group="g", keyring=Keyring(tmp_path / "ring"))
    out, owned = apply(
        worker,
        [
            signed(KEY, price, SECRET_B, "node-b"),  # a signed price relayed by node-001, on node-000's GPU
            signed(KEY, b"\n".join(lines), SECRET_A, "node-a", offset=1),
            signed(KEY, b"", SECRET_A, "node-a", [(CONTROL_HEADER, END_OF_INPUT)], offset=2),
        ],
    )
    auditor = Auditor(audit)
    want = sum(
        r.cost_micro_usd
        for r in expand(auditor.ingest_lines(lines, str)) + auditor.finish()
        if isinstance(r, CostRecord)
    )
    report("another node's price-only message first", len(lines) + 1, letters(out), billed(out), want, audit)
    assert "wrong_key" not in {d.reason for d in letters(out)}
    assert owned.owners == {KEY.decode(): "node-000"} and billed(out) == want


@CONFIGS
def test_a_nodes_binding_only_first_message_claims_its_gpu(audit: AuditSettings, tmp_path: Path) -> None:
    """node-000's first message on its GPU's key held only bindings (they name node-000, as the router copies them
    to its GPUs' keys): it established nothing, so node-001's key could then claim the GPU with a sample naming
    itself, and node-000's own events were refused as ``wrong_key``. A binding naming the signer's node claims."""
    (tmp_path / "ring").write_text(KEYRING)
    lines = sign_prices(LINES[KEY])
    bindings = [line for line in lines if b'"tenant_binding"' in line]
    rest = [line for line in lines if b'"tenant_binding"' not in line]
    foreign = next(line for line in rest if b'"process_sample"' in line).replace(b"node-000", b"node-001")
    worker = Worker(KafkaSettings(), audit, group="g", keyring=Keyring(tmp_path / "ring"))
    out, owned = apply(
        worker,
        [
            signed(KEY, b"\n".join(bindings), SECRET_A, "node-a"),
            signed(KEY, foreign, SECRET_B, "node-b", offset=1),  # node-001 names itself on node-000's GPU
            signed(KEY, b"\n".join(rest), SECRET_A, "node-a", offset=2),
            signed(KEY, b"", SECRET_A, "node-a", [(CONTROL_HEADER, END_OF_INPUT)], offset=3),
        ],
    )
    auditor = Auditor(audit)
    want = sum(
        r.cost_micro_usd
        for r in expand(auditor.ingest_lines(bindings + rest, str)) + auditor.finish()
        if isinstance(r, CostRecord)
    )
    report("a foreign node after a binding-only message", len(lines) + 1, letters(out), billed(out), want, audit)
    assert [d.reason for d in letters(out)] == ["wrong_key"] and json.loads(letters(out)[0].raw)[
        "node_id"
    ] == "node-001"
    assert owned.owners == {KEY.decode(): "node-000"} and billed(out) == want


def _fleet_of_one(running: bool) -> list[bytes]:
    """A GPU sampled every 10 s for 8 h, process 7 on it for the first hour (or all along, ``running``)."""
    t0 = 1_767_571_200 * 10**9
    lines = [
        json.dumps({"kind": "price", "gpu_model": "H100", "ts_ns": t0 - 10**9, "usd_per_gpu_hour": "2.5"}).encode()
    ]
    for k in range(8 * 360):
        ts = t0 + k * 10 * 10**9
        lines.append(
            json.dumps(
                {
                    "kind": "gpu_sample",
                    "node_id": "n",
                    "gpu_uuid": "GPU-1",
                    "gpu_model": "H100",
                    "ts_ns": ts,
                    "interval_s": 10,
                    "sm_util_pct": 50,
                    "mem_bw_util_pct": 1,
                    "mem_used_bytes": 1,
                    "mem_total_bytes": 2,
                    "power_w": 1,
                    "temp_c": 1,
                }
            ).encode()
        )
        if running or k < 360:
            lines.append(
                json.dumps(
                    {
                        "kind": "process_sample",
                        "node_id": "n",
                        "gpu_uuid": "GPU-1",
                        "pid": 7,
                        "ts_ns": ts + 1,
                        "interval_s": 10,
                        "sm_util_pct": 50,
                        "mem_bw_util_pct": 1,
                        "mem_used_bytes": 1,
                    }
                ).encode()
            )
    return lines


def _binding_line(lines: list[bytes], behind_s: int, team: str = "ml") -> bytes:
    """Process 7's binding to ``team``, stamped ``behind_s`` before the last event of ``lines``."""
    last = max(json.loads(line)["ts_ns"] for line in lines)
    return json.dumps(
        {
            "kind": "tenant_binding",
            "node_id": "n",
            "pid": 7,
            "ts_ns": last - behind_s * 10**9,
            "team": team,
            "env": "",
            "app": "",
            "tier": "",
            "sla": "Gold",
        }
    ).encode()


@CONFIGS
def test_a_binding_reaching_only_panes_beyond_the_horizon_is_dead_lettered_late(audit: AuditSettings) -> None:
    """The process ran only in the first hour and was bound to ``ops`` half an hour in; a binding to ``ml`` from
    its start arrives 7 h later. The span it governs (until ``ops``) lies beyond the horizon (R = 6 h, or 0). It
    was taken and counted ``binding_past_horizon``; the contract dead-letters it ``late``, with its payload, and
    it changes nothing."""
    lines = _fleet_of_one(running=False)
    lines.insert(1, _binding_line(lines, 7 * 3600 + 1800 - 30, team="ops"))  # on time, half an hour in
    auditor = Auditor(audit)
    out = expand(auditor.ingest_lines(lines, str)) + auditor.ingest(_binding_line(lines, 8 * 3600 - 30), "b")
    late = [d for d in letters(out) if d.kind == "tenant_binding"]
    HOSTILE_LINES.append(
        f"{horizon_label(audit):<5} {'a binding 8 h late, superseded, its process gone':<44} | "
        f"refused {[d.reason for d in late]} | counted late {auditor.counts['late']}"
    )
    assert [d.reason for d in late] == ["late"] and json.loads(late[0].raw)["team"] == "ml"
    assert auditor.counts["late"] == 1 and "ml" not in by_team(out + auditor.finish())


@CONFIGS
def test_a_binding_far_behind_superseded_within_the_horizon_is_taken(audit: AuditSettings) -> None:
    """As above, but the process was bound to ``ops`` only 30 s before the end: the span the late binding
    governs reaches into the horizon, where a late sample may still fall, so it is taken (counted
    ``binding_past_horizon``), not refused."""
    lines = _fleet_of_one(running=False)
    lines.insert(1, _binding_line(lines, 30, team="ops"))
    auditor = Auditor(audit)
    out = expand(auditor.ingest_lines(lines, str)) + auditor.ingest(_binding_line(lines, 8 * 3600 - 30), "b")
    assert not letters(out) and auditor.counts["binding_past_horizon"] == 1 and auditor.counts["late"] == 0


@CONFIGS
def test_a_binding_far_behind_still_governs_its_process_samples_to_come(audit: AuditSettings) -> None:
    """A binding stamped 8 h before it arrived, of a process whose samples come only after it (its node's other
    GPU went ahead): nothing binds the process later, so it governs every sample from its ``ts_ns`` on. It is
    not ``late``: refusing it left the process's whole bill ``unattributed``. Checked against the binding sent
    first, on both entries."""
    ahead = [line for line in _fleet_of_one(running=False) if b'"process_sample"' not in line]
    later = [line.replace(b'"GPU-1"', b'"GPU-2"') for line in _fleet_of_one(running=True) if b'"price"' not in line]
    binding = _binding_line(ahead, 8 * 3600 - 30)  # the first sample's time
    batch = Auditor(audit)
    got = (
        expand(batch.ingest_lines(ahead, str))
        + batch.ingest(binding, "b")
        + expand(batch.ingest_lines(later, str))
        + batch.finish()
    )
    row = Auditor(audit)
    by_row = [o for i, line in enumerate(ahead + [binding] + later) for o in row.ingest(line, str(i))] + row.finish()
    first = Auditor(audit)
    want = first.ingest(binding, "b") + expand(first.ingest_lines(ahead + later, str)) + first.finish()
    report(
        "a binding 8 h behind, its samples to come",
        len(ahead) + len(later) + 1,
        letters(got),
        by_team(got).get("ml", 0),
        by_team(want).get("ml", 0),
        audit,
    )
    assert not letters(got) and by_team(got) == by_team(want) == by_team(by_row) and by_team(want)["ml"] > 0


@CONFIGS
def test_a_late_binding_applies_to_every_sample_of_an_open_pane_at_or_after_it(audit: AuditSettings) -> None:
    """With revisions off, a binding that came after samples of a pane still open applied only to the samples
    after it; the as-of join in event time applies it to all of them, at or after its ``ts_ns``, on both
    entries. Checked against the same events with the binding sent first."""
    lines = _fleet_of_one(running=True)
    binding = _binding_line(lines, 20)  # within the last, open, pane
    batch = Auditor(audit)
    got = expand(batch.ingest_lines(lines, str)) + batch.ingest(binding, "b") + batch.finish()
    row = Auditor(audit)
    by_row = (
        [o for i, line in enumerate(lines) for o in row.ingest(line, str(i))] + row.ingest(binding, "b") + row.finish()
    )
    first = Auditor(audit)
    want = first.ingest(binding, "b") + expand(first.ingest_lines(lines, str)) + first.finish()
    report(
        "a binding 20 s behind, its pane open",
        len(lines) + 1,
        letters(got),
        by_team(got).get("ml", 0),
        by_team(want).get("ml", 0),
        audit,
    )
    assert by_team(got) == by_team(want) == by_team(by_row) and by_team(want)["ml"] > 0


@CONFIGS
def test_addresses_are_checked_within_the_lateness_and_kept_no_longer(audit: AuditSettings) -> None:
    """Twenty minutes of one process's addresses at 10 a second, then two new ones behind its latest: one just
    within the allowed lateness is taken, one just beyond is ``late`` (MAE windows never revise, so the horizon
    does not widen it). The state keeps the lateness's addresses only: keeping the horizon's 6 h made a busy
    process's Kafka state record megabytes, rewritten at every poll."""
    t0, step = 1_767_571_200 * 10**9, 10**8
    lines = [
        json.dumps(
            {"kind": "mem_access", "node_id": "n", "pid": 7, "ts_ns": t0 + k * step, "address": 4096 * k}
        ).encode()
        for k in range(12_000)
    ]
    latest, lateness = t0 + 11_999 * step, audit.lateness_s * 10**9
    auditor = Auditor(audit)
    out = expand(auditor.ingest_lines(lines, str))
    for behind, address in ((lateness - 10**9, 1), (lateness + 10**9, 2)):
        out += auditor.ingest(
            json.dumps(
                {"kind": "mem_access", "node_id": "n", "pid": 7, "ts_ns": latest - behind, "address": address}
            ).encode(),
            "late",
        )
    HOSTILE_LINES.append(
        f"{horizon_label(audit):<5} {'addresses 119 s and 121 s behind their latest':<44} | refused "
        f"{[d.reason for d in letters(out)]} | addresses kept "
        f"{len(auditor.to_state()['mae']['taken'][0][3]):,} of 12,002"
    )
    assert [(d.reason, json.loads(d.raw)["address"]) for d in letters(out)] == [("late", 2)]
    kept = auditor.to_state()["mae"]["taken"]
    assert len(kept) == 1 and len(kept[0][3]) <= audit.lateness_s * 10 + 2
