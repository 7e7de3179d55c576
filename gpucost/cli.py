"""``gpucost``: run the audit, simulate a fleet, replay recordings, query the output."""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from aiokafka.errors import KafkaConnectionError

from gpucost.commands import (IDLE_POLICIES, cmd_compact, cmd_export, cmd_fit_weights, cmd_prices, cmd_query,
                              cmd_replay, cmd_report, cmd_simulate, cmd_views, cmd_whatif)
from gpucost.config import ConfigError
from gpucost.focus import FORMATS
from gpucost.kernels import add_kernels_parser, cmd_kernels
from gpucost.kafka.commands import cmd_produce, cmd_sink, cmd_topics, cmd_worker
from gpucost.kafka.state import StateError
from gpucost.operations import cmd_discovery, cmd_health, cmd_reclaim
from gpucost.sinks.compact import CompactError
from gpucost.sinks.lock import OutputBusyError
from gpucost.sinks.parquet import SinkWriteError
from gpucost.streams.discovery import TARGET_PORT
from gpucost.webhook import WebhookSettings
from gpucost.flags import (add_compact, add_cost_series, add_fleet, add_kafka, add_live, add_metrics, add_opex,
                           add_log_format, add_out, add_publication, add_settings, date_arg, env_default, env_flag)
from gpucost.run import cmd_run
from gpucost.wiring import UsageError

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpucost", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="audit a fleet embedded (no broker): NVML if present, else simulated")
    run.add_argument("--source", choices=["auto", "simulate", "nvml", "dcgm", "ebpf"],
                     default=env_default("GPUCOST_SOURCE", "auto"),
                     help="where events come from: auto = nvml where NVML works, else simulate (env GPUCOST_SOURCE)")
    add_live(run)
    add_fleet(run)
    add_out(run, "output directory")
    add_settings(run)
    add_publication(run)
    add_log_format(run)
    add_metrics(run)
    add_cost_series(run)

    sim = sub.add_parser("simulate", help="write a simulated fleet's events as JSON Lines or Parquet")
    add_fleet(sim)
    sim.add_argument("--out", type=Path, required=True, help="directory for events-NNNNN.jsonl (or .parquet)")
    sim.add_argument("--overwrite", action="store_true", help="replace the event files already in --out")
    sim.add_argument("--format", choices=["jsonl", "parquet"], default="jsonl",
                     help="JSON Lines (the wire form), or Parquet with one column per wire field")

    rep = sub.add_parser("replay", help="run recorded events (JSON Lines or Parquet) through the pipeline")
    rep.add_argument("input", type=Path, nargs="+", help="JSON Lines or Parquet files, or directories of them")
    add_out(rep, "output directory")
    add_settings(rep)
    add_log_format(rep)

    qry = sub.add_parser("query", help="run SQL over the views idle_index, mae, cost, health, quota, reclaim, "
                                       "efficiency, dlq and unit_cost")
    qry.add_argument("sql")
    qry.add_argument("--format", choices=["table", "csv", "json", "lines"], default="table",
                     help="lines: one value per line, of a one-column query (e.g. dead letters' raw text to replay)")
    qry.add_argument("--unsafe", action="store_true",
                     help="run any statement with DuckDB's full file access (by default: SELECT or EXPLAIN only, "
                          "reading files under --out only)")
    qry.add_argument("--raw-times", action="store_true",
                     help="show event times (the records' *_ns columns) as the integer nanoseconds stored, not as "
                          "ISO-8601 UTC (env GPUCOST_QUERY_RAW_TIMES=1)")
    add_out(qry, "directory holding the output to query")
    add_opex(qry)

    prices = sub.add_parser("prices", help="price authority: sign price events so workers with a keyring take them")
    price_sub = prices.add_subparsers(dest="action", required=True)
    sign = price_sub.add_parser("sign", help="write each price of FILE(s) with the authority's key id and signature "
                                             "as JSON Lines on stdout (other lines: refused)")
    sign.add_argument("files", nargs="+", type=Path)
    sign.add_argument("--signing-key-file", type=Path, required=True,
                      help="the price authority's one key, '<key_id> <secret hex> @prices' (or '*')")

    views = sub.add_parser("views", help="print the CREATE VIEW statements for use in any DuckDB")
    add_out(views, "directory holding the output")
    add_opex(views)

    topics = sub.add_parser("topics", help="the Kafka topic contract: create the topics, or write JSON Schemas")
    topics.add_argument("action", choices=["create", "list", "schemas"])
    topics.add_argument("--schemas-out", type=Path, default=Path("json-schemas"),
                        help="directory for `schemas` (default ./json-schemas)")
    add_kafka(topics)

    prod = sub.add_parser("produce", help="publish events to Kafka (idempotent, batched per key)")
    prod.add_argument("--source", choices=["simulate", "replay", "nvml", "dcgm", "ebpf"], required=True)
    prod.add_argument("--flush-interval-s", type=float, default=1.0,
                      help="send a key's batch after this long even if not full (default 1.0)")
    prod.add_argument("input", type=Path, nargs="*", help="with --source replay: JSON Lines files or directories")
    prod.add_argument("--no-end-of-input", dest="end_of_input", action="store_false",
                      help="do not mark the end of the input (the panes of a finite input then stay open)")
    env_flag(prod, "--spool", "GPUCOST_SPOOL", Path, None,
              "file where messages wait, past --buffer-mb, while the broker is unreachable; a later run sends "
              "what it holds first (unset: ~/.local/state/gpucost/<topic prefix>produce.spool)")
    env_flag(prod, "--progress-s", "GPUCOST_PROGRESS_S", float, "60",
              "off a terminal, write a progress line (events read, messages acknowledged, waiting) on stderr this "
              "often, and at the end; on a terminal a bar shows it")
    env_flag(prod, "--buffer-mb", "GPUCOST_BUFFER_MB", float, "64",
              "memory for messages not yet acknowledged, before spilling to the spool")
    env_flag(prod, "--signing-key-file", "GPUCOST_SIGNING_KEY_FILE", Path, None,
              "sign every message with the one key in this file, '<key_id> <secret hex> [nodes]' (unset: unsigned)")
    add_fleet(prod)
    add_live(prod)
    add_metrics(prod)
    add_kafka(prod)

    work = sub.add_parser("worker", help="run a worker: input topics → operators → output topics, exactly once")
    env_flag(work, "--group", "GPUCOST_GROUP", str, "gpucost",
              "consumer group shared by all workers; also names their transactions")
    env_flag(work, "--session-timeout-s", "GPUCOST_SESSION_TIMEOUT_S", float, "30",
              "seconds before a silent worker's partitions move to another")
    env_flag(work, "--max-batch", "GPUCOST_MAX_BATCH", int, "200",
              "input messages per poll at most, each partition's share applied in one transaction: fewer "
              "commit sooner, more cost less per event")
    env_flag(work, "--lag-interval-s", "GPUCOST_LAG_INTERVAL_S", float, "5",
              "ask the broker this often for the group's lag on every input partition (a dead worker's too), "
              "and say 'caught up' once a finite input is committed to its end")
    env_flag(work, "--verify-keys", "GPUCOST_VERIFY_KEYS", Path, None,
              "apply only messages signed by a key in this keyring file (re-read when it changes); others are "
              "dead-lettered (unset: no verification)")
    env_flag(work, "--output-signing-key-file", "GPUCOST_OUTPUT_SIGNING_KEY_FILE", Path, None,
              "sign every published record with the one key in this file, for sinks and billing consumers to "
              "verify (unset: unsigned)")
    add_settings(work, writes_out=False)
    add_metrics(work)
    add_kafka(work)

    sink = sub.add_parser("sink", help="consume the output topics into Parquet (each record once)")
    add_out(sink, "output directory (appended to)")
    sink.add_argument("--group", default=env_default("GPUCOST_SINK_GROUP", "gpucost-sink"),
                      help="consumer group (env GPUCOST_SINK_GROUP; default gpucost-sink)")
    sink.add_argument("--flush-interval-s", type=float, default=2.0, help="seconds between file flushes (default 2)")
    env_flag(sink, "--retry-s", "GPUCOST_SINK_RETRY_S", float, "5",
              "while the output cannot be written, retry this often")
    add_compact(sink, "GPUCOST_SINK_COMPACT_MIN_FILES")
    env_flag(sink, "--verify-keys", "GPUCOST_SINK_VERIFY_KEYS", Path, None,
              "write only records signed by a key in this keyring file (the workers' output keys); others are "
              "dead-lettered (unset: no verification)")
    add_metrics(sink)
    add_cost_series(sink)
    add_kafka(sink)

    disc = sub.add_parser("discovery", help="the nodes in service as a Prometheus file_sd file, from the health "
                                            "records (removed or probation GPUs take their node out)")
    env_flag(disc, "--file-sd", "GPUCOST_FILE_SD", Path, None, "the file_sd JSON file to keep (replaced atomically)")
    disc.add_argument("--out", type=Path, default=env_default("GPUCOST_DISCOVERY_OUT", None),
                      help="read the health view of this output directory once (env GPUCOST_DISCOVERY_OUT; unset: "
                           "follow the Kafka health topic, and publish each node's entry to the discovery topic)")
    env_flag(disc, "--target-port", "GPUCOST_DISCOVERY_PORT", int, str(TARGET_PORT),
              "each target is node:PORT, the exporter Prometheus should scrape (9400: the DCGM exporter's port); "
              "a node whose name is not a host name or a routable IP address is left out")
    disc.add_argument("--label", action="append", default=[], metavar="NAME=VALUE",
                      help="a label for every target group (repeatable)")
    env_flag(disc, "--verify-keys", "GPUCOST_DISCOVERY_VERIFY_KEYS", Path, None,
              "apply only health messages signed by a key in this keyring file (the workers' output keys; the "
              "Kafka topic only)")
    env_flag(disc, "--audit-keys", "GPUCOST_DISCOVERY_AUDIT_KEYS", Path, None,
              "count only health records whose hash holds and whose signature is by a key in this file (the audit "
              "keys, as for health verify --key-file); others are refused and counted")
    add_kafka(disc)

    recl = sub.add_parser("reclaim", help="act on reclaim triggers once each: POST them to a webhook and/or write "
                                          "them to a file (from the Kafka reclaim topic, or once from --out)")
    recl.add_argument("--out", type=Path, default=env_default("GPUCOST_RECLAIM_OUT", None),
                      help="act on the reclaim view of this output directory once (env GPUCOST_RECLAIM_OUT; unset: "
                           "follow the Kafka reclaim topic)")
    env_flag(recl, "--webhook", "GPUCOST_RECLAIM_WEBHOOK", str, None,
              "POST each action as JSON here (http or https), with Idempotency-Key: <trigger_id>; retried until a "
              "2xx, up to --max-attempts")
    env_flag(recl, "--actions-file", "GPUCOST_RECLAIM_ACTIONS_FILE", Path, None,
              "append each action, with its outcome, to this JSON Lines file")
    env_flag(recl, "--ledger", "GPUCOST_RECLAIM_LEDGER", Path, "reclaim-ledger.txt",
              "the trigger ids already acted on (never acted on again)")
    recl.add_argument("--dry-run", action="store_true", help="print what would be done; act on nothing, commit nothing")
    env_flag(recl, "--group", "GPUCOST_RECLAIM_GROUP", str, "gpucost-reclaim", "the Kafka consumer group")
    env_flag(recl, "--verify-keys", "GPUCOST_RECLAIM_VERIFY_KEYS", Path, None,
              "act only on triggers signed by a key in this keyring file (the workers' output keys)")
    bounds = recl.add_argument_group("each webhook attempt's bounds and the retries (a redirect is a failed attempt, "
                                     "never followed)")
    for f in dataclasses.fields(WebhookSettings):
        env_flag(bounds, f"--{f.name.replace('_', '-')}", f"GPUCOST_RECLAIM_{f.name.upper()}", type(f.default),
                  str(f.default), f.metadata["help"])
    add_kafka(recl)

    health = sub.add_parser("health", help="health snapshots for admission: write a GPU's latest, or verify one")
    hsub = health.add_subparsers(dest="health_command", required=True)
    snap = hsub.add_parser("snapshot", help="write a GPU's latest health record, with its device, as a JSON file")
    snap.add_argument("--gpu", required=True, help="the GPU's UUID")
    add_out(snap, "output directory holding the health records")
    snap.add_argument("--file", type=Path, default=Path("health-snapshot.json"),
                      help="the snapshot file to write (default ./health-snapshot.json)")
    ver = hsub.add_parser("verify", help="check a snapshot's hash, device and (with --key-file) signature; exit 1 if "
                                         "it fails, saying why")
    ver.add_argument("file", type=Path, help="a snapshot, or an OTLP JSON export (then: does it cover --admission-h?)")
    env_flag(ver, "--key-file", "GPUCOST_AUDIT_KEY_FILE", Path, None,
              "the audit key(s) the signature must be one of, '<key_id> <secret hex>' per line (unset: hash only)")
    env_flag(ver, "--admission-h", "GPUCOST_ADMISSION_H", int, "48",
              "hours an OTLP export must cover without a gap, up to each GPU's latest window")
    otlp = hsub.add_parser("export-otlp", help="the health figures as OpenTelemetry metrics (OTLP/HTTP protobuf), "
                                                "each point at its window's event time")
    add_out(otlp, "output directory holding the health records")
    env_flag(otlp, "--endpoint", "GPUCOST_OTLP_ENDPOINT", str, None,
              "the receiver's OTLP/HTTP metrics URL, e.g. http://collector:4318/v1/metrics")
    otlp.add_argument("--json", type=Path, help="also write the request as OTLP JSON to this file")
    otlp.add_argument("--gpu", help="one GPU's windows only")

    fit = sub.add_parser("fit-weights", help="fit α, β, γ to the GPUs' power over recorded events (METRICS.md, "
                                             "Weights fit): prints them with R² and writes a settings snippet")
    fit.add_argument("input", type=Path, nargs="+", help="JSON Lines or Parquet event files, or directories of them")
    fit.add_argument("--write", type=Path, help="write the snippet to this TOML file (default: print it)")
    add_settings(fit, writes_out=False)

    what = sub.add_parser("whatif", help="bill the published cost records again under other prices, weights or idle "
                                         "policy: per team, base µ$, scenario µ$, difference (exact, from --out alone)")
    add_out(what, "output directory holding the cost records")
    what.add_argument("--prices", type=Path, nargs="+", default=[],
                      help="JSON Lines of price events in force instead of the records' own prices")
    what.add_argument("--idle-policy", choices=IDLE_POLICIES, default="separate",
                      help="separate: idle is its own party (as billed); share: each pane's idle µ$ go to its tenants "
                           "by weight")
    what.add_argument("--format", choices=["table", "csv", "json"], default="table")
    add_settings(what, writes_out=False)

    rep_html = sub.add_parser("report", help="the output as one self-contained HTML page of plots (cost by team, "
                                             "idle share, an idle heatmap, health, reclaims, MAE, dead letters)")
    add_out(rep_html, "output directory holding the records")
    rep_html.add_argument("--html", type=Path, required=True, help="the HTML file to write")
    rep_html.add_argument("--since", type=date_arg, help="first UTC date to show, YYYY-MM-DD (default: the first)")
    rep_html.add_argument("--until", type=date_arg, help="last UTC date to show, YYYY-MM-DD (default: the last)")

    export = sub.add_parser("export", help="the cost records in a standard other tools read")
    export_sub = export.add_subparsers(dest="export_format", required=True)
    focus = export_sub.add_parser("focus", help="a month of cost records as a FinOps FOCUS 1.2 Cost and Usage file "
                                                "(exact decimal costs)")
    focus.add_argument("file", type=Path, help="the file to write")
    add_out(focus, "output directory holding the cost records")
    focus.add_argument("--month", required=True, help="the billing period, YYYY-MM (UTC)")
    focus.add_argument("--format", choices=FORMATS, default="csv")
    focus.add_argument("--overwrite", action="store_true", help="replace FILE if it exists")
    env_flag(focus, "--provider", "GPUCOST_FOCUS_PROVIDER", str, "gpucost",
              "ProviderName, PublisherName and InvoiceIssuerName: who runs the fleet")
    env_flag(focus, "--billing-account", "GPUCOST_FOCUS_BILLING_ACCOUNT", str, "gpucost",
              "BillingAccountId and BillingAccountName")

    squash = sub.add_parser("compact", help="merge the small Parquet files of an output directory, atomically")
    add_out(squash, "output directory")
    squash.add_argument("--min-files", type=int, default=2,
                        help="merge a partition's files under 1 Mi rows once it has this many (default 2)")
    add_kernels_parser(sub)
    return parser


