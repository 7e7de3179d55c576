"""FOCUS 1.3 on the allocation basis (`gpucost export focus --focus-version 1.3 --basis allocation`): each pane's
cost split by what tenants held (docs/definitions.md, "Allocation basis"), written as split cost allocation with
AllocatedMethodId `gpucost-allocation` and the unallocated capacity as its own row; recomputed here with SQL over
the allocation records, and held to the usage basis's file of the same month, pane by pane."""

from __future__ import annotations

import calendar
import json
from dataclasses import replace
from datetime import datetime
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from gpucost.producers.simulate import FleetSpec, simulate
from gpucost.schemas.codec import encode_event
from gpucost.sinks.views import connect
from tests.support.cli import gpucost

pytestmark = pytest.mark.slow
NS = 1_000_000_000
#: four simulated GPUs across a month's end: time-sliced, MPS and exclusive holds (one GPU of each mode, and one more)
FLEET = replace(FleetSpec(gpus=4, hours=6, seed=11, interval_s=20), start_ns=1_738_360_800 * NS - 3 * 3600 * NS)
ORIGIN = ("ResourceId", "ChargePeriodStart", "x_Revision")


@pytest.fixture(scope="module")
def billed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("allocated")
    (base / "events").mkdir()
    (base / "events" / "e.jsonl").write_text("".join(encode_event(e) + "\n" for e in simulate(FLEET)))
    gpucost("replay", str(base / "events"), "--out", str(base / "out"))
    return base / "out"


def ns(when: object) -> int:
    """A FOCUS time as read back from Parquet (a datetime, UTC) in epoch ns, exactly (panes start on whole µs)."""
    assert isinstance(when, datetime)
    return calendar.timegm(when.utctimetuple()) * NS + when.microsecond * 1000


def export(billed: Path, dest: Path, month: str, basis: str) -> list[dict[str, object]]:
    gpucost(
        "export", "focus", str(dest), "--out", str(billed), "--month", month, "--focus-version", "1.3", "--basis", basis
    )
    return pq.read_table(dest).to_pylist()


def test_rows_add_up_to_their_origin_and_to_the_usage_basis_pane_by_pane(billed: Path, tmp_path: Path) -> None:
    con = connect(billed)
    months = [
        m
        for (m,) in con.execute(
            "SELECT DISTINCT strftime(make_timestamp(pane_start_ns // 1000), '%Y-%m') FROM allocation ORDER BY 1"
        ).fetchall()
    ]
    assert months == ["2025-01", "2025-02"]
    for month in months:
        rows = export(billed, tmp_path / f"a{month}.parquet", month, "allocation")
        # each origin: the pane's C at that revision less its C before, from the allocation records alone
        want: dict[tuple[str, int, int], Decimal] = {}
        before: dict[tuple[str, int], int] = {}
        for gpu, start, revision, c in con.execute(
            "SELECT DISTINCT gpu_uuid, pane_start_ns, revision, pane_cost_micro_usd FROM allocation "
            "WHERE strftime(make_timestamp(pane_start_ns // 1000), '%Y-%m') = ? ORDER BY ALL",
            [month],
        ).fetchall():
            want[(gpu, start, revision)] = Decimal(c - before.get((gpu, start), 0)) / 1_000_000
            before[(gpu, start)] = c
        got: dict[tuple[str, int, int], Decimal] = {}
        for row in rows:
            key = (str(row["ResourceId"]), ns(row["ChargePeriodStart"]), int(row["x_Revision"]))
            got[key] = got.get(key, Decimal(0)) + Decimal(str(row["BilledCost"]))
        assert got == want  # A-003-M, exactly
        # both bases bill each pane its one cost: the usage file's rows of these panes add up the same
        usage = export(billed, tmp_path / f"u{month}.parquet", month, "usage")
        panes = {(g, s) for g, s, _ in got}
        by_pane: dict[tuple[str, int], list[Decimal]] = {}
        for which, file_rows in enumerate((rows, usage)):
            for row in file_rows:
                pane = (str(row["ResourceId"]), ns(row["ChargePeriodStart"]))
                if pane in panes:
                    by_pane.setdefault(pane, [Decimal(0), Decimal(0)])[which] += Decimal(str(row["BilledCost"]))
        assert by_pane and all(a == u for a, u in by_pane.values())


