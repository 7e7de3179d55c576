"""``--report on|off`` (env ``GPUCOST_REPORT``): ``replay``, a batch step, leaves no ``report.html`` unless asked and
says how to build it; ``run``, which a person watches, leaves one unless told not to. Either way the records are the
same, and ``gpucost report`` builds the page from the output afterwards.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from gpucost.cli import main


def gpucost(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(list(argv))
    return rc, out.getvalue()


@pytest.fixture(scope="module")
def events(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("report-flag") / "events"
    assert gpucost("simulate", "--gpus", "1", "--hours", "1", "--interval-s", "60", "--out", str(where))[0] == 0
    return where


def parquet_rows(out: Path) -> dict[str, int]:
    import pyarrow.dataset as ds

    return {
        kind.name: ds.dataset(kind, format="parquet").count_rows() for kind in sorted(out.iterdir()) if kind.is_dir()
    }


def test_replay_builds_no_page_unless_asked_and_says_how(events: Path, tmp_path: Path) -> None:
    rc, text = gpucost("replay", str(events), "--out", str(tmp_path / "plain"))
    assert rc == 0 and not (tmp_path / "plain" / "report.html").exists()
    assert f"report --out {tmp_path / 'plain'} --html FILE" in text and "--report off" in text
    rc, text = gpucost("replay", str(events), "--out", str(tmp_path / "asked"), "--report", "on")
    assert rc == 0 and (tmp_path / "asked" / "report.html").stat().st_size > 10_000
    assert f"report: {tmp_path / 'asked' / 'report.html'}" in text
    assert parquet_rows(tmp_path / "plain") == parquet_rows(tmp_path / "asked")  # the page changes no record
    # the command the hint names builds the same page afterwards
    assert gpucost("report", "--out", str(tmp_path / "plain"), "--html", str(tmp_path / "later.html"))[0] == 0
    assert (tmp_path / "later.html").stat().st_size > 10_000


def test_the_variable_and_run_s_default(events: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUCOST_REPORT", "on")
    assert gpucost("replay", str(events), "--out", str(tmp_path / "env"))[0] == 0
    assert (tmp_path / "env" / "report.html").exists()
    monkeypatch.delenv("GPUCOST_REPORT")
    run = ["run", "--source", "simulate", "--gpus", "1", "--hours", "1", "--interval-s", "60"]
    assert gpucost(*run, "--out", str(tmp_path / "run"))[0] == 0
    assert (tmp_path / "run" / "report.html").exists()  # run: on unless told
    assert gpucost(*run, "--out", str(tmp_path / "quiet"), "--report", "off")[0] == 0
    assert not (tmp_path / "quiet" / "report.html").exists()


def test_a_word_that_is_not_on_or_off_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as refused:
        main(["replay", str(tmp_path), "--out", str(tmp_path / "o"), "--report", "yes"])
    assert refused.value.code == 2 and "'yes': write on or off" in capsys.readouterr().err
