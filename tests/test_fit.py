"""``gpucost fit-weights``: α, β, γ regressed from power recover the weights a fleet was generated with.

The simulated fleet's power is ``idle + c_T·ΣSM% + c_B·ΣBW% + c_L·(NUMA Σ hops·weight per ms) + noise``
with known coefficients (``FleetSpec``). The weights those coefficients imply are recomputed here in SQL
over the raw events, independently of the pipeline's panes, and the fit must land on them.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import duckdb
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpucost.fit import fit_weights, nnls, pane_features
from gpucost.producers.simulate import FleetSpec, simulate
from gpucost.schemas.codec import encode_event
from gpucost.streams.settings import AuditSettings
from tests.support.cli import gpucost

pytestmark = pytest.mark.slow
SPEC = FleetSpec(gpus=4, hours=24, seed=5, interval_s=10)


def write_fleet(path: Path, spec: FleetSpec, numa: bool = True) -> Path:
    path.mkdir()
    (path / "events.jsonl").write_text(
        "".join(encode_event(e) + "\n" for e in simulate(spec) if numa or e.kind != "numa_event")
    )
    return path


def implied_weights(events: Path, spec: FleetSpec) -> np.ndarray:
    """α : β : γ ∝ c_T·mean(T) : c_B·mean(B) : c_L·mean(L) over the panes with GPU samples, from the raw events."""
    files = str(events / "*.jsonl")
    ((t, b, l_),) = duckdb.sql(f"""
        WITH ev AS (SELECT * FROM read_json('{files}', format = 'newline_delimited',
                                            columns = {{kind: 'VARCHAR', gpu_uuid: 'VARCHAR', ts_ns: 'BIGINT',
                                                       interval_s: 'DOUBLE', sm_util_pct: 'DOUBLE',
                                                       mem_bw_util_pct: 'DOUBLE', hops: 'BIGINT',
                                                       latency_weight: 'BIGINT'}})),
        g AS (SELECT gpu_uuid, ts_ns // 60000000000 AS pane, sum(interval_s) AS covered FROM ev
              WHERE kind = 'gpu_sample' GROUP BY ALL),
        p AS (SELECT gpu_uuid, ts_ns // 60000000000 AS pane, sum(sm_util_pct * interval_s) AS t,
                     sum(mem_bw_util_pct * interval_s) AS b FROM ev WHERE kind = 'process_sample' GROUP BY ALL),
        n AS (SELECT gpu_uuid, ts_ns // 60000000000 AS pane, sum(hops * latency_weight) AS l FROM ev
              WHERE kind = 'numa_event' GROUP BY ALL)
        SELECT avg(coalesce(t, 0) / covered), avg(coalesce(b, 0) / covered), avg(coalesce(l, 0) / (covered * 1000))
        FROM g LEFT JOIN p USING (gpu_uuid, pane) LEFT JOIN n USING (gpu_uuid, pane)""").fetchall()
    explained = np.array([spec.watts_per_sm_pct * t, spec.watts_per_bw_pct * b, spec.watt_ms_per_numa * l_])
    return explained / explained.sum()


def test_the_fit_recovers_the_weights_the_fleet_was_generated_with(tmp_path: Path) -> None:
    events = write_fleet(tmp_path / "fleet", SPEC)
    fit = fit_weights(pane_features([events], AuditSettings()))
    want = implied_weights(events, SPEC)
    got = np.array([float(fit.weights[w]) for w in ("alpha", "beta", "gamma")])  # type: ignore[arg-type]
    assert abs(got.sum() - 1) <= 2e-6
    # stated tolerance: 0.02 on each weight; the slopes within 5 % of the coefficients, the idle draw within 2 W
    assert np.abs(got - want).max() < 0.02, (got, want)
    assert fit.slopes == pytest.approx([SPEC.watts_per_sm_pct, SPEC.watts_per_bw_pct, SPEC.watt_ms_per_numa], rel=0.05)
    assert abs(fit.intercept_w - SPEC.idle_power_w) < 2
    assert fit.r2 > 0.95
    assert fit.panes == 4 * 24 * 60


def test_other_coefficients_give_other_weights(tmp_path: Path) -> None:
    """Not a constant answer: a fleet whose memory bandwidth costs more power gets a larger β."""
    spec = replace(SPEC, watts_per_sm_pct=1.0, watts_per_bw_pct=4.0, seed=6)
    events = write_fleet(tmp_path / "fleet", spec)
    fit = fit_weights(pane_features([events], AuditSettings()))
    want = implied_weights(events, spec)
    assert float(fit.weights["beta"]) > float(fit.weights["alpha"])  # type: ignore[arg-type]
    assert np.abs(np.array([float(fit.weights[w]) for w in ("alpha", "beta", "gamma")]) - want).max() < 0.02


def test_without_numa_events_gamma_is_not_estimated(tmp_path: Path) -> None:
    events = write_fleet(tmp_path / "fleet", replace(SPEC, hours=6), numa=False)
    fit = fit_weights(pane_features([events], AuditSettings()))
    assert fit.weights["gamma"] is None and "no NUMA events" in fit.why_not["gamma"]
    assert fit.weights["alpha"] + fit.weights["beta"] == pytest.approx(1, abs=2e-6)  # type: ignore[operator]
    assert "# gamma: not estimated" in fit.snippet() and "\ngamma =" not in fit.snippet()
    # through the CLI: printed, and a snippet that --config takes
    out = gpucost("fit-weights", str(events), "--write", str(tmp_path / "weights.toml")).stdout
    assert "gamma = not estimated: L is the same in every pane (no NUMA events)" in out
    replayed = gpucost(
        "replay", str(events), "--out", str(tmp_path / "out"), "--config", str(tmp_path / "weights.toml")
    )
    assert replayed.returncode == 0


def test_too_few_panes_is_a_usage_error(tmp_path: Path) -> None:
    events = write_fleet(tmp_path / "fleet", replace(SPEC, gpus=1, hours=0.05))
    proc = gpucost("fit-weights", str(events), check=False)
    assert proc.returncode == 2 and "at least 5 are needed" in proc.stderr


@settings(max_examples=200, deadline=None)
@given(
    st.integers(6, 40).flatmap(
        lambda n: st.tuples(
            st.lists(st.lists(st.floats(0, 100, allow_nan=False), min_size=3, max_size=3), min_size=n, max_size=n),
            st.lists(st.floats(-50, 500, allow_nan=False), min_size=n, max_size=n),
        )
    )
)
def test_nnls_meets_the_optimality_conditions(case: tuple[list[list[float]], list[float]]) -> None:
    """Karush-Kuhn-Tucker: slopes ≥ 0; the residual is orthogonal to the intercept and to every positive slope's
    column, and no zero slope's column could lower the squared error by growing."""
    x, y = np.array(case[0]), np.array(case[1])
    intercept, slopes = nnls(x, y)
    assert (slopes >= 0).all()
    residual = y - intercept - x @ slopes
    scale = 1e-6 * (1 + np.abs(y).sum()) * (1 + np.abs(x).sum())
    assert abs(residual.sum()) <= scale
    gradient = x.T @ residual  # the error falls as slope j grows where this is positive
    assert (gradient <= scale).all()
    assert (np.abs(gradient[slopes > 0]) <= scale).all()


