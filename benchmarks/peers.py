"""11. The Kafka worker against the stream processors a user would pick instead, on the same topic.

The peers compute only a subset of the worker's job: per-GPU 60 s idle and covered sums, the
``idle_ms`` and ``covered_ms`` of gpucost's ``idle_index`` records, over the events topic
(``benchmarks/peer_apps/``): quixstreams idiomatic (each event a row, a tumbling window, exactly
once), quixstreams pre-summing each message's samples per pane before the window, and
faust-streaming (a table of sums per GPU and minute, exactly once). They run in a virtual
environment of their own (``.peers-venv``, made on first use with the versions pinned below):
nothing of theirs is a gpucost dependency. Every window a peer closes must equal gpucost's
pane, and a peer must close every pane but each GPU's last few (within the allowed lateness of
its last event, which only gpucost's end of input closes).

The worker does the whole job (every operator, both input topics, state and outputs in
transactions). Each side's rate is its input events over the time from its first message to its
last one processed (start-up left out on every side), median of ``runs``, alternated.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from aiokafka import TopicPartition

from benchmarks.common import Result, events_in
from benchmarks.kafka_vs_raw import through_worker
from benchmarks.rebalance import PARTITIONS, copy_input, read_input
from gpucost.embedded import run_embedded
from gpucost.kafka.publish import create_topics, publish
from gpucost.kafka.settings import KafkaSettings
from gpucost.producers.simulate import FleetSpec, simulate
from gpucost.streams.settings import AuditSettings

ROOT = Path(__file__).resolve().parent.parent
PEERS_VENV = ROOT / ".peers-venv"
PINS = ("quixstreams==3.28.1", "faust-streaming==0.15.3", "cramjam==2.14.0")  # cramjam: zstd for faust's aiokafka
PEERS = {
    "quixstreams, idiomatic": ("quix_idle.py", ["idiomatic"]),
    "quixstreams, pre-summing each message": ("quix_idle.py", ["presum"]),
    "faust-streaming": ("faust_idle.py", ["worker", "-l", "warn"]),
}


def peers_python() -> Path | str:
    """The peers' Python, its environment made if missing; or why there is none."""
    python = PEERS_VENV / "bin" / "python"
    if python.exists():
        return python
    try:
        subprocess.run([sys.executable, "-m", "venv", str(PEERS_VENV)], check=True, capture_output=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *PINS], check=True, capture_output=True, timeout=900)
    except (subprocess.SubprocessError, OSError) as exc:
        shutil.rmtree(PEERS_VENV, ignore_errors=True)
        return f"the peers could not be installed ({exc})"
    return python


