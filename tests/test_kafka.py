"""The distributed path against a real broker: identical to the embedded run, through crashes.

Every test gets its own topic prefix and consumer groups on the one session broker.
"""
from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from gpucost.discovery import from_output
from gpucost.sinks.views import connect, query
from tests.conftest import ROOT
from tests.support.metrics import scrape
from tests.support.webhook import Webhook

pytestmark = [pytest.mark.slow, pytest.mark.kafka]
VIEWS = [("idle_index", "gpu_uuid, pane_start_ns"), ("cost", "record_id"), ("mae", "node_id, pid, first_ts_ns"),
         ("health", "gpu_uuid, window_start_ns"), ("quota", "gpu_uuid, pane_start_ns, tenant_key"),
         ("reclaim", "trigger_id"), ("efficiency", "gpu_uuid, pane_start_ns, pid")]


class Deployment:
    """Producer, workers and sink of one test, as separate processes, like a real deployment."""

    def __init__(self, bootstrap: str, tmp: Path) -> None:
        self.tmp = tmp
        ns = uuid.uuid4().hex[:8]
        self.prefix = f"t{ns}."
        self.app_id = f"app-{ns}"
        self.out = tmp / "parquet"
        self.env = {**os.environ, "GPUCOST_KAFKA_BOOTSTRAP": bootstrap, "GPUCOST_KAFKA_TOPIC_PREFIX": self.prefix,
                    "GPUCOST_KAFKA_PARTITIONS": "4", "PYTHONUNBUFFERED": "1", "GPUCOST_SPOOL": str(tmp / "spool")}
        self.bootstrap = bootstrap
        self.procs: list[subprocess.Popen[bytes]] = []

    def gpucost(self, *args: str) -> None:
        subprocess.run([sys.executable, "-m", "gpucost.cli", *args], cwd=ROOT, env=self.env, check=True,
                       capture_output=True, timeout=300)

    def spawn(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = open(self.tmp / f"{name}.log", "ab")  # noqa: SIM115 (the process writes it until it is stopped)
        proc = subprocess.Popen([sys.executable, "-m", "gpucost.cli", *args], cwd=ROOT, env=self.env,
                                stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def worker(self, name: str, *flags: str) -> subprocess.Popen[bytes]:
        return self.spawn(name, "worker", "--group", self.app_id, "--session-timeout-s", "6", *flags)

    def sink(self, name: str = "sink") -> subprocess.Popen[bytes]:
        # compacting at every second file: a sink killed or restarted may be caught mid-compaction
        return self.spawn(name, "sink", "--out", str(self.out), "--group", f"{self.app_id}-sink",
                          "--flush-interval-s", "0.5", "--compact-min-files", "2")

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


def billing_totals(d: Deployment) -> tuple[dict[str, int], int, int, dict[str, int]]:
    spec = importlib.util.spec_from_file_location("billing_consumer", ROOT / "examples" / "billing_consumer.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    totals, records, dups, adjustments = asyncio.run(module.team_totals({"bootstrap_servers": d.bootstrap},
                                                                        f"{d.prefix}cost", f"{d.app_id}-bill", 3.0))
    return dict(totals), records, dups, dict(adjustments)


def embedded_team_totals(embedded: Path, where: str = "true") -> dict[str, int]:
    return dict(connect(embedded).execute(f"SELECT team, sum(cost_micro_usd)::BIGINT FROM cost WHERE {where} "
                                          "GROUP BY team").fetchall())


def test_kafka_path_equals_embedded_and_billing_totals_match(deployment: Deployment, recorded: tuple[Path, Path]) -> None:
    events, embedded = recorded
    d = deployment
    bad = d.tmp / "bad.jsonl"
    bad.write_text('{"kind": "gpu_sample", "sm_util_pct": \n')  # a torn line among the recorded files
    d.gpucost("produce", "--source", "replay", str(events), str(bad))
    d.worker("worker", "--metrics-address", "127.0.0.1:0")
    d.spawn("sink", "sink", "--out", str(d.out), "--group", f"{d.app_id}-sink", "--flush-interval-s", "0.5",
            "--metrics-address", "127.0.0.1:0")
    counts = embedded_counts(embedded)
    wait_for("the sink to hold every record", lambda: all(d.rows(v) >= n for v, n in counts.items()), 240, d.tmp)
    # what the worker and the sink say they did, scraped as Prometheus would, is what the Parquet holds
    worker, sink = (scrape(metrics_port(d.tmp / f"{name}.log")) for name in ("worker", "sink"))
    # service discovery from the health topic: the file and the node entries the embedded records give
    sd_file = d.tmp / "gpus.json"
    d.spawn("discovery", "discovery", "--file-sd", str(sd_file), "--target-port", "9400", "--label", "job=gpu")
    expected = from_output(embedded)
    wait_for("the discovery file", sd_file.exists, 60, d.tmp)
    assert json.loads(sd_file.read_text()) == expected.file_sd(9400, {"job": "gpu"}), "the first file written"
    entries = topic_values(d, "discovery")
    assert {n: e["in_service"] for n, e in entries.items()} == {n: n in expected.in_service() for n in expected.nodes()}
    # the reclaim consumer: each trigger of the embedded run reaches the webhook once, through 503s
    triggers = {t for (t,) in connect(embedded).execute("SELECT trigger_id FROM reclaim").fetchall()}
    hook = Webhook(fail=1)
    try:
        d.spawn("reclaim", "reclaim", "--webhook", hook.url, "--ledger", str(d.tmp / "ledger"), "--group",
                f"{d.app_id}-reclaim")
        wait_for("every trigger at the webhook", lambda: len(hook.accepted) >= len(triggers), 120, d.tmp)
        time.sleep(1)  # nothing more may come
    finally:
        hook.server.shutdown()
    assert sorted(k for k, _ in hook.accepted) == sorted(triggers) and triggers
    # another reclaimer, SIGKILLed once the receiver has taken two triggers, then restarted on its ledger: no
    # trigger is lost, and one is sent again at most (the kill between the receiver's answer and the ledger's
    # fsync), with the same Idempotency-Key and body, which is how the receiver knows it
    hook = Webhook(fail=1)
    try:
        reclaim = ["reclaim", "--webhook", hook.url, "--ledger", str(d.tmp / "ledger-killed"), "--group",
                   f"{d.app_id}-reclaim-killed"]
        victim = d.spawn("reclaim-killed", *reclaim)
        wait_for("two triggers at the webhook", lambda: len(hook.accepted) >= 2, 120, d.tmp)
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        assert len({k for k, _ in hook.accepted}) < len(triggers), "the kill came too late to test anything"
        d.spawn("reclaim-restarted", *reclaim)
        wait_for("every trigger at the webhook again", lambda: {k for k, _ in hook.accepted} >= triggers, 120,
                 d.tmp)
        time.sleep(1)  # nothing more may come
    finally:
        hook.server.shutdown()
    assert {k for k, _ in hook.accepted} == triggers and len(hook.accepted) <= len(triggers) + 1
    firsts = {k: body for k, body in reversed(hook.accepted)}
    assert all(body == firsts[k] for k, body in hook.accepted)
    d.stop()
    assert_same_parquet(d.out, embedded, dead_letters=1)
    assert worker[("gpucost_worker_records_total", (("kind", "cost"),))] == counts["cost"]
    assert sink[("gpucost_sink_records_written_total", (("kind", "cost"),))] == counts["cost"]
    # the sink's cost counters, charged less credited per team, are the embedded run's bill
    net: Counter[str] = Counter()
    for (name, labels), value in sink.items():
        if name in ("gpucost_cost_micro_usd_total", "gpucost_cost_credit_micro_usd_total"):
            net[dict(labels)["team"]] += int(value) if name == "gpucost_cost_micro_usd_total" else -int(value)
    assert {t: v for t, v in net.items() if v} == {t: v for t, v in embedded_team_totals(embedded).items() if v}
    assert worker[("gpucost_worker_transactions_total", (("outcome", "committed"),))] > 0
    (reason, source), = connect(d.out).execute("SELECT reason, source FROM dlq").fetchall()
    assert reason == "malformed_json" and source == f"{bad}:1"
    totals, records, _, adjustments = billing_totals(d)
    assert totals == embedded_team_totals(embedded)
    assert records == embedded_counts(embedded)["cost"]
    # the simulated fleet's late bindings revised the bill: the consumer applied the same adjustments
    assert adjustments == embedded_team_totals(embedded, "revision > 0") and adjustments


def topic_messages(d: Deployment, kind: str) -> list[Any]:
    """Every committed message of a topic, read from its start to its end, each partition in order."""
    async def read() -> list[Any]:
        consumer = AIOKafkaConsumer(bootstrap_servers=d.bootstrap, isolation_level="read_committed",
                                    enable_auto_commit=False)
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


def test_two_workers_one_killed_mid_stream(deployment: Deployment, recorded: tuple[Path, Path]) -> None:
    events, embedded = recorded
    d = deployment
    d.gpucost("produce", "--source", "replay", str(events))
    # a few messages a transaction, so that the input takes many: a worker's default 200 took its whole
    # share in one, and the kill came after the last
    victim = d.worker("worker-a", "--max-batch", "4")
    d.worker("worker-b", "--max-batch", "4")
    d.sink()
    expected = embedded_counts(embedded)["cost"]
    wait_for("the first cost records", lambda: d.topic_size("cost") > 0, 120, d.tmp)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert d.topic_size("cost") < expected, "the kill came too late to test anything"
    d.worker("worker-a-restarted")
    run_to_completion(d, embedded)
    assert_same_parquet(d.out, embedded)
    totals, records, duplicates, _ = billing_totals(d)
    assert totals == embedded_team_totals(embedded) and records == expected
    # the killed worker's open transaction was aborted: a read_committed consumer sees no record twice
    assert duplicates == 0


def test_a_worker_meeting_a_state_of_a_later_version_stops_and_says_why(deployment: Deployment) -> None:
    """It must not restore a layout it does not know (and bill from it), nor fetch for ever a partition it
    could not take: it exits 5, naming the record and the version."""
    d = deployment
    d.gpucost("topics", "create")

    async def write() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=d.bootstrap)
        await producer.start()
        try:
            for partition in range(4):
                await producer.send_and_wait(f"{d.prefix}state.events", b'{"v":99,"audit":{}}', key=b"GPU-later",
                                             partition=partition)
        finally:
            await producer.stop()

    asyncio.run(write())
    worker = d.worker("worker")
    assert worker.wait(timeout=120) == 5
    log = (d.tmp / "worker.log").read_text()
    assert "gpucost: error: the state record b'GPU-later' has state version 99" in log, log[-2000:]


