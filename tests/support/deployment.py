"""A deployment of the distributed path on the session's real broker: producer, workers and sink as separate
processes, each test in its own topic prefix and consumer groups; what its topics and its output hold, against the
embedded run's."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from gpucost.sinks.views import connect, query
from tests.conftest import ROOT

VIEWS = [
    ("idle_index", "gpu_uuid, pane_start_ns"),
    ("cost", "record_id"),
    ("allocation", "record_id"),
    ("mae", "node_id, pid, first_ts_ns"),
    ("health", "gpu_uuid, window_start_ns"),
    ("quota", "gpu_uuid, pane_start_ns, tenant_key"),
    ("reclaim", "trigger_id"),
    ("efficiency", "gpu_uuid, pane_start_ns, pid"),
    ("kernel_cost", "record_id"),
    ("range_cost", "record_id"),
]


class Deployment:
    """Producer, workers and sink of one test, as separate processes, like a real deployment."""

    def __init__(self, bootstrap: str, tmp: Path) -> None:
        self.tmp = tmp
        ns = uuid.uuid4().hex[:8]
        self.prefix = f"t{ns}."
        self.app_id = f"app-{ns}"
        self.out = tmp / "parquet"
        self.env = {
            **os.environ,
            "GPUCOST_KAFKA_BOOTSTRAP": bootstrap,
            "GPUCOST_KAFKA_TOPIC_PREFIX": self.prefix,
            "GPUCOST_KAFKA_PARTITIONS": "4",
            "PYTHONUNBUFFERED": "1",
            "GPUCOST_SPOOL": str(tmp / "spool"),
        }
        self.bootstrap = bootstrap
        self.procs: list[subprocess.Popen[bytes]] = []

    def gpucost(self, *args: str) -> None:
        subprocess.run(
            [sys.executable, "-m", "gpucost.cli", *args],
            cwd=ROOT,
            env=self.env,
            check=True,
            capture_output=True,
            timeout=300,
        )

    def spawn(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = open(self.tmp / f"{name}.log", "ab")  # noqa: SIM115 (the process writes it until it is stopped)
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpucost.cli", *args], cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT
        )
        self.procs.append(proc)
        return proc

    def worker(self, name: str, *flags: str) -> subprocess.Popen[bytes]:
        return self.spawn(name, "worker", "--group", self.app_id, "--session-timeout-s", "6", *flags)

    def sink(self, name: str = "sink") -> subprocess.Popen[bytes]:
        # compacting at every second file: a sink killed or restarted may be caught mid-compaction
        return self.spawn(
            name,
            "sink",
            "--out",
            str(self.out),
            "--group",
            f"{self.app_id}-sink",
            "--flush-interval-s",
            "0.5",
            "--compact-min-files",
            "2",
        )

    def topic_size(self, kind: str) -> int:
        async def size() -> int:
            consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap)
            await consumer.start()
            try:
                tps = [TopicPartition(f"{self.prefix}{kind}", p) for p in range(4)]
                return sum((await consumer.end_offsets(tps)).values())
            finally:
                await consumer.stop()

        return asyncio.run(size())

    def rows(self, view: str) -> int:
        """The view's rows now. The sink compacts as it runs, so a query may list a file that is then swapped
        away: it is run again, as `gpucost query` does (README, Compaction)."""
        return query(self.out, f"SELECT count(*) FROM {view}", attempts=20)[1][0][0]

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.fixture
def deployment(kafka_bootstrap: str, tmp_path: Path) -> Iterator[Deployment]:
    d = Deployment(kafka_bootstrap, tmp_path)
    yield d
    d.stop()


def wait_for(what: str, check: Callable[[], bool], timeout_s: float, logs: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    tails = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}" for p in sorted(logs.glob("*.log")))
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}\n{tails}")


def embedded_counts(embedded: Path) -> dict[str, int]:
    con = connect(embedded)
    return {v: con.execute(f"SELECT count(*) FROM {v}").fetchone()[0] for v, _ in VIEWS}


def assert_same_parquet(got: Path, want: Path, dead_letters: int = 0) -> None:
    a, b = connect(want), connect(got)
    for view, order in VIEWS:
        rows = a.execute(f"SELECT * FROM {view} ORDER BY {order}").fetchall()
        assert rows == b.execute(f"SELECT * FROM {view} ORDER BY {order}").fetchall(), view
    assert b.execute("SELECT count(*) FROM dlq").fetchone() == (dead_letters,)


def run_to_completion(d: Deployment, embedded: Path, timeout_s: float = 240) -> None:
    want = embedded_counts(embedded)
    wait_for("the sink to hold every record", lambda: all(d.rows(v) >= n for v, n in want.items()), timeout_s, d.tmp)
    d.stop()


def embedded_team_totals(embedded: Path, where: str = "true") -> dict[str, int]:
    return dict(
        connect(embedded)
        .execute(f"SELECT team, sum(cost_micro_usd)::BIGINT FROM cost WHERE {where} GROUP BY team")
        .fetchall()
    )


def topic_messages(d: Deployment, kind: str) -> list[Any]:
    """Every committed message of a topic, read from its start to its end, each partition in order."""

    async def read() -> list[Any]:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=d.bootstrap, isolation_level="read_committed", enable_auto_commit=False
        )
        await consumer.start()
        try:
            tps = [TopicPartition(f"{d.prefix}{kind}", p) for p in range(4)]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            ends, out = await consumer.end_offsets(tps), []
            while any([await consumer.position(tp) < ends[tp] for tp in tps]):
                for messages in (await consumer.getmany(timeout_ms=500)).values():
                    out += messages
            return out
        finally:
            await consumer.stop()

    return asyncio.run(read())


def topic_values(d: Deployment, kind: str) -> dict[str, Any]:
    """The latest JSON value of each key of a topic, read from its start to its end."""
    return {m.key.decode(): json.loads(m.value) for m in topic_messages(d, kind)}


def metrics_port(log: Path) -> int:
    """The port a command started with --metrics-address HOST:0 says it serves on."""
    for _ in range(100):
        found = re.search(r"metrics at http://[^:]+:(\d+)/metrics", log.read_text())
        if found:
            return int(found[1])
        time.sleep(0.1)
    raise AssertionError(f"{log.name} names no metrics port")