def peer_run(python: Path, script: str, args: list[str], kafka: KafkaSettings, messages: int) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        env = {
            **os.environ,
            "PEER_BOOTSTRAP": kafka.bootstrap,
            "PEER_TOPIC": kafka.topic("events"),
            "PEER_MESSAGES": str(messages),
            "PEER_OUT": out.name,
        }
        done = subprocess.run(
            [str(python), str(ROOT / "benchmarks" / "peer_apps" / script), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=1200,
        )
        if done.returncode:
            raise RuntimeError(f"{script} {' '.join(args)} failed: {done.stderr[-2000:]}")
        return json.loads(Path(out.name).read_text())


def our_panes(gpus: int, hours: float, work: Path) -> dict[tuple[str, int], tuple[int, int]]:
    """gpucost's panes of the same fleet, from the embedded run: (GPU, start in ms) → (idle, covered) ms."""
    run_embedded(
        ((e, "simulate") for e in simulate(FleetSpec(gpus=gpus, hours=hours, interval_s=10))), AuditSettings(), work
    )
    rows = pq.read_table(
        work / "idle_index", columns=["gpu_uuid", "pane_start_ns", "idle_ms", "covered_ms", "revision"]
    ).to_pylist()
    return {
        (r["gpu_uuid"], r["pane_start_ns"] // 1_000_000): (r["idle_ms"], r["covered_ms"])
        for r in rows
        if r["revision"] == 0
    }


def agreement(peer: dict[str, Any], ours: dict[tuple[str, int], tuple[int, int]], gpus: int) -> str:
    """Whether the peer's windows are gpucost's panes; raises if not."""
    windows = {(gpu, start): (idle, covered) for gpu, start, idle, covered in peer["windows"]}
    wrong = [k for k, v in windows.items() if ours.get(k) != v]
    # a GPU's panes still within the allowed lateness of its last event when input ends stay open in a peer
    open_at_end = gpus * (1 + AuditSettings().lateness_s // 60)
    if wrong or len(windows) < len(ours) - open_at_end:
        raise AssertionError(
            f"a peer disagrees with gpucost: {len(wrong)} of {len(windows)} windows differ "
            f"(first: {wrong[:3]}), {len(ours) - len(windows)} of gpucost's {len(ours)} panes missing"
        )
    return f"{len(windows):,} windows equal to gpucost's panes"


def run(gpus: int, hours: float, runs: int = 3, port: int = 19740) -> Result:
    python = peers_python()
    if isinstance(python, str):
        return Result(
            "11. The worker against its peers",
            "worker ≥ 3× idiomatic quixstreams, ≥ 1.5× pre-summing",
            None,
            [],
            [python],
        )
    data = Path(tempfile.mkdtemp(prefix="gpucost-bench-peers-"))
    env = {**os.environ, "GPUCOST_KAFKA_PORT": str(port), "GPUCOST_KAFKA_DATA": str(data)}
    subprocess.run(["bash", str(ROOT / "scripts" / "kafka.sh"), "start"], env=env, check=True, capture_output=True)
    try:
        bootstrap = f"127.0.0.1:{port}"
        # the peers read JSON Lines; the worker reads that topic, and the same events as Arrow IPC (its default)
        source = KafkaSettings(bootstrap=bootstrap, topic_prefix="peers.", partitions=PARTITIONS, event_encoding="json")
        arrow_source = source.model_copy(update={"topic_prefix": "peers-arrow.", "event_encoding": "arrow"})

        async def setup(settings: KafkaSettings) -> dict[TopicPartition, list[Any]]:
            await create_topics(settings)
            fleet = simulate(FleetSpec(gpus=gpus, hours=hours, interval_s=10))
            await publish(fleet, settings, spool=data / f"spool-{settings.event_encoding}")
            return await read_input(settings)

        inputs, arrow_inputs = asyncio.run(setup(source)), asyncio.run(setup(arrow_source))
        count = {
            t: (
                sum(len(b) for tp, b in inputs.items() if tp.topic == source.topic(t)),
                sum(events_in(m) for tp, b in inputs.items() if tp.topic == source.topic(t) for m in b),
            )
            for t in ("events", "mem_access")
        }
        ours = our_panes(gpus, hours, data / "embedded")
        ours_json, ours_arrow = "gpucost worker (the whole job), JSON Lines input", "… the same, Arrow IPC input"
        rates: dict[str, list[float]] = {ours_json: [], ours_arrow: [], **{name: [] for name in PEERS}}
        agreed: dict[str, str] = {}
        for i in range(runs):
            for name, given, prefix in ((ours_json, inputs, "peers"), (ours_arrow, arrow_inputs, "peers-arrow")):
                kafka = KafkaSettings(bootstrap=bootstrap, topic_prefix=f"{prefix}{i}.", partitions=PARTITIONS)
                asyncio.run(copy_input(given, source if given is inputs else arrow_source, kafka))
                worker = asyncio.run(through_worker(kafka, sum(map(len, given.values()))))
                rates[name].append(sum(e for _, e in count.values()) / (worker.end_s - worker.began_s))
            for name, (script, args) in PEERS.items():
                peer = peer_run(python, script, args, source, count["events"][0])
                rates[name].append(peer["events"] / (peer["last"] - peer["first"]))
                agreed[name] = agreement(peer, ours, gpus)
    finally:
        subprocess.run(["bash", str(ROOT / "scripts" / "kafka.sh"), "stop"], env=env, capture_output=True)
        shutil.rmtree(data, ignore_errors=True)

    median = {name: statistics.median(r) for name, r in rates.items()}
    ours_rate, arrow_rate = median[ours_json], median[ours_arrow]
    rows = [
        (
            "input",
            f"{gpus} GPUs × {hours:g} h at 10 s: {count['events'][1]:,} events in {count['events'][0]:,} "
            f"messages on the events topic, {count['mem_access'][1]:,} in {count['mem_access'][0]:,} on "
            f"mem_access (the worker's alone), {PARTITIONS} partitions, one process each",
        )
    ]
    for name, r in rates.items():
        rows.append(
            (
                name,
                f"{median[name]:,.0f} events/s (runs: "
                + ", ".join(f"{x:,.0f}" for x in r)
                + ")"
                + (f"; {agreed[name]}" if name in agreed else ""),
            )
        )
    idiomatic, presum = median["quixstreams, idiomatic"], median["quixstreams, pre-summing each message"]
    for label, rate in (("worker, JSON input", ours_rate), ("worker, Arrow input", arrow_rate)):
        rows.append((f"{label} / quixstreams idiomatic (target ≥ 3)", f"{rate / idiomatic:.2f}"))
        rows.append((f"{label} / quixstreams pre-summing (target ≥ 1.5)", f"{rate / presum:.2f}"))
        rows.append((f"{label} / faust-streaming", f"{rate / median['faust-streaming']:.1f}"))
    return Result(
        "11. The worker against its peers",
        "the worker ≥ 3× idiomatic quixstreams and ≥ 1.5× quixstreams pre-summing, on the full job",
        arrow_rate >= 3 * idiomatic and arrow_rate >= 1.5 * presum,
        rows,
        [
            f"Peers: {', '.join(PINS)}, in `.peers-venv` (Python {sys.version_info.major}."
            f"{sys.version_info.minor}); each reads the events topic from the beginning in a consumer group "
            "of its own, and stops at its last message.",
            "Rates are events/s from the first message seen to the last one processed; the worker's from the "
            "start of its first batch to the end of its last transaction (polled every 10 ms, as benchmark 2 "
            "does), over both input topics.",
            "The peers read the JSON Lines topic; the worker reads a copy of it, and a copy of the same events "
            "produced as Arrow IPC (the producers' default): the target is judged on the latter.",
        ],
    )
