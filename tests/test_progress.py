"""Progress off a terminal: a line every interval (and one at the end), as key=value words or JSON lines; a bar
and no line on a terminal. It once printed nothing at all off a terminal (systemd, a container's log)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from gpucost.cli import main
from gpucost.progress import Progress


class Log(io.StringIO):
    def isatty(self) -> bool:
        return False


def test_a_line_every_interval_and_one_at_the_end() -> None:
    now = [0.0]
    log = Log()
    with Progress(
        "run",
        "events",
        facts=lambda: {"records": 7},
        log_format="json",
        every_s=60,
        stream=log,
        monotonic=lambda: now[0],
        clock=lambda: 0.0,
    ) as bar:
        for _ in range(150):  # 150 updates of 10 events, a second apart
            now[0] += 1
            bar.update(10)
    lines = [json.loads(line) for line in log.getvalue().splitlines()]
    assert [(x["state"], x["events"]) for x in lines] == [("running", 600), ("running", 1200), ("done", 1500)]
    assert lines[0]["per_s"] == 10.0 and lines[-1]["records"] == 7 and lines[0]["ts"] == "1970-01-01T00:00:00Z"


def test_a_failed_command_writes_no_done_line() -> None:
    log = Log()
    with pytest.raises(ValueError), Progress("run", "events", stream=log):
        raise ValueError
    assert log.getvalue() == ""


def test_run_off_a_terminal_logs_its_progress(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "run",
                "--source",
                "simulate",
                "--gpus",
                "1",
                "--hours",
                "1",
                "--out",
                str(tmp_path),
                "--log-format",
                "json",
            ]
        )
        == 0
    )
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")]
    assert lines and lines[-1]["state"] == "done" and lines[-1]["events"] > 0 and lines[-1]["records"] > 0
