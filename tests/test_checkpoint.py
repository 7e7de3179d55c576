"""A run's publication and checkpoint, step by step (``gpucost.publication``, ``gpucost.sinks.checkpoint``): a kill
between any two of its steps, made to happen here by raising where the step would run, and a restart on the same
``--out``, end with the records of a run never killed; records reach the Parquet while a quiet source waits; a
resume refuses what would mix two runs; compaction keeps a partition's files few. Default horizon and R = 0."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import gpucost.publication
import gpucost.wiring
from gpucost.cli import main
from gpucost.embedded import run_embedded
from gpucost.producers.simulate import FleetSpec, simulate
from gpucost.publication import Publication
from gpucost.sinks.checkpoint import Checkpoint
from gpucost.sinks.parquet import ParquetSink
from gpucost.streams.settings import AuditSettings
from tests.support.outputs import HORIZONS, rows

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


def killed_midway(monkeypatch: pytest.MonkeyPatch, out: Path, publication: int) -> None:
    """``RUN`` into ``out``, killed between the checkpoint and the renames of its ``publication``-th publication."""
    with monkeypatch.context() as patched:
        kill_at(patched, ParquetSink, "publish", publication)
        with pytest.raises(Killed):
            main([*RUN, "--out", str(out)])


def whole_run(tmp_path: Path) -> Path:
    assert main([*RUN, "--out", str(tmp_path / "whole")]) == 0
    return tmp_path / "whole"


@pytest.mark.slow  # a whole run per case, killed and resumed: CI runs it
@HORIZONS
@pytest.mark.parametrize(
    "owner,step",
    [(ParquetSink, "publish"), (gpucost.publication, "save"), (ParquetSink, "stage_all")],
    ids=["after the checkpoint, before the renames", "after staging, before the checkpoint", "before staging"],
)
def test_a_kill_between_steps_of_a_publication_loses_and_repeats_nothing(
    tmp_path: Path, monkeypatch, capsys, horizon_s: int, owner: object, step: str
) -> None:
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
    done = threading.Thread(
        target=run_embedded, args=(source(), settings, tmp_path), kwargs={"publication": publication, "live": True}
    )
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


@pytest.mark.slow
def test_a_resume_refuses_what_would_mix_two_runs(tmp_path: Path, monkeypatch, capsys) -> None:
    out = tmp_path / "out"
    killed_midway(monkeypatch, out, 4)
    capsys.readouterr()
    for argv, words in (
        ([*RUN[:4], "3", *RUN[5:]], "read"),
        ([*RUN, "--pane-s", "30"], "pane_s"),
    ):
        assert main([*argv, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and words in err and "--overwrite" in err, err
    assert main([*RUN, "--out", str(out)]) == 0
    capsys.readouterr()
    assert main([*RUN, "--out", str(out)]) == 2 and "has finished" in capsys.readouterr().err
    (out / ".checkpoint.json").write_text("{not json")
    assert main([*RUN, "--out", str(out)]) == 2 and "cannot read the checkpoint" in capsys.readouterr().err
    assert main([*RUN, "--out", str(out), "--overwrite"]) == 0


@pytest.mark.slow
def test_compaction_keeps_a_partitions_files_few(tmp_path: Path) -> None:
    """A publication every 10 ms makes a file per kind and day each time; a folder that gains 4 is merged."""
    assert main([*RUN, "--out", str(tmp_path), "--compact-min-files", "4"]) == 0
    folders = [f for f in tmp_path.glob("*/date=*") if f.is_dir()]
    assert folders and max(len(list(f.glob("part-*.parquet"))) for f in folders) <= 4
    assert main([*RUN, "--out", str(tmp_path / "never"), "--compact-min-files", "0"]) == 0
    assert max(len(list(f.glob("part-*.parquet"))) for f in (tmp_path / "never").glob("*/date=*")) > 4


def kill_after_save(monkeypatch: pytest.MonkeyPatch, when: Callable[[Checkpoint], bool]) -> None:
    """The checkpoint is written, then the process dies before renaming what it names, when ``when`` says."""
    real = gpucost.publication.save

    def save(out_dir: Path, checkpoint: Checkpoint) -> None:
        real(out_dir, checkpoint)
        if when(checkpoint):
            raise Killed

    monkeypatch.setattr(gpucost.publication, "save", save)


@pytest.mark.slow  # a whole run per case, killed and resumed: CI runs it
@HORIZONS
def test_a_kill_after_the_last_checkpoint_still_publishes_its_files(
    tmp_path: Path, monkeypatch, capsys, horizon_s: int
) -> None:
    """Killed between the finishing checkpoint and its renames: a restart once refused ('has finished') and the
    run's last records never appeared. It now renames them into place, then says the run has finished."""
    monkeypatch.setenv("GPUCOST_REVISION_HORIZON_S", str(horizon_s))
    want = rows(whole_run(tmp_path))
    out = tmp_path / "killed"
    with monkeypatch.context() as patched:
        kill_after_save(patched, lambda checkpoint: checkpoint.finished)
        with pytest.raises(Killed):
            main([*RUN, "--out", str(out)])
    capsys.readouterr()
    assert main([*RUN, "--out", str(out)]) == 2 and "has finished" in capsys.readouterr().err
    assert rows(out) == want and not list(out.glob("*/date=*/.*.tmp"))