def test_the_split_columns_say_the_allocation_basis(billed: Path, tmp_path: Path) -> None:
    rows = export(billed, tmp_path / "f.parquet", "2025-01", "allocation")
    held = {
        (g, s, r, k): (sh, fr, sharing, n)
        for g, s, r, k, sh, fr, sharing, n in connect(billed)
        .execute(
            "SELECT gpu_uuid, pane_start_ns, revision, tenant_key, allocated_share, allocated_fraction, sharing, "
            "allocations FROM allocation"
        )
        .fetchall()
    }
    by_origin: dict[tuple[object, ...], list[dict[str, object]]] = {}
    for row in rows:
        by_origin.setdefault(tuple(row[c] for c in ORIGIN), []).append(row)
        unallocated = row["x_TenantKey"] == "unallocated"
        assert row["AllocatedMethodId"] == "gpucost-allocation"
        assert (row["AllocatedResourceId"] is None) == unallocated  # CAU-AllocatedResourceId-C-005-C / -006-C
        assert (row["AllocatedTags"] is None) == unallocated and row["Tags"] is None
        if row["AllocatedMethodDetails"] is None:
            continue
        d = json.loads(str(row["AllocatedMethodDetails"]), parse_float=Decimal)
        (element,) = d["Elements"]
        assert d["x_Basis"] == "allocation" and "x_Alpha" not in d
        key = (row["ResourceId"], ns(row["ChargePeriodStart"]), row["x_Revision"], row["x_TenantKey"])
        share, fraction, sharing, n = held[key]
        assert (element["x_AllocatedShare"], element["x_AllocatedFraction"]) == (
            Decimal(repr(share)),
            Decimal(repr(fraction)),
        )
        assert (element["x_Sharing"], element["x_Holds"]) == (sharing, n)
    assert any(r["x_TenantKey"] == "unallocated" for r in rows) and any(r["AllocatedResourceId"] for r in rows)
    for group in by_origin.values():  # the ratios: each row's share of its origin, adding up to exactly 1
        cost = [Fraction(Decimal(str(r["BilledCost"]))) for r in group]
        if sum(cost):
            ratios = [
                Fraction(
                    json.loads(str(r["AllocatedMethodDetails"]), parse_float=Decimal)["Elements"][0]["AllocatedRatio"]
                )
                for r in group
            ]
            assert sum(ratios) == 1
            assert all(abs(q - c / sum(cost)) < Fraction(1, 10**12) for q, c in zip(ratios, cost))


def test_the_allocation_basis_needs_1_3_and_says_so(billed: Path, tmp_path: Path) -> None:
    out = gpucost(
        "export",
        "focus",
        str(tmp_path / "f.csv"),
        "--out",
        str(billed),
        "--month",
        "2025-01",
        "--basis",
        "allocation",
        check=False,
    )
    assert out.returncode == 2 and "--focus-version 1.3" in out.stderr and "Traceback" not in out.stderr
    out = gpucost(
        "export",
        "focus",
        str(tmp_path / "g.csv"),
        "--out",
        str(billed),
        "--month",
        "2024-12",
        "--focus-version",
        "1.3",
        "--basis",
        "allocation",
        check=False,
    )
    assert out.returncode == 2 and "no allocation record of 2024-12" in out.stderr and "2025-01, 2025-02" in out.stderr
    assert not (tmp_path / "f.csv").exists() and not (tmp_path / "g.csv").exists()


def test_the_export_says_which_panes_of_the_month_it_leaves_on_the_usage_basis(billed: Path, tmp_path: Path) -> None:
    """Panes before a device's first hold are on the usage basis only: the allocation file has them not, and says
    how many and what they cost, counted here from the two tables."""
    month = "2025-01"
    said = gpucost(
        "export",
        "focus",
        str(tmp_path / "f.csv"),
        "--out",
        str(billed),
        "--month",
        month,
        "--focus-version",
        "1.3",
        "--basis",
        "allocation",
    ).stdout
    con = connect(billed)
    usage = {
        (g, s): c
        for g, s, c in con.execute(
            "SELECT gpu_uuid, pane_start_ns, sum(cost_micro_usd) FROM cost "
            "WHERE strftime(make_timestamp(pane_start_ns // 1000), '%Y-%m') = ? GROUP BY ALL",
            [month],
        ).fetchall()
    }
    held = set(con.execute("SELECT DISTINCT gpu_uuid, pane_start_ns FROM allocation").fetchall())
    left = {k: c for k, c in usage.items() if k not in held}
    assert left  # the fleet's GPUs ran before their pods' first holds
    assert f"{len(left):,} panes (${sum(left.values()) / 1e6:,.2f}) of {month} are on the usage basis only" in said
