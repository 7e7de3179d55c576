"""The health audit's judgement written from docs/definitions.md, "Health audit": the grade and fail
reasons of one window at the default thresholds, the breaker table, and every health record recomputed from
the raw events (``reference``; tests/test_health.py and tests/test_health_faults.py hold both paths to it)."""

from __future__ import annotations

import hashlib
import hmac
import json
from fractions import Fraction
from typing import Any

import duckdb

from gpucost.schemas.arrow import events_table
from gpucost.schemas.events import Event
from gpucost.schemas.records import HealthRecord, Output
from gpucost.streams.settings import AuditSettings
from tests.support.health_fleet import H_S, NS


def judged(
    kw_per_tops: Fraction | None, sched_deviation: Fraction, coverage: Fraction, faults_fatal: int = 0
) -> tuple[str, list[str]]:
    """A window's grade and its failed checks, in the definition's order (grade, sched_deviation, coverage,
    device_fault: a fatal device fault new in one of its samples)."""
    if kw_per_tops is None:
        grade = "idle"
    elif kw_per_tops < Fraction("0.18") and sched_deviation < Fraction("0.021"):
        grade = "excellent"
    elif kw_per_tops <= Fraction("0.25") and sched_deviation <= Fraction("0.045"):
        grade = "good"
    else:
        grade = "needs_optimisation"
    checks = (
        ("grade", grade == "needs_optimisation"),
        ("sched_deviation", sched_deviation > Fraction("0.05")),
        ("coverage", coverage < Fraction("0.95")),
        ("device_fault", faults_fatal > 0),
    )
    return grade, [reason for reason, failed in checks if failed]


#: (state, passed, covered) → next state, and what happens to the count; written from the breaker table of
#: docs/definitions.md, "Health audit"
def reference_breaker(windows: list[tuple[int, bool, bool]], admission: int, readmit: int) -> list[tuple[str, int]]:
    """For each window k (ascending; with its verdict and whether coverage was met) the state after it and
    the windows skipped before it."""
    state, count, last, out = ("probation" if admission else "in_service"), 0, None, []
    for k, passed, covered in windows:
        skipped = 0 if last is None else k - last - 1
        for verdict in [(False, False)] * skipped + [(passed, covered)]:
            ok, cov = verdict
            if state == "probation":
                count = count + 1 if cov else 0
                if count >= admission:
                    state, count = "in_service", 0
            elif state == "in_service" and not ok:
                state = "observation"
            elif state == "observation":
                state, count = ("in_service", 0) if ok else ("removed", 0)
            elif state == "removed":
                count = count + 1 if ok else 0
                if count >= readmit:
                    state, count = "in_service", 0
        out.append((state, skipped))
        last = k
    return out


# --- the reference -------------------------------------------------------------------------------

REFERENCE_SQL = """
WITH g AS (
  SELECT gpu_uuid, node_id, gpu_model, ts_ns - ts_ns % {P} AS pane, ts_ns - ts_ns % {H} AS win,
         CAST(round(interval_s * 1000) AS BIGINT) AS iv, CAST(round(sm_util_pct * 100) AS BIGINT) AS sm,
         CAST(round(power_w * 1000) AS BIGINT) AS mw, fault_fatal, fault_warning,
         coalesce(power_estimated, false) AS est
  FROM ev WHERE kind = 'gpu_sample'),
placed AS (
  SELECT DISTINCT gpu_uuid, ts_ns - ts_ns % {P} AS pane FROM ev
  WHERE kind = 'process_sample' AND pid IN (SELECT pid FROM ev WHERE kind = 'tenant_binding')),
panes AS (
  SELECT g.gpu_uuid, g.pane, any_value(g.win) AS win, sum(iv) AS covered,
         sum(CASE WHEN sm < {THR} THEN iv ELSE 0 END) AS idle,
         bool_or(placed.pane IS NOT NULL) AS allocated
  FROM g LEFT JOIN placed ON placed.gpu_uuid = g.gpu_uuid AND placed.pane = g.pane
  GROUP BY ALL),
windows AS (
  SELECT gpu_uuid, win, min(node_id) AS node_id, min(gpu_model) AS gpu_model, sum(iv) AS covered,
         sum(CASE WHEN sm < {THR} THEN iv ELSE 0 END) AS idle, sum(mw * iv) AS energy, sum(sm * iv) AS busy,
         max(pane) AS last_pane, count(coalesce(fault_fatal, fault_warning)) AS fault_samples,
         coalesce(sum(fault_fatal), 0) AS fatal, coalesce(sum(fault_warning), 0) AS warning,
         sum(CASE WHEN est THEN iv ELSE 0 END) AS estimated
  FROM g GROUP BY ALL),
deviation AS (
  SELECT gpu_uuid, win, sum(CASE WHEN allocated THEN idle ELSE covered - idle END) AS dev FROM panes GROUP BY ALL)
SELECT w.gpu_uuid, w.win, w.node_id, w.gpu_model, w.covered, w.idle, w.energy, w.busy, d.dev,
       (SELECT sum(p.idle) FROM panes p WHERE p.gpu_uuid = w.gpu_uuid AND p.pane > w.last_pane - {W}
          AND p.pane <= w.last_pane) AS idle72,
       (SELECT sum(p.covered) FROM panes p WHERE p.gpu_uuid = w.gpu_uuid AND p.pane > w.last_pane - {W}
          AND p.pane <= w.last_pane) AS covered72, w.fault_samples, w.fatal, w.warning, w.estimated
FROM windows w JOIN deviation d USING (gpu_uuid, win)
ORDER BY w.gpu_uuid, w.win
"""


