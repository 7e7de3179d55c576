"""Fault injection against the real broker: each fault, then the Parquet against the embedded run.

At the end of the session pytest prints one line per fault: events sent, records in the
output, events dead-lettered (by reason), and µ$ billed against µ$ expected.
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import secrets
import select
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from gpucost.kafka.routing import Router
from gpucost.kafka.signing import Signer, parse_keys
from gpucost.kafka.sink import JOURNAL, run_kafka_sink
from gpucost.kafka.worker import INPUTS
from gpucost.producers.replay import input_files
from gpucost.schemas.codec import Rejected, decode_line
from gpucost.schemas.events import Event
from gpucost.schemas.records import OUTPUT_KINDS
from gpucost.schemas.topics import CONTROL_HEADER, END_OF_INPUT
from gpucost.sinks.views import connect
from tests.conftest import FAULT_LINES, ROOT, Broker
from tests.support.deployment import (  # noqa: F401 (deployment is a fixture)
    Deployment,
    assert_same_parquet,
    deployment,
    embedded_counts,
    run_to_completion,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.kafka]


def events_in(folder: Path) -> int:
    return sum(sum(1 for line in f.open("rb") if line.strip()) for f in input_files([folder]))


def report(fault: str, sent: int, d: Deployment, embedded: Path) -> None:
    got, want = connect(d.out), connect(embedded)
    records = sum(got.execute(f"SELECT count(*) FROM {v}").fetchone()[0] for v in ("cost", "idle_index", "mae"))
    reasons = dict(got.execute("SELECT reason, count(*) FROM dlq GROUP BY reason ORDER BY reason").fetchall())
    billed = got.execute("SELECT coalesce(sum(cost_micro_usd), 0)::BIGINT FROM cost").fetchone()[0]
    expected = want.execute("SELECT coalesce(sum(cost_micro_usd), 0)::BIGINT FROM cost").fetchone()[0]
    FAULT_LINES.append(f"{fault:<28} events sent {sent:>7,} | records out {records:>6,} | dead-lettered "
                       f"{sum(reasons.values()):>4} {reasons or ''} | µ$ billed {billed:,} vs expected {expected:,}"
                       f" {'OK' if billed == expected else 'MISMATCH'}")


def all_visible_files_readable(out: Path) -> None:
    for path in out.glob("*/date=*/*.parquet"):
        try:
            duckdb.connect().execute(f"SELECT count(*) FROM read_parquet('{path}')").fetchone()  # raises if torn
        except duckdb.IOException as exc:  # merged away by a compaction since the glob (names are never reused)
            if path.exists() or "No such file" not in str(exc):
                raise


def test_broker_unavailable_for_30_s(deployment: Deployment, kafka_broker: Broker,
                                     recorded: tuple[Path, Path]) -> None:
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
    report("broker down 30 s" + (f" ({'+'.join(restarted)} restarted)" if restarted else ""), events_in(events), d,
           embedded)


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


def test_producer_stopped_while_the_broker_is_unreachable(deployment: Deployment,
                                                          recorded: tuple[Path, Path]) -> None:
    """Started with no broker: it buffers and keeps going; stopped, it spools; the next run delivers it."""
    events, embedded = recorded
    d = deployment
    d.gpucost("topics", "create")
    away = {**d.env, "GPUCOST_KAFKA_BOOTSTRAP": "127.0.0.1:1"}  # nothing listens there
    first = subprocess.Popen([sys.executable, "-m", "gpucost.cli", "produce", "--source", "replay", str(events)],
                             cwd=ROOT, env=away, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
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
        victim = d.spawn(f"sink-{kills}", "sink", "--out", str(d.out), "--group", f"{d.app_id}-sink",
                         "--flush-interval-s", "0.1")
        # killed once it has published a few files, how many drawn at random, or half of the rows left, whichever
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


def test_sink_dies_between_rename_and_commit(deployment: Deployment, recorded: tuple[Path, Path],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
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
        asyncio.run(run_kafka_sink({"bootstrap_servers": d.bootstrap}, {k: f"{d.prefix}{k}" for k in OUTPUT_KINDS},
                                   d.out, f"{d.app_id}-sink", asyncio.Event(), flush_interval_s=0.5))
    monkeypatch.undo()
    journal = (d.out / JOURNAL).read_text().split()
    assert connect(d.out).execute("SELECT count(*) FROM cost").fetchone()[0] > 0 and journal
    # a file outside the journal is not read again: were it, this one would stop the sink
    stale = d.out / "cost" / "date=2000-01-01" / "part-99999.parquet"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"not parquet")
    # committing after every poll: the first commits come before it has read again all that the journal covers
    sink = d.spawn("sink-after", "sink", "--out", str(d.out), "--group", f"{d.app_id}-sink", "--flush-interval-s", "0")
    wait_for("the restarted sink past what it read twice (it empties the journal)",
             lambda: not (d.out / JOURNAL).read_text().split(), 120, d.tmp)
    assert sink.poll() is None, "the restarted sink stopped"
    stale.unlink()
    stale.parent.rmdir()
    run_to_completion(d, embedded)
    assert_same_parquet(d.out, embedded)
    assert (d.out / JOURNAL).read_text().split() == [], "the journal outlived the commit"


def test_sink_dies_between_commit_and_clearing_its_journal(deployment: Deployment, recorded: tuple[Path, Path],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
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
        sink = asyncio.create_task(run_kafka_sink(
            {"bootstrap_servers": d.bootstrap}, {k: f"{d.prefix}{k}" for k in OUTPUT_KINDS}, d.out,
            f"{d.app_id}-sink", stop, flush_interval_s=0.5, compact_min_files=0))
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
    wait_for("the restarted sink to see it is past the journal", lambda: not (d.out / JOURNAL).read_text().split(),
             60, d.tmp)
    assert sink.poll() is None, "the restarted sink stopped"
    d.stop()
    assert_same_parquet(d.out, embedded)


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs (a full disk) needs root")
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], capture_output=True,
                          text=True)
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
    sink = d.spawn("sink", "sink", "--out", str(d.out), "--group", f"{d.app_id}-sink", "--flush-interval-s", "0.5",
                   "--retry-s", "0.5")
    wait_for("the sink to report the full disk", lambda: "No space left" in (d.tmp / "sink.log").read_text(),
             120, d.tmp)
    time.sleep(2)
    assert sink.poll() is None, "the sink died instead of waiting for space"
    all_visible_files_readable(d.out)
    # a retry in progress holds its temporaries for a moment; one a failed write leaked would be there at every look
    wait_for("no temporary file taking space between retries", lambda: not list(d.out.glob("*/date=*/.*.tmp")),
             5, d.tmp)
    subprocess.run(["mount", "-o", "remount,size=64m", str(tiny_disk)], check=True)  # space is back
    run_to_completion(d, embedded)
    assert "writable again" in (d.tmp / "sink.log").read_text()
    assert_same_parquet(d.out, embedded)
    report("disk full, then space", events_in(events), d, embedded)


async def _first_messages(bootstrap: str, topic: str) -> list[tuple[bytes, bytes, list[tuple[str, bytes]]]]:
    """The first message of each partition of ``topic``, headers and all."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(4)]
        consumer.assign(tps)
        copies = []
        for tp in tps:
            batch = (await consumer.getmany(tp, timeout_ms=5000, max_records=1)).get(tp, [])
            copies += [(m.key, m.value, list(m.headers)) for m in batch]
        return copies
    finally:
        await consumer.stop()