COMMANDS = {"run": cmd_run, "simulate": cmd_simulate, "replay": cmd_replay, "query": cmd_query,
            "views": cmd_views, "topics": cmd_topics, "produce": cmd_produce, "worker": cmd_worker,
            "sink": cmd_sink, "compact": cmd_compact, "prices": cmd_prices, "health": cmd_health,
            "discovery": cmd_discovery, "reclaim": cmd_reclaim, "fit-weights": cmd_fit_weights, "whatif": cmd_whatif,
            "export": cmd_export, "report": cmd_report, "kernels": cmd_kernels}


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except (UsageError, ConfigError, OutputBusyError, CompactError) as exc:
        print(f"gpucost: error: {exc}", file=sys.stderr)
        return 2
    except SinkWriteError as exc:
        print(f"gpucost: error: {exc}", file=sys.stderr)
        return 4
    except StateError as exc:
        print(f"gpucost: error: {exc}", file=sys.stderr)
        return 5
    except KafkaConnectionError as exc:
        print(f"gpucost: error: {exc}. Check the broker address (GPUCOST_KAFKA_BOOTSTRAP) and, for a secured "
              "listener, GPUCOST_KAFKA_SECURITY_PROTOCOL and its TLS/SASL settings; the line above says why the "
              "connection failed", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print("gpucost: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader left (`| head -1`): stop quietly, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the flush at exit fails no more
        return 141


if __name__ == "__main__":
    sys.exit(main())
