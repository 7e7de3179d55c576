"""α, β, γ fitted from power instead of guessed (docs/definitions.md, "Weights fit").

Per GPU pane with covered time, the pane's mean power is regressed on ``[1, T, B, L]``: T and B the
process samples' Σ SM % · ms and Σ memory-bandwidth % · ms over the covered ms, L their NUMA Σ hops ·
latency_weight over the covered ms. The three slopes are held non-negative (a resource cannot lower
the power it draws); the intercept, the GPU's idle draw, is free. Each resource's weight is its mean
share of the dynamic power it explains, ``c_T·mean(T) : c_B·mean(B) : c_L·mean(L)``, normalised.

The panes are the pipeline's own: the events go through an ``Auditor`` as ``gpucost replay`` takes
them (late, duplicate and overlapping events refused as in billing, late ones within the revision horizon
taken into their panes), and each pane's sums are read through ``Auditor.on_closed`` as it closes and again
whenever a revision changes it, so the fit sees every pane as it finally stands.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gpucost.producers.replay import LineBatch, RowBatch, input_files, read_batches
from gpucost.streams.audit import Auditor
from gpucost.streams.pane_rules import pane_start_ns
from gpucost.streams.pane_totals import PaneColumns
from gpucost.streams.settings import AuditSettings

__all__ = ["Features", "Fit", "pane_features", "fit_weights", "nnls"]

RESOURCES = ("T", "B", "L")


@dataclass(frozen=True)
class Features:
    """One row per pane with covered time: its mean power (W) and T, B, L, and what the per-platform fit splits
    them by (gpucost/calibration.py): the pane's GPU model as its events name it, and the pane's start."""

    power_w: np.ndarray
    x: np.ndarray  # (panes, 3): T (SM %), B (memory-bandwidth %), L (Σ hops · latency_weight per ms)
    model: np.ndarray  # object: the gpu_model of the pane's GPU samples
    start_ns: np.ndarray
    read: np.ndarray  # bool: no GPU sample of the pane labels its power_w not_reported or estimated (``_unread``)

    def take(self, rows: np.ndarray) -> Features:
        """The panes ``rows`` selects (a boolean mask or indices), every column alike."""
        return Features(self.power_w[rows], self.x[rows], self.model[rows], self.start_ns[rows], self.read[rows])


class _Panes:
    """Each closed pane's features, by (GPU, pane start): a revision of a pane replaces its row, so the fit sees
    every pane as it finally stands (``Auditor.on_closed`` is called on every close path, revisions included)."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, int], tuple[np.ndarray, str]] = {}

    def __call__(self, panes: PaneColumns) -> None:
        covered = panes.covered_ms.astype(np.float64)
        sums = [
            np.bincount(panes.t_pane, weights=values.astype(np.float64), minlength=len(panes))
            for values in (panes.t_sm, panes.t_bw, panes.t_numa)
        ]
        with np.errstate(divide="ignore", invalid="ignore"):  # panes without covered time are dropped below
            rows = np.column_stack(
                [panes.energy_uj / covered / 1000, sums[0] / 100 / covered, sums[1] / 100 / covered, sums[2] / covered]
            )
        for key, row, model, kept in zip(
            zip(panes.gpu_uuid.tolist(), panes.pane_start_ns.tolist()),
            rows,
            panes.gpu_model.tolist(),
            (covered > 0).tolist(),
        ):
            if kept:
                self.rows[key] = (row, model)
            else:
                self.rows.pop(key, None)


def _unread(lines: list[bytes], pane_ns: int, into: set[tuple[str, int]]) -> None:
    """Add to ``into`` the (GPU, pane start) of each GPU sample among ``lines`` whose ``power_w`` is labelled
    ``not_reported``, or that is ``power_estimated`` (gpucost/producers/accelerators/events.py; files written before
    that field label the TDP ``estimated``): its watts, 0 or the platform table's TDP, stand in for a reading the
    device does not give, and a fit on them would learn the stand-in. The labels are JSON Lines fields the event
    schema ignores, so they are read here, from the lines, before the auditor drops them; a line that is not such a
    sample is left to the auditor to take or refuse."""
    for line in lines:
        if b'"not_reported"' not in line and b'"estimated"' not in line and b'"power_estimated"' not in line:
            continue  # the cheap test first: most lines carry no label
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if not isinstance(event, dict) or event.get("kind") != "gpu_sample":
            continue
        labels = [event.get(k) for k in ("not_reported", "estimated")]
        unread = event.get("power_estimated") is True or any(isinstance(v, list) and "power_w" in v for v in labels)
        gpu, ts = event.get("gpu_uuid"), event.get("ts_ns")
        if isinstance(gpu, str) and isinstance(ts, int) and unread:
            into.add((gpu, pane_start_ns(ts, pane_ns)))


