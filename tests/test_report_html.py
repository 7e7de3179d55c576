"""``gpucost report``: one self-contained HTML page, opened in a real browser (headless Chromium through
Selenium): no console error, every plot rendered with the traces and marks that DuckDB counts over the same
Parquet, and the team table equal to a DuckDB query."""

from __future__ import annotations

import datetime as dt
import json
from html.parser import HTMLParser
from pathlib import Path

import duckdb
import pytest

from gpucost.producers.simulate import FleetSpec, simulate
from gpucost.schemas.codec import encode_event
from gpucost.schemas.events import Event, GpuSample
from gpucost.sinks.views import connect
from tests.support.cli import gpucost

pytestmark = pytest.mark.slow
SPEC = FleetSpec(gpus=4, hours=30, seed=3, interval_s=30)
FAULTY = sorted(
    {e.gpu_uuid for e in simulate(FleetSpec(gpus=4, hours=1, seed=3, interval_s=30)) if isinstance(e, GpuSample)}
)[:2]


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("report")
    (base / "events").mkdir()
    lines = [encode_event(faulty(e)) for e in simulate(SPEC)]
    lines[100:100] = ['{"kind": "gpu_sample"}', "not json"]  # two dead letters of two reasons
    (base / "events" / "events.jsonl").write_text("\n".join(lines) + "\n")
    gpucost("replay", str(base / "events"), "--out", str(base / "out"), "--report", "on")
    gpucost("report", "--out", str(base / "out"), "--html", str(base / "report.html"))
    return base / "out", base / "report.html"


