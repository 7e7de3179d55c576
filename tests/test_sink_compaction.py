"""Compaction as the rest of the tool meets it: the Kafka sink merging its files as it goes (and within its
budget), the thresholds that would merge nothing, and the guards around an output a sink writes (a replay that
would overwrite it, a query whose files a compaction swapped, a directory that cannot be made). Compaction itself
is tested in tests/test_compact.py."""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest
from aiokafka import TopicPartition

import gpucost.kafka.sink
from gpucost.cli import main
from gpucost.kafka.sink import run_kafka_sink
from gpucost.schemas.records import kind_of
from gpucost.sinks.compact import partition_folders
from gpucost.sinks.lock import OutputBusyError, OutputLock
from gpucost.sinks.views import connect
from tests.fake_kafka import Message, ScriptedConsumer
from tests.support.compaction import LINES, RECORDS, VIEWS, part_files, rows, write_as_flushes


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
    events.write_bytes(b"\n".join(LINES[:50]) + b"\n")
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
    events.write_bytes(b"\n".join(LINES[:5]) + b"\n")
    assert main(["replay", str(events), "--out", str(tmp_path / "file" / "out")]) == 4
    assert (
        capsys.readouterr().err == f"gpucost: error: cannot create the output directory {tmp_path}/file/out: "
        "Not a directory\n"
    )
