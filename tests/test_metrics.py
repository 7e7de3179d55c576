"""The pipeline's own metrics, scraped over HTTP and read with Prometheus' text parser, against what the
component did (recounted from what it published), and its health check."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import TopicPartition

from gpucost.cost_metrics import OTHER_TEAM, CostMetrics
from gpucost.embedded import RunStats, run_embedded
from gpucost.kafka.owned import Owned
from gpucost.kafka.settings import KafkaSettings
from gpucost.kafka.state import IDLE_PREFIX
from gpucost.kafka.worker import Worker
from gpucost.metrics import Health, MetricsServer, parse_address
from gpucost.producers.simulate import FleetSpec, simulate
from gpucost.schemas.arrow import to_table
from gpucost.schemas.records import CostRecord
from gpucost.schemas.topics import CONTROL_HEADER, END_OF_INPUT
from gpucost.sinks.views import connect
from gpucost.streams.audit import Auditor
from gpucost.streams.settings import AuditSettings
from tests.fake_kafka import Message, RecordingProducer
from tests.support.metrics import scrape
from tests.support.worker_input import BAD, LINES


def test_a_worker_serves_what_it_committed() -> None:
    from gpucost.kafka.closing import is_control

    worker, producer = Worker(KafkaSettings(), AuditSettings(), group="g"), RecordingProducer()
    tp = TopicPartition("gpucost.events", 0)
    worker.owned[tp] = Owned(producer, {}, {}, 0)  # type: ignore[arg-type]
    messages = []
    for key, lines in LINES.items():  # every GPU's lines, one bad line among them, each key ended
        messages += [
            Message(key, b"\n".join([*lines[:50], BAD[0], *lines[50:]]), len(messages)),
            Message(key, b"", len(messages) + 1, [(CONTROL_HEADER, END_OF_INPUT)]),
        ]
    for i in range(0, len(messages), 3):
        asyncio.run(worker.process(tp, messages[i : i + 3]))
    server = MetricsServer("127.0.0.1:0", worker.metrics, worker.health)
    try:
        got = scrape(server.port)
    finally:
        server.close()
    # recounted from what the worker published and wrote
    kinds = Counter(m.topic.removeprefix("gpucost.") for m in producer.published if not is_control(m.headers))
    markers = [m for m in producer.published if is_control(m.headers)]
    assert got[("gpucost_worker_closed_markers_total", ())] == len(markers) > 0
    reasons = Counter(json.loads(m.value)["reason"] for m in producer.published if m.topic == "gpucost.dlq")
    state = sum(len(k) + len(v or b"") for t in producer.transactions for _, k, v in t if not k.startswith(b"\x00next"))
    assert got[("gpucost_worker_input_messages_total", ())] == len(messages)
    # every line of a known kind was taken but those dead-lettered
    sent = Counter(json.loads(line)["kind"] for lines in LINES.values() for line in lines)
    sent.subtract(json.loads(m.value)["kind"] for m in producer.published if m.topic == "gpucost.dlq")
    assert {k: got.get(("gpucost_worker_events_total", (("kind", k),)), 0) for k in +sent} == +sent
    assert {k: got[("gpucost_worker_records_total", (("kind", k),))] for k in kinds} == kinds
    assert kinds["cost"] > 0 and reasons["malformed_json"] == len(LINES)
    assert {r: got[("gpucost_worker_dead_letters_total", (("reason", r),))] for r in reasons} == reasons
    assert got[("gpucost_worker_transactions_total", (("outcome", "committed"),))] == len(producer.transactions)
    assert got[("gpucost_worker_state_bytes_written_total", ())] == state > 0
    assert got[("gpucost_worker_partitions", ())] == 1
    assert got[("gpucost_worker_open_panes", ())] == 0  # every key ended: every pane billed
    assert any(k.startswith(IDLE_PREFIX) for t in producer.transactions for _, k, _ in t)


def test_health_says_why_it_fails() -> None:
    clock = [0.0]
    health = Health(stall_s=60, clock=lambda: clock[0])
    server = MetricsServer("127.0.0.1:0", lambda: [], health)

    def check() -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/healthz", timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    try:
        assert check() == (200, "ok\n")
        clock[0] = 61.0
        assert check() == (503, "the main loop has not run for 61 s\n")
        health.beat()
        assert check()[0] == 200
        waited: list[float | None] = [None]
        health.watch("the source (NVML)", lambda: waited[0])
        assert check()[0] == 200  # no call running
        waited[0] = 60.0
        assert check()[0] == 200  # not past the stall
        waited[0] = 75.4
        code, text = check()
        assert code == 503 and text.startswith("the source (NVML) has given no events for 75 s (a wedged driver")
        waited[0] = None
        assert check()[0] == 200  # it answered
        health.failure = "cannot take its partitions: a state of version 99"
        assert check() == (503, "cannot take its partitions: a state of version 99\n")
    finally:
        server.close()


@pytest.mark.parametrize("address", ["9464", "host:port", "127.0.0.1:70000", ""])
def test_a_bad_metrics_address_is_refused_with_an_example(address: str) -> None:
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_address(address)


def test_an_embedded_run_serves_what_it_wrote(tmp_path: Path) -> None:
    """`gpucost run --metrics-address`: events by kind recounted from the input, rows and dead letters from
    the Parquet, scraped while the server runs."""
    events = list(simulate(FleetSpec(gpus=2, hours=1, interval_s=10)))
    items = [(e, "sim") for e in events] + [(b'{"kind": "gpu_sample"', "bad")]
    stats = RunStats()
    server = MetricsServer("127.0.0.1:0", stats.metrics, stats.health)
    try:
        run_embedded(items, AuditSettings(), tmp_path, stats=stats)
        got = scrape(server.port)
    finally:
        server.close()
    con = connect(tmp_path)
    kinds = Counter(e.kind for e in events)
    assert {k: got[("gpucost_run_events_total", (("kind", k),))] for k in kinds} == kinds
    for view in ("cost", "idle_index", "mae", "dlq"):
        assert (
            got[("gpucost_run_rows_written_total", (("kind", view),))]
            == con.execute(f"SELECT count(*) FROM {view}").fetchone()[0]
        )
    assert got[("gpucost_run_dead_letters_total", (("reason", "malformed_json"),))] == 1
    assert got[("gpucost_run_inputs_total", ())] == len(items)


@pytest.mark.slow
def test_a_live_source_is_audited_as_it_comes_not_after_a_full_batch(tmp_path: Path) -> None:
    """A slow source (a few events a second) used to be handed over 2,048 items at a time: minutes behind."""
    events = list(simulate(FleetSpec(gpus=1, hours=0.1, interval_s=10)))[:12]
    seen: list[float] = []
    started = time.monotonic()

    def slow() -> Iterator[tuple[object, str]]:
        for e in events:
            time.sleep(0.25)
            yield e, "live"

    run_embedded(slow(), AuditSettings(), tmp_path, on_batch=lambda b: seen.append(time.monotonic() - started))
    assert len(seen) >= 2 and seen[0] < 2.0  # the first events audited a second or so after they came


def test_an_embedded_run_serves_the_cost_it_wrote_to_the_micro_dollar(tmp_path: Path) -> None:
    """The cost counters against SQL over the Parquet: per label set, charged = Σ positive records and credited
    = −Σ negative ones (revisions, from late bindings), so charged − credited is the bill; idle by model and
    node; reclaim triggers; GPUs by their latest health record's grade and breaker state."""
    events = list(simulate(FleetSpec(gpus=4, hours=3, interval_s=10, late_binding_fraction=0.5)))
    stats = RunStats(cost=CostMetrics())
    server = MetricsServer("127.0.0.1:0", stats.metrics, stats.health)
    try:
        run_embedded([(e, "sim") for e in events], AuditSettings(), tmp_path, stats=stats)
        got = scrape(server.port)
    finally:
        server.close()
    con = connect(tmp_path)
    labels = ("team", "env", "app", "sla", "gpu_model")

    def series(name: str) -> dict[tuple[str, ...], float]:
        return {tuple(dict(key)[k] for k in labels): v for (n, key), v in got.items() if n == name}

    for name, sign in (("gpucost_cost_micro_usd_total", ">"), ("gpucost_cost_credit_micro_usd_total", "<")):
        want = {
            tuple(r[:-1]): float(abs(r[-1]))
            for r in con.execute(
                f"SELECT {', '.join(f'coalesce({c}, {chr(39)}{chr(39)})' for c in labels)}, sum(cost_micro_usd) "
                "FROM cost "
                f"WHERE cost_micro_usd {sign} 0 GROUP BY ALL"
            ).fetchall()
        }
        assert series(name) == want, name
    assert series("gpucost_cost_credit_micro_usd_total"), "no revision credited anything: the case is not made"
    idle = {
        (dict(k)["gpu_model"], dict(k)["node"]): v
        for (n, k), v in got.items()
        if n == "gpucost_idle_cost_micro_usd_total"
    }
    assert idle == {
        (m, node): float(c)
        for m, node, c in con.execute(
            "SELECT gpu_model, node_id, sum(cost_micro_usd) FROM cost WHERE team = 'idle' GROUP BY ALL"
        ).fetchall()
    }
    triggers = {
        (dict(k)["sla"], dict(k)["team"]): v for (n, k), v in got.items() if n == "gpucost_reclaim_triggers_total"
    }
    assert triggers == {
        (sla, team): float(c)
        for sla, team, c in con.execute("SELECT coalesce(sla, ''), team, count(*) FROM reclaim GROUP BY ALL").fetchall()
    }
    gpus = {(dict(k)["grade"], dict(k)["breaker_state"]): v for (n, k), v in got.items() if n == "gpucost_gpus"}
    assert gpus and gpus == {
        (g, s): float(c)
        for g, s, c in con.execute(
            "SELECT grade, state, count(*) FROM (SELECT gpu_uuid, arg_max(grade, window_end_ns) AS grade, "
            "arg_max(breaker_state, window_end_ns) AS state FROM health GROUP BY gpu_uuid) GROUP BY ALL"
        ).fetchall()
    }


def test_past_the_cap_cost_is_folded_under_other_and_the_total_stays() -> None:
    auditor = Auditor(AuditSettings())
    records = [r for e in simulate(FleetSpec(gpus=2, hours=2, interval_s=10)) for r in auditor.update(e)]
    cost = [r for r in records + auditor.finish() if isinstance(r, CostRecord)]
    whole, capped = CostMetrics(), CostMetrics(max_series=2)
    for m in (whole, capped):
        m.observe("cost", to_table("cost", cost))
    assert len(capped.charged) <= 2 and capped.charged.folded > 0  # the _other series among the 2, whatever the models
    assert {k for k in capped.charged if k[0] == OTHER_TEAM}
    assert (
        sum(capped.charged.values())
        == sum(whole.charged.values())
        == sum(r.cost_micro_usd for r in cost if r.cost_micro_usd > 0)
    )
