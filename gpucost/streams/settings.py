"""The operators' settings: the defaults docs/definitions.md gives, overridable by file, environment, flags.

A plain model: building one reads nothing from the environment, so an operator or a test gets
exactly what it passes. The command line layers file, environment and flags over it
(``gpucost.config.load_settings``)."""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gpucost.schemas.devices import platform_peaks

__all__ = ["AuditSettings", "DEFAULT_L2_CALIBRATION", "DEFAULT_PEAK_TOPS", "SlaTier", "DEFAULT_SLA_TIERS"]

DEFAULT_L2_CALIBRATION: tuple[tuple[float, float], ...] = ((2.1, 8.3), (5.7, 41.9), (7.9, 127.4))
#: each part of the platform table (``schemas/platforms.toml``: vendors' datasheets, one row per part) at its dense
#: peak, under its name and aliases (``platform_peaks``), by the text a ``gpu_model`` contains (``peak_tops``: the
#: longest key it contains, case-insensitively and followed by no letter or digit, wins); ``default`` for a model
#: none matches. One table for every vendor: a device the table lists is judged against its own peak, not the default's
DEFAULT_PEAK_TOPS: dict[str, Decimal] = {**platform_peaks(), "default": Decimal(100)}
Weight = Annotated[Decimal, Field(ge=0, le=1000, allow_inf_nan=False)]


