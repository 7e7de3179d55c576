"""Compaction of the sink's small files: every row once, in order, and never a half-swapped view. The sink that
compacts as it goes, and the commands that guard an output a sink writes, are in tests/test_sink_compaction.py."""

from __future__ import annotations

import multiprocessing
import os
import threading
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpucost.sinks.compact
from gpucost.cli import main
from gpucost.kafka.sink import JOURNAL
from gpucost.sinks.compact import RETIRED, STAGING, compact, partition_folders
from gpucost.sinks.lock import OutputLock
from gpucost.sinks.parquet import Journal, ParquetSink
from gpucost.sinks.views import connect, straddled, swaps
from tests.support.compaction import RECORDS, in_file_order, part_files, rows, write_as_flushes


@pytest.mark.slow  # seconds of a whole run: CI runs it, the inner loop does not
@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.integers(0, len(RECORDS)), min_size=1, max_size=40).map(sorted),
    st.integers(2, 12),
    st.integers(40, 5000),
    st.one_of(st.none(), st.integers(1, 8)),
)
def test_compaction_keeps_every_row_once_and_in_file_order(
    tmp_path_factory, cuts: list[int], min_files: int, file_rows: int, max_files: int | None
) -> None:
    out = tmp_path_factory.mktemp("out")
    write_as_flushes(out, cuts)
    before_rows = rows(out)
    before = {f: part_files(f) for f in partition_folders(out)}
    sizes = {p: pq.read_metadata(p).num_rows for files in before.values() for p in files}
    inodes = {p: p.stat().st_ino for p in sizes}
    content = {p: in_file_order([p]) for p in sizes}

    stats = compact(out, min_files, file_rows, max_files=max_files)

    assert rows(out) == before_rows
    assert not (out / STAGING).exists()
    merged = []
    for folder, old in before.items():
        new = part_files(folder)
        small = [p for p in old if sizes[p] < file_rows]
        taken = small[:max_files] if len(small) >= min_files else []  # the oldest, and only where enough are small
        if -(-sum(sizes[p] for p in taken) // file_rows) >= len(taken):
            taken = []  # merging them would leave as many files
        kept = [p for p in new if p in inodes and p.stat().st_ino == inodes[p]]
        assert kept == [p for p in old if p not in taken]  # full files, and small ones not taken, untouched
        written = [p for p in new if p not in kept]
        assert [p.name for p in written] == [p.name for p in taken[: len(written)]]  # the first replaced files' names
        counts = [pq.read_metadata(p).num_rows for p in written]
        assert all(n <= file_rows for n in counts) and sum(n < file_rows for n in counts) <= 1
        assert in_file_order(written) == [r for p in taken for r in content[p]]  # the order they were written in
        assert _straddling_reads_are_whole_or_fail(
            {p.name: content[p] for p in old}, {p.name: in_file_order([p]) for p in new}
        )
        assert stats.small_left[folder] == sum(pq.read_metadata(p).num_rows < file_rows for p in new)
        merged += taken
    assert stats.files_merged == len(merged) and stats.rows == sum(sizes[p] for p in merged)


def _straddling_reads_are_whole_or_fail(old: dict[str, list], new: dict[str, list]) -> bool:
    """Every way a DuckDB scan of one folder can straddle its swap reads each row once or fails: it lists the old
    folder's names, ``stat``s them by path in order (a name that no longer resolves is skipped without a word,
    as its ``LocalFileSystem::ListFiles`` does), then opens the names it kept in name order; the swap lands
    before the ``stat`` of name ``t`` (every open after it), or before the open of kept name ``j``."""
    whole = sorted(map(repr, (r for rows in old.values() for r in rows)))
    names = sorted(old)
    ways = [([n for n in names[:t]] + [n for n in names[t:] if n in new], 0) for t in range(len(names) + 1)]
    ways += [(names, j) for j in range(len(names) + 1)]
    for listed, j in ways:
        sides = [old] * j + [new] * (len(listed) - j)
        if any(name not in side for name, side in zip(listed, sides)):
            continue  # "No such file": the query fails, and is run again
        read = sorted(map(repr, (r for name, side in zip(listed, sides) for r in side[name])))
        if read != whole:
            return False
    return True


@pytest.mark.slow
def test_a_reader_sees_every_row_exactly_once_while_folders_are_swapped(tmp_path: Path) -> None:
    write_as_flushes(tmp_path, list(range(0, len(RECORDS), max(1, len(RECORDS) // 60))))
    (total,) = connect(tmp_path).execute("SELECT count(*) FROM cost").fetchone()
    (money,) = connect(tmp_path).execute("SELECT sum(cost_micro_usd) FROM cost").fetchone()
    results: list[tuple[int, int]] = []
    errors: list[str] = []
    done = threading.Event()

    def read() -> None:
        con = None
        while not done.is_set():
            before = swaps(tmp_path)
            try:  # creating the views lists files too: a swap can catch that as well
                con = con or connect(tmp_path)
                results.append(con.execute("SELECT count(*), sum(cost_micro_usd) FROM cost").fetchone())
            except duckdb.Error as exc:  # listed before a swap, read after: an error, never a wrong sum
                if "No such file" not in str(exc) and not straddled(tmp_path, before):
                    errors.append(f"{type(exc).__name__}: {exc}")  # with no swap to explain it

    reader = threading.Thread(target=read)
    reader.start()
    swapped = []
    try:
        for rounds in range(6):  # each round's larger files make the last round's files small again
            swapped.append(compact(tmp_path, 2, file_rows=50 + 40 * rounds).partitions)
    finally:
        done.set()
        reader.join()
    assert all(swapped[:5]) and sum(swapped) >= 20, swapped  # folders swapped in each round but the last
    assert results, "the reader never completed a query"
    assert set(results) == {(total, money)}
    assert not errors, "\n".join(errors)


def test_a_query_begun_before_a_swap_and_failing_before_the_old_folder_is_retired_counts_as_straddling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The swap and the retiring of the old folder are two steps: a query that failed between them saw no
    change in the retired folders. It began while the folder was staged, which ``straddled`` counts (a
    query error taken for a real one failed the suite under load once)."""
    write_as_flushes(tmp_path, list(range(0, len(RECORDS), max(1, len(RECORDS) // 20))))
    exchange = gpucost.sinks.compact.exchange_folders
    verdicts: list[tuple[bool, bool]] = []

    def watched(a: Path, b: Path) -> None:
        begun = swaps(tmp_path)  # a query begins just before the swap …
        exchange(a, b)
        verdicts.append((straddled(tmp_path, begun), straddled(tmp_path, swaps(tmp_path))))  # … and fails after it
        # (the second: a query begun after the swap, while the old folder is not yet retired, may not either)

    monkeypatch.setattr(gpucost.sinks.compact, "exchange_folders", watched)
    assert compact(tmp_path, 2).partitions > 0
    assert verdicts and all(first for first, _ in verdicts)
    quiet = swaps(tmp_path)  # nothing being compacted: an error then is a real one
    assert not straddled(tmp_path, quiet)


def test_a_swapped_out_folder_outlives_any_listing_that_began_before_the_swap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its files stay (under ``RETIRED``, outside every view) for ``RETIRE_S``: a reader that opened the old folder
    just before the swap lists all of it, rather than only the hard links the swap kept (a silent partial read)."""
    write_as_flushes(tmp_path, list(range(0, len(RECORDS), max(1, len(RECORDS) // 30))))
    before = {p.name for f in partition_folders(tmp_path) for p in part_files(f)}
    before_rows = rows(tmp_path)
    assert compact(tmp_path, 2, file_rows=50).partitions > 0
    first = {p.relative_to(tmp_path / RETIRED).parts[0] for p in (tmp_path / RETIRED).rglob("*.parquet")}
    kept = {p.name for p in (tmp_path / RETIRED).rglob("*.parquet")}
    assert first and kept <= before, "the old files were deleted at the swap"
    assert rows(tmp_path) == before_rows  # and the views read none of them
    compact(tmp_path, 2, file_rows=90)  # at once: within RETIRE_S, they stay
    assert first <= {p.name for p in (tmp_path / RETIRED).iterdir()}
    monkeypatch.setattr(gpucost.sinks.compact, "RETIRE_S", 0)
    compact(tmp_path, 2, file_rows=130)
    assert not first & {p.name for p in (tmp_path / RETIRED).iterdir()}, "retired folders never go"
    assert rows(tmp_path) == before_rows


def _die_at(out: str, step: str) -> None:
    """A compaction killed at ``step`` (in a process of its own, as SIGKILL would leave it)."""

    def die(*_: object) -> None:
        os._exit(9)

    if step == "writing":
        ParquetSink.flush = die  # type: ignore[method-assign]
    elif step == "swapping":
        gpucost.sinks.compact.exchange_folders = die
    else:  # swapped, the old files not yet removed
        gpucost.sinks.compact.fsync_dir = die  # type: ignore[attr-defined]
    compact(Path(out))


@pytest.mark.slow
@pytest.mark.parametrize("step", ["writing", "swapping", "swapped"])
def test_a_compaction_killed_at_any_step_loses_and_repeats_nothing(tmp_path: Path, step: str) -> None:
    write_as_flushes(tmp_path, list(range(0, len(RECORDS), 50)))
    want = rows(tmp_path)
    child = multiprocessing.get_context("spawn").Process(target=_die_at, args=(str(tmp_path), step))
    child.start()
    child.join()
    assert child.exitcode == 9
    assert (tmp_path / STAGING).exists()  # it died with work under the staging folder …
    assert rows(tmp_path) == want  # … which no view reads
    stats = compact(tmp_path)
    assert not (tmp_path / STAGING).exists()
    assert rows(tmp_path) == want
    assert stats.partitions > 0 or step == "swapped"


def test_the_cli_leaves_folders_the_journal_needs_and_refuses_while_a_sink_writes(tmp_path: Path, capsys) -> None:
    write_as_flushes(tmp_path, list(range(0, len(RECORDS), 100)))
    want = rows(tmp_path)
    before = {f: len(part_files(f)) for f in partition_folders(tmp_path)}
    held = part_files(next(f for f in partition_folders(tmp_path) if f.parent.name == "cost"))[-1]
    Journal(tmp_path / JOURNAL, lambda: {"t:0": 7}).add(held.relative_to(tmp_path))
    with OutputLock(tmp_path, "gpucost sink"):
        assert main(["compact", "--out", str(tmp_path)]) == 2
        assert f"{tmp_path} is being written by gpucost sink (pid {os.getpid()})" in capsys.readouterr().err
    assert main(["compact", "--out", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    why = "holds files written since the sink's last commit"
    assert f"left as it is: {held.parent.relative_to(tmp_path)}: {why}" in err
    assert held.exists() and len(part_files(held.parent)) > 1
    others = [f for f in partition_folders(tmp_path) if f != held.parent]
    assert all(len(part_files(f)) == 1 for f in others)
    assert out.startswith(f"compacted {sum(before[f] > 1 for f in others)} partition(s)")
    assert rows(tmp_path) == want


def test_an_unreadable_file_leaves_its_folder_as_it_is(tmp_path: Path) -> None:
    write_as_flushes(tmp_path, list(range(0, len(RECORDS), 100)))
    idle, cost = (next(f for f in partition_folders(tmp_path) if f.parent.name == k) for k in ("idle_index", "cost"))
    (cost / "part-09998.parquet").write_bytes(b"not parquet")  # a corrupt file
    foreign = idle / "part-09999.parquet"  # a file of another kind's columns
    pq.write_table(pq.read_table(part_files(cost)[0]), foreign)
    before = {f: part_files(f) for f in (idle, cost)}
    due = [f for f in partition_folders(tmp_path) if f not in before and len(part_files(f)) > 1]
    stats = compact(tmp_path)
    assert set(stats.skipped) == {str(f.relative_to(tmp_path)) for f in (idle, cost)}
    assert all("is not a readable" in why for why in stats.skipped.values())
    assert {f: part_files(f) for f in (idle, cost)} == before
    assert stats.partitions == len(due) > 0
