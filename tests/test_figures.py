"""Honest figures (issue 36, part 5): the end-of-run summary and the ``unit_cost`` view, recomputed independently
from the raw Parquet (pyarrow and plain Python, never the views or the summary's SQL).

- EFU's two sources (FLOPs counted, ``tensor_active``) never share one figure;
- a unit cost below ``MIN_EFFECTIVE_TFLOP_HOURS`` of effective work is n/a;
- reclaim's $ at stake per hour counts each GPU once, at its price; its idle GPU-hours are a union;
- GPUs under observation are not called out of service;
- "idle" is worded one way everywhere.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from collections import defaultdict
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest

from gpucost.cli import main
from gpucost.cost_metrics import CostMetrics
from gpucost.embedded import RunStats
from gpucost.report import IDLE_WORDS
from gpucost.sinks.views import MIN_EFFECTIVE_TFLOP_HOURS, connect
from tests.conftest import ROOT

#: 4 GPUs (an A100 without tensor counters, H100 and H200 with them, all with some cuBLAS traces) for 26 h, in
#: service from the start: by its end one GPU is in service, two removed and one under observation
#: the minimum of effective work docs/definitions.md promises a unit cost ("Unit cost"), in effective TFLOP-hours
DOCUMENTED_MINIMUM = 1.0
RUN = ["run", "--gpus", "4", "--hours", "26", "--interval-s", "30", "--admission-h", "0"]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("figures") / "out"
    text = io.StringIO()
    with contextlib.redirect_stdout(text), contextlib.redirect_stderr(io.StringIO()):
        assert main([*RUN, "--out", str(out)]) == 0
    return out, text.getvalue()


def records(out: Path, kind: str) -> list[dict[str, Any]]:
    """Every record of ``kind`` as written, read by pyarrow alone."""
    rows: list[dict[str, Any]] = ds.dataset(out / kind, format="parquet", partitioning="hive").to_table().to_pylist()
    return rows


def section(text: str, heading: str) -> list[list[str]]:
    """The data rows (cells split on runs of two or more spaces) of the summary table under the heading that starts
    with ``heading``."""
    block = text.split("\n" + heading, 1)[1].split("\n\n", 1)[0].splitlines()[3:]
    return [re.split(r"\s{2,}", line.strip()) for line in block if line.strip()]


@pytest.mark.slow
def test_unit_cost_keeps_efu_sources_apart_and_is_na_below_the_minimum(fleet: tuple[Path, str]) -> None:
    out, text = fleet
    pane_cost: dict[tuple[str, int], int] = defaultdict(int)
    model: dict[tuple[str, int], str] = {}
    for r in records(out, "cost"):
        pane_cost[r["gpu_uuid"], r["pane_start_ns"]] += r["cost_micro_usd"]
        model[r["gpu_uuid"], r["pane_start_ns"]] = r["gpu_model"]
    source: dict[tuple[str, int], str | None] = {}
    tflop_h: dict[tuple[str | None, str | None], float] = defaultdict(float)
    for r in records(out, "efficiency"):
        if r["pid"] == 0:
            source[r["gpu_uuid"], r["pane_start_ns"]] = r["efu_source"]
            if r["efu"] is not None:
                tflop_h[r["gpu_model"], r["efu_source"]] += r["efu"] * r["peak_tops"] * r["covered_ms"] / 3.6e6
    cost: dict[tuple[str, str | None], int] = defaultdict(int)
    for pane, micro_usd in pane_cost.items():
        cost[model[pane], source.get(pane)] += micro_usd
    # the fleet has both sources, on one model too: what mixing them would blur
    by_model = defaultdict(set)
    for m, s in cost:
        by_model[m].add(s)
    assert {"flops", "tensor_active"} <= by_model["NVIDIA H100 80GB HBM3"]
    view = {
        (m, s): (c, t)
        for m, s, c, t in connect(out)
        .execute(
            "SELECT gpu_model, efu_source, sum(cost_micro_usd), sum(effective_tflop_hours) FROM unit_cost GROUP BY ALL"
        )
        .fetchall()
    }
    assert {k: v[0] for k, v in view.items()} == dict(cost)  # every µ$ once, with its pane's source
    assert all(v[1] == pytest.approx(tflop_h.get(k, 0.0), rel=1e-9, abs=1e-12) for k, v in view.items())
    # the summary: one line per model and source; a price only over the minimum of effective work
    lines = {(row[0], row[1]): row for row in section(text, "Unit cost by GPU model and EFU source")}
    assert set(lines) == {(m, s or "none") for m, s in cost}
    below = 0
    for (m, s), micro_usd in cost.items():
        shown = lines[m, s or "none"][4]
        if s is None or tflop_h[m, s] < DOCUMENTED_MINIMUM:
            below += 1
            assert shown == "n/a", (m, s)
        else:
            assert shown == f"{micro_usd / 1e6 / tflop_h[m, s]:.4f}", (m, s)
    assert 0 < below < len(cost)  # both cases shown
    # the view per day: NULL (n/a) exactly where that day's effective work is below the minimum
    for s, t, unit in (
        connect(out)
        .execute("SELECT efu_source, effective_tflop_hours, usd_per_effective_tflop_hour FROM unit_cost")
        .fetchall()
    ):
        assert (unit is None) == (s is None or t < DOCUMENTED_MINIMUM)
    assert float(MIN_EFFECTIVE_TFLOP_HOURS) == DOCUMENTED_MINIMUM
    assert "**1 effective TFLOP-hour**" in (ROOT / "docs" / "definitions.md").read_text()


def _union_ns(spans: list[tuple[int, int]]) -> int:
    """The length of the union of half-open intervals, by brute force over their sorted ends."""
    total, reach = 0, None
    for s, e in sorted(spans):
        if reach is None or s > reach:
            total, reach = total + e - s, e
        elif e > reach:
            total, reach = total + e - reach, e
    return total


def test_reclaim_puts_each_gpu_at_stake_once(fleet: tuple[Path, str]) -> None:
    out, text = fleet
    triggers = records(out, "reclaim")
    shown = {row[0]: row for row in section(text, "Reclaim triggers by SLA tier")}
    tiers = {r["sla"] for r in triggers} | {"all tiers"}
    assert set(shown) == tiers
    for tier in tiers:
        mine = [r for r in triggers if tier in ("all tiers", r["sla"])]
        latest: dict[str, dict[str, Any]] = {}
        for r in sorted(mine, key=lambda r: r["trigger_ns"]):
            latest[r["gpu_uuid"]] = r
        micro_usd = sum(int((r["usd_per_gpu_hour"] or Decimal(0)) * 10**6) for r in latest.values())
        idle_ns = sum(
            _union_ns([(r["run_start_ns"], r["trigger_ns"]) for r in mine if r["gpu_uuid"] == g]) for g in latest
        )
        assert shown[tier][1:3] + shown[tier][4:] == [
            str(len(mine)),
            str(len(latest)),
            str(micro_usd),
            f"{Decimal(micro_usd) / 10**6:.2f}",
        ], tier
        assert float(shown[tier][3]) == pytest.approx(idle_ns / 3.6e12, abs=0.0051), tier
    # some GPU was triggered more than once in a tier: summing triggers would have counted it again
    assert any(
        len([r for r in triggers if (r["sla"], r["gpu_uuid"]) == key]) > 1
        for key in {(r["sla"], r["gpu_uuid"]) for r in triggers}
    )
    # at stake per hour, over all tiers: never more than the whole fleet costs per hour at its latest prices
    fleet_price: dict[str, Decimal] = {}
    for r in sorted(records(out, "cost"), key=lambda r: r["pane_start_ns"]):
        fleet_price[r["gpu_uuid"]] = r["usd_per_gpu_hour"]
    assert Decimal(shown["all tiers"][5]) <= sum(fleet_price.values())


def test_gpus_under_observation_are_not_called_out_of_service(fleet: tuple[Path, str]) -> None:
    out, text = fleet
    latest: dict[str, str] = {}
    for r in sorted(records(out, "health"), key=lambda r: r["window_start_ns"]):
        latest[r["gpu_uuid"]] = r["breaker_state"]
    gone = {g for g, s in latest.items() if s in ("removed", "probation")}
    watched = {g for g, s in latest.items() if s == "observation"}
    assert gone and watched  # the fleet shows both
    assert {row[0] for row in section(text, "GPUs out of service")} == gone
    assert {row[0] for row in section(text, "GPUs under observation")} == watched
    assert f"GPUs out of service ({len(gone)};" in text


def test_idle_is_worded_once_everywhere(fleet: tuple[Path, str]) -> None:
    out, text = fleet
    assert f"({IDLE_WORDS})" in text
    assert IDLE_WORDS in (out / "report.html").read_text()
    assert "cost of unused capacity" in IDLE_WORDS
    definitions = (ROOT / "docs" / "definitions.md").read_text()
    assert "**idle**" in definitions.split("## Words the output uses", 1)[1].split("\n## ", 1)[0]
    # the old wording ("time no tenant used") is gone from every page, command and dashboard
    for path in [
        ROOT / "README.md",
        *(ROOT / "docs").glob("*.md"),
        *(ROOT / "gpucost").glob("*.py"),
        *(ROOT / "compose" / "grafana" / "dashboards").glob("*.json"),
    ]:
        assert "no tenant used" not in path.read_text(), path
    # the Prometheus family behind the dashboards' idle panels says it in its help text
    (idle,) = [f for f in RunStats(cost=CostMetrics()).metrics() if f.name == "gpucost_idle_cost_micro_usd"]
    assert "unused capacity" in idle.documentation
    # every dashboard panel about idle cost says what it is
    for board in (ROOT / "compose" / "grafana" / "dashboards").glob("*.json"):
        for panel in json.loads(board.read_text())["panels"]:
            if "idle cost" in panel["title"].lower():
                assert "unused capacity" in panel["title"], panel["title"]
