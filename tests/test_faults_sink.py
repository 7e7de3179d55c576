"""Fault injection against the real broker, at the sink: SIGKILLed while writing, dying between a rename and its
commit and between its commit and emptying its journal, and a full disk; each time the Parquet against the embedded
run, every visible file readable.

At the end of the session pytest prints one line per fault: events sent, records in the output, events
dead-lettered (by reason), and µ$ billed against µ$ expected (tests/support/faults.py).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest
from aiokafka import AIOKafkaConsumer

from gpucost.kafka.sink import JOURNAL, run_kafka_sink
from gpucost.schemas.records import OUTPUT_KINDS
from gpucost.sinks.views import connect
from tests.support.deployment import (
    Deployment,
    assert_same_parquet,
    deployment,  # noqa: F401 (a fixture)
    embedded_counts,
    run_to_completion,
    wait_for,
)
from tests.support.faults import events_in, report

pytestmark = [pytest.mark.slow, pytest.mark.kafka]


def all_visible_files_readable(out: Path) -> None:
    for path in out.glob("*/date=*/*.parquet"):
        try:
            duckdb.connect().execute(f"SELECT count(*) FROM read_parquet('{path}')").fetchone()  # raises if torn
        except duckdb.IOException as exc:  # merged away by a compaction since the glob (names are never reused)
            if path.exists() or "No such file" not in str(exc):
                raise


def cost_files(out: Path) -> list[Path]:
    return list(out.glob("cost/date=*/part-*.parquet"))


class CostRows:
    """The cost rows in the sink's published files, from each file's footer (read once a file): far
    cheaper than a query, so it can be looked at between two of a sink's flushes."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.rows: dict[Path, int] = {}

    def __call__(self) -> int:
        files = cost_files(self.out)
        for f in files:
            if f not in self.rows:
                try:
                    self.rows[f] = pq.read_metadata(f).num_rows
                except OSError:  # merged away by a compaction meanwhile
                    self.rows[f] = 0
        return sum(self.rows[f] for f in files)


def test_sink_killed_while_writing(deployment: Deployment, recorded: tuple[Path, Path]) -> None:
    events, embedded = recorded
    d = deployment
    d.gpucost("produce", "--source", "replay", str(events))
    d.worker("worker")
    want = embedded_counts(embedded)["cost"]
    rnd = random.Random(int(os.environ.get("GPUCOST_FAULT_SEED", "7")))  # when each kill falls
    kills = mid_write = 0
    written = CostRows(d.out)
    while kills < 4 and d.rows("cost") < want:
        victim = d.spawn(
            f"sink-{kills}", "sink", "--out", str(d.out), "--group", f"{d.app_id}-sink", "--flush-interval-s", "0.01"
        )
        # a flush every 0.01 s publishes each poll (at most 5,000 records) as it is read: a sink started once the
        # worker has finished still writes what is left over several flushes, so a kill can land among them on a
        # machine of any speed (at 0.1 s, one flush took all a second sink had left on a fast CI machine).
        # Killed once it has published a few files, how many drawn at random, or half of the rows left, whichever
        # comes first: somewhere in the middle of writing, however fast this machine writes (a sink drawing 4
        # files once finished all there was before its fourth). Files and their footers are counted, not rows
        # queried: a query takes long enough under load for a fast sink to finish meanwhile
        seen, rows = len(cost_files(d.out)), written()
        target, half, deadline = seen + rnd.randint(1, 4), rows + (want - rows) // 2, time.monotonic() + 60
        while (n := len(cost_files(d.out))) < target and victim.poll() is None and time.monotonic() < deadline:
            if n != seen:  # publishing: 5 s for each next file, so a sink that wrote everything is not waited on
                seen, deadline = n, time.monotonic() + 5
                if written() >= half:
                    break
            time.sleep(0.002)
        time.sleep(rnd.random() * 0.01)
        mid_write += d.rows("cost") < want
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        kills += 1
        all_visible_files_readable(d.out)  # never a partial file, whenever it died
    assert mid_write >= 2, f"only {mid_write} of {kills} kills came before the sink had written everything"
    d.sink("sink-last")
    run_to_completion(d, embedded)
    assert not list(d.out.glob("*/date=*/.*.tmp")), "temporaries of the killed sinks were left behind"
    assert_same_parquet(d.out, embedded)
    report(f"sink SIGKILLed x{kills}", events_in(events), d, embedded)


