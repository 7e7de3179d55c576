"""What-if bills: the published cost records billed again under other prices, weights or idle policy.

docs/definitions.md, "What-if bills". Each cost record carries the exact integers its pane was split from (``t_num``,
``b_num``, ``l_num``: the tenant's sums; ``busy_num``, ``covered_ms``: the pane's), so a pane's split
is made again from the Parquet alone, by the very function that made it (``apportion``): a what-if
under the settings of a replay equals that replay to the µ$, and every pane's parties still sum to
its cost. Idle policy ``share`` then gives each pane's idle µ$ to its tenants in proportion to their
weights (largest remainder, ties by tenant key), as OpenCost's shareIdle does; a pane with no
weighted tenant keeps it as idle.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from gpucost.schemas.events import TENANT_FIELDS, Price
from gpucost.schemas.records import IDLE_TENANT, CostRecord
from gpucost.sinks.views import query
from gpucost.streams.apportion import Weights, apportion, tenant_weights
from gpucost.streams.money import split_in_order
from gpucost.streams.pane_totals import PaneTotals, TenantTotals
from gpucost.streams.tables import PriceTable, Tenant

__all__ = ["IDLE_POLICIES", "Scenario", "TeamBill", "cost_panes", "whatif", "bills", "lacking_numerators"]

IDLE_POLICIES = ("separate", "share")
_COLUMNS = (
    "gpu_uuid",
    "node_id",
    "gpu_model",
    "pane_start_ns",
    "pane_end_ns",
    "tenant_key",
    *TENANT_FIELDS,
    "usd_per_gpu_hour",
    "unpriced",
    "cost_micro_usd",
    "t_num",
    "b_num",
    "l_num",
    "busy_num",
    "covered_ms",
)


@dataclass(frozen=True)
class Scenario:
    """What to bill again with: prices (None: each record's own), weights, and the idle policy."""

    weights: Weights
    prices: PriceTable | None = None
    idle_policy: str = "separate"

    @classmethod
    def of(
        cls, alpha: Decimal, beta: Decimal, gamma: Decimal, prices: Iterable[Price] = (), idle_policy: str = "separate"
    ) -> Scenario:
        if idle_policy not in IDLE_POLICIES:
            raise ValueError(f"idle policy {idle_policy!r}: choose one of {', '.join(IDLE_POLICIES)}")
        table = None
        for price in prices:
            table = table or PriceTable()
            if table.admit(price) is None:  # the first price of an instant stays, as in the audit
                table.take(price)
        return cls(Weights(alpha, beta, gamma), table, idle_policy)


@dataclass(frozen=True)
class TeamBill:
    team: str
    base_micro_usd: int
    scenario_micro_usd: int

    @property
    def difference_micro_usd(self) -> int:
        return self.scenario_micro_usd - self.base_micro_usd


def cost_panes(out_dir: Path) -> Iterator[list[dict[str, Any]]]:
    """The cost records of ``out_dir`` as revised, pane by pane (each pane's parties by tenant key, idle first):
    a party's latest record, its µ$ the sum of its differences (the ``cost_as_revised`` view). Read from every
    record instead, a revised party took whichever of its records came last, so a party a late binding emptied
    could keep its first numerators beside its new tenant's: the bill under the settings billed then moved
    money to ``unattributed``."""
    columns, rows = query(
        out_dir,
        f"SELECT {', '.join(_COLUMNS)} FROM cost_as_revised "
        "ORDER BY gpu_uuid, pane_start_ns, tenant_key <> 'idle', tenant_key",
    )
    pane: list[dict[str, Any]] = []
    for row in rows:
        record = dict(zip(columns, row))
        if record["t_num"] is None or record["covered_ms"] is None:  # a file written before the numerators
            raise ValueError(lacking_numerators(out_dir, "t_num is null in a record of the cost view"))
        if pane and (record["gpu_uuid"], record["pane_start_ns"]) != (pane[0]["gpu_uuid"], pane[0]["pane_start_ns"]):
            yield pane
            pane = []
        pane.append(record)
    if pane:
        yield pane


def lacking_numerators(out_dir: Path, detail: str) -> str:
    """What to do about cost records written before they carried the numerators a what-if bills from."""
    return (
        f"the cost records in {out_dir} lack the numerators a what-if needs (t_num, b_num, l_num, busy_num, "
        f"covered_ms: written by a gpucost before them); replay their events with this one first ({detail})"
    )


def _rebuilt(records: list[dict[str, Any]]) -> PaneTotals:
    """The pane a split was made from, as far as the split reads it."""
    head = records[0]
    pane = PaneTotals(
        head["gpu_uuid"],
        head["pane_start_ns"],
        head["pane_end_ns"],
        head["node_id"],
        head["gpu_model"],
        covered_ms=head["covered_ms"],
    )
    for r in records:
        if r["tenant_key"] != IDLE_TENANT:
            tenant = Tenant(*(r.get(f) for f in TENANT_FIELDS))  # labels: absent from a record before them
            pane.tenants[r["tenant_key"]] = TenantTotals(tenant, int(r["t_num"]), int(r["b_num"]), int(r["l_num"]))
    return pane


def whatif(records: list[dict[str, Any]], scenario: Scenario) -> list[CostRecord]:
    """One pane's cost records billed again under ``scenario``: its parties sum to the pane's new cost."""
    pane = _rebuilt(records)
    price = records[0]["usd_per_gpu_hour"]
    if scenario.prices is not None:
        price = scenario.prices.lookup(pane.gpu_model or "", pane.pane_start_ns)
    out = apportion(pane, price, scenario.weights)
    if scenario.idle_policy == "share" and len(out) > 1:
        keys = [r.tenant_key for r in out[1:]]
        weights = tenant_weights(pane, scenario.weights)
        if sum(weights):
            extra = split_in_order(out[0].cost_micro_usd, weights, sum(weights))
            out = [
                out[0].model_copy(update={"cost_micro_usd": 0}),
                *(r.model_copy(update={"cost_micro_usd": r.cost_micro_usd + e}) for r, e in zip(out[1:], extra)),
            ]
            assert [r.tenant_key for r in out[1:]] == keys
    return out


def bills(out_dir: Path, scenario: Scenario, unpriced: Counter[str] | None = None) -> list[TeamBill]:
    """Per team, what the published records bill and what ``scenario`` bills, in µ$ (teams by name); a
    ``ValueError`` where ``out_dir`` holds no cost record (not a zero bill: nothing was billed there).
    ``unpriced`` (if given) counts, by GPU model, the panes billed at a price that the scenario's prices leave
    without one (no price of their model, nor a ``default``): 0 µ$ in the scenario, which the caller says."""
    base: dict[str, int] = defaultdict(int)
    new: dict[str, int] = defaultdict(int)
    for records in cost_panes(out_dir):
        for r in records:
            base[r["team"]] += r["cost_micro_usd"]
        again_records = whatif(records, scenario)
        if unpriced is not None and again_records and again_records[0].unpriced and not records[0]["unpriced"]:
            unpriced[str(records[0]["gpu_model"])] += 1
        for again in again_records:
            new[again.team] += again.cost_micro_usd
    if not base:
        raise ValueError(
            f"{out_dir} holds no cost records to bill again; give the --out of a gpucost run, replay "
            "or sink that billed GPU time"
        )
    return [TeamBill(team, base[team], new[team]) for team in sorted(base.keys() | new.keys())]
