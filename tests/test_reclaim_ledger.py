"""``gpucost reclaim`` acts on each trigger once, wherever it is started from.

Its ledger of the triggers acted on defaulted to ``reclaim-ledger.txt`` in the working folder, so a second run
from another folder (a cron job's, a shell's) found no ledger and acted on every trigger again. It now defaults
to the state folder (``$XDG_STATE_HOME/gpucost``, as the producer's spool does; docs/operations.md), so both
runs read and write the same ledger.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpucost.cli import main
from gpucost.sinks.views import connect
from gpucost.streams.settings import AuditSettings
from tests.support.pipeline_runs import pipeline_run
from tests.support.sla_fleet import SCRIPTS, fleet


def triggers(out: Path) -> set[str]:
    """The reclaim view's trigger ids, read with SQL over the output (not by the command under test)."""
    return {row[0] for row in connect(out).execute("SELECT trigger_id FROM reclaim").fetchall()}


def test_a_second_run_from_another_folder_acts_on_nothing_again(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch, horizon: AuditSettings
) -> None:
    run = horizon.model_copy(update={"lateness_s": 0})
    out = pipeline_run(tmp_path_factory, "reclaim-ledger", run, lambda: fleet(SCRIPTS))
    want = triggers(out)
    assert want, "the SLA fleet's run has reclaim triggers to act on"
    state = tmp_path / "state"  # not made: the command makes its state folder
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    acted: list[list[dict[str, str]]] = []
    for folder in ("first", "second"):
        (tmp_path / folder).mkdir()
        monkeypatch.chdir(tmp_path / folder)
        actions = tmp_path / f"{folder}.jsonl"
        assert main(["reclaim", "--out", str(out), "--actions-file", str(actions)]) == 0
        acted.append([json.loads(line) for line in actions.read_text().splitlines()] if actions.exists() else [])
    assert {a["trigger_id"] for a in acted[0]} == want
    assert acted[1] == [], "the second run acted on triggers the first had acted on"
    assert set((state / "gpucost" / "reclaim-ledger.txt").read_text().split()) == want
    assert not list((tmp_path / "first").iterdir()), "the ledger was written in the working folder"
