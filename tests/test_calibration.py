"""The power model per platform (gpucost/calibration.py, docs/definitions.md "Weights fit"): each platform's fit
recovers its own power formula where one regression over the fleet cannot, it is scored on the panes it never saw
as a plain least-squares recomputation scores them, and a platform without a power reading is fitted nowhere.

The inputs are synthetic panes whose power formula is known per platform; the scores are recomputed with
``numpy.linalg.lstsq`` over the split the documentation states, written here from the rule, not from the code.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpucost.calibration import calibrate
from gpucost.fit import Features, Fit

MINUTE_NS = 60 * 10**9
#: (model as the events name it, idle W, W per unit of T, B, L): two platforms that draw unlike each other, and a
#: third too small to score
FORMULAS = {
    "NVIDIA H100 80GB HBM3": (90.0, np.array([2.0, 0.8, 15_000.0])),
    "AMD Instinct MI300X": (160.0, np.array([5.0, 2.5, 40_000.0])),
    "NVIDIA L4": (16.0, np.array([0.5, 0.1, 1_000.0])),
}
NOISE_W = 2.0


def panes_of(
    rng: np.random.Generator,
    model: str,
    n: int,
    power: np.ndarray | None = None,
    like: str | None = None,
    read: bool = True,
) -> Features:
    """``n`` panes of ``model`` on four GPUs, a minute apart: T, B, L drawn at random, the power from the formula
    of ``model`` (or of ``like``) plus noise, or ``power`` as given: a device reporting none; ``read`` False where
    the samples label that power not_reported or estimated."""
    x = np.column_stack([rng.uniform(0, 150, n), rng.uniform(0, 100, n), rng.uniform(0, 0.005, n)])
    if power is None:
        idle, slopes = FORMULAS[like or model]
        power = idle + x @ slopes + rng.normal(0, NOISE_W, n)
    return Features(power, x, np.array([model] * n, dtype=object), (np.arange(n) // 4) * MINUTE_NS, np.full(n, read))


def fleet(*parts: Features, seed: int = 0) -> Features:
    """The parts as one input, its rows shuffled: nothing may hang on the order panes come in."""
    order = np.random.default_rng(seed).permutation(sum(len(p.power_w) for p in parts))
    return Features(
        np.concatenate([p.power_w for p in parts])[order],
        np.concatenate([p.x for p in parts])[order],
        np.concatenate([p.model for p in parts])[order],
        np.concatenate([p.start_ns for p in parts])[order],
        np.concatenate([p.read for p in parts])[order],
    )


def mixed(seed: int = 1) -> Features:
    rng = np.random.default_rng(seed)
    return fleet(
        panes_of(rng, "NVIDIA H100 80GB HBM3", 400),
        panes_of(rng, "AMD Instinct MI300X", 300),
        # MI300X devices without a power reading beside them: the table's TDP, labelled estimated
        panes_of(rng, "AMD Instinct MI300X", 60, power=np.full(60, 750.0), read=False),
        panes_of(rng, "Trainium2", 200, power=np.zeros(200), read=False),  # neuron-monitor: 0 W, not_reported
        panes_of(rng, "HL-225", 100, power=np.full(100, 600.0), read=False),  # the table's TDP, estimated
        panes_of(rng, "Inferentia2", 80, power=np.zeros(80)),  # 0 W with no label (a Parquet input keeps none)
        panes_of(rng, "NVIDIA L4", 12),  # too few panes to hold a fifth out
    )


def recovers(fit: Fit, model: str) -> bool:
    """Within noise: 2 W of noise over hundreds of panes fixes the idle draw to about a watt, each slope to 3 %."""
    idle, slopes = FORMULAS[model]
    return abs(fit.intercept_w - idle) < 1.5 and bool(np.all(np.abs(fit.slopes - slopes) < 0.03 * slopes))


def test_each_platform_recovers_its_own_formula_where_the_pooled_fit_does_not() -> None:
    cal = calibrate(mixed())
    by_name = {p.name: p for p in cal.platforms}
    assert cal.pooled is not None
    for name, model in (("H100", "NVIDIA H100 80GB HBM3"), ("MI300X", "AMD Instinct MI300X")):
        p = by_name[name]
        assert p.fit is not None and p.models == (model,) and p.in_table
        assert recovers(p.fit, model), (name, p.fit)
        assert p.rmse_w is not None and p.rmse_w < 1.3 * NOISE_W
        assert p.r2 is not None and p.r2 > 0.99
        # one regression over both platforms is neither formula, and its error on the held-out panes is many times
        # the platform's own
        assert not recovers(cal.pooled, model) and not recovers(cal.fleet, model)
        assert p.pooled_rmse_w is not None and p.pooled_rmse_w > 5 * p.rmse_w
    assert by_name["H100"].fitted_panes + by_name["H100"].held_out_panes == 400


def test_platforms_without_a_power_reading_are_listed_with_the_reason_and_fitted_nowhere() -> None:
    cal = calibrate(mixed())
    by_name = {p.name: p for p in cal.platforms}
    trn, gaudi, inf, l4 = (by_name[n] for n in ("Trn2", "Gaudi 2", "Inf2", "L4"))
    for p in (trn, gaudi):
        assert p.why_not is not None and p.why_not.startswith("no power reading: its GPU samples label power_w")
    assert inf.why_not is not None and inf.why_not.startswith("no power reported: 0 W in every pane")
    assert l4.why_not is not None and "at least 20 and 5 are needed" in l4.why_not
    for p in (trn, gaudi, inf, l4):
        assert p.fit is None and p.rmse_w is None and p.fitted_panes == p.held_out_panes == 0
    assert [(p.panes, p.unread_panes) for p in (trn, gaudi, inf, l4)] == [(200, 200), (100, 100), (80, 0), (12, 0)]
    # the MI300X panes at the stand-in TDP are left out and the rest fitted as if they were not there
    mi = by_name["MI300X"]
    assert (mi.panes, mi.unread_panes, mi.fitted_panes + mi.held_out_panes) == (360, 60, 300)
    assert mi.fit is not None and recovers(mi.fit, "AMD Instinct MI300X")
    # the fleet-wide fit leaves out every pane without a reading (not the platform merely too small to score)
    assert cal.fleet.panes == 400 + 300 + 12


def test_an_input_without_any_power_reading_is_an_error_that_says_why() -> None:
    rng = np.random.default_rng(2)
    with pytest.raises(ValueError, match="no pane has a power reading to fit: Trn2: no power reading: its GPU"):
        calibrate(panes_of(rng, "Trainium2", 50, power=np.zeros(50), read=False))


def test_a_model_the_platform_table_lacks_is_fitted_under_its_own_name() -> None:
    rng = np.random.default_rng(3)
    (p,) = calibrate(panes_of(rng, "Acme X1", 100, like="AMD Instinct MI300X")).platforms
    assert (p.name, p.in_table, p.fit is not None) == ("Acme X1", False, True)


def held_out_by_the_rule(starts: list[int]) -> list[bool]:
    """docs/definitions.md: a platform's panes starting at or after the start of its pane at index ⌊0.8·n⌋ in
    start order are held out."""
    cut = sorted(starts)[math.floor(0.8 * len(starts))]
    return [s >= cut for s in starts]


def least_squares(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    design = np.column_stack([np.ones(len(y)), x])
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    assert (coef[1:] > 0).all()  # every slope positive: the non-negative fit is this unconstrained one
    return np.asarray(coef)


def rmse_and_r2(coef: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    predicted = coef[0] + x @ coef[1:]
    residual_ss = sum((a - b) ** 2 for a, b in zip(y.tolist(), predicted.tolist()))
    mean = sum(y.tolist()) / len(y)
    total_ss = sum((a - mean) ** 2 for a in y.tolist())
    return math.sqrt(residual_ss / len(y)), 1 - residual_ss / total_ss


def test_the_held_out_scores_equal_a_plain_least_squares_recomputation() -> None:
    features = mixed(seed=4)
    cal = calibrate(features)
    early_x, early_y, held = [], [], {}
    for name, model in (("H100", "NVIDIA H100 80GB HBM3"), ("MI300X", "AMD Instinct MI300X")):
        # the platform's panes with a power reading; the pooled fit is over the fitted platforms' (L4 is too small)
        rows = [i for i, (m, r) in enumerate(zip(features.model.tolist(), features.read.tolist())) if m == model and r]
        late = held_out_by_the_rule([int(features.start_ns[i]) for i in rows])
        fit_rows = [i for i, h in zip(rows, late) if not h]
        held_rows = [i for i, h in zip(rows, late) if h]
        early_x.append(features.x[fit_rows])
        early_y.append(features.power_w[fit_rows])
        held[name] = (features.x[held_rows], features.power_w[held_rows], fit_rows)
    pooled = least_squares(np.concatenate(early_x), np.concatenate(early_y))
    by_name = {p.name: p for p in cal.platforms}
    for name, (x, y, fit_rows) in held.items():
        p = by_name[name]
        own = least_squares(features.x[fit_rows], features.power_w[fit_rows])
        assert (p.fitted_panes, p.held_out_panes) == (len(fit_rows), len(y))
        assert p.fit is not None and p.fit.intercept_w == pytest.approx(own[0], rel=1e-9)
        assert p.fit.slopes == pytest.approx(own[1:], rel=1e-9)
        want_rmse, want_r2 = rmse_and_r2(own, x, y)
        assert p.rmse_w == pytest.approx(want_rmse, rel=1e-9) and p.r2 == pytest.approx(want_r2, rel=1e-9)
        want_rmse, want_r2 = rmse_and_r2(pooled, x, y)
        assert p.pooled_rmse_w == pytest.approx(want_rmse, rel=1e-9)
        assert p.pooled_r2 == pytest.approx(want_r2, rel=1e-9)


def test_the_held_out_panes_are_the_latest_and_a_pane_start_is_never_split() -> None:
    """Four GPUs a minute apart: 100 panes are 25 starts; the last fifth by start is 5 starts, 20 panes."""
    rng = np.random.default_rng(5)
    cal = calibrate(panes_of(rng, "NVIDIA H100 80GB HBM3", 100))
    (p,) = cal.platforms
    assert (p.fitted_panes, p.held_out_panes) == (80, 20)
    # 102 panes: starts 0..25, the 26th start holds two panes; index ⌊81.6⌋ = 81 is in start 20, so starts 20–25
    # (4·5 + 2 = 22 panes) are held out
    cal = calibrate(panes_of(rng, "NVIDIA H100 80GB HBM3", 102))
    (p,) = cal.platforms
    assert (p.fitted_panes, p.held_out_panes) == (80, 22)


def test_held_out_power_that_does_not_vary_has_no_r2() -> None:
    """R² divides by the held-out power's variance: none, and R² is reported as not defined, never a number."""
    rng = np.random.default_rng(6)
    panes = panes_of(rng, "NVIDIA H100 80GB HBM3", 100)
    late = panes.start_ns >= 20 * MINUTE_NS
    power = panes.power_w.copy()
    power[late] = 300.0
    (p,) = calibrate(Features(power, panes.x, panes.model, panes.start_ns, panes.read)).platforms
    assert p.held_out_panes == 20 and p.r2 is None and p.rmse_w is not None
