"""The producer side of the Kafka commands: the topic contract (create, list, JSON Schemas) and `produce`."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from aiokafka.errors import KafkaConnectionError

from gpucost.command import Command
from gpucost.flags import (
    add_fleet,
    add_kafka,
    add_live,
    add_metrics,
    env_flag,
)
from gpucost.kafka.signing import Signer
from gpucost.producers.live import LIVE_SOURCES, LiveSource
from gpucost.producers.replay import read_inputs
from gpucost.producers.simulate import simulate
from gpucost.report import format_table
from gpucost.schemas.codec import Rejected, decode_line, raw_text
from gpucost.schemas.events import Event
from gpucost.wiring import (
    UsageError,
    attributed,
    event_files,
    fleet_spec,
    kafka_settings,
    live_source,
    load_keys,
    metrics_served,
    say_source_counts,
    stop_on_signals,
)

__all__ = ["cmd_topics", "cmd_produce", "replay_events", "TOPICS", "PRODUCE"]


def cmd_topics(args: argparse.Namespace) -> int:
    kafka = kafka_settings(args)
    if args.action == "schemas":
        from gpucost.output_files import made_folder
        from gpucost.schemas.json_schemas import write_json_schemas

        made_folder(args.schemas_out, "--schemas-out")
        try:
            written = write_json_schemas(args.schemas_out)
        except OSError as exc:
            raise UsageError(
                f"--schemas-out {args.schemas_out}: cannot write a schema there ({exc.strerror}); "
                "choose a folder you may write in, on a disk with room"
            ) from None
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

    rows = [
        (
            kafka.topic(t.suffix),
            t.key,
            "compact" if t.compacted else "delete",
            1 if t.single_partition else kafka.partitions,
            topic_config(t, kafka).get("retention.ms", "broker's"),
            t.value,
        )
        for t in topic_specs()
    ]
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
        logging.getLogger("gpucost.kafka.publish").warning(
            "cannot reach Kafka to create the topics (%s); publishing anyway, buffered until the broker is back", exc
        )

    async def main() -> Counter[str]:
        """Stopped now (the second signal, or the first without a live source), what the broker has not
        acknowledged is kept in the spool."""
        stop = stop_on_signals(live)
        stats = ProducerStats(source=live.counts if live is not None else Counter())
        if live is not None:
            stats.health.watch(f"the source ({live.what})", live.silent_s)
        progress, finished = ProduceProgress(stats, args.progress_s), asyncio.Event()
        shown = asyncio.create_task(progress.run(finished))
        try:
            with metrics_served(args.metrics_address, stats.metrics, stats.health):
                return await publish(
                    events,
                    kafka,
                    end_of_input=args.end_of_input,
                    flush_interval_s=args.flush_interval_s,
                    signer=signer,
                    spool=args.spool,
                    buffer_bytes=int(args.buffer_mb * (1 << 20)),
                    stop=stop,
                    stats=stats,
                )
        finally:
            finished.set()
            await shown

    try:
        sent = asyncio.run(main())
    except Stopped:
        say_source_counts(live)
        print(
            "gpucost: producer stopped; anything not yet acknowledged is in the spool and goes first next time",
            file=sys.stderr,
        )
        return 130
    say_source_counts(live)
    if rejected:
        asyncio.run(publish_dead_letters(rejected, kafka))
    print(
        f"published to {kafka.bootstrap}: "
        + ", ".join(f"{t}: {n:,} messages" for t, n in sorted(sent.items()))
        + (f"; {len(rejected):,} bad line(s) sent to {kafka.topic('dlq')}" if rejected else "")
    )
    return 0


def _topics_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["create", "list", "schemas"])
    p.add_argument(
        "--schemas-out",
        type=Path,
        default=Path("json-schemas"),
        help="directory for `schemas` (default ./json-schemas)",
    )
    add_kafka(p)


def _produce_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--source", choices=["simulate", "replay", *LIVE_SOURCES], required=True)
    p.add_argument(
        "--flush-interval-s",
        type=float,
        default=1.0,
        help="send a key's batch after this long even if not full (default 1.0)",
    )
    p.add_argument("input", type=Path, nargs="*", help="with --source replay: JSON Lines files or directories")
    p.add_argument(
        "--no-end-of-input",
        dest="end_of_input",
        action="store_false",
        help="do not mark the end of the input (the panes of a finite input then stay open)",
    )
    env_flag(
        p,
        "--spool",
        "GPUCOST_SPOOL",
        Path,
        None,
        "file where messages wait, past --buffer-mb, while the broker is unreachable; a later run sends "
        "what it holds first (unset: ~/.local/state/gpucost/<topic prefix>produce.spool)",
    )
    env_flag(
        p,
        "--progress-s",
        "GPUCOST_PROGRESS_S",
        float,
        "60",
        "off a terminal, write a progress line (events read, messages acknowledged, waiting) on stderr this "
        "often, and at the end; on a terminal a bar shows it",
    )
    env_flag(
        p,
        "--buffer-mb",
        "GPUCOST_BUFFER_MB",
        float,
        "64",
        "memory for messages not yet acknowledged, before spilling to the spool",
    )
    env_flag(
        p,
        "--signing-key-file",
        "GPUCOST_SIGNING_KEY_FILE",
        Path,
        None,
        "sign every message with the one key in this file, '<key_id> <secret hex> [nodes]' (unset: unsigned)",
    )
    add_fleet(p)
    add_live(p)
    add_metrics(p)
    add_kafka(p)


TOPICS = Command(
    "topics", "the Kafka topic contract: create the topics, or write JSON Schemas", _topics_arguments, cmd_topics
)
PRODUCE = Command("produce", "publish events to Kafka (idempotent, batched per key)", _produce_arguments, cmd_produce)
