"""The distributed path against a real broker: identical to the embedded run, through crashes.

Every test gets its own topic prefix and consumer groups on the one session broker.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import signal
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from gpucost.discovery import from_output
from gpucost.sinks.views import connect
from tests.conftest import ROOT
from tests.support.dcgm_exporter import expected, exporter  # noqa: F401 (the exporter fixture serves a real scrape)
from tests.support.deployment import (
    Deployment,
    assert_same_parquet,
    deployment,  # noqa: F401 (a fixture)
    embedded_counts,
    embedded_team_totals,
    metrics_port,
    run_to_completion,
    topic_values,
    wait_for,
)
from tests.support.metrics import scrape
from tests.support.webhook import Webhook

pytestmark = [pytest.mark.slow, pytest.mark.kafka]


#: range records as revised: how many; outermost paths over their tenant's kernel µ$; parents with children; those
#: whose children sum past them; the latest revision
RANGES_WITHIN_THEIR_PARENTS = """WITH r AS (SELECT * FROM range_cost_as_revised),
k AS (SELECT gpu_uuid, pane_start_ns, tenant_key, sum(cost_micro_usd) AS kmu FROM kernel_cost_as_revised
      WHERE category <> 'no_kernel' GROUP BY ALL),
top AS (SELECT gpu_uuid, pane_start_ns, tenant_key, sum(cost_micro_usd) AS s FROM r WHERE depth = 1 GROUP BY ALL),
kids AS (SELECT p.gpu_uuid, p.pane_start_ns, p.tenant_key, p.range_path, any_value(p.cost_micro_usd) AS parent,
                sum(c.cost_micro_usd) AS s
         FROM r p JOIN r c USING (gpu_uuid, pane_start_ns, tenant_key)
         WHERE c.depth = p.depth + 1
           AND from_json(c.range_path, '["VARCHAR"]')[1:p.depth] = from_json(p.range_path, '["VARCHAR"]')
         GROUP BY ALL)
