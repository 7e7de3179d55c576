"""Compaction of the sink's small files: every row once, in order, and never a half-swapped view."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import threading
from collections import Counter, defaultdict
from dataclasses import replace
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest
from aiokafka import TopicPartition
from hypothesis import given, settings
from hypothesis import strategies as st

import gpucost.kafka.sink
import gpucost.sinks.compact
from gpucost.cli import main
from gpucost.kafka.sink import JOURNAL, run_kafka_sink
from gpucost.producers.simulate import FleetSpec, simulate
from gpucost.schemas.blocks import expand
from gpucost.schemas.codec import encode_event
from gpucost.schemas.records import kind_of
from gpucost.sinks.compact import RETIRED, STAGING, compact, partition_folders
from gpucost.sinks.lock import OutputBusyError, OutputLock
from gpucost.sinks.parquet import Journal, ParquetSink
from gpucost.sinks.views import connect, straddled, swaps
from gpucost.streams.audit import Auditor
from gpucost.streams.settings import AuditSettings
from tests.fake_kafka import Message, ScriptedConsumer

NS = 1_000_000_000
# two GPUs for 3 h across midnight UTC, and two bad lines: records of every kind, on two dates
_LINES = [
    encode_event(e).encode()
    for e in simulate(replace(FleetSpec(gpus=2, hours=3, interval_s=20), start_ns=FleetSpec().start_ns - 90 * 60 * NS))
]
_auditor = Auditor(AuditSettings())
RECORDS = expand(
    _auditor.ingest_lines([*_LINES, b"{not json", b'{"kind": "gpu_sample"}'], lambda i: f"f:{i}") + _auditor.finish()
)
VIEWS = ("idle_index", "cost", "mae", "health", "quota", "reclaim", "efficiency", "dlq")


def write_as_flushes(out: Path, cuts: list[int]) -> None:
    """The records as a sink writes them: a file per kind and date at every flush, here after each cut."""
    sink = ParquetSink(out)
    for lo, hi in zip([0, *cuts], [*cuts, len(RECORDS)]):
        for record in RECORDS[lo:hi]:
            sink.write(record)
        sink.flush()


def rows(out: Path) -> dict[str, list[tuple]]:
    """Every row of every view, as a sorted multiset (DuckDB over the files, as an analyst reads them)."""
    con = connect(out)
    return {v: con.execute(f"SELECT * FROM {v} ORDER BY ALL").fetchall() for v in VIEWS}


def part_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("part-*.parquet"))


def in_file_order(files: list[Path]) -> list[dict]:
    return [r for f in files for r in pq.ParquetFile(f).read().to_pylist()]


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
    exchange = gpucost.sinks.compact.exchange
    verdicts: list[tuple[bool, bool]] = []

    def watched(a: Path, b: Path) -> None:
        begun = swaps(tmp_path)  # a query begins just before the swap …
        exchange(a, b)
        verdicts.append((straddled(tmp_path, begun), straddled(tmp_path, swaps(tmp_path))))  # … and fails after it
        # (the second: a query begun after the swap, while the old folder is not yet retired, may not either)

    monkeypatch.setattr(gpucost.sinks.compact, "exchange", watched)
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
        gpucost.sinks.compact.exchange = die
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


def run_sink(out: Path, per_poll: int, min_files: int, monkeypatch: pytest.MonkeyPatch) -> gpucost.kafka.sink.SinkStats:
    """The sink over ``RECORDS`` as its topics would hold them, ``per_poll`` a poll, flushing after each."""
    offsets: Counter[str] = Counter()
    polls = []
    for lo in range(0, len(RECORDS), per_poll):
        poll = defaultdict(list)
        for record in RECORDS[lo : lo + per_poll]:
            kind = kind_of(record)
            poll[TopicPartition(f"t.{kind}", 0)].append(
                Message(b"", record.model_dump_json().encode(), offsets[kind], topic=f"t.{kind}", partition=0)
            )
            offsets[kind] += 1
        polls.append(dict(poll))
    monkeypatch.setattr(ScriptedConsumer, "polls", polls)
    monkeypatch.setattr(gpucost.kafka.sink, "AIOKafkaConsumer", ScriptedConsumer)

    async def main() -> gpucost.kafka.sink.SinkStats:
        ScriptedConsumer.done = asyncio.Event()
        return await run_kafka_sink(
            {},
            {k: f"t.{k}" for k in VIEWS},
            out,
            "g",
            ScriptedConsumer.done,
            flush_interval_s=0,
            compact_min_files=min_files,
        )

    return asyncio.run(main())


@pytest.mark.slow  # seconds of a whole run: CI runs it, the inner loop does not
@pytest.mark.parametrize("min_files", [2, 5])
def test_the_sink_compacts_as_it_goes_and_writes_each_record_once(tmp_path: Path, monkeypatch, min_files: int) -> None:
    reference = tmp_path / "reference"
    write_as_flushes(reference, [])
    stats = run_sink(tmp_path / "out", 25, min_files, monkeypatch)
    assert rows(tmp_path / "out") == rows(reference)
    flushes = -(-len(RECORDS) // 25)
    assert stats.compacted_files > flushes  # most of a flush's files were merged away
    for folder in partition_folders(tmp_path / "out"):  # left at most: a merged file, the files since, the last flush's
        assert sum(pq.read_metadata(p).num_rows < 1 << 20 for p in part_files(folder)) <= min_files + 1


@pytest.mark.slow  # seconds of a whole run: CI runs it, the inner loop does not
def test_the_sink_merges_a_few_files_at_a_time_and_within_its_budget(tmp_path: Path, monkeypatch, caplog) -> None:
    """A sink that finds many files (an old sink's) merges them a few at a time, over several commits."""
    write_as_flushes(tmp_path, list(range(0, len(RECORDS), 10)))  # what a sink without compaction left
    monkeypatch.setattr(gpucost.kafka.sink, "COMPACT_MAX_FILES", 3)
    before = max(len(part_files(f)) for f in partition_folders(tmp_path))
    with caplog.at_level("INFO", logger="gpucost.compact"):
        stats = run_sink(tmp_path, 25, 2, monkeypatch)
    merges = [int(r.getMessage().split(": ")[1].split(" files")[0]) for r in caplog.records]
    assert merges and max(merges) == 3 and sum(merges) == stats.compacted_files
    assert stats.compacted_files > before  # the fullest folder took more than one round
    monkeypatch.setattr(gpucost.kafka.sink, "COMPACT_BUDGET_S", 0.0)  # nothing begun after a commit
    assert run_sink(tmp_path / "other", 25, 2, monkeypatch).compacted_files == 0


def test_the_sink_leaves_its_files_as_flushed_with_compaction_off(tmp_path: Path, monkeypatch) -> None:
    stats = run_sink(tmp_path, 25, 0, monkeypatch)
    assert stats.compacted_files == 0
    assert max(len(part_files(f)) for f in partition_folders(tmp_path)) > 20


def test_a_second_sink_on_one_directory_is_refused(tmp_path: Path, monkeypatch) -> None:
    with OutputLock(tmp_path, "gpucost sink"), pytest.raises(OutputBusyError, match="one sink per directory"):
        run_sink(tmp_path, 25, 2, monkeypatch)


@pytest.mark.parametrize(
    "argv,words",
    [
        (["sink", "--compact-min-files", "1"], "--compact-min-files must be 0"),
        (["sink", "--compact-min-files", "-3"], "--compact-min-files must be 0"),
        (["compact", "--min-files", "1"], "--min-files must be at least 2"),
    ],
)
def test_thresholds_that_merge_nothing_are_usage_errors(tmp_path: Path, capsys, argv: list[str], words: str) -> None:
    write_as_flushes(tmp_path, [10])
    assert main([*argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err


def test_a_replay_never_overwrites_a_directory_a_sink_writes(tmp_path: Path, capsys) -> None:
    write_as_flushes(tmp_path / "out", [10])
    want = rows(tmp_path / "out")
    events = tmp_path / "events.jsonl"
    events.write_bytes(b"\n".join(_LINES[:50]) + b"\n")
    with OutputLock(tmp_path / "out", "gpucost sink"):
        assert main(["replay", str(events), "--out", str(tmp_path / "out"), "--overwrite"]) == 2
        assert "is being written by gpucost sink" in capsys.readouterr().err
    assert rows(tmp_path / "out") == want
    assert main(["replay", str(events), "--out", str(tmp_path / "out"), "--overwrite"]) == 0
    assert rows(tmp_path / "out") != want


class _Vanishing:
    """A connection whose first ``fails`` queries meet a file a compaction swapped away."""

    def __init__(self, out: Path, fails: int) -> None:
        self.con, self.fails = connect(out), fails

    def execute(self, sql: str) -> duckdb.DuckDBPyConnection:
        if self.fails:
            self.fails -= 1
            raise duckdb.IOException('IO Error: Cannot open file "cost/date=x/part-00001.parquet": No such file')
        return self.con.execute(sql)


@pytest.mark.parametrize("fails", [1, 2, 3])
def test_gpucost_query_runs_a_query_again_when_compaction_swapped_its_files(
    tmp_path: Path, capsys, monkeypatch, fails: int
) -> None:
    write_as_flushes(tmp_path, [10])
    tries = iter([_Vanishing(tmp_path, fails)] * 3)
    monkeypatch.setattr("gpucost.sinks.views.connect", lambda *args: next(tries))
    rc = main(["query", "--out", str(tmp_path), "SELECT count(*) FROM cost", "--format", "csv"])
    out, err = capsys.readouterr()
    if fails < 3:  # the third failure in a row is reported
        assert rc == 0 and out.splitlines()[1] == str(len(rows(tmp_path)["cost"]))
    else:
        assert rc == 2 and "No such file" in err and err.count("\n") == 1


def test_an_output_directory_that_cannot_be_made_is_said_so(tmp_path: Path, capsys) -> None:
    (tmp_path / "file").write_text("")
    events = tmp_path / "events.jsonl"
    events.write_bytes(b"\n".join(_LINES[:5]) + b"\n")
    assert main(["replay", str(events), "--out", str(tmp_path / "file" / "out")]) == 4
    assert (
        capsys.readouterr().err == f"gpucost: error: cannot create the output directory {tmp_path}/file/out: "
        "Not a directory\n"
    )
