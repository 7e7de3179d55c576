"""Readable output (issue 36, part 6): the report's axes say what and in what unit, the page says the period it
covers and draws no empty plot; ``gpucost query`` shows event times as ISO-8601 UTC unless asked for the integers;
the README's sample output is what a run prints today. Expected values come from pyarrow over the raw Parquet,
numpy's own ISO parser, or the README itself, never from the code under test."""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.dataset as ds
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpucost.cli import main
from gpucost.report_html import PLOTS
from gpucost.times import iso_ns
from tests.conftest import ROOT

RUN = ["run", "--gpus", "2", "--hours", "3", "--interval-s", "30", "--admission-h", "0"]


def run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(args))
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("readable") / "out"
    rc, text, _ = run(*RUN, "--out", str(out))
    assert rc == 0
    return out, text


def plots(page: str) -> dict[str, tuple[list[Any], dict[str, Any]]]:
    """Each figure's data and layout, as the page hands them to ``Plotly.newPlot``."""
    found = {}
    decoder = json.JSONDecoder()
    for m in re.finditer(r'Plotly\.newPlot\(\s*"([^"]+)",\s*', page):
        data, end = decoder.raw_decode(page, m.end())
        layout, _ = decoder.raw_decode(page, page.index("{", end))
        found[m.group(1)] = (data, layout)
    return found


