"""What every benchmark reports with its numbers: the machine, and how a figure was taken."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from gpucost.embedded import run_embedded
from gpucost.producers.replay import read_batches
from gpucost.schemas.topics import ARROW_IPC, ENCODING_HEADER
from gpucost.streams.settings import AuditSettings
from tests.recompute import parquet_source, recompute_sql

__all__ = ["Result", "machine", "timed", "median_time", "embedded_and_duckdb", "rss_bytes"]


@dataclass
class Result:
    name: str
    target: str
    met: bool | None  # None: not measurable here (the reason is in the notes)
    rows: list[tuple[str, str]] = field(default_factory=list)  # (what, figure)
    notes: list[str] = field(default_factory=list)

    def markdown(self) -> str:
        verdict = {True: "met", False: "**not met**", None: "not measured here"}[self.met]
        lines = [f"### {self.name}", "", f"Target: {self.target}. Result: {verdict}.", "", "| | |", "| --- | --- |"]
        lines += [f"| {what} | {figure} |" for what, figure in self.rows]
        lines += [""] + [f"- {n}" for n in self.notes]
        return "\n".join(lines) + "\n"


def machine() -> str:
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as lines:
            cpu = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), cpu)
        with open("/proc/meminfo") as lines:
            mem_kib = next(int(line.split()[1]) for line in lines if line.startswith("MemTotal"))
    except OSError:
        mem_kib = 0
    return (
        f"{cpu}, {os.cpu_count()} cores, {mem_kib / 2**20:.0f} GiB RAM, {platform.system()} "
        f"{platform.release()}, Python {platform.python_version()}"
    )


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def median_time(fn: Callable[[], object], repeat: int) -> float:
    return statistics.median(timed(fn)[0] for _ in range(repeat))


def embedded_and_duckdb(
    files: list[Path], settings: AuditSettings, work: Path, runs: int
) -> tuple[list[tuple[float, Any]], list[float], duckdb.DuckDBPyConnection]:
    """The embedded replay of ``files`` (its Parquet written under ``work``) and DuckDB's recomputation of
    them (tests/recompute.sql), ``runs`` times each, alternated (one run of either moved by ±10 % on these
    VMs): each replay's seconds and stats, each recomputation's seconds, and the last DuckDB connection."""
    embedded, sql = [], []
    for i in range(runs):
        out = work / f"out-{i}"
        embedded.append(timed(lambda out=out: run_embedded(read_batches(files), settings, out)))
        con = duckdb.connect()
        sql.append(timed(lambda con=con: con.execute(recompute_sql(parquet_source(files), settings)))[0])
    return embedded, sql, con


def rss_bytes() -> int:
    """This process's resident memory now."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * 4096


def events_in(message: Any) -> int:
    """The events a Kafka input message carries, by its encoding: an Arrow IPC batch's rows, a JSON value's lines."""
    if not message.value:
        return 0
    if (ENCODING_HEADER, ARROW_IPC) in list(message.headers or ()):
        return int(pa.ipc.open_stream(message.value).read_all().num_rows)
    return int(message.value.count(b"\n")) + 1