class SlaTier(BaseModel):
    """One SLA tier (docs/definitions.md, "SLA tiers"): a tenant is idle in a pane when its utilisation is below
    ``threshold_pct`` (0: when it is exactly 0); an idle run of ``duration_s`` triggers a reclaim, to be
    acted on within ``max_idle_s`` of the run's start; ``quota_base`` scales its quota."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    threshold_pct: Annotated[Decimal, Field(ge=0, le=100, decimal_places=2, allow_inf_nan=False)]
    duration_s: Annotated[int, Field(ge=1, le=366 * 86_400)]
    max_idle_s: Annotated[int, Field(ge=1, le=366 * 86_400)]
    quota_base: Annotated[Decimal, Field(ge=0, le=1000, allow_inf_nan=False)]

    @field_validator("threshold_pct", "quota_base", mode="before")
    @classmethod
    def _exact(cls, value: object) -> object:
        return Decimal(repr(value)) if isinstance(value, float) else value

    @property
    def threshold_cp(self) -> int:
        return int(self.threshold_pct * 100)


#: the seed's tiers, keyed by a binding's ``sla``
DEFAULT_SLA_TIERS: dict[str, SlaTier] = {
    "Gold": SlaTier(threshold_pct=Decimal(5), duration_s=720, max_idle_s=900, quota_base=Decimal("1.0")),
    "Silver": SlaTier(threshold_pct=Decimal(10), duration_s=180, max_idle_s=300, quota_base=Decimal("0.8")),
    "Bronze": SlaTier(threshold_pct=Decimal(0), duration_s=60, max_idle_s=90, quota_base=Decimal("0.5")),
}
Ratio = Annotated[Decimal, Field(ge=0, le=1000, allow_inf_nan=False)]
PositiveDecimal = Annotated[Decimal, Field(gt=0, le=10**9, allow_inf_nan=False)]


class AuditSettings(BaseModel):
    """Every knob of docs/definitions.md. The CLI reads environment variables ``GPUCOST_<FIELD>`` (e.g.
    ``GPUCOST_PANE_S``) into it; the model itself never does."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    pane_s: Annotated[int, Field(ge=1, le=86_400, description="pane length P, seconds")] = 60
    lateness_s: Annotated[int, Field(ge=0, le=86_400, description="allowed lateness, seconds")] = 120
    window_h: Annotated[int, Field(ge=1, le=24 * 31, description="idle index window, hours")] = 72
    idle_threshold_pct: Annotated[
        Decimal, Field(gt=0, le=100, decimal_places=2, description="a GPU sample is idle below this SM %")
    ] = Decimal("5")
    alpha: Annotated[Weight, Field(description="weight α of the time-slice share")] = Decimal("0.6")
    beta: Annotated[Weight, Field(description="weight β of the memory-bandwidth share")] = Decimal("0.3")
    gamma: Annotated[Weight, Field(description="weight γ of the cross-NUMA share")] = Decimal("0.1")
    mae_window: Annotated[int, Field(ge=1, le=1 << 24, description="addresses per MAE window W")] = 1024
    mae_bins: Annotated[int, Field(ge=1, le=1 << 16, description="histogram bins B")] = 256
    mae_lo: Annotated[int, Field(ge=0, lt=1 << 64, description="lowest address binned")] = 0
    mae_hi: Annotated[int, Field(ge=1, le=1 << 64, description="end (exclusive) of the binned range")] = 1 << 32
    max_future_s: Annotated[
        int,
        Field(
            ge=1,
            le=366 * 86_400,
            description=("events more than this ahead of the worker's clock are dead-lettered (future_timestamp)"),
        ),
    ] = 600
    max_jump_s: Annotated[
        int,
        Field(
            ge=1,
            le=366 * 86_400,
            description=(
                "an event further than this ahead of its GPU's latest moves the GPU's watermark only once a second "
                "such event confirms it"
            ),
        ),
    ] = 300
    idle_timeout_s: Annotated[
        int,
        Field(
            ge=1,
            le=366 * 86_400,
            description=(
                "a GPU silent while its partition's watermark moved this far past a pane's end has that pane closed"
                " (the worker's rule)"
            ),
        ),
    ] = 900
    revision_horizon_s: Annotated[
        int,
        Field(
            ge=0,
            le=31 * 86_400,
            description=(
                "a late event for a pane closed at most this long (event time) before its GPU's watermark revises "
                "the pane's records instead of being dead-lettered late; 0: no revisions"
            ),
        ),
    ] = 6 * 3600
    l2_calibration: tuple[tuple[float, float], ...] = DEFAULT_L2_CALIBRATION
    # --- the health audit (docs/definitions.md, "Health audit") -------------------------------------------
    health_window_h: Annotated[
        int, Field(ge=1, le=24 * 31, description=("health audit window H, hours (a multiple of the pane)"))
    ] = 1
    admission_h: Annotated[
        int,
        Field(
            ge=0,
            le=24 * 366,
            description=("hours of windows each covered ≥ pass_coverage before a new GPU is in service (0: at once)"),
        ),
    ] = 48
    excellent_kw_per_tops: Annotated[Ratio, Field(description="grade excellent: kW/TOPS below this …")] = Decimal(
        "0.18"
    )
    excellent_sched_deviation: Annotated[Ratio, Field(description="… and scheduling deviation below this")] = Decimal(
        "0.021"
    )
    good_kw_per_tops: Annotated[Ratio, Field(description="grade good: kW/TOPS at most this …")] = Decimal("0.25")
    good_sched_deviation: Annotated[Ratio, Field(description="… and scheduling deviation at most this")] = Decimal(
        "0.045"
    )
    pass_sched_deviation: Annotated[
        Ratio, Field(description=("a window fails its audit above this scheduling deviation"))
    ] = Decimal("0.05")
    pass_coverage: Annotated[
        Ratio,
        Field(description=("a window fails its audit below this coverage (and does not count towards admission)")),
    ] = Decimal("0.95")
    readmit_passes: Annotated[
        int, Field(ge=1, le=10_000, description=("consecutive passed windows that bring a removed GPU back in service"))
    ] = 2
    peak_tops: dict[str, PositiveDecimal] = Field(default_factory=lambda: dict(DEFAULT_PEAK_TOPS))
    # --- efficiency (docs/definitions.md, "Efficiency: EFU, ΔBW, diagnosis"): the roofline diagnosis ---------
    compute_bound_efu: Annotated[Ratio, Field(description="a pane is compute_bound at an EFU of at least this")] = (
        Decimal("0.5")
    )
    memory_bound_bw: Annotated[
        Ratio,
        Field(description=("… else memory_bound at a bandwidth utilisation of at least this, else latency_bound")),
    ] = Decimal("0.5")
    opex_usd_per_gpu_hour: Annotated[
        Decimal,
        Field(
            ge=0,
            lt=10**9,
            allow_inf_nan=False,
            description=("operating cost per GPU-hour (power, space, staff) that unit_cost adds to the bill"),
        ),
    ] = Decimal(0)
    sla_tiers: dict[str, SlaTier] = Field(default_factory=lambda: dict(DEFAULT_SLA_TIERS))

    @field_validator(
        "alpha",
        "beta",
        "gamma",
        "excellent_kw_per_tops",
        "excellent_sched_deviation",
        "good_kw_per_tops",
        "good_sched_deviation",
        "pass_sched_deviation",
        "pass_coverage",
        "compute_bound_efu",
        "memory_bound_bw",
        "opex_usd_per_gpu_hour",
        mode="before",
    )
    @classmethod
    def _exact_decimal(cls, value: object) -> object:
        # read weights and thresholds as the decimals written, never through a binary float
        return Decimal(repr(value)) if isinstance(value, float) else value

    @field_validator("peak_tops", mode="before")
    @classmethod
    def _exact_table(cls, table: object) -> object:
        if isinstance(table, dict):
            return {k: Decimal(repr(v)) if isinstance(v, float) else v for k, v in table.items()}
        return table

    @field_validator("peak_tops")
    @classmethod
    def _has_default(cls, table: dict[str, Decimal]) -> dict[str, Decimal]:
        if "default" not in table:
            raise ValueError("the peak_tops table needs a 'default' entry, used for a gpu_model no key matches")
        if any(not key.strip() for key in table):
            raise ValueError("a peak_tops key is empty: it would match every gpu_model")
        return table

    @field_validator("l2_calibration")
    @classmethod
    def _sorted_table(cls, table: tuple[tuple[float, float], ...]) -> tuple[tuple[float, float], ...]:
        if not table:
            raise ValueError("the L2 calibration table needs at least one (mae_bits, evictions) point")
        xs = [x for x, _ in table]
        if any(b <= a for a, b in zip(xs, xs[1:])):
            raise ValueError("the L2 calibration table's mae_bits must be strictly increasing")
        return table

    @model_validator(mode="after")
    def _consistent(self) -> AuditSettings:
        if self.alpha + self.beta + self.gamma == 0:
            raise ValueError("alpha, beta and gamma are all 0: no tenant could ever be billed")
        if self.window_h * 3600 < self.pane_s:
            raise ValueError(f"window_h ({self.window_h} h) must be at least one pane ({self.pane_s} s)")
        if self.mae_hi <= self.mae_lo:
            raise ValueError(f"mae_hi ({self.mae_hi}) must be greater than mae_lo ({self.mae_lo})")
        if (self.health_window_h * 3600) % self.pane_s:
            fits = self.pane_s // math.gcd(3600, self.pane_s)
            raise ValueError(
                f"health_window_h ({self.health_window_h} h) must be a whole number of panes "
                f"({self.pane_s} s): set it to a multiple of {fits}"
            )
        return self

    def ns(self, seconds_field: str) -> int:
        """A setting in seconds (``pane_s``, ``lateness_s``, ``max_jump_s``…) in nanoseconds, as event times are."""
        return int(getattr(self, seconds_field)) * 1_000_000_000

    @property
    def pane_ns(self) -> int:
        """Pane length P in ns."""
        return self.ns("pane_s")

    @property
    def lateness_ns(self) -> int:
        """Allowed lateness in ns."""
        return self.ns("lateness_s")

    @property
    def idle_timeout_ns(self) -> int:
        """A silent GPU's timeout in ns."""
        return self.ns("idle_timeout_s")

    @property
    def max_jump_ns(self) -> int:
        """The largest one-event watermark jump in ns."""
        return self.ns("max_jump_s")

    @property
    def revision_horizon_ns(self) -> int:
        """The revision horizon R in ns."""
        return self.ns("revision_horizon_s")

    @property
    def max_future_ns(self) -> int:
        """The clock skew refused, in ns."""
        return self.ns("max_future_s")

    @property
    def window_ns(self) -> int:
        return self.window_h * 3_600_000_000_000

    @property
    def health_window_ns(self) -> int:
        return self.health_window_h * 3_600_000_000_000

    @property
    def idle_threshold_cp(self) -> int:
        return int(self.idle_threshold_pct * 100)
