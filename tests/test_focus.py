"""``gpucost export focus``: the cost records as FOCUS 1.2 rows, exact to the µ$, checked against the Parquet,
and by the FinOps Foundation's own validator (``focus-validator`` 2.2.1, in a virtual environment of its own)."""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import replace
from decimal import Decimal
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from gpucost.producers.simulate import FleetSpec, simulate
from gpucost.schemas.codec import encode_event
from gpucost.sinks.views import connect
from tests.support.cli import gpucost
from tests.support.focus_validator import run_validator, validator  # noqa: F401  (validator: a fixture)

pytestmark = pytest.mark.slow
NS = 1_000_000_000
#: a fleet across a month's end: 2025-01-31 22:00 to 2025-02-01 02:00 UTC
SPEC = replace(FleetSpec(gpus=3, hours=4, seed=8, interval_s=20), start_ns=1_738_360_800 * NS)
#: InvoiceId-C-003-C (MUST) is "null when no invoice OR not null when one", and passes; focus-validator 2.2.1 counts
#: its two branches as rules too, and cannot know whether a charge is invoiced, so the branch the column does not
#: take fails on every row: C-005-C ("not null") when InvoiceId is null, C-004-C ("null") when it is given
OTHER_BRANCH = {None: "InvoiceId-C-005-C", "INV-2025-01-0042": "InvoiceId-C-004-C"}


@pytest.fixture(scope="module")
def billed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("focus")
    (base / "events").mkdir()
    (base / "events" / "events.jsonl").write_text("".join(encode_event(e) + "\n" for e in simulate(SPEC)))
    gpucost("replay", str(base / "events"), "--out", str(base / "out"))
    return base / "out"


def test_each_month_bills_exactly_its_records(billed: Path, tmp_path: Path) -> None:
    con = connect(billed)
    want = {
        (m, t): Decimal(c)
        for m, t, c in con.execute(
            "SELECT strftime(make_timestamp(pane_start_ns // 1000), '%Y-%m'), team, sum(cost_micro_usd) "
            "FROM cost GROUP BY ALL"
        ).fetchall()
    }
    assert {m for m, _ in want} == {"2025-01", "2025-02"}
    got: dict[tuple[str, str], Decimal] = {}
    ids = []
    for month in ("2025-01", "2025-02"):
        gpucost(
            "export",
            "focus",
            str(tmp_path / f"{month}.parquet"),
            "--out",
            str(billed),
            "--month",
            month,
            "--format",
            "parquet",
        )
        table = pq.read_table(tmp_path / f"{month}.parquet")
        assert str(table.schema.field("BilledCost").type) == "decimal128(38, 6)"
        for row in table.to_pylist():
            got[(month, row["SubAccountId"])] = got.get((month, row["SubAccountId"]), Decimal(0)) + row["BilledCost"]
            assert row["BilledCost"] == row["EffectiveCost"] == row["ListCost"] == row["ContractedCost"]
            assert row["BillingPeriodStart"].strftime("%Y-%m") == month and row["BillingPeriodStart"].day == 1
            assert row["ChargePeriodEnd"] - row["ChargePeriodStart"] == dt.timedelta(minutes=1)
            assert json.loads(row["Tags"])["team"] == row["SubAccountId"]
            ids.append(row["x_RecordId"])
    assert got == {k: v / 1_000_000 for k, v in want.items()}  # µ$ / 10^6, exactly: no float anywhere
    # every record once, in the month of its pane
    assert sorted(ids) == sorted(r for (r,) in con.execute("SELECT record_id FROM cost").fetchall())


def test_quantities_are_each_partys_gpu_hours(billed: Path, tmp_path: Path) -> None:
    """A pane's parties share its covered hours, and a party's quantity at the list price is its cost (to the µ$
    the split rounded)."""
    gpucost("export", "focus", str(tmp_path / "f.csv"), "--out", str(billed), "--month", "2025-01")
    panes = duckdb.sql(f"""
        SELECT ResourceId, ChargePeriodStart, sum(ConsumedQuantity) AS hours,
               max(abs(ConsumedQuantity * ListUnitPrice - BilledCost)) AS off
        FROM read_csv('{tmp_path / "f.csv"}', types = {{
            'ConsumedQuantity': 'DECIMAL(38,12)', 'ChargePeriodStart': 'VARCHAR', 'BilledCost': 'DECIMAL(38,6)',
            'ListUnitPrice': 'DECIMAL(18,6)'}})
        GROUP BY ALL""").fetchall()
    covered = dict(
        ((g, s), c)
        for g, s, c in connect(billed)
        .execute(
            "SELECT gpu_uuid, strftime(make_timestamp(pane_start_ns // 1000), '%Y-%m-%dT%H:%M:%SZ'), covered_ms "
            "FROM idle_index"
        )
        .fetchall()
    )
    assert panes
    for gpu, start, hours, off in panes:
        assert abs(hours - Decimal(covered[(gpu, start)]) / 3_600_000) < Decimal("1e-9")
        assert off <= Decimal("0.000001")


