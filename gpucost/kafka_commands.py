"""The Kafka commands: topics, produce, worker, sink."""
from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from aiokafka.errors import KafkaConnectionError

from gpucost.discovery import refusals, run_kafka_discovery
from gpucost.flags import compact_min_files
from gpucost.kafka.signing import Keyring, Signer
from gpucost.producers.live import LiveSource
from gpucost.producers.replay import read_inputs
from gpucost.producers.simulate import simulate
from gpucost.reclaim import Reclaimer, run_kafka_reclaim
from gpucost.report import format_table
from gpucost.schemas.codec import Rejected, decode_line, raw_text
from gpucost.schemas.events import Event
from gpucost.schemas.records import OUTPUT_KINDS
from gpucost.streams.discovery import ServiceDiscovery
from gpucost.wiring import (UsageError, attributed, audit_key, audit_settings, event_files, fleet_spec, kafka_settings,
                            live_source, load_keys, metrics_served, say_source_counts, stop_on_signals)

__all__ = ["cmd_topics", "cmd_produce", "cmd_worker", "cmd_sink", "follow_discovery", "follow_reclaim", "replay_events"]


def cmd_topics(args: argparse.Namespace) -> int:
    kafka = kafka_settings(args)
    if args.action == "schemas":
        from gpucost.output_files import made_folder
        from gpucost.schemas.json_schemas import write_json_schemas

        made_folder(args.schemas_out, "--schemas-out")
        try:
            written = write_json_schemas(args.schemas_out)
        except OSError as exc:
            raise UsageError(f"--schemas-out {args.schemas_out}: cannot write a schema there ({exc.strerror}); "
                             "choose a folder you may write in, on a disk with room") from None
        print(*written, sep="\n")
        return 0
    from gpucost.kafka.publish import create_topics

    if args.action == "create":
        from gpucost.kafka.retention import retention_warnings

        created = asyncio.run(create_topics(kafka))
        print(f"created {len(created)} topic(s): {', '.join(created) or 'none missing'}")
        for warning in asyncio.run(retention_warnings(kafka)):
            print(f"gpucost: warning: {warning}", file=sys.stderr)
        return 0
    from gpucost.kafka.retention import topic_config
    from gpucost.schemas.topics import topic_specs

    rows = [(kafka.topic(t.suffix), t.key, "compact" if t.compacted else "delete",
             1 if t.single_partition else kafka.partitions, topic_config(t, kafka).get("retention.ms", "broker's"),
             t.value) for t in topic_specs()]
    print(format_table(["topic", "key", "cleanup", "partitions", "retention_ms", "value"], rows))
    return 0


def replay_events(files: list[Path], rejected: list[tuple[Rejected, str, str]]) -> Iterator[Event]:
    for line, label in read_inputs(files):
        decoded = decode_line(line)
        if isinstance(decoded, Rejected):
            rejected.append((decoded, label, raw_text(line)))
        else:
            yield decoded


def cmd_produce(args: argparse.Namespace) -> int:
    from gpucost.kafka.progress import ProduceProgress
    from gpucost.kafka.publish import ProducerStats, Stopped, create_topics, publish, publish_dead_letters

    kafka = kafka_settings(args)
    if not args.progress_s > 0:
        raise UsageError(f"--progress-s must be more than 0 seconds, got {args.progress_s}")
    rejected: list[tuple[Rejected, str, str]] = []
    events: Iterator[Event]
    live: LiveSource | None = None
    if args.source == "simulate":
        events = simulate(fleet_spec(args))
    elif args.source == "replay":
        if not args.input:
            raise UsageError("--source replay needs at least one INPUT file or directory")
        events = replay_events(event_files(args.input), rejected)
    else:
        reference = replay_events(event_files(args.prices), rejected) if args.prices else iter(())
        live = live_source(args, args.source)
        events = attributed(args, live, before=reference)
    signer = load_keys(Signer.from_file, args.signing_key_file) if args.signing_key_file else None
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(create_topics(kafka))
    except KafkaConnectionError as exc:  # a node's producer must not stop sampling because the broker is away
        logging.getLogger("gpucost.kafka.publish").warning("cannot reach Kafka to create the topics (%s); publishing "
                                                     "anyway, buffered until the broker is back", exc)

    async def main() -> Counter[str]:
        """Stopped now (the second signal, or the first without a live source), what the broker has not
        acknowledged is kept in the spool."""
        stop = stop_on_signals(live)
        stats = ProducerStats(source=live.counts if live is not None else Counter())
        progress, finished = ProduceProgress(stats, args.progress_s), asyncio.Event()
        shown = asyncio.create_task(progress.run(finished))
        try:
            with metrics_served(args.metrics_address, stats.metrics, stats.health):
                return await publish(events, kafka, end_of_input=args.end_of_input,
                                     flush_interval_s=args.flush_interval_s, signer=signer, spool=args.spool,
                                     buffer_bytes=int(args.buffer_mb * (1 << 20)), stop=stop, stats=stats)
        finally:
            finished.set()
            await shown

    try:
        sent = asyncio.run(main())
    except Stopped:
        say_source_counts(live)
        print("gpucost: producer stopped; anything not yet acknowledged is in the spool and goes first next time",
              file=sys.stderr)
        return 130
    say_source_counts(live)
    if rejected:
        asyncio.run(publish_dead_letters(rejected, kafka))
    print(f"published to {kafka.bootstrap}: " + ", ".join(f"{t}: {n:,} messages" for t, n in sorted(sent.items()))
          + (f"; {len(rejected):,} bad line(s) sent to {kafka.topic('dlq')}" if rejected else ""))
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from gpucost.kafka.lag import GroupLag
    from gpucost.kafka.publish import create_topics
    from gpucost.kafka.worker import Worker

    kafka, settings = kafka_settings(args), audit_settings(args)
    if args.max_batch < 1:
        raise UsageError(f"--max-batch must be at least 1 message, got {args.max_batch}")
    if not args.lag_interval_s > 0:
        raise UsageError(f"--lag-interval-s must be more than 0 seconds, got {args.lag_interval_s}")
    keyring = load_keys(Keyring, args.verify_keys) if args.verify_keys else None
    signer = load_keys(Signer.from_file, args.output_signing_key_file) if args.output_signing_key_file else None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("aiokafka").setLevel(logging.WARNING)

    async def main() -> None:
        await create_topics(kafka)
        stop = stop_on_signals()
        worker = Worker(kafka, settings, args.group, args.session_timeout_s, max_batch=args.max_batch, keyring=keyring,
                        output_signer=signer, audit_key=audit_key(args))
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
            await run_kafka_sink(kafka.client_options(), {k: kafka.topic(k) for k in OUTPUT_KINDS}, args.out,
                                 args.group, stop, args.flush_interval_s, args.retry_s, min_files,
                                 keyring, stats)
        print(f"sink stopped: consumed {stats.consumed:,}, written {dict(stats.written)}, "
              f"duplicates dropped {dict(stats.duplicates)}, unverified {stats.unverified:,}, "
              f"small files merged {stats.compacted_files:,}",
              file=sys.stderr)

    asyncio.run(main())
    return 0


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
        return await run_kafka_discovery(kafka, args.file_sd, args.target_port, labels, stop_on_signals(), keyring,
                                         counts, secrets, refused)
    sd = asyncio.run(follow())
    print(f"discovery stopped: {counts['records']:,} health record(s) applied, {counts['refused']:,} message(s) "
          f"refused, the file written {counts['writes']:,} time(s)", file=sys.stderr)
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