def records(out: Path, kind: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = ds.dataset(out / kind, format="parquet", partitioning="hive").to_table().to_pylist()
    return rows


def test_every_axis_says_what_and_in_what_unit(fleet: tuple[Path, str]) -> None:
    figures = plots((fleet[0] / "report.html").read_text())
    # every figure but the dead letters' and the device faults', of which the simulated fleet has none
    assert set(figures) == {p.id for p in PLOTS} - {"dead-letters", "device-faults"}
    for name, (_, layout) in figures.items():
        for axis in ("xaxis", "yaxis"):
            assert layout[axis]["title"]["text"].strip(), (name, axis)
    y = {name: layout["yaxis"]["title"]["text"] for name, (_, layout) in figures.items()}
    assert "USD" in y["cost-by-team"] and "%" in y["idle-share"] and "%" in y["most-idle"]
    assert "UTC" in figures["cost-by-team"][1]["xaxis"]["title"]["text"]
    # the idle share is drawn in %: its hourly values are 100 × the idle µ$ over all µ$, from the raw records
    hours: dict[int, list[int]] = {}
    for r in records(fleet[0], "cost"):
        h = hours.setdefault(r["pane_start_ns"] // 3_600_000_000_000, [0, 0])
        h[0] += r["cost_micro_usd"] if r["team"] == "idle" else 0
        h[1] += r["cost_micro_usd"]
    want = [100 * i / t for _, (i, t) in sorted(hours.items()) if t > 0]
    assert figures["idle-share"][0][0]["y"] == pytest.approx(want, rel=1e-9)


def test_the_page_says_the_period_it_covers(fleet: tuple[Path, str]) -> None:
    out = fleet[0]
    panes = [(r["pane_start_ns"], r["pane_end_ns"]) for kind in ("cost", "idle_index") for r in records(out, kind)]
    start, end = (
        dt.datetime.fromtimestamp(ns // 10**9, dt.UTC).strftime("%Y-%m-%d %H:%M")
        for ns in (min(s for s, _ in panes), max(e for _, e in panes))
    )
    assert f"Period covered: {start} UTC to {end} UTC" in (out / "report.html").read_text()
    assert f"Period covered: {start} UTC to {end} UTC" in fleet[1]  # the run's summary says it too


def test_a_section_with_no_data_says_so_instead_of_an_empty_plot(fleet: tuple[Path, str], tmp_path: Path) -> None:
    page = (fleet[0] / "report.html").read_text()
    assert not (fleet[0] / "dlq").exists() or not records(fleet[0], "dlq")
    assert "no dead letters" in page and "dead-letters" not in plots(page)
    # nothing but dead letters: every other section says what it lacks, and the one figure drawn still gets its script
    (tmp_path / "bad.jsonl").write_text('not json\n{"kind": "gpu_sample"}\n')
    rc, text, _ = run("replay", str(tmp_path / "bad.jsonl"), "--out", str(tmp_path / "o"), "--report", "on")
    assert rc == 0 and "no cost records" in text and "no idle index records" in text  # the summary, likewise
    assert "team  micro_usd" not in text
    page = (tmp_path / "o" / "report.html").read_text()
    assert list(plots(page)) == ["dead-letters"]
    assert "no cost records" in page and "no reclaim triggers" in page and "Period covered: none" in page
    assert page.count("<script") >= 2 and "plotly.js" in page.split('id="dead-letters"')[0].lower()


@given(st.integers(min_value=-(10**18) * 9, max_value=2**63 - 1))
def test_an_event_time_reads_back_as_the_same_nanosecond(ns: int) -> None:
    text = iso_ns(ns)
    assert text.endswith("Z") and "T" in text
    assert np.datetime64(text[:-1], "ns").astype(np.int64) == ns  # numpy's own ISO parser, to the nanosecond


def test_query_shows_event_times_in_utc_unless_asked_for_integers(
    fleet: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = str(fleet[0])
    sql = (
        "SELECT pane_start_ns, pane_end_ns - pane_start_ns AS span_ns, covered_ms FROM idle_index "
        "ORDER BY gpu_uuid, pane_start_ns LIMIT 3"
    )
    want = sorted(
        (r["gpu_uuid"], r["pane_start_ns"], r["pane_end_ns"], r["covered_ms"]) for r in records(fleet[0], "idle_index")
    )[:3]
    rc, text, _ = run("query", sql, "--out", out, "--format", "json")
    got = json.loads(text)
    assert rc == 0 and [np.datetime64(r["pane_start_ns"].rstrip("Z"), "ns").astype(np.int64) for r in got] == [
        w[1] for w in want
    ]
    assert all(r["pane_start_ns"].endswith(":00Z") for r in got)  # whole minutes, UTC
    assert [r["span_ns"] for r in got] == [w[2] - w[1] for w in want]  # a computed length stays a number
    assert [r["covered_ms"] for r in got] == [w[3] for w in want]
    rc, text, _ = run("query", sql, "--out", out, "--format", "json", "--raw-times")
    assert [r["pane_start_ns"] for r in json.loads(text)] == [w[1] for w in want]
    monkeypatch.setenv("GPUCOST_QUERY_RAW_TIMES", "1")
    rc, text, _ = run("query", sql, "--out", out, "--format", "csv")
    assert text.splitlines()[1].split(",")[0] == str(want[0][1])
    monkeypatch.setenv("GPUCOST_QUERY_RAW_TIMES", "maybe")
    rc, _, err = run("query", sql, "--out", out)
    assert rc == 2 and err.count("\n") == 1 and "GPUCOST_QUERY_RAW_TIMES" in err


def _shape(lines: list[str]) -> set[str]:
    """A summary's headings and table header lines, with every number as ``#`` and columns as two spaces apart:
    what does not depend on the fleet."""
    keep = {line for line in lines if line.endswith(":") and not line.startswith(" ")}
    keep |= {lines[i] for i in range(len(lines) - 1) if lines[i + 1].startswith("---")}
    return {re.sub(r"\s{2,}", "  ", re.sub(r"\d[\d,.]*", "#", line.rstrip())) for line in keep}


@pytest.mark.slow
def test_the_readmes_sample_output_is_todays(fleet: tuple[Path, str], tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## What a run looks like", 1)[1].split("```", 2)[1].splitlines()
    command = block[1].removeprefix("$ .venv/bin/gpucost ").split()
    assert command[0] == "run"
    # the same command on a smaller fleet prints the same sections, tables and columns
    rc, text, _ = run(
        *command[:1],
        "--gpus",
        "4",
        "--hours",
        "26",
        "--interval-s",
        "30",
        "--admission-h",
        "0",
        "--out",
        str(tmp_path / "o"),
    )
    assert rc == 0
    assert _shape(block) == _shape(text.splitlines())