SELECT (SELECT count(*) FROM r), (SELECT count(*) FROM top LEFT JOIN k USING (gpu_uuid, pane_start_ns, tenant_key)
        WHERE s > coalesce(kmu, 0)), (SELECT count(*) FROM kids), (SELECT count(*) FROM kids WHERE s > parent),
       (SELECT max(revision) FROM range_cost)"""


def billing_totals(d: Deployment) -> tuple[dict[str, int], int, int, dict[str, int]]:
    spec = importlib.util.spec_from_file_location("billing_consumer", ROOT / "examples" / "billing_consumer.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    totals, records, dups, adjustments = asyncio.run(
        module.team_totals({"bootstrap_servers": d.bootstrap}, f"{d.prefix}cost", f"{d.app_id}-bill", 3.0)
    )
    return dict(totals), records, dups, dict(adjustments)


def test_kafka_path_equals_embedded_and_billing_totals_match(
    deployment: Deployment, recorded: tuple[Path, Path]
) -> None:
    events, embedded = recorded
    d = deployment
    bad = d.tmp / "bad.jsonl"
    bad.write_text('{"kind": "gpu_sample", "sm_util_pct": \n')  # a torn line among the recorded files
    d.gpucost("produce", "--source", "replay", str(events), str(bad))
    d.worker("worker", "--metrics-address", "127.0.0.1:0")
    d.spawn(
        "sink",
        "sink",
        "--out",
        str(d.out),
        "--group",
        f"{d.app_id}-sink",
        "--flush-interval-s",
        "0.5",
        "--metrics-address",
        "127.0.0.1:0",
    )
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
        d.spawn(
            "reclaim",
            "reclaim",
            "--webhook",
            hook.url,
            "--ledger",
            str(d.tmp / "ledger"),
            "--group",
            f"{d.app_id}-reclaim",
        )
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
        reclaim = [
            "reclaim",
            "--webhook",
            hook.url,
            "--ledger",
            str(d.tmp / "ledger-killed"),
            "--group",
            f"{d.app_id}-reclaim-killed",
        ]
        victim = d.spawn("reclaim-killed", *reclaim)
        wait_for("two triggers at the webhook", lambda: len(hook.accepted) >= 2, 120, d.tmp)
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        assert len({k for k, _ in hook.accepted}) < len(triggers), "the kill came too late to test anything"
        d.spawn("reclaim-restarted", *reclaim)
        wait_for("every trigger at the webhook again", lambda: {k for k, _ in hook.accepted} >= triggers, 120, d.tmp)
        time.sleep(1)  # nothing more may come
    finally:
        hook.server.shutdown()
    assert {k for k, _ in hook.accepted} == triggers and len(hook.accepted) <= len(triggers) + 1
    firsts = {k: body for k, body in reversed(hook.accepted)}
    assert all(body == firsts[k] for k, body in hook.accepted)
    d.stop()
    assert_same_parquet(d.out, embedded, dead_letters=1)
    # the kernel lines, recomputed from the Kafka path's own records: some revised by late kernels, and per
    # (GPU, pane, tenant) their µ$ over every revision are the tenant's cost as revised (or 0 for a tenant whose
    # kernels all moved to another tenant), the latest line saying so
    lines = (
        connect(d.out)
        .execute(
            """WITH k AS (SELECT gpu_uuid, pane_start_ns, tenant_key, sum(cost_micro_usd) AS paid,
                             arg_max(tenant_cost_micro_usd, revision) AS tenant, max(revision) AS revised
                      FROM kernel_cost GROUP BY ALL),
                c AS (SELECT gpu_uuid, pane_start_ns, tenant_key, sum(cost_micro_usd) AS paid FROM cost GROUP BY ALL)
           SELECT count(*), count(*) FILTER (WHERE k.paid <> k.tenant OR (k.tenant <> 0 AND k.tenant <> c.paid)),
                  max(k.revised), count(*) FILTER (WHERE k.tenant > 0)
           FROM k LEFT JOIN c USING (gpu_uuid, pane_start_ns, tenant_key)"""
        )
        .fetchone()
    )
    assert lines[0] > 100 and lines[1] == 0 and lines[2] > 0 and lines[3] > 0, lines
    # the range paths, from the Kafka path's own records as revised: per (GPU, pane, tenant) the outermost paths sum
    # to no more than the tenant's kernel lines' µ$ (all but no_kernel), and each path's children to no more than it
    paths = connect(d.out).execute(RANGES_WITHIN_THEIR_PARENTS).fetchone()
    assert paths[0] > 100 and paths[1] == 0 and paths[2] > 0 and paths[3] == 0 and paths[4] > 0, paths
    assert worker[("gpucost_worker_records_total", (("kind", "cost"),))] == counts["cost"]
    assert sink[("gpucost_sink_records_written_total", (("kind", "cost"),))] == counts["cost"]
    # the sink's cost counters, charged less credited per team, are the embedded run's bill
    net: Counter[str] = Counter()
    for (name, labels), value in sink.items():
        if name in ("gpucost_cost_micro_usd_total", "gpucost_cost_credit_micro_usd_total"):
            net[dict(labels)["team"]] += int(value) if name == "gpucost_cost_micro_usd_total" else -int(value)
    assert {t: v for t, v in net.items() if v} == {t: v for t, v in embedded_team_totals(embedded).items() if v}
    assert worker[("gpucost_worker_transactions_total", (("outcome", "committed"),))] > 0
    ((reason, source),) = connect(d.out).execute("SELECT reason, source FROM dlq").fetchall()
    assert reason == "malformed_json" and source == f"{bad}:1"
    totals, records, _, adjustments = billing_totals(d)
    assert totals == embedded_team_totals(embedded)
    assert records == embedded_counts(embedded)["cost"]
    # the simulated fleet's late bindings revised the bill: the consumer applied the same adjustments
    assert adjustments == embedded_team_totals(embedded, "revision > 0") and adjustments


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
                await producer.send_and_wait(
                    f"{d.prefix}state.events", b'{"v":99,"audit":{}}', key=b"GPU-later", partition=partition
                )
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


def test_live_source_is_published_while_it_runs(deployment: Deployment, exporter: tuple[str, str]) -> None:
    """`produce --source dcgm`: batches leave every flush interval, not only at the end."""
    url, text = exporter
    d = deployment
    started = time.monotonic()
    proc = d.spawn(
        "producer",
        "produce",
        "--source",
        "dcgm",
        "--url",
        url,
        "--period-s",
        "0.1",
        "--duration-s",
        "8",
        "--flush-interval-s",
        "0.3",
    )
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