def test_bad_arguments_are_usage_errors(billed: Path, tmp_path: Path) -> None:
    for args, says in ((["--month", "2025-13"], "not YYYY-MM"), (["--month", "2025-01", "--format", "xml"], "invalid")):
        proc = gpucost("export", "focus", str(tmp_path / "f.csv"), "--out", str(billed), *args, check=False)
        assert proc.returncode == 2 and says in proc.stderr
    (tmp_path / "f.csv").write_text("keep me")
    proc = gpucost("export", "focus", str(tmp_path / "f.csv"), "--out", str(billed), "--month", "2025-01", check=False)
    assert proc.returncode == 2 and "--overwrite" in proc.stderr and (tmp_path / "f.csv").read_text() == "keep me"


@pytest.mark.parametrize("fmt,invoice", [("csv", None), ("parquet", None), ("parquet", "INV-2025-01-0042")])
def test_the_finops_validator_accepts_the_export(
    billed: Path, tmp_path: Path, validator: Path, fmt: str, invoice: str | None
) -> None:
    export = tmp_path / f"focus.{fmt}"
    gpucost(
        "export",
        "focus",
        str(export),
        "--out",
        str(billed),
        "--month",
        "2025-01",
        "--format",
        fmt,
        *(["--invoice-id", invoice] if invoice else []),
    )
    done = run_validator(validator, export, "1.2")
    total = re.search(r"Total: (\d+) \| Pass: (\d+) \| Fail: (\d+) \| Skipped: (\d+)", done.stdout)
    assert total is not None, done.stdout[-2000:] + done.stderr[-2000:]
    failed = set(re.findall(r"^- ([A-Za-z]+-[A-Z]-\d+-[A-Z]): violations", done.stdout, re.MULTILINE))
    assert int(total[3]) == len(failed) and failed == {OTHER_BRANCH[invoice]}, done.stdout[-3000:]
    assert int(total[2]) > 100  # the rules ran: columns present, values checked
    assert not any(rule.endswith("-M") for rule in failed)  # no mandatory rule failed (docs/analysts.md)


def test_invoice_id_is_null_unless_the_user_gives_one(billed: Path, tmp_path: Path) -> None:
    gpucost(
        "export",
        "focus",
        str(tmp_path / "none.parquet"),
        "--out",
        str(billed),
        "--month",
        "2025-01",
        "--format",
        "parquet",
    )
    gpucost(
        "export",
        "focus",
        str(tmp_path / "given.parquet"),
        "--out",
        str(billed),
        "--month",
        "2025-01",
        "--format",
        "parquet",
        "--invoice-id",
        "INV-2025-01-0042",
    )
    none, given = (
        pq.read_table(tmp_path / f).column("InvoiceId").to_pylist() for f in ("none.parquet", "given.parquet")
    )
    assert none and set(none) == {None}
    assert len(given) == len(none) and set(given) == {"INV-2025-01-0042"}


def test_the_format_follows_the_files_name_unless_given(billed: Path, tmp_path: Path) -> None:
    """``export focus x.parquet`` once wrote CSV into a file named .parquet."""
    gpucost("export", "focus", str(tmp_path / "named.parquet"), "--out", str(billed), "--month", "2025-01")
    assert pq.read_table(tmp_path / "named.parquet").num_rows > 0
    gpucost("export", "focus", str(tmp_path / "plain"), "--out", str(billed), "--month", "2025-01")
    assert (tmp_path / "plain").read_text().startswith("BilledCost,")
    done = gpucost(
        "export",
        "focus",
        str(tmp_path / "x.csv"),
        "--out",
        str(billed),
        "--month",
        "2025-01",
        "--format",
        "parquet",
        check=False,
    )
    assert done.returncode == 2 and "make them agree" in done.stderr and not (tmp_path / "x.csv").exists()