async def _inject(bootstrap: str, topic: str, messages: list[tuple[bytes, bytes, list[tuple[str, bytes]]]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for key, value, headers in messages:
            await producer.send_and_wait(topic, value, key=key, headers=headers)
    finally:
        await producer.stop()


def test_forged_events_over_tls(deployment: Deployment, kafka_broker: Broker, recorded: tuple[Path, Path]) -> None:
    """Producer, worker and sink all on the TLS listener; the worker verifies signatures."""
    events, embedded = recorded
    d = deployment
    old, new = (f"{kid} {secrets.token_hex(32)}" for kid in ("2026-11", "2026-12"))
    (d.tmp / "ring").write_text(f"{old}\n{new}\n")  # mid-rotation: both accepted
    (d.tmp / "producer.key").write_text(new + "\n")
    d.env.update(GPUCOST_KAFKA_BOOTSTRAP=kafka_broker.tls_bootstrap, GPUCOST_KAFKA_SECURITY_PROTOCOL="SSL",
                 GPUCOST_KAFKA_SSL_CAFILE=str(kafka_broker.ca_file))
    d.gpucost("produce", "--source", "replay", str(events), "--signing-key-file", str(d.tmp / "producer.key"),
              "--no-end-of-input")
    # what an attacker who can reach the broker sends: real-looking batches for a real GPU's key
    line = next(ln for f in input_files([events]) for ln in f.open("rb") if b'"gpu_sample"' in ln).strip()
    gpu = json.loads(line)["gpu_uuid"].encode()
    fake = json.dumps({**json.loads(line), "sm_util_pct": 100.0, "ts_ns": json.loads(line)["ts_ns"] + 1}).encode()
    stranger = Signer(parse_keys(f"evil {secrets.token_hex(32)}", "attacker")["evil"])
    honest = Signer(parse_keys(new, "ring")["2026-12"])
    forged = [(gpu, fake, []), (gpu, fake, stranger.headers(gpu, fake)),
              (gpu, fake + b"\n" + fake, honest.headers(gpu, fake))]  # a signed message with a line appended
    # then the end of the input, signed as the producer would (every key it wrote to)
    router = Router()
    keys = {(t, k) for ev in replay_events(events) for t, k, _ in router.route(ev) if t in INPUTS}
    end = {CONTROL_HEADER: END_OF_INPUT}
    ends = [(k.encode(), b"", [*end.items(), *honest.headers(k.encode(), b"", end)]) for _, k in keys]
    asyncio.run(_inject(d.bootstrap, f"{d.prefix}events", forged))
    # and copies of real signed messages, as a broker holds a re-sent message twice: applied once, and
    # for mem_access (addresses carry no identity) only the sequence header can tell
    copies = {topic: asyncio.run(_first_messages(d.bootstrap, d.prefix + topic)) for topic in INPUTS}
    assert all(copies.values())
    for topic, messages in copies.items():
        asyncio.run(_inject(d.bootstrap, f"{d.prefix}{topic}", messages))
    for topic in INPUTS:
        asyncio.run(_inject(d.bootstrap, f"{d.prefix}{topic}", [e for (t, _), e in zip(keys, ends) if t == topic]))
    d.spawn("worker", "worker", "--group", d.app_id, "--session-timeout-s", "6", "--verify-keys", str(d.tmp / "ring"))
    d.sink()
    run_to_completion(d, embedded)
    reasons = Counter(dict(connect(d.out).execute("SELECT reason, count(*) FROM dlq GROUP BY reason").fetchall()))
    assert reasons == Counter({"unsigned": 1, "unknown_key": 1, "bad_signature": 2})
    assert_same_parquet(d.out, embedded, dead_letters=4)
    report("forged events, over TLS", events_in(events) + 4, d, embedded)


def replay_events(folder: Path) -> Iterator[Event]:
    for f in input_files([folder]):
        for line in f.open("rb"):
            ev = decode_line(line)
            assert not isinstance(ev, Rejected)
            yield ev


def test_scram_credentials_reach_the_clients(kafka_broker: Broker, tmp_path: Path) -> None:
    env = {**os.environ, "GPUCOST_KAFKA_BOOTSTRAP": kafka_broker.scram_bootstrap,
           "GPUCOST_KAFKA_TOPIC_PREFIX": f"s{secrets.token_hex(3)}.", "GPUCOST_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
           "GPUCOST_KAFKA_SASL_MECHANISM": "SCRAM-SHA-256", "GPUCOST_KAFKA_SASL_USERNAME": kafka_broker.scram_user,
           "GPUCOST_KAFKA_SASL_PASSWORD": kafka_broker.scram_password, "GPUCOST_SPOOL": str(tmp_path / "spool")}
    gpucost = [sys.executable, "-m", "gpucost.cli"]
    ok = subprocess.run([*gpucost, "produce", "--source", "simulate", "--gpus", "1", "--hours", "0.5"], env=env,
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and "events:" in ok.stdout, ok.stderr[-2000:]
    env["GPUCOST_KAFKA_SASL_PASSWORD"] = "not-the-password"
    refused = subprocess.run([*gpucost, "topics", "create"], env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 3 and "SaslAuthenticationFailed" in refused.stderr
    assert "GPUCOST_KAFKA_SECURITY_PROTOCOL" in refused.stderr  # and it says what to check
