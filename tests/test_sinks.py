"""The Parquet sink fed the batch path's blocks of columns against the same records one by one."""

from __future__ import annotations

import errno
from dataclasses import replace
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpucost.producers.simulate import FleetSpec, simulate
from gpucost.schemas.blocks import ClosedPanes, Outputs, expand
from gpucost.schemas.codec import encode_event
from gpucost.sinks.parquet import ParquetSink, SinkWriteError
from gpucost.streams.audit import Auditor
from gpucost.streams.settings import AuditSettings

NS = 1_000_000_000
# two GPUs for 3 h across midnight UTC: records of two dates, in blocks that hold both
LINES = [
    encode_event(e).encode()
    for e in simulate(replace(FleetSpec(gpus=2, hours=3, interval_s=20), start_ns=FleetSpec().start_ns - 90 * 60 * NS))
]


def outputs(cuts: list[int]) -> Outputs:
    auditor = Auditor(AuditSettings())
    out: Outputs = []
    for lo, hi in zip([0, *cuts], [*cuts, len(LINES)]):
        out += auditor.ingest_lines(LINES[lo:hi], lambda i: f"f:{i}")
    return out + auditor.finish()


def files(out_dir: Path) -> dict[str, list[dict]]:
    return {p.relative_to(out_dir).as_posix(): pq.read_table(p).to_pylist() for p in sorted(out_dir.rglob("*.parquet"))}


@pytest.mark.slow  # seconds of a whole run: CI runs it, the inner loop does not
@settings(max_examples=10, deadline=None)
@given(st.lists(st.integers(0, len(LINES)), max_size=4).map(sorted), st.integers(1, 400))
def test_blocks_write_the_files_their_records_would(tmp_path_factory, cuts: list[int], file_rows: int) -> None:
    out = outputs(cuts)
    assert any(isinstance(o, ClosedPanes) and o.idle.num_rows > 1 for o in out)
    by_block, by_record = tmp_path_factory.mktemp("blocks"), tmp_path_factory.mktemp("records")
    sink = ParquetSink(by_block, file_rows=file_rows)
    for item in out:
        sink.write_block(item) if isinstance(item, ClosedPanes) else sink.write(item)
    sink.flush()
    reference = ParquetSink(by_record, file_rows=file_rows)
    for record in expand(out):
        reference.write(record)
    reference.flush()

    got, want = files(by_block), files(by_record)
    assert got == want
    assert sink.rows_written == reference.rows_written
    dates = {name.split("/")[1] for name in got if name.startswith("cost/")}
    assert len(dates) == 2, dates
    for kind in ("cost", "idle_index"):  # every file full but each date's last
        for date in dates:
            sizes = [len(rows) for name, rows in got.items() if name.startswith(f"{kind}/{date}/")]
            assert all(n == file_rows for n in sizes[:-1]) and 0 < sizes[-1] <= file_rows


def test_a_file_that_cannot_be_written_keeps_its_records_and_those_after_it(tmp_path: Path, monkeypatch) -> None:
    """The disk refuses one file of a flush: the files before it are in place, no temporary file is
    left, and the next flush writes the rest: together, the files of a flush that never failed."""
    out = outputs([])
    reference, failing = ParquetSink(tmp_path / "ok"), ParquetSink(tmp_path / "failing")
    for sink in (reference, failing):
        for item in out:
            sink.write_block(item) if isinstance(item, ClosedPanes) else sink.write(item)
    reference.flush()
    keys = failing.buffered_partitions
    refused = keys[len(keys) // 2]
    write = pq.write_table

    def full_disk(table, where, **options):
        if f"/{refused[0]}/date={refused[1]}/" in str(where):
            raise OSError(errno.ENOSPC, "No space left on device")
        write(table, where, **options)

    monkeypatch.setattr(pq, "write_table", full_disk)
    with pytest.raises(SinkWriteError, match="No space left on device"):
        failing.flush()
    published = files(tmp_path / "failing")
    assert {tuple(name.split("/")[:2]) for name in published} == {(k, f"date={d}") for k, d in keys[: len(keys) // 2]}
    assert not list((tmp_path / "failing").rglob("*.tmp"))
    assert failing.buffered_partitions == keys[len(keys) // 2 :]
    monkeypatch.setattr(pq, "write_table", write)
    failing.flush()
    assert files(tmp_path / "failing") == files(tmp_path / "ok")
    assert failing.rows_written == reference.rows_written
