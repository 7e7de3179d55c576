"""SLA tiers against an independent recomputation from the raw events.

DuckDB sums each tenant's process samples per (GPU, pane) and each pane's covered time; a plain
loop written from docs/definitions.md's "SLA tiers" finds the idle runs, the triggers and the quota scale. Scripts
put runs just under and just over each tier's duration, Bronze's "= 0 %" against 0.01 %, a tenant
leaving mid-run, and tenants of different tiers sharing a GPU; a property test draws them. Both
paths are checked.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpucost.cli import main
from gpucost.schemas.arrow import events_table
from gpucost.schemas.blocks import expand
from gpucost.schemas.codec import decode_line, encode_event
from gpucost.schemas.events import Event
from gpucost.schemas.records import Output, QuotaRecord, ReclaimRecord
from gpucost.sinks.views import connect
from gpucost.streams.audit import Auditor
from gpucost.streams.settings import AuditSettings
from tests.support.sla_fleet import GAPS, NS, P_S, SCRIPTS, TENANTS, fleet
from tests.support.webhook import Webhook

TIERS = {
    "Gold": (Fraction(5), 720, 900, 1.0),
    "Silver": (Fraction(10), 180, 300, 0.8),
    "Bronze": (Fraction(0), 60, 90, 0.5),
}  # threshold %, duration s, max idle s, quota base (definitions.md)


REFERENCE_SQL = f"""
WITH covered AS (
  SELECT gpu_uuid, ts_ns - ts_ns % {P_S * NS} AS pane, sum(CAST(round(interval_s * 1000) AS BIGINT)) AS covered
  FROM ev WHERE kind = 'gpu_sample' GROUP BY ALL),
tenant AS (
  SELECT gpu_uuid, pid, ts_ns - ts_ns % {P_S * NS} AS pane,
         sum(CAST(round(sm_util_pct * 100) AS BIGINT) * CAST(round(interval_s * 1000) AS BIGINT)) AS sm
  FROM ev WHERE kind = 'process_sample' GROUP BY ALL)
SELECT t.gpu_uuid, t.pid, t.pane, t.sm, c.covered FROM tenant t JOIN covered c USING (gpu_uuid, pane)
ORDER BY t.gpu_uuid, t.pid, t.pane
"""


def reference(events: list[Event]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The quota and reclaim records' fields, from the raw events alone."""
    con = duckdb.connect()
    con.register("ev", events_table(events))
    quotas, reclaims = [], []
    runs: dict[tuple[str, int], tuple[int, int, int]] = {}  # (gpu, pid) → (run start, panes, last pane)
    for gpu, pid, pane, sm, covered in con.execute(REFERENCE_SQL).fetchall():
        team, sla = TENANTS[pid]
        threshold, duration_s, max_idle_s, base = TIERS[sla]
        util = Fraction(sm, covered)  # centi-percent
        idle = util < threshold * 100 if threshold else util == 0
        start, n, last = runs.get((gpu, pid), (pane, 0, None))
        if not idle:
            runs.pop((gpu, pid), None)
            run_ms = 0
        else:
            if last != pane - P_S * NS:  # not the pane right after the run's last: a new run
                start, n = pane, 0
            runs[(gpu, pid)] = (start, n + 1, pane)
            run_ms = (n + 1) * P_S * 1000
            if run_ms >= duration_s * 1000 > run_ms - P_S * 1000:
                reclaims.append(
                    {
                        "gpu_uuid": gpu,
                        "team": team,
                        "sla": sla,
                        "run_start_ns": start,
                        "trigger_ns": pane + P_S * NS,
                        "idle_run_ms": run_ms,
                        "deadline_ns": start + max_idle_s * NS,
                        "usd_per_gpu_hour": Decimal("2.5"),
                    }
                )
        scale = (
            base * (0.3 + 0.7 * math.exp(-(run_ms / 1000) / 300))
            if run_ms
            else base * min(1.5, 1 + 0.5 * float(util / 10_000))
        )
        quotas.append(
            {
                "gpu_uuid": gpu,
                "pane_start_ns": pane,
                "team": team,
                "sla": sla,
                "util_pct": float(util / 100),
                "idle_run_ms": run_ms,
                "quota_scale": scale,
            }
        )
    return (
        sorted(quotas, key=lambda q: (q["gpu_uuid"], q["pane_start_ns"], q["team"])),
        sorted(reclaims, key=lambda r: (r["gpu_uuid"], r["trigger_ns"], r["team"])),
    )


