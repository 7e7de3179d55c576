"""Hostile input, money and records: bindings that arrive late, and addresses behind their latest, in the
configuration users run (a 6 h revision horizon) and with revisions off. A late binding is dead-lettered ``late``
only where the span it governs lies wholly beyond the horizon; otherwise it applies, in event time, to every sample
at or after it, on both operator entries, exactly as if it had been sent first. Addresses are checked within the
allowed lateness, and kept no longer."""

from __future__ import annotations

import json

from gpucost.schemas.blocks import expand
from gpucost.streams.audit import Auditor
from gpucost.streams.settings import AuditSettings
from tests.conftest import HOSTILE_LINES, horizon_label
from tests.support.hostile import CONFIGS, letters, report
from tests.support.team_totals import by_team

__all__: list[str] = []


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
