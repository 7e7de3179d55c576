"""The power model fitted per platform and scored on panes it did not see (docs/definitions.md, "Weights fit").

One regression across a mixed fleet is wrong: an A100 idles and climbs unlike an H200 or an MI300X, so each
platform (the pane's ``gpu_model`` read through the platform table, ``schemas/platforms.toml``) gets its own
intercept (idle W), slopes and weights, fitted as ``gpucost.fit.fit_weights`` fits the fleet. Each is scored as a
forecast: fitted on the platform's earlier panes and scored (RMSE in W, R²) on its latest ``HELD_OUT`` share by
pane start, which it never saw; the same split scores the pooled fit (one regression over every platform's earlier
panes), so the table shows what a per-platform model gains.

Watts that are no reading are fitted nowhere, the fleet-wide fit included, since a fit on them would learn the
stand-in, not the device: a pane whose GPU samples label ``power_w`` ``not_reported`` (Neuron and TPU tools give
no power: 0 W is sent) or that are ``power_estimated`` (the platform table's TDP is sent) is left out
(``Features.read``), and a platform left with no pane, or with 0 W in every pane (a source that sends 0 W
without the label, or an events Parquet file without the not_reported label), is listed with the reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from gpucost.fit import RESOURCES, Features, Fit, fit_weights
from gpucost.report import format_table
from gpucost.schemas.devices import platform_for

__all__ = [
    "HELD_OUT",
    "MIN_FIT",
    "MIN_HELD_OUT",
    "Calibration",
    "Platform",
    "as_json",
    "as_text",
    "calibrate",
    "held_out",
    "scores",
]

#: the share of each platform's panes, the latest by pane start, held out of its fit and scored
HELD_OUT = 0.2
#: the fewest panes a platform's fit and its held-out part each need: five fix four coefficients with one to
#: spare, so twenty leave the fit room for noise, and five held-out panes are the fewest an R² says anything on
MIN_FIT = 20
MIN_HELD_OUT = 5


@dataclass(frozen=True)
class Platform:
    """One platform's calibration: its fit on the earlier panes and its scores on the held-out ones, or why not."""

    name: str  # the platform table's row name; a model the table lacks, as its events name it
    in_table: bool
    models: tuple[str, ...]  # the gpu_model names its panes carry
    panes: int
    unread_panes: int  # of those, panes without a power reading (``Features.read``): in no fit
    fitted_panes: int = 0
    held_out_panes: int = 0
    fit: Fit | None = None
    rmse_w: float | None = None
    r2: float | None = None  # None: the held-out power does not vary, so R² is undefined
    pooled_rmse_w: float | None = None
    pooled_r2: float | None = None
    why_not: str | None = None  # why the platform is not fitted


@dataclass(frozen=True)
class Calibration:
    """What ``gpucost fit-weights`` reports: the fleet-wide fit it writes, and the per-platform ones it only shows."""

    fleet: Fit  # every pane with a power reading, as ``gpucost fit-weights`` has always fitted
    pooled: Fit | None  # the fitted platforms' earlier panes, pooled: the per-platform fits' baseline
    platforms: list[Platform]


def held_out(start_ns: np.ndarray) -> np.ndarray:
    """The held-out panes of one platform: those starting at or after the start of its pane at index
    ``⌊(1 − HELD_OUT)·n⌋`` in pane-start order. By time, not by a hash, because the model is used to forecast
    power it has not seen; panes of one start (the platform's GPUs at one minute) all fall on one side."""
    cut = np.sort(start_ns)[math.floor((1 - HELD_OUT) * len(start_ns))]
    return np.asarray(start_ns >= cut)


def scores(fit: Fit, panes: Features) -> tuple[float, float | None]:
    """RMSE (W) and R² of ``fit``'s power on ``panes``: R² = 1 − Σ residual² / Σ (power − its mean)², None when
    the power does not vary there (no variance to explain)."""
    residual = panes.power_w - (fit.intercept_w + panes.x @ fit.slopes)
    total = float(((panes.power_w - panes.power_w.mean()) ** 2).sum())
    return math.sqrt(float((residual**2).mean())), (1 - float((residual**2).sum()) / total if total else None)


def _no_reading(power_w: np.ndarray) -> str | None:
    """Why a platform's panes with a power reading (``Features.read``) give nothing to fit, or None."""
    if not len(power_w):
        return (
            "no power reading: its GPU samples label power_w not_reported (sent as 0 W) or are power_estimated "
            "(the platform table's TDP)"
        )
    if not (power_w > 0).any():
        return "no power reported: 0 W in every pane (a source without a power reading sends 0 W)"
    return None


