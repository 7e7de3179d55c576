"""Fault injection against the real broker, the broker itself away: frozen (SIGSTOP) for 30 s while a producer
publishes through a 0.2 MB buffer, and absent when a producer starts, is stopped and restarted; each time the Parquet
against the embedded run.

At the end of the session pytest prints one line per fault: events sent, records in the output, events
dead-lettered (by reason), and µ$ billed against µ$ expected (tests/support/faults.py).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpucost.sinks.views import connect
from tests.conftest import ROOT, Broker
from tests.support.deployment import (
    Deployment,
    assert_same_parquet,
    deployment,  # noqa: F401 (a fixture)
    run_to_completion,
    wait_for,
)
from tests.support.faults import events_in, report

pytestmark = [pytest.mark.slow, pytest.mark.kafka]


def test_broker_unavailable_for_30_s(deployment: Deployment, kafka_broker: Broker, recorded: tuple[Path, Path]) -> None:
    events, embedded = recorded
    d = deployment
    d.gpucost("topics", "create")
    worker, sink = d.worker("worker"), d.sink()
    producer = d.spawn("producer", "produce", "--source", "replay", str(events), "--buffer-mb", "0.2")
    wait_for("the first batch on the broker", lambda: d.topic_size("events") > 0, 60, d.tmp)
    broker_pid = int((Path(kafka_broker.env["GPUCOST_KAFKA_DATA"]) / "kafka.pid").read_text())
    os.kill(broker_pid, signal.SIGSTOP)  # unresponsive, like a partitioned or hung broker
    try:
        time.sleep(30)
        assert producer.poll() is None, "the producer gave up while the broker was away"
    finally:
        os.kill(broker_pid, signal.SIGCONT)
    assert producer.wait(timeout=240) == 0
    log = (d.tmp / "producer.log").read_text()
    assert "spilling to" in log and "drained" in log, log[-3000:]
    assert not (d.tmp / "spool").exists()
    # restart whatever the outage stopped, as a service manager would (and say so in the report)
    restarted = [name for name, proc in (("worker", worker), ("sink", sink)) if proc.poll() is not None]
    if "worker" in restarted:
        d.worker("worker-restarted")
    if "sink" in restarted:
        d.sink("sink-restarted")
    run_to_completion(d, embedded, timeout_s=300)
    reasons = dict(connect(d.out).execute("SELECT reason, count(*) FROM dlq GROUP BY reason").fetchall())
    assert set(reasons) <= {"duplicate"}  # a re-sent batch is refused, never billed twice
    assert_same_parquet(d.out, embedded, dead_letters=sum(reasons.values()))
    report(
        "broker down 30 s" + (f" ({'+'.join(restarted)} restarted)" if restarted else ""),
        events_in(events),
        d,
        embedded,
    )


def _until(process: subprocess.Popen[str], text: str, timeout_s: float) -> str:
    """The process's output up to the first line holding ``text`` (or all of it, at its end or the timeout)."""
    assert process.stdout is not None
    out, deadline = [], time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not select.select([process.stdout], [], [], 0.5)[0]:
            continue
        line = process.stdout.readline()
        out.append(line)
        if not line or text in line:
            break
    return "".join(out)


def test_producer_stopped_while_the_broker_is_unreachable(deployment: Deployment, recorded: tuple[Path, Path]) -> None:
    """Started with no broker: it buffers and keeps going; stopped, it spools; the next run delivers it."""
    events, embedded = recorded
    d = deployment
    d.gpucost("topics", "create")
    away = {**d.env, "GPUCOST_KAFKA_BOOTSTRAP": "127.0.0.1:1"}  # nothing listens there
    first = subprocess.Popen(
        [sys.executable, "-m", "gpucost.cli", "produce", "--source", "replay", str(events)],
        cwd=ROOT,
        env=away,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen = _until(first, "cannot deliver", timeout_s=60)  # buffering (a loaded host may take a while to say so)
    if "input read to its end" not in seen:  # said once it is: a timed wait here was a flake on a loaded host
        seen += _until(first, "input read to its end", timeout_s=120)
    assert "input read to its end" in seen, seen[-3000:]
    assert first.poll() is None, "the producer gave up on an unreachable broker"
    first.send_signal(signal.SIGTERM)
    log = seen + first.communicate(timeout=60)[0]
    assert first.returncode == 130 and "cannot deliver" in log and "kept in" in log, log[-3000:]
    assert (d.tmp / "spool").stat().st_size > 0
    (d.tmp / "empty.jsonl").write_text("")
    d.gpucost("produce", "--source", "replay", str(d.tmp / "empty.jsonl"))  # the spool goes first
    assert not (d.tmp / "spool").exists()
    d.worker("worker")
    d.sink()
    run_to_completion(d, embedded)
    assert_same_parquet(d.out, embedded)
    report("producer stopped, no broker", events_in(events), d, embedded)