#: each path's SLA state after its last run, by path name
STATES: dict[str, Any] = {}


def by_rows(events: list[Event]) -> list[Output]:
    auditor = Auditor(AuditSettings(lateness_s=0))
    out = [r for e in events for r in auditor.update(e)]
    STATES["rows"] = auditor.sla.to_state()
    return out + auditor.finish()


def by_batches(events: list[Event]) -> list[Output]:
    auditor = Auditor(AuditSettings(lateness_s=0))
    lines = [encode_event(e).encode() for e in events]
    half = len(lines) // 2
    out = expand(auditor.ingest_lines(lines[:half], str))
    out += expand(auditor.ingest_batch(events_table([decode_line(x) for x in lines[half:]]).to_batches()[0], str))
    STATES["batches"] = auditor.sla.to_state()
    return out + auditor.finish()


def published(records: list[Output]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    quotas = [
        {
            "gpu_uuid": q.gpu_uuid,
            "pane_start_ns": q.pane_start_ns,
            "team": q.team,
            "sla": q.sla,
            "util_pct": q.util_pct,
            "idle_run_ms": q.idle_run_ms,
            "quota_scale": q.quota_scale,
        }
        for q in records
        if isinstance(q, QuotaRecord)
    ]
    reclaims = []
    for r in records:
        if isinstance(r, ReclaimRecord):
            assert r.node_id == f"n-{r.gpu_uuid}" and r.tenant_key.startswith(f"{r.team}:prod:a:P1:{r.sla}")
            reclaims.append(
                {
                    "gpu_uuid": r.gpu_uuid,
                    "team": r.team,
                    "sla": r.sla,
                    "run_start_ns": r.run_start_ns,
                    "trigger_ns": r.trigger_ns,
                    "idle_run_ms": r.idle_run_ms,
                    "deadline_ns": r.deadline_ns,
                    "usd_per_gpu_hour": r.usd_per_gpu_hour,
                }
            )
    return (
        sorted(quotas, key=lambda q: (q["gpu_uuid"], q["pane_start_ns"], q["team"])),
        sorted(reclaims, key=lambda r: (r["gpu_uuid"], r["trigger_ns"], r["team"])),
    )


@pytest.mark.parametrize("path", [by_rows, by_batches], ids=["rows", "batches"])
def test_quota_and_reclaim_are_the_raw_events_recomputed(path: Any) -> None:
    events = fleet(SCRIPTS, GAPS)
    got, want = published(path(events)), reference(events)
    assert got == want
    fired = {(r["gpu_uuid"], r["sla"], r["idle_run_ms"]) for r in got[1]}
    # Gold at 12 panes (not 11), Silver at 3 (not 2), Bronze at once at 0 % (never at 0.01 %), Gold again after
    # coming back (12 panes after the gap), each tier on G3
    assert fired == {
        ("G0", "Gold", 720_000),
        ("G1", "Silver", 180_000),
        ("G1", "Bronze", 60_000),
        ("G2", "Gold", 720_000),
        ("G3", "Gold", 720_000),
        ("G3", "Silver", 180_000),
        ("G3", "Bronze", 60_000),
    }, "G4's runs of 6 and 11 idle panes around its gap fire nothing"
    assert sum(1 for r in got[1] if r["gpu_uuid"] == "G0") == 1


@pytest.mark.slow
@settings(max_examples=25, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["G0", "G1"]),
        st.dictionaries(
            st.sampled_from(sorted(TENANTS)),
            st.lists(st.sampled_from([None, 0.0, 0.01, 4.99, 5.0, 9.99, 10.0, 40.0]), min_size=1, max_size=16),
            min_size=1,
        ),
        min_size=1,
    ),
    st.sets(st.integers(0, 15), max_size=3),
)
def test_random_tenants_recomputed_on_both_paths(
    scripts: dict[str, dict[int, list[float | None]]], gaps: set[int]
) -> None:
    events = fleet(scripts, {"G0": gaps})
    want = reference(events)
    assert published(by_rows(events)) == want
    assert published(by_batches(events)) == want
    assert STATES["rows"] == STATES["batches"], "the paths left different runs"