def faulty(event: Event) -> Event:
    """A simulated event, the samples of two GPUs in some hours carrying device faults (fatal ones for the first)."""
    if not isinstance(event, GpuSample) or event.gpu_uuid not in FAULTY or (event.ts_ns // 3600 // 10**9) % 7:
        return event
    fatal = int(event.gpu_uuid == FAULTY[0])
    return event.model_copy(update={"fault_fatal": fatal, "fault_warning": 1 + fatal})


class _Fetches(HTMLParser):
    """What a page's tags would fetch when it is opened (script sources, stylesheets, images, frames)."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.urls += [v for k, v in attrs if k in ("src", "href") and v and tag in ("script", "link", "img", "iframe")]


def test_the_page_is_self_contained(page: tuple[Path, Path]) -> None:
    text = page[1].read_text()
    fetches = _Fetches()
    fetches.feed(text)
    assert fetches.urls == []  # scripts and data inline: nothing fetched at view time
    assert text.count('class="plotly-graph-div"') == 11


def test_replay_asked_for_it_leaves_the_report_beside_its_output(page: tuple[Path, Path]) -> None:
    assert (page[0] / "report.html").stat().st_size > 1_000_000


def test_every_plot_renders_what_duckdb_counts(page: tuple[Path, Path], browser) -> None:  # type: ignore[no-untyped-def]
    out, html = page
    browser.get(html.as_uri())
    plots = browser.execute_script(
        "return Object.fromEntries(Array.from(document.querySelectorAll('.js-plotly-plot')).map(e => [e.id, {"
        " traces: e.data.map(t => ({x: (t.x || []).length, z: (t.z || []).length})),"
        " marks: e.querySelectorAll('.point').length, heat: e.querySelectorAll('.hm').length}]))"
    )
    errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert errors == []
    con = connect(out)

    def one(sql: str) -> int:
        return int(con.execute(sql).fetchall()[0][0])

    # cost by team: a trace per team, a bar per hour it billed, each bar drawn
    teams = con.execute(
        "SELECT team, count(DISTINCT pane_start_ns // 3600000000000) FROM cost GROUP BY team ORDER BY team"
    ).fetchall()
    assert [t["x"] for t in plots["cost-by-team"]["traces"]] == [n for _, n in teams]
    assert plots["cost-by-team"]["marks"] == sum(n for _, n in teams)
    # held against used: a bar per team that held (unallocated among them), and per team that used those panes
    held = one("SELECT count(DISTINCT team) FROM allocation")
    used = one(
        "SELECT count(DISTINCT team) FROM cost SEMI JOIN (SELECT DISTINCT gpu_uuid, pane_start_ns FROM allocation) "
        "USING (gpu_uuid, pane_start_ns)"
    )
    assert held > 1 and sorted(t["x"] for t in plots["held-against-used"]["traces"]) == sorted([held, used])
    assert plots["held-against-used"]["marks"] == held + used
    hours = one("SELECT count(DISTINCT pane_start_ns // 3600000000000) FROM cost")
    assert [t["x"] for t in plots["idle-share"]["traces"]] == [hours] and hours >= 30
    # the heatmap: a row per GPU, a column per day, drawn
    gpus, days = (
        one("SELECT count(DISTINCT gpu_uuid) FROM idle_index"),
        one("SELECT count(DISTINCT date) FROM idle_index"),
    )
    assert plots["idle-heatmap"]["traces"] == [{"x": days, "z": gpus}] and plots["idle-heatmap"]["heat"] == 1
    # device faults: a bar per GPU with fatal faults, and per GPU with warnings
    fatal = one("SELECT count(DISTINCT gpu_uuid) FROM health WHERE faults_fatal > 0")
    warning = one("SELECT count(DISTINCT gpu_uuid) FROM health WHERE faults_warning > 0")
    assert (fatal, warning) == (1, 2)  # as ``faulty`` made them
    assert [t["x"] for t in plots["device-faults"]["traces"]] == [fatal, warning]  # fatal first, as sorted
    assert plots["device-faults"]["marks"] == fatal + warning
    for plot, sql in (
        ("most-idle", "SELECT least(10, count(DISTINCT gpu_uuid)) FROM idle_index"),
        ("health-grades", "SELECT count(DISTINCT grade) FROM health"),
        (
            "breaker-states",
            "SELECT count(DISTINCT s) FROM (SELECT arg_max(breaker_state, window_start_ns)"
            " AS s FROM health GROUP BY gpu_uuid)",
        ),
        ("reclaims", "SELECT count(DISTINCT sla) FROM reclaim"),
        ("mae", "SELECT count(DISTINCT (node_id, pid)) FROM mae"),
        ("dead-letters", "SELECT count(DISTINCT reason) FROM dlq"),
    ):
        want = one(sql)
        assert want > 0, plot  # this fleet has something to show in every plot
        assert [t["x"] for t in plots[plot]["traces"]] == [want] and plots[plot]["marks"] == want, plot


def test_the_team_table_is_duckdbs(page: tuple[Path, Path], browser) -> None:  # type: ignore[no-untyped-def]
    out, html = page
    browser.get(html.as_uri())
    rows = browser.execute_script(
        "return Array.from(document.querySelectorAll('#teams tr')).slice(1)"
        ".map(r => Array.from(r.cells).map(c => c.textContent))"
    )
    want = connect(out).execute("SELECT team, sum(cost_micro_usd), count(*) FROM cost GROUP BY team").fetchall()
    assert {r[0]: (int(r[1]), int(r[2])) for r in rows} == {t: (c, n) for t, c, n in want}


def test_a_date_range_narrows_every_plot(page: tuple[Path, Path], tmp_path: Path) -> None:
    out, _ = page
    gpucost(
        "report",
        "--out",
        str(out),
        "--html",
        str(tmp_path / "day.html"),
        "--since",
        "2025-01-07",
        "--until",
        "2025-01-07",
    )
    text = (tmp_path / "day.html").read_text()
    assert "2025-01-06" not in text.split("</script>", 1)[1].split("2025-01-07", 1)[0]  # the heatmap starts there
    proc = gpucost(
        "report",
        "--out",
        str(out),
        "--html",
        str(tmp_path / "x.html"),
        "--since",
        "2025-01-08",
        "--until",
        "2025-01-07",
        check=False,
    )
    assert proc.returncode == 2 and "after" in proc.stderr


def test_a_period_without_cost_records_is_an_error_not_an_empty_page(page: tuple[Path, Path], tmp_path: Path) -> None:
    """As export focus refuses a month without cost records: a --since past the data wrote a page of nothing."""
    out, _ = page
    (last,) = connect(out).execute("SELECT max(date) FROM cost").fetchone()
    later = (last + dt.timedelta(days=1)).isoformat()
    proc = gpucost("report", "--out", str(out), "--html", str(tmp_path / "x.html"), "--since", later, check=False)
    assert proc.returncode == 2 and "no cost record" in proc.stderr and str(last) in proc.stderr, proc.stderr
    assert not (tmp_path / "x.html").exists()


class _Tables(HTMLParser):
    """Each table's rows of cell texts by its id."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self._id: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self._id = dict(attrs).get("id")
            self.tables[self._id or ""] = []
        elif tag == "tr" and self._id:
            self.tables[self._id].append([])
        elif tag in ("td", "th") and self._id:
            self.tables[self._id][-1].append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self._id = None

    def handle_data(self, data: str) -> None:
        if self._id and self.tables[self._id] and self.tables[self._id][-1]:
            self.tables[self._id][-1][-1] += data


def _costliest(out: Path, kind: str, dates: tuple[str, str] | None) -> list[tuple[str, str, int]]:
    """The ten costliest (team, kernel line) or (team, range path) over the raw Parquet records, as revised (each line's
    records summed), in the report's order: (team, name, µ$)."""
    key = "category, kernel" if kind == "kernel" else "range_path"
    where = f"WHERE date BETWEEN DATE '{dates[0]}' AND DATE '{dates[1]}'" if dates else ""
    skip = "WHERE category <> 'no_kernel'" if kind == "kernel" else ""
    order = "team, kernel, category" if kind == "kernel" else "team, range_path"
    rows = duckdb.sql(
        f"""SELECT team, {"kernel" if kind == "kernel" else "range_path"}, sum(usd) AS usd FROM (
              SELECT team, {key}, sum(cost_micro_usd) AS usd
              FROM read_parquet('{out}/{kind}_cost/**/*.parquet', hive_partitioning = true) {where}
              GROUP BY gpu_uuid, pane_start_ns, tenant_key, team, {key}) {skip}
            GROUP BY team, {key} ORDER BY usd DESC, {order} LIMIT 10"""
    ).fetchall()
    name = (lambda n: n) if kind == "kernel" else (lambda n: " > ".join(json.loads(n)))
    return [(team, name(n), int(usd)) for team, n, usd in rows]


@pytest.mark.parametrize("dates", [None, ("2025-01-07", "2025-01-07")])
def test_the_costliest_kernels_and_ranges_are_the_raw_records_as_revised(
    page: tuple[Path, Path], tmp_path: Path, dates: tuple[str, str] | None
) -> None:
    out, html = page
    if dates:
        html = tmp_path / "day.html"
        gpucost("report", "--out", str(out), "--html", str(html), "--since", dates[0], "--until", dates[1])
    tables = _Tables()
    tables.feed(html.read_text())
    for kind, name_column in (("kernel", "kernel"), ("range", "range")):
        head, *rows = tables.tables[f"costliest-{kind}s-table"]
        at = {c: i for i, c in enumerate(head)}
        got = [(r[at["team"]], r[at[name_column]], int(r[at["micro_usd"]])) for r in rows]
        want = _costliest(out, kind, dates)
        assert len(want) == 10 and got == want, kind
    if dates:  # the day's figures are not the run's
        assert _costliest(out, "kernel", dates) != _costliest(out, "kernel", None)