def reference(events: list[Event], s: AuditSettings) -> list[dict[str, Any]]:
    """Every ``health`` record's fields, from the raw events alone."""
    con = duckdb.connect()
    con.register("ev", events_table(events))
    sql = REFERENCE_SQL.format(
        P=s.pane_s * NS, H=s.health_window_h * H_S * NS, THR=s.idle_threshold_cp, W=s.window_h * H_S * NS
    )
    found = con.execute(sql).fetchall()
    h_ms = s.health_window_h * H_S * 1000
    peaks = {k.lower(): Fraction(v) for k, v in s.peak_tops.items()}
    out, per_gpu = [], {}
    for row in found:
        gpu, win, node, model, covered, idle, energy, busy, dev, idle72, covered72, reported, fatal, warning, est = row
        keys = sorted((k for k in peaks if k != "default" and k in model.lower()), key=lambda k: (-len(k), k))
        peak = peaks[keys[0] if keys else "default"]
        kw = (
            None
            if busy == 0 or energy == 0
            else (Fraction(energy, covered * 1000) / 1000) / (peak * Fraction(busy, 10_000 * covered))
        )
        sd, coverage = Fraction(dev, covered), Fraction(covered, h_ms)
        grade, reasons = judged(kw, sd, coverage, fatal)
        record = {
            "gpu_uuid": gpu,
            "node_id": node,
            "gpu_model": model,
            "window_start_ns": win,
            "window_end_ns": win + h_ms * 1_000_000,
            "covered_ms": covered,
            "idle_ms": idle,
            "energy_uj": energy,
            "mean_power_w": float(Fraction(energy, covered * 1000)),
            "effective_tops": float(peak * Fraction(busy, 10_000 * covered)),
            "kw_per_tops": None if kw is None else float(kw),
            "sched_deviation": float(sd),
            "idle_index_72h": float(Fraction(idle72, covered72)),
            "coverage": float(coverage),
            "grade": grade,
            "entitlement": {"excellent": 1.25, "good": 1.0, "needs_optimisation": 0.75, "idle": 1.0}[grade],
            "passed": not reasons,
            "fail_reasons": reasons,
            "faults_fatal": fatal if reported else None,
            "faults_warning": warning if reported else None,
            "power_estimated_ms": int(est) or None,
        }
        per_gpu.setdefault(gpu, []).append((win // (h_ms * 1_000_000), record))
        out.append(record)
    admission = -(-s.admission_h // s.health_window_h)
    for windows in per_gpu.values():
        verdicts = [(k, r["passed"], "coverage" not in r["fail_reasons"]) for k, r in windows]
        for (_, r), (state, skipped) in zip(windows, reference_breaker(verdicts, admission, s.readmit_passes)):
            r["windows_skipped"], r["breaker_state"] = skipped, state
    return out


def checked(records: list[Output], key: bytes | None = None) -> list[dict[str, Any]]:
    """The health records' fields, each hash and signature checked from scratch here (hashlib, hmac)."""
    out = []
    for r in records:
        if not isinstance(r, HealthRecord):
            continue
        fields = r.model_dump()
        digest = fields.pop("snapshot_sha256")
        signature = fields.pop("signature")
        hashed = {
            k: v
            for k, v in fields.items()
            if not (v is None and k in ("faults_fatal", "faults_warning", "power_estimated_ms"))
        }
        text = json.dumps(hashed, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
        assert digest == hashlib.sha256(text).hexdigest(), r
        assert signature == (None if key is None else hmac.new(key, digest.encode(), hashlib.sha256).hexdigest())
        out.append(fields)
    return sorted(out, key=lambda f: (f["gpu_uuid"], f["window_start_ns"]))
