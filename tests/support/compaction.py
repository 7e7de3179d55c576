"""The records a sink writes and the ways the compaction tests read them back: shared by the tests of compaction
itself (tests/test_compact.py) and of the sink and commands that compact or guard an output as it goes
(tests/test_sink_compaction.py). Built once per process, on import: a simulated fleet audited into records of
every kind, on two dates."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pyarrow.parquet as pq

from gpucost.producers.simulate import FleetSpec, simulate
from gpucost.schemas.blocks import expand
from gpucost.schemas.codec import encode_event
from gpucost.schemas.records import OUTPUT_KINDS
from gpucost.sinks.parquet import ParquetSink
from gpucost.sinks.views import connect
from gpucost.streams.audit import Auditor
from gpucost.streams.settings import AuditSettings

__all__ = ["LINES", "NS", "RECORDS", "VIEWS", "in_file_order", "part_files", "rows", "write_as_flushes"]

NS = 1_000_000_000
# two GPUs for 3 h across midnight UTC, and two bad lines: records of every kind, on two dates
LINES = [
    encode_event(e).encode()
    for e in simulate(replace(FleetSpec(gpus=2, hours=3, interval_s=20), start_ns=FleetSpec().start_ns - 90 * 60 * NS))
]
_auditor = Auditor(AuditSettings())
RECORDS = expand(
    _auditor.ingest_lines([*LINES, b"{not json", b'{"kind": "gpu_sample"}'], lambda i: f"f:{i}") + _auditor.finish()
)
VIEWS = tuple(OUTPUT_KINDS)


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
    """A partition folder's published files, in name order (the order a DuckDB scan reads them in)."""
    return sorted(folder.glob("part-*.parquet"))


def in_file_order(files: list[Path]) -> list[dict]:
    """The files' rows, file after file: what a merge must keep, order included."""
    return [r for f in files for r in pq.ParquetFile(f).read().to_pylist()]
