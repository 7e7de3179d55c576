"""A run's publication and checkpoint, step by step (``gpucost.publication``, ``gpucost.sinks.checkpoint``): a kill
between any two of its steps, made to happen here by raising where the step would run, and a restart on the same
``--out``, end with the records of a run never killed; records reach the Parquet while a quiet source waits; a
resume refuses what would mix two runs; compaction keeps a partition's files few. Default horizon and R = 0."""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import gpucost.publication
from gpucost.cli import main
from gpucost.embedded import run_embedded
from gpucost.producers.simulate import FleetSpec, simulate
from gpucost.publication import Publication
from gpucost.sinks.parquet import ParquetSink
from gpucost.streams.settings import AuditSettings
from tests.test_live_run import HORIZONS, rows

RUN = ["run", "--source", "simulate", "--gpus", "2", "--hours", "12", "--seed", "3", "--publish-delay-s", "0.01"]


class Killed(BaseException):
    """Stands for SIGKILL: nothing after it runs, no handler sees it."""


def kill_at(monkeypatch: pytest.MonkeyPatch, owner: object, name: str, call: int) -> None:
    """``owner.name`` raises ``Killed`` on its ``call``-th call instead of running."""
    real, calls = getattr(owner, name), [0]

    def step(*args: object, **kwargs: object) -> object:
        calls[0] += 1
        if calls[0] == call:
            raise Killed
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, step)


def whole_run(tmp_path: Path) -> Path:
    assert main([*RUN, "--out", str(tmp_path / "whole")]) == 0
    return tmp_path / "whole"


@HORIZONS
@pytest.mark.parametrize("owner,step", [(ParquetSink, "publish"), (gpucost.publication, "save"),
                                        (ParquetSink, "stage_all")],
                         ids=["after the checkpoint, before the renames", "after staging, before the checkpoint",
                              "before staging"])
def test_a_kill_between_steps_of_a_publication_loses_and_repeats_nothing(tmp_path: Path, monkeypatch, capsys,
                                                                         horizon_s: int, owner: object,
                                                                         step: str) -> None:
    monkeypatch.setenv("GPUCOST_REVISION_HORIZON_S", str(horizon_s))
    want = rows(whole_run(tmp_path))
    out = tmp_path / "killed"
    for call in (1, 3, 7):  # the first publication too: no checkpoint yet, only temporaries
        with monkeypatch.context() as patched:
            kill_at(patched, owner, step, call)
            with pytest.raises(Killed):
                main([*RUN, "--out", str(out)])
    assert main([*RUN, "--out", str(out)]) == 0
    assert "going on from the checkpoint" in capsys.readouterr().err
    assert rows(out) == want
    assert not list(out.glob("*/date=*/.*.tmp"))  # nothing left half-published


@HORIZONS
def test_records_reach_the_parquet_while_a_quiet_source_waits(tmp_path: Path, horizon_s: int) -> None:
    """Two hours of a fleet, then a source with nothing to say: the closed panes' records are in the Parquet
    within the publication delay, while the run goes on (they once waited for the end of the run)."""
    settings = AuditSettings(revision_horizon_s=horizon_s)
    released = threading.Event()

    def source() -> Iterator[tuple[object, str]]:
        for ev in simulate(FleetSpec(gpus=2, hours=2, seed=1)):
            yield ev, "simulate"
        released.wait(30)

    publication = Publication(tmp_path, 0.2, settings.model_dump(mode="json"), {"source": "test"})
    done = threading.Thread(target=run_embedded, args=(source(), settings, tmp_path),
                            kwargs={"publication": publication, "live": True})
    done.start()
    deadline = time.monotonic() + 20
    while not list(tmp_path.glob("cost/date=*/part-*.parquet")) and time.monotonic() < deadline:
        time.sleep(0.05)
    waiting = done.is_alive()
    published = rows(tmp_path)["cost"]
    released.set()
    done.join()
    assert waiting and sum(published.values()) > 0
    assert sum(rows(tmp_path)["cost"].values()) >= sum(published.values())


def test_a_resume_refuses_what_would_mix_two_runs(tmp_path: Path, monkeypatch, capsys) -> None:
    out = tmp_path / "out"
    with monkeypatch.context() as patched:
        kill_at(patched, ParquetSink, "publish", 4)
        with pytest.raises(Killed):
            main([*RUN, "--out", str(out)])
    capsys.readouterr()
    for argv, words in (([*RUN[:4], "3", *RUN[5:]], "read"), ([*RUN, "--pane-s", "30"], "pane_s"),):
        assert main([*argv, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and words in err and "--overwrite" in err, err
    assert main([*RUN, "--out", str(out)]) == 0
    capsys.readouterr()
    assert main([*RUN, "--out", str(out)]) == 2 and "has finished" in capsys.readouterr().err
    (out / ".checkpoint.json").write_text("{not json")
    assert main([*RUN, "--out", str(out)]) == 2 and "cannot read the checkpoint" in capsys.readouterr().err
    assert main([*RUN, "--out", str(out), "--overwrite"]) == 0


def test_compaction_keeps_a_partitions_files_few(tmp_path: Path) -> None:
    """A publication every 10 ms makes a file per kind and day each time; a folder that gains 4 is merged."""
    assert main([*RUN, "--out", str(tmp_path), "--compact-min-files", "4"]) == 0
    folders = [f for f in tmp_path.glob("*/date=*") if f.is_dir()]
    assert folders and max(len(list(f.glob("part-*.parquet"))) for f in folders) <= 4
    assert main([*RUN, "--out", str(tmp_path / "never"), "--compact-min-files", "0"]) == 0
    assert max(len(list(f.glob("part-*.parquet"))) for f in (tmp_path / "never").glob("*/date=*")) > 4