def test_sink_killed_mid_stream_writes_each_row_once(deployment: Deployment, recorded: tuple[Path, Path]) -> None:
    events, embedded = recorded
    d = deployment
    d.gpucost("produce", "--source", "replay", str(events))
    d.worker("worker")
    victim = d.sink("sink-a")
    expected = embedded_counts(embedded)["cost"]
    wait_for("some cost rows in Parquet", lambda: d.rows("cost") > 0, 120, d.tmp)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert d.rows("cost") < expected, "the kill came too late to test anything"
    d.sink("sink-b")
    run_to_completion(d, embedded)
    con = connect(d.out)
    assert con.execute("SELECT count(*), count(DISTINCT record_id) FROM cost").fetchone() == (expected, expected)
    assert_same_parquet(d.out, embedded)


from tests.test_dcgm import expected, exporter  # noqa: E402,F401  (the exporter fixture serves a real scrape)


def test_live_source_is_published_while_it_runs(deployment: Deployment, exporter: tuple[str, str]) -> None:
    """`produce --source dcgm`: batches leave every flush interval, not only at the end."""
    url, text = exporter
    d = deployment
    started = time.monotonic()
    proc = d.spawn("producer", "produce", "--source", "dcgm", "--url", url, "--period-s", "0.1",
                   "--duration-s", "8", "--flush-interval-s", "0.3")
    wait_for("events on the topic", lambda: d.topic_size("events") > 0, 60, d.tmp)
    # start-up takes ~2 s; a producer that sent only at the end would show nothing before 8 s
    assert time.monotonic() - started < 5.5, "no batch left before the source ended"
    assert proc.wait(timeout=60) == 0
    d.worker("worker")
    d.sink()
    gpus = set(expected(text))
    wait_for("the GPU's panes in Parquet", lambda: d.rows("idle_index") > 0, 120, d.tmp)
    time.sleep(2)  # the end-of-input closes the last pane too; let the sink flush it
    d.stop()
    con = connect(d.out)
    assert {u for (u,) in con.execute("SELECT DISTINCT gpu_uuid FROM idle_index").fetchall()} == gpus
    (covered,) = con.execute("SELECT sum(covered_ms) FROM idle_index").fetchone()
    assert 7_000 <= covered <= 9_000  # eight seconds of 0.1 s samples, the whole run accounted for