@pytest.mark.slow  # a whole run per case, killed and resumed: CI runs it
@HORIZONS
@pytest.mark.parametrize("call", [2, 3, 4, 5])
def test_a_kill_before_a_checkpoint_after_compaction_freed_a_name_repeats_nothing(
    tmp_path: Path, monkeypatch, horizon_s: int, call: int
) -> None:
    """With a merge every two files, compaction frees the part number the last checkpoint named; a publication
    killed before its checkpoint staged a temporary of that number, which the restart took for the checkpoint's
    and renamed into place: up to 287 rows twice. Temporaries now carry their publication's number."""
    monkeypatch.setenv("GPUCOST_REVISION_HORIZON_S", str(horizon_s))
    argv = [*RUN, "--compact-min-files", "2"]
    assert main([*argv, "--out", str(tmp_path / "whole")]) == 0
    out = tmp_path / "killed"
    with monkeypatch.context() as patched:
        kill_at(patched, gpucost.publication, "save", call)
        with pytest.raises(Killed):
            main([*argv, "--out", str(out)])
    assert main([*argv, "--out", str(out)]) == 0
    assert rows(out) == rows(tmp_path / "whole")


@pytest.mark.parametrize(
    "edit",
    [
        {"inputs": "x"},
        {"inputs": -5},
        {"inputs": None},
        {"state": []},
        {"state": {}},
        {"state": {"panes": "x"}},
        {"publishing": 5},
        {"publishing": [["a"]]},
        {"settings": []},
        {"finished": "no"},
        {"publication": True},
        {"v": 2},  # a later layout
        {"v": True},  # equal to 1 in Python, not a layout
        {"v": "1"},
    ],
)
def test_a_checkpoint_of_wrong_types_is_refused_in_one_line_and_changes_nothing(
    tmp_path: Path, monkeypatch, capsys, edit: dict
) -> None:
    out = tmp_path / "out"
    with monkeypatch.context() as patched:
        kill_after_save(patched, lambda checkpoint: checkpoint.publication == 3)  # its files still to rename
        with pytest.raises(Killed):
            main([*RUN, "--out", str(out)])
    path = out / ".checkpoint.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **edit}))
    before = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    capsys.readouterr()
    assert main([*RUN, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--overwrite" in err, err
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == before


@pytest.mark.slow
def test_a_checkpoint_that_cannot_be_written_is_one_line_and_the_run_goes_on_later(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    want = rows(whole_run(tmp_path))
    out = tmp_path / "full"
    real, calls = gpucost.publication.save, [0]

    def full(out_dir: Path, checkpoint: Checkpoint) -> None:
        calls[0] += 1
        if calls[0] == 4:
            raise OSError(28, "No space left on device")
        real(out_dir, checkpoint)

    with monkeypatch.context() as patched:
        patched.setattr(gpucost.publication, "save", full)
        capsys.readouterr()
        assert main([*RUN, "--out", str(out)]) == 4
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "No space left" in err and "Traceback" not in err
    assert main([*RUN, "--out", str(out)]) == 0 and rows(out) == want


def test_an_overwrite_killed_midway_never_resumes_from_the_old_checkpoint(tmp_path: Path, monkeypatch, capsys) -> None:
    """``--overwrite`` once deleted the output first and the checkpoint last: killed in between, the next start
    resumed from a checkpoint whose records were gone (328 idle rows lost, no word)."""
    out = tmp_path / "out"
    killed_midway(monkeypatch, out, 5)
    with monkeypatch.context() as patched:
        kill_at(patched, gpucost.wiring.shutil, "rmtree", 2)
        with pytest.raises(Killed):
            main([*RUN, "--out", str(out), "--overwrite"])
    capsys.readouterr()
    assert main([*RUN, "--out", str(out)]) == 2 and "already holds gpucost output" in capsys.readouterr().err


def test_a_restarted_run_counts_the_files_earlier_lives_left_toward_compaction(tmp_path: Path, monkeypatch) -> None:
    """A life that never compacts leaves many small files; the next life, compacting at 4, merges them at its
    first publication. It once counted only its own files, so a run restarted more often than it compacted
    piled files up without bound."""
    for min_files, call in (("0", 9), ("4", 2)):
        with monkeypatch.context() as patched:
            kill_at(patched, ParquetSink, "publish", call)
            with pytest.raises(Killed):
                main([*RUN, "--compact-min-files", min_files, "--out", str(tmp_path)])
        most = max(len(list(f.glob("part-*.parquet"))) for f in tmp_path.glob("*/date=*"))
        assert most > 4 if min_files == "0" else most <= 4


def test_the_same_settings_spelled_otherwise_resume(tmp_path: Path, monkeypatch, capsys) -> None:
    """0.60 is 0.6; the opex rate bills nothing (the unit_cost view adds it at query time)."""
    out = tmp_path / "out"
    killed_midway(monkeypatch, out, 4)
    alpha = f"{AuditSettings().alpha}0"
    assert main([*RUN, "--out", str(out), "--alpha", alpha, "--opex-usd-per-gpu-hour", "0.35"]) == 0
    said = capsys.readouterr()
    (taken,) = re.findall(r"going on from the checkpoint in .* \(([\d,]+) inputs taken\)", said.err)
    # the summary says how many came before the restart; its rate is this run's own (a newcomer saw both mixed)
    assert f"({taken} of them before a restart)" in said.out and "rows written by this run" in said.out, said.out


def test_progress_goes_on_while_the_source_is_quiet(tmp_path: Path) -> None:
    settings, released, calls = AuditSettings(), threading.Event(), []

    def source() -> Iterator[tuple[object, str]]:
        yield from ((ev, "simulate") for ev in simulate(FleetSpec(gpus=1, hours=1, seed=1)))
        released.wait(1.5)

    publication = Publication(tmp_path, 0.2, settings.model_dump(mode="json"), {"source": "test"})
    run_embedded(source(), settings, tmp_path, on_batch=calls.append, publication=publication, live=True)
    assert sum(1 for batch in calls if not batch) >= 3  # the progress bar was told every time a publication fell due