def _unread_rows(batch: pa.RecordBatch, pane_ns: int, into: set[tuple[str, int]]) -> None:
    """``_unread`` of an events Parquet batch: its GPU samples that are ``power_estimated`` (Parquet keeps that
    field, and no label)."""
    if "power_estimated" not in batch.schema.names:
        return
    rows = batch.filter(pc.and_kleene(pc.equal(batch.column("kind"), "gpu_sample"), batch.column("power_estimated")))
    for gpu, ts in zip(rows.column("gpu_uuid").to_pylist(), rows.column("ts_ns").to_pylist()):
        if isinstance(gpu, str) and isinstance(ts, int):
            into.add((gpu, pane_start_ns(ts, pane_ns)))


def pane_features(paths: Iterable[Path], settings: AuditSettings) -> Features:
    """Every pane's features, from event files (or directories of them) as ``gpucost replay`` reads them."""
    panes, auditor, not_read = _Panes(), Auditor(settings), set[tuple[str, int]]()
    auditor.on_closed = panes
    for item in read_batches(input_files(list(paths))):
        if isinstance(item, RowBatch):
            _unread_rows(item.batch, settings.pane_ns, not_read)
            auditor.ingest_batch(item.batch, item.label)
        elif isinstance(item, LineBatch):
            _unread(item.lines, settings.pane_ns, not_read)
            auditor.ingest_lines(item.lines, item.label)
    auditor.finish()
    keys = sorted(panes.rows)
    rows = np.stack([panes.rows[k][0] for k in keys]) if keys else np.zeros((0, 4))
    return Features(
        rows[:, 0],
        rows[:, 1:],
        np.array([panes.rows[k][1] for k in keys], dtype=object),
        np.array([k[1] for k in keys], dtype=np.int64),
        np.array([k not in not_read for k in keys], dtype=bool),
    )


def nnls(x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """Least squares of ``y`` on ``[1, x]`` with the slopes ≥ 0: the intercept and slopes. Exhaustive over
    which slopes are 0 (three columns: eight solves), which is exact where an iterative solver stops near."""
    best: tuple[float, float, np.ndarray] | None = None
    for free in itertools.chain.from_iterable(
        itertools.combinations(range(x.shape[1]), k) for k in range(x.shape[1] + 1)
    ):
        design = np.column_stack([np.ones(len(y)), x[:, list(free)]])
        coef, *_ = np.linalg.lstsq(design, y, rcond=None)
        if (coef[1:] < 0).any():
            continue
        residual = float(((design @ coef - y) ** 2).sum())
        if best is None or residual < best[0]:
            slopes = np.zeros(x.shape[1])
            slopes[list(free)] = coef[1:]
            best = (residual, float(coef[0]), slopes)
    assert best is not None  # the intercept alone always qualifies
    return best[1], best[2]


@dataclass(frozen=True)
class Fit:
    panes: int
    intercept_w: float
    slopes: np.ndarray  # W per unit of T, B, L
    r2: float
    weights: dict[str, Decimal | None]  # alpha, beta, gamma to 6 places (None: cannot be estimated)
    why_not: dict[str, str]  # for a weight that cannot be estimated, why

    def snippet(self) -> str:
        """The weights as lines of a ``--config`` file."""
        lines = [f"# fitted by gpucost fit-weights from {self.panes} panes, R² = {self.r2:.4f}"]
        for name, value in self.weights.items():
            lines.append(
                f"{name} = {value}"
                if value is not None
                else f"# {name}: not estimated ({self.why_not[name]}); keep the one you have"
            )
        return "\n".join(lines) + "\n"


def fit_weights(features: Features) -> Fit:
    """The regression, R² and the weights it gives (docs/definitions.md, "Weights fit"); a resource that never varies
    in the
    input (no NUMA events at all, say) has no weight estimated rather than one invented."""
    x, y = features.x, features.power_w
    if len(y) < 5:
        raise ValueError(
            f"{len(y)} panes with covered time: at least 5 are needed to fit four coefficients; "
            "give event files with gpu_sample lines of more panes"
        )
    varies = np.ptp(x, axis=0) > 0
    names = ("alpha", "beta", "gamma")
    why_not = {
        n: f"{r} is the same in every pane" + (" (no NUMA events)" if r == "L" and not x[:, 2].any() else "")
        for n, r, v in zip(names, RESOURCES, varies)
        if not v
    }
    intercept, slopes = nnls(x[:, varies], y)
    full = np.zeros(3)
    full[varies] = slopes
    fitted = intercept + x @ full
    total = float(((y - y.mean()) ** 2).sum())
    r2 = 1 - float(((y - fitted) ** 2).sum()) / total if total else 1.0
    explained = full * x.mean(axis=0)
    if explained.sum() <= 0:
        raise ValueError(
            "no resource explains any of the power (every slope fitted 0): the weights cannot be "
            "estimated from this input"
        )
    shares = explained / explained.sum()
    weights = {
        n: None if n in why_not else Decimal(repr(float(share))).quantize(Decimal("0.000001"))
        for n, share in zip(names, shares)
    }
    return Fit(len(y), intercept, full, r2, weights, why_not)
