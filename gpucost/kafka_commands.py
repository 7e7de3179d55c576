"""The consumer side of the Kafka commands: `worker` and `sink`, and following the health and reclaim topics for
`discovery` and `reclaim`."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

from gpucost.command import Command
from gpucost.discovery import refusals, run_kafka_discovery
from gpucost.flags import (
    add_compact,
    add_cost_series,
    add_kafka,
    add_metrics,
    add_out,
    add_settings,
    compact_min_files,
    env_default,
    env_flag,
)
from gpucost.kafka.balance import ASSIGNORS
from gpucost.kafka.signing import Keyring, Signer
from gpucost.reclaim import Reclaimer, run_kafka_reclaim
from gpucost.schemas.records import OUTPUT_KINDS
from gpucost.streams.discovery import ServiceDiscovery
from gpucost.wiring import (
    UsageError,
    audit_key,
    audit_settings,
    kafka_settings,
    load_keys,
    metrics_served,
    stop_on_signals,
)

__all__ = ["cmd_worker", "cmd_sink", "follow_discovery", "follow_reclaim", "WORKER", "SINK"]


def cmd_worker(args: argparse.Namespace) -> int:
    from gpucost.kafka.lag import GroupLag
    from gpucost.kafka.publish import create_topics
    from gpucost.kafka.worker import Worker

    kafka, settings = kafka_settings(args), audit_settings(args)
    if args.max_batch < 1:
        raise UsageError(f"--max-batch must be at least 1 message, got {args.max_batch}")
    if not args.lag_interval_s > 0:
        raise UsageError(f"--lag-interval-s must be more than 0 seconds, got {args.lag_interval_s}")
    if args.assignor not in ASSIGNORS:
        raise UsageError(
            f"--assignor must be one of {', '.join(ASSIGNORS)}, got {args.assignor!r} (or env GPUCOST_ASSIGNOR)"
        )
    keyring = load_keys(Keyring, args.verify_keys) if args.verify_keys else None
    signer = load_keys(Signer.from_file, args.output_signing_key_file) if args.output_signing_key_file else None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("aiokafka").setLevel(logging.WARNING)

    async def main() -> None:
        await create_topics(kafka)
        stop = stop_on_signals()
        worker = Worker(
            kafka,
            settings,
            args.group,
            args.session_timeout_s,
            max_batch=args.max_batch,
            keyring=keyring,
            output_signer=signer,
            audit_key=audit_key(args),
            assignor=args.assignor,
        )
        lag = GroupLag(kafka, args.group, list(worker.inputs), lambda: worker.ends_applied, args.lag_interval_s)
        with metrics_served(args.metrics_address, lambda: [*worker.metrics(), *lag.metrics()], worker.health):
            watch = asyncio.create_task(lag.run(stop))
            try:
                await worker.run(stop)
            finally:
                stop.set()
                await watch
        print(f"worker stopped after {worker.processed:,} input messages", file=sys.stderr)

    asyncio.run(main())
    return 0


def cmd_sink(args: argparse.Namespace) -> int:
    from gpucost.cost_metrics import CostMetrics
    from gpucost.kafka.sink import SinkStats, run_kafka_sink

    kafka = kafka_settings(args)
    min_files = compact_min_files(args)
    keyring = load_keys(Keyring, args.verify_keys) if args.verify_keys else None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("aiokafka").setLevel(logging.WARNING)

    async def main() -> None:
        stop = stop_on_signals()
        stats = SinkStats(cost=CostMetrics(args.cost_series) if args.metrics_address else None)
        with metrics_served(args.metrics_address, stats.metrics, stats.health):
            await run_kafka_sink(
                kafka.client_options(),
                {k: kafka.topic(k) for k in OUTPUT_KINDS},
                args.out,
                args.group,
                stop,
                args.flush_interval_s,
                args.retry_s,
                min_files,
                keyring,
                stats,
            )
        print(
            f"sink stopped: consumed {stats.consumed:,}, written {_by_kind(stats.written)}, "
            f"duplicates dropped {_by_kind(stats.duplicates)}, unverified {stats.unverified:,}, "
            f"small files merged {stats.compacted_files:,}",
            file=sys.stderr,
        )

    asyncio.run(main())
    return 0


def _by_kind(counts: Mapping[str, int]) -> str:
    """``cost 1,204, mae 4`` (``none`` for no count): what a person reads, not a Python dict."""
    return ", ".join(f"{kind} {n:,}" for kind, n in sorted(counts.items())) or "none"


def follow_discovery(args: argparse.Namespace, labels: dict[str, str], secrets: dict[str, bytes] | None) -> int:
    """``gpucost discovery`` without ``--out``: follow the health topic until SIGINT/SIGTERM (``secrets``: the
    audit keys each record's seal must verify with)."""
    kafka = kafka_settings(args)
    keyring = load_keys(Keyring, args.verify_keys) if args.verify_keys else None
    try:
        ServiceDiscovery().file_sd(args.target_port, labels)  # refuses a label or port Prometheus would
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    counts: dict[str, int] = {}
    refused: Counter[str] = Counter()

    async def follow() -> ServiceDiscovery:
        return await run_kafka_discovery(
            kafka, args.file_sd, args.target_port, labels, stop_on_signals(), keyring, counts, secrets, refused
        )

    sd = asyncio.run(follow())
    print(
        f"discovery stopped: {counts['records']:,} health record(s) applied, {counts['refused']:,} message(s) "
        f"refused, the file written {counts['writes']:,} time(s)",
        file=sys.stderr,
    )
    if said := refusals(refused, sd):
        print(f"gpucost: discovery: {said}", file=sys.stderr)
    return 0


def follow_reclaim(args: argparse.Namespace, reclaimer: Reclaimer) -> int:
    """``gpucost reclaim`` without ``--out``: follow the reclaim topic until SIGINT/SIGTERM."""
    kafka = kafka_settings(args)
    keyring = load_keys(Keyring, args.verify_keys) if args.verify_keys else None

    async def follow() -> None:
        await run_kafka_reclaim(kafka, args.group, reclaimer, stop_on_signals(), keyring)

    asyncio.run(follow())
    print(", ".join(f"{k}: {v:,}" for k, v in reclaimer.counts.items()), file=sys.stderr)
    return 0


# --- the command line: each command's flags and its entry in the table of gpucost.cli ---


def _worker_arguments(p: argparse.ArgumentParser) -> None:
    env_flag(
        p,
        "--group",
        "GPUCOST_GROUP",
        str,
        "gpucost",
        "consumer group shared by all workers; also names their transactions",
    )
    env_flag(
        p,
        "--session-timeout-s",
        "GPUCOST_SESSION_TIMEOUT_S",
        float,
        "30",
        "seconds before a silent worker's partitions move to another",
    )
    env_flag(
        p,
        "--max-batch",
        "GPUCOST_MAX_BATCH",
        int,
        "200",
        "input messages per poll at most, each partition's share applied in one transaction: fewer "
        "commit sooner, more cost less per event",
    )
    env_flag(
        p,
        "--assignor",
        "GPUCOST_ASSIGNOR",
        str,
        "balance",
        "how the group spreads the input partitions: 'balance' by each partition's measured work (backlog, "
        "arrival rate, seconds per message), keeping state where it can; 'roundrobin' by count, as Kafka does "
        "(docs/performance.md, 'Workers, partitions and cores')",
    )
    env_flag(
        p,
        "--lag-interval-s",
        "GPUCOST_LAG_INTERVAL_S",
        float,
        "5",
        "ask the broker this often for the group's lag on every input partition (a dead worker's too), "
        "and say 'caught up' once a finite input is committed to its end",
    )
    env_flag(
        p,
        "--verify-keys",
        "GPUCOST_VERIFY_KEYS",
        Path,
        None,
        "apply only messages signed by a key in this keyring file (re-read when it changes); others are "
        "dead-lettered (unset: no verification)",
    )
    env_flag(
        p,
        "--output-signing-key-file",
        "GPUCOST_OUTPUT_SIGNING_KEY_FILE",
        Path,
        None,
        "sign every published record with the one key in this file, for sinks and billing consumers to "
        "verify (unset: unsigned)",
    )
    add_settings(p, writes_out=False)
    add_metrics(p)
    add_kafka(p)


def _sink_arguments(p: argparse.ArgumentParser) -> None:
    add_out(p, "output directory (appended to)")
    p.add_argument(
        "--group",
        default=env_default("GPUCOST_SINK_GROUP", "gpucost-sink"),
        help="consumer group (env GPUCOST_SINK_GROUP; default gpucost-sink)",
    )
    p.add_argument("--flush-interval-s", type=float, default=2.0, help="seconds between file flushes (default 2)")
    env_flag(p, "--retry-s", "GPUCOST_SINK_RETRY_S", float, "5", "while the output cannot be written, retry this often")
    add_compact(p, "GPUCOST_SINK_COMPACT_MIN_FILES")
    env_flag(
        p,
        "--verify-keys",
        "GPUCOST_SINK_VERIFY_KEYS",
        Path,
        None,
        "write only records signed by a key in this keyring file (the workers' output keys); others are "
        "dead-lettered (unset: no verification)",
    )
    add_metrics(p)
    add_cost_series(p)
    add_kafka(p)


WORKER = Command(
    "worker", "run a worker: input topics → operators → output topics, exactly once", _worker_arguments, cmd_worker
)
SINK = Command("sink", "consume the output topics into Parquet (each record once)", _sink_arguments, cmd_sink)