def _features(path: Path, events: list) -> np.ndarray:  # type: ignore[type-arg]
    path.mkdir()
    (path / "events.jsonl").write_text("".join(encode_event(e) + "\n" for e in events))
    f = pane_features([path], AuditSettings())  # revisions on: the default 6 h horizon
    rows = np.column_stack([f.power_w, f.x])
    return rows[np.lexsort(rows.T[::-1])]


def test_a_pane_revised_by_late_events_is_fitted_as_revised(tmp_path: Path) -> None:
    """Late GPU and process samples of a closed pane (within the horizon) revise it, and the fit reads the
    revised pane: the features equal those of the same events sent in event-time order, where nothing is late.
    Reading panes only where they first close, it would keep the pane without them."""
    ordered = sorted(simulate(replace(SPEC, gpus=2, hours=1, seed=7)), key=lambda e: e.ts_ns)
    pane_ns = AuditSettings().pane_ns
    busy = next(e for e in ordered if e.kind == "process_sample" and e.ts_ns >= ordered[0].ts_ns + 10 * pane_ns)
    gpu, lo = busy.gpu_uuid, busy.ts_ns - busy.ts_ns % pane_ns  # a busy pane, closed long before the input ends
    chosen = [
        e
        for kind in ("gpu_sample", "process_sample")  # every other one: half the pane's samples arrive late
        for e in [e for e in ordered if e.kind == kind and e.gpu_uuid == gpu and lo <= e.ts_ns < lo + pane_ns][::2]
    ]
    assert {e.kind for e in chosen} == {"gpu_sample", "process_sample"}
    rest = [e for e in ordered if e not in chosen]
    want = _features(tmp_path / "ordered", ordered)
    got = _features(tmp_path / "late", rest + chosen)
    without = _features(tmp_path / "without", rest)
    assert got.shape == want.shape == without.shape
    assert not np.array_equal(without, want)  # the late samples change their pane's features
    np.testing.assert_array_equal(got, want)