# --- acting on triggers ---------------------------------------------------------------------------


@pytest.mark.slow  # seconds of a whole run: CI runs it, the inner loop does not
def test_each_trigger_reaches_the_webhook_once_through_failures_and_restarts(tmp_path: Path) -> None:
    from gpucost.embedded import run_embedded
    from gpucost.producers.replay import read_inputs

    events = tmp_path / "events.jsonl"
    events.write_text("".join(encode_event(e) + "\n" for e in fleet(SCRIPTS, GAPS)))
    out = tmp_path / "out"
    run_embedded(read_inputs([events]), AuditSettings(lateness_s=0), out)
    triggers = dict(connect(out).execute("SELECT trigger_id, gpu_uuid FROM reclaim").fetchall())
    assert len(triggers) == 7
    refused = frozenset([sorted(triggers)[0]])
    hook = Webhook(fail=2, refuse=refused)
    ledger, actions = tmp_path / "ledger", tmp_path / "actions.jsonl"
    argv = [
        "reclaim",
        "--out",
        str(out),
        "--webhook",
        hook.url,
        "--ledger",
        str(ledger),
        "--actions-file",
        str(actions),
    ]
    try:
        assert main(argv) == 0
        assert main(argv) == 0  # run again: the ledger holds every trigger, nothing is sent twice
    finally:
        hook.server.shutdown()
    accepted = [key for key, _ in hook.accepted]
    assert sorted(accepted) == sorted(set(triggers) - refused), "a trigger delivered twice, or not at all"
    assert all(hook.attempts[k] == 3 for k in accepted) and hook.attempts[min(refused)] == 1
    assert {body["trigger_id"]: body["gpu_uuid"] for _, body in hook.accepted} == {
        k: g for k, g in triggers.items() if k not in refused
    }
    written = [json.loads(line) for line in actions.read_text().splitlines()]
    assert {w["trigger_id"]: w["outcome"] for w in written} == {
        k: "refused" if k in refused else "delivered" for k in triggers
    }
    assert len(written) == len(triggers)


def test_a_dry_run_says_what_it_would_do_and_does_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gpucost.embedded import run_embedded
    from gpucost.producers.replay import read_inputs

    events = tmp_path / "events.jsonl"
    events.write_text("".join(encode_event(e) + "\n" for e in fleet(SCRIPTS, GAPS)))
    run_embedded(read_inputs([events]), AuditSettings(lateness_s=0), tmp_path / "out")
    assert main(["reclaim", "--out", str(tmp_path / "out"), "--dry-run", "--ledger", str(tmp_path / "ledger")]) == 0
    said = capsys.readouterr().out
    lines = [line for line in said.splitlines() if line.startswith("would reclaim:")]
    assert len(lines) == 7 and "would_act: 7" in said  # the closing counts say it too
    assert not (tmp_path / "ledger").exists()
    for line in lines:  # the times a person reads are the action's own nanoseconds, to the second
        said, action = line.split(": {", 1)
        sent = json.loads("{" + action)
        for label, field in (("idle since ", "idle_since_ns"), ("triggered ", "triggered_ns")):
            text = said.split(label, 1)[1][:19]
            assert dt.datetime.fromisoformat(text + "+00:00").timestamp() == sent[field] // 10**9, line