def calibrate(features: Features) -> Calibration:
    """The fleet-wide fit, and each platform's fit on its earlier panes scored on the held-out ones (module doc).
    ValueError, saying why, where no pane has a power reading or the fleet-wide fit cannot be made."""
    found = [platform_for(m) for m in features.model.tolist()]
    names = np.array([f[0] if f else m for f, m in zip(found, features.model.tolist())], dtype=object)
    in_table = {n: f is not None for n, f in zip(names.tolist(), found)}
    reading = features.read.copy()
    listed: dict[str, Platform] = {}
    for name in sorted(in_table):
        mine = names == name
        why = _no_reading(features.power_w[mine & reading])
        if why is not None:
            reading &= ~mine
        models = tuple(sorted(set(features.model[mine].tolist())))
        unread = int((mine & ~features.read).sum())
        listed[name] = Platform(name, in_table[name], models, int(mine.sum()), unread, why_not=why)
    if not reading.any():
        raise ValueError(
            "no pane has a power reading to fit: "
            + "; ".join(f"{p.name}: {p.why_not}" for p in listed.values())
            + ". Give events of GPUs that report power"
        )
    fleet = fit_weights(features.take(reading))
    early = np.zeros(len(names), bool)  # the fitted platforms' panes before their held-out ones: the pooled fit's
    parts: dict[str, tuple[int, Features, Fit]] = {}
    for name, p in listed.items():
        if p.why_not is not None:
            continue
        (mine,) = np.nonzero((names == name) & reading)
        late = held_out(features.start_ns[mine])
        fitted, held = features.take(mine[~late]), features.take(mine[late])
        if len(fitted.power_w) < MIN_FIT or len(held.power_w) < MIN_HELD_OUT:
            listed[name] = replace(
                p,
                why_not=f"{len(fitted.power_w)} panes to fit and {len(held.power_w)} held out (the latest "
                f"{HELD_OUT:.0%} by pane start): at least {MIN_FIT} and {MIN_HELD_OUT} are needed; give a longer input",
            )
            continue
        try:
            parts[name] = (len(fitted.power_w), held, fit_weights(fitted))
        except ValueError as exc:
            listed[name] = replace(p, why_not=str(exc))
            continue
        early[mine[~late]] = True
    pooled = fit_weights(features.take(early)) if parts else None
    for name, (n_fitted, held, fit) in parts.items():
        assert pooled is not None
        rmse, r2 = scores(fit, held)
        pooled_rmse, pooled_r2 = scores(pooled, held)
        listed[name] = replace(
            listed[name],
            fitted_panes=n_fitted,
            held_out_panes=len(held.power_w),
            fit=fit,
            rmse_w=rmse,
            r2=r2,
            pooled_rmse_w=pooled_rmse,
            pooled_r2=pooled_r2,
        )
    return Calibration(fleet, pooled, list(listed.values()))


def _fit_json(fit: Fit) -> dict[str, Any]:
    return {
        "panes": fit.panes,
        "intercept_w": fit.intercept_w,
        "slopes": dict(zip(RESOURCES, fit.slopes.tolist())),
        "r2": fit.r2,
        "weights": {n: None if v is None else float(v) for n, v in fit.weights.items()},
        "not_estimated": fit.why_not,
    }


def as_json(cal: Calibration) -> dict[str, Any]:
    """The calibration as ``gpucost fit-weights --format json`` prints it (docs/analysts.md)."""
    return {
        "fleet": _fit_json(cal.fleet),
        "held_out": {"share": HELD_OUT, "rule": "each platform's latest panes by pane start"},
        "pooled": None if cal.pooled is None else _fit_json(cal.pooled),
        "platforms": [
            {
                "platform": p.name,
                "in_platform_table": p.in_table,
                "models": list(p.models),
                "panes": p.panes,
                "panes_without_power_reading": p.unread_panes,
                "fitted_panes": p.fitted_panes,
                "held_out_panes": p.held_out_panes,
                "fit": None if p.fit is None else _fit_json(p.fit),
                "rmse_w": p.rmse_w,
                "r2": p.r2,
                "pooled_rmse_w": p.pooled_rmse_w,
                "pooled_r2": p.pooled_r2,
                "not_fitted": p.why_not,
            }
            for p in cal.platforms
        ],
    }


def _num(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def as_text(cal: Calibration) -> str:
    """The per-platform table, then the platforms not fitted with their reasons."""
    columns = ["platform", "fitted", "held out", "idle W", "W/T", "W/B", "W/L", "alpha", "beta", "gamma"]
    columns += ["RMSE W", "R²", "pooled RMSE W", "pooled R²"]
    rows = [
        [
            p.name + ("" if p.in_table else " (not in the platform table)"),
            f"{p.fitted_panes:,}",
            f"{p.held_out_panes:,}",
            f"{p.fit.intercept_w:.1f}",
            *(f"{s:.4g}" for s in p.fit.slopes.tolist()),
            *("n/e" if w is None else str(w) for w in p.fit.weights.values()),
            f"{p.rmse_w:.2f}",
            _num(p.r2, ".4f"),
            _num(p.pooled_rmse_w, ".2f"),
            _num(p.pooled_r2, ".4f"),
        ]
        for p in cal.platforms
        if p.fit is not None
    ]
    head = (
        f"per platform: fitted on its panes but the latest {HELD_OUT:.0%} by pane start, scored on those "
        "(n/e: not estimated, as above)"
    )
    lines = [head, format_table(columns, rows)] if rows else [head, "(no platform could be fitted)"]
    lines += [
        f"{p.name}: {p.unread_panes:,} of its {p.panes:,} panes have no power reading: left out of every fit"
        for p in cal.platforms
        if p.unread_panes and p.why_not is None
    ]
    lines += [f"{p.name} ({p.panes:,} panes): not fitted: {p.why_not}" for p in cal.platforms if p.why_not]
    return "\n".join(lines) + "\n"