def test_a_partition_kept_across_a_rebalance_is_not_read_again_unless_another_owner_wrote_to_it(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    """aiokafka revokes every partition at each rebalance and most come back: their state is kept, not read
    again from the state topic, unless another owner applied a batch meanwhile (a member the group dropped
    misses a generation). Either way the state owned equals what the state topic holds."""
    from gpucost.kafka.publish import create_topics, publish
    from gpucost.kafka.settings import KafkaSettings
    from gpucost.kafka.state import restored
    from gpucost.kafka.worker import Worker
    from gpucost.producers.simulate import FleetSpec, simulate
    from gpucost.streams.settings import AuditSettings

    kafka = KafkaSettings(bootstrap=kafka_bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:8]}.", partitions=4)
    group = f"app-{uuid.uuid4().hex[:8]}"

    async def committed(w: Worker, tp: TopicPartition) -> dict[str, Any]:
        """What the state topic holds for ``tp``, restored: what a new owner would start from."""
        latest, _, _ = await w._read_state(tp)
        return {k: a.to_state() for k, a in restored(w.audit, latest).auditors.items()}

    async def scenario() -> None:
        await create_topics(kafka)
        await publish(simulate(FleetSpec(gpus=4, hours=2, interval_s=20)), kafka, spool=tmp_path / "spool")
        reader = AIOKafkaConsumer(**kafka.client_options(), enable_auto_commit=False)
        await reader.start()
        tps = [TopicPartition(kafka.topic("events"), p) for p in range(4)]
        ends = await reader.end_offsets(tps)
        tp = max(tps, key=lambda t: ends[t])
        reader.assign([tp])
        reader.seek(tp, 0)
        messages: list[Any] = []
        while len(messages) < ends[tp]:
            messages += (await reader.getmany(tp, timeout_ms=1000)).get(tp, [])
        await reader.stop()
        assert len(messages) >= 3, "too few messages to apply in three batches"
        thirds = [messages[: len(messages) // 3], messages[len(messages) // 3: 2 * len(messages) // 3],
                  messages[2 * len(messages) // 3:]]
        a, b = (Worker(kafka, AuditSettings(), group=group) for _ in range(2))
        for w in (a, b):
            w.consumer = AIOKafkaConsumer(**kafka.client_options(), isolation_level="read_committed",
                                          enable_auto_commit=False)
            await w.consumer.start()
            w.consumer.assign([tp])
        try:
            await a.on_partitions_assigned([tp])
            await a._in_sequence(a.consumer, tp, thirds[0])
            await a.on_partitions_revoked([tp])
            await a.on_partitions_assigned([tp])  # back to the member that had it
            assert a.taken == {"restored": 1, "kept": 1}
            assert {k: o.to_state() for k, o in a.owned[tp].auditors.items()} == await committed(a, tp)
            await a._in_sequence(a.consumer, tp, thirds[1])
            await a.on_partitions_revoked([tp])
            await b.on_partitions_assigned([tp])  # a generation that a missed
            assert b.taken == {"restored": 1} and b.owned[tp].next_offset == thirds[1][-1].offset + 1
            await b._in_sequence(b.consumer, tp, thirds[2])
            await b.on_partitions_revoked([tp])
            await a.on_partitions_assigned([tp])
            assert a.taken == {"restored": 2, "kept": 1}
            assert a.owned[tp].next_offset == messages[-1].offset + 1
            assert {k: o.to_state() for k, o in a.owned[tp].auditors.items()} == await committed(a, tp)
        finally:
            for w in (a, b):
                for owned in w.owned.values():
                    await owned.producer.stop()
                assert w.consumer is not None
                await w.consumer.stop()

    asyncio.run(scenario())
