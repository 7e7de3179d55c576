"""``streams.health`` on its own: one GPU's audit windows graded, judged and run through the breaker,
recomputed from docs/definitions.md, "Health audit", with exact fractions (``tests.support.health_oracle``
holds the grade and the breaker as the definition states them), one pane per window."""

from __future__ import annotations

import tomllib
from decimal import Decimal
from fractions import Fraction as F

from hypothesis import given
from hypothesis import strategies as st

from gpucost.streams.health import HealthAudit
from gpucost.streams.pane_totals import PaneTotals
from gpucost.streams.settings import AuditSettings
from tests.conftest import ROOT
from tests.support.health_oracle import judged, reference_breaker
from tests.support.panes import closing

H_MS = 3_600_000
H_NS = H_MS * 1_000_000
PEAK = F(str(tomllib.loads((ROOT / "gpucost" / "schemas" / "platforms.toml").read_text())["H100"]["fp16"]))  # its peak


def expected(windows: list[tuple[int, dict]], admission_h: int) -> list[dict]:
    """Per window with GPU samples (k: its index), the record's judged fields."""
    out, verdicts = [], []
    for k, w in windows:
        covered_ms = w["covered_ms"]
        mean_power_w = F(w["energy_uj"], covered_ms) / 1000
        effective_tops = PEAK * w["busy_cp_ms"] / (10_000 * covered_ms)
        kw_per_tops = (mean_power_w / 1000) / effective_tops if effective_tops and mean_power_w else None
        dev = F(w["idle_ms"] if w["placed"] else covered_ms - w["idle_ms"], covered_ms)
        coverage = F(covered_ms, H_MS)
        grade, reasons = judged(kw_per_tops, dev, coverage)
        verdicts.append((k, not reasons, coverage >= F("0.95")))
        out.append(
            {
                "window_start_ns": k * H_NS,
                "mean_power_w": float(mean_power_w),
                "effective_tops": float(effective_tops),
                "kw_per_tops": None if kw_per_tops is None else float(kw_per_tops),
                "sched_deviation": float(dev),
                "coverage": float(coverage),
                "grade": grade,
                "passed": not reasons,
                "fail_reasons": reasons,
            }
        )
    # one window per hour: admission_h windows to admit, 2 passes to readmit (the defaults)
    for row, (state, skipped) in zip(out, reference_breaker(verdicts, admission_h, 2)):
        row["windows_skipped"], row["breaker_state"] = skipped, state
    return out


@st.composite
def window(draw: st.DrawFn) -> dict:
    covered = draw(st.sampled_from([H_MS, H_MS * 95 // 100, H_MS * 95 // 100 - 1, 1000]))
    busy_share = draw(st.sampled_from([F(0), F(1, 2), F(1)]))
    # energies around the grade thresholds: kW per effective TOPS of 0.18 and 0.25
    kw = draw(st.sampled_from([F(18, 100), F(1, 10), F(25, 100), F(26, 100)]))
    busy_cp_ms = int(10_000 * covered * busy_share)
    energy_uj = int(kw * PEAK * busy_cp_ms * 100) + draw(st.sampled_from([0, 1, -1]))
    return {
        "covered_ms": covered,
        "busy_cp_ms": busy_cp_ms,
        "energy_uj": max(energy_uj, 0),
        "idle_ms": draw(st.sampled_from([0, covered * 2 // 100, covered * 5 // 100, covered])),
        "placed": draw(st.sampled_from([0, 3])),
    }


FIELDS = (
    "window_start_ns",
    "mean_power_w",
    "effective_tops",
    "kw_per_tops",
    "sched_deviation",
    "coverage",
    "grade",
    "passed",
    "fail_reasons",
    "windows_skipped",
    "breaker_state",
)
windows = st.lists(st.tuples(st.integers(1, 3), window()), max_size=10)  # index steps: >1 skips windows


@given(windows, st.sampled_from([0, 1, 3]))
def test_grades_fails_and_breaker_follow_the_definition(steps, admission_h) -> None:
    k, seq = 0, []
    for step, w in steps:
        k += step
        seq.append((k, w))
    audit = HealthAudit(AuditSettings(pane_s=3600, health_window_h=1, admission_h=admission_h))
    got = []
    for k, w in seq:  # one pane is one window: each pane closes its own
        pane = PaneTotals(
            gpu_uuid="GPU-0",
            pane_start_ns=k * H_NS,
            pane_end_ns=(k + 1) * H_NS,
            node_id="n",
            gpu_model="NVIDIA H100",
            **w,
        )
        (record,) = audit.on_close(closing(pane))
        got.append({f: getattr(record, f) for f in FIELDS})
    assert got == expected(seq, admission_h)
    assert audit.finish() == []


def test_a_window_closes_when_a_later_pane_of_its_gpu_does() -> None:
    audit = HealthAudit(AuditSettings(pane_s=600, health_window_h=1, admission_h=0))
    pane = dict(gpu_uuid="GPU-0", node_id="n", gpu_model="H100", covered_ms=600_000, busy_cp_ms=0)
    assert audit.on_close(closing(PaneTotals(pane_start_ns=0, pane_end_ns=600 * 10**9, **pane))) == []
    (record,) = audit.on_close(closing(PaneTotals(pane_start_ns=H_NS, pane_end_ns=H_NS + 600 * 10**9, **pane)))
    assert (record.window_start_ns, record.covered_ms, record.coverage) == (0, 600_000, 600_000 / H_MS)
    assert [r.window_start_ns for r in audit.finish()] == [H_NS]
    assert Decimal(str(record.coverage)) < Decimal("0.95") and "coverage" in record.fail_reasons