def test_sink_dies_between_rename_and_commit(
    deployment: Deployment, recorded: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one window where a record can be read twice: its file is renamed into place, the offset not yet
    committed. The next sink drops those records by the journal's files, up to the offsets the journal
    holds, even across its own commits; and it reads nothing older."""
    events, embedded = recorded
    d = deployment
    d.gpucost("produce", "--source", "replay", str(events))
    d.worker("worker")
    want = embedded_counts(embedded)
    wait_for("every cost record on its topic", lambda: d.topic_size("cost") >= want["cost"], 120, d.tmp)

    commit = AIOKafkaConsumer.commit

    async def died(self: AIOKafkaConsumer, *args: object, **kwargs: object) -> None:
        if not any((d.out / "cost").rglob("*.parquet")):  # the kill comes after a cost file is in place
            return await commit(self, *args, **kwargs)
        raise RuntimeError("killed between the rename and the commit")

    monkeypatch.setattr(AIOKafkaConsumer, "commit", died)
    with pytest.raises(RuntimeError, match="between the rename"):
        asyncio.run(
            run_kafka_sink(
                {"bootstrap_servers": d.bootstrap},
                {k: f"{d.prefix}{k}" for k in OUTPUT_KINDS},
                d.out,
                f"{d.app_id}-sink",
                asyncio.Event(),
                flush_interval_s=0.5,
            )
        )
    monkeypatch.undo()
    journal = (d.out / JOURNAL).read_text().split()
    assert connect(d.out).execute("SELECT count(*) FROM cost").fetchone()[0] > 0 and journal
    # a file outside the journal is not read again: were it, this one would stop the sink
    stale = d.out / "cost" / "date=2000-01-01" / "part-99999.parquet"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"not parquet")
    # committing after every poll: the first commits come before it has read again all that the journal covers
    sink = d.spawn("sink-after", "sink", "--out", str(d.out), "--group", f"{d.app_id}-sink", "--flush-interval-s", "0")
    wait_for(
        "the restarted sink past what it read twice (it empties the journal)",
        lambda: not (d.out / JOURNAL).read_text().split(),
        120,
        d.tmp,
    )
    assert sink.poll() is None, "the restarted sink stopped"
    stale.unlink()
    stale.parent.rmdir()
    run_to_completion(d, embedded)
    assert_same_parquet(d.out, embedded)
    assert (d.out / JOURNAL).read_text().split() == [], "the journal outlived the commit"


def test_sink_dies_between_commit_and_clearing_its_journal(
    deployment: Deployment, recorded: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Everything the journal lists is behind the last commit and nothing more arrives: the restarted sink
    has nothing to read, and must still see that it is past the journal (by its partitions' positions), so
    that it stops holding those files' keys and compacts again. It once waited for a record on every
    partition the journal named, which a finished or quiet topic never sends."""
    events, embedded = recorded
    d = deployment
    d.gpucost("produce", "--source", "replay", str(events))
    d.worker("worker")
    want = embedded_counts(embedded)

    async def until_all_read() -> None:
        stop = asyncio.Event()
        sink = asyncio.create_task(
            run_kafka_sink(
                {"bootstrap_servers": d.bootstrap},
                {k: f"{d.prefix}{k}" for k in OUTPUT_KINDS},
                d.out,
                f"{d.app_id}-sink",
                stop,
                flush_interval_s=0.5,
                compact_min_files=0,
            )
        )
        deadline = time.monotonic() + 240
        while not all(d.rows(v) >= n for v, n in want.items()):
            assert not sink.done() and time.monotonic() < deadline, "the first sink stopped or fell behind"
            await asyncio.sleep(0.2)
        stop.set()
        await sink  # its last commit covers every record read

    monkeypatch.setattr("gpucost.sinks.parquet.Journal.clear", lambda self: None)  # killed before each clear
    asyncio.run(until_all_read())
    monkeypatch.undo()
    assert (d.out / JOURNAL).read_text().split(), "the journal was cleared after all"
    sink = d.spawn("sink-after", "sink", "--out", str(d.out), "--group", f"{d.app_id}-sink", "--flush-interval-s", "0")
    wait_for(
        "the restarted sink to see it is past the journal", lambda: not (d.out / JOURNAL).read_text().split(), 60, d.tmp
    )
    assert sink.poll() is None, "the restarted sink stopped"
    d.stop()
    assert_same_parquet(d.out, embedded)


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs (a full disk) needs root")
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_disk_full_then_space_back(deployment: Deployment, recorded: tuple[Path, Path], tiny_disk: Path) -> None:
    events, embedded = recorded
    d = deployment
    d.out = tiny_disk / "parquet"
    d.gpucost("produce", "--source", "replay", str(events))
    d.worker("worker")
    sink = d.spawn(
        "sink",
        "sink",
        "--out",
        str(d.out),
        "--group",
        f"{d.app_id}-sink",
        "--flush-interval-s",
        "0.5",
        "--retry-s",
        "0.5",
    )
    wait_for(
        "the sink to report the full disk", lambda: "No space left" in (d.tmp / "sink.log").read_text(), 120, d.tmp
    )
    time.sleep(2)
    assert sink.poll() is None, "the sink died instead of waiting for space"
    all_visible_files_readable(d.out)
    # a retry in progress holds its temporaries for a moment; one a failed write leaked would be there at every look
    wait_for(
        "no temporary file taking space between retries", lambda: not list(d.out.glob("*/date=*/.*.tmp")), 5, d.tmp
    )
    subprocess.run(["mount", "-o", "remount,size=64m", str(tiny_disk)], check=True)  # space is back
    run_to_completion(d, embedded)
    assert "writable again" in (d.tmp / "sink.log").read_text()
    assert_same_parquet(d.out, embedded)
    report("disk full, then space", events_in(events), d, embedded)
