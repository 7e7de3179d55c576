"""``gpucost``: run the audit, simulate a fleet, replay recordings, query the output."""
from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import os
import socket
import sys
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation
from pathlib import Path

from aiokafka.errors import KafkaConnectionError

from gpucost.commands import (IDLE_POLICIES, cmd_compact, cmd_discovery, cmd_export, cmd_fit_weights, cmd_health,
                              cmd_prices, cmd_query, cmd_reclaim, cmd_replay, cmd_report, cmd_run, cmd_simulate,
                              cmd_views, cmd_whatif)
from gpucost.config import FLAG_FIELDS, ConfigError
from gpucost.focus import FORMATS
from gpucost.kafka.commands import cmd_produce, cmd_sink, cmd_topics, cmd_worker
from gpucost.kafka.settings import KafkaSettings
from gpucost.kafka.state import StateError
from gpucost.producers.attribution import ATTRIBUTION_SOURCES
from gpucost.producers.kubernetes import LABELS, KubernetesSettings
from gpucost.producers.simulate import FleetSpec
from gpucost.schemas.events import SLAS
from gpucost.sinks.compact import CompactError
from gpucost.sinks.lock import OutputBusyError
from gpucost.sinks.parquet import SinkWriteError
from gpucost.streams.discovery import TARGET_PORT
from gpucost.streams.settings import AuditSettings
from gpucost.webhook import WebhookSettings
from gpucost.wiring import UsageError

__all__ = ["main"]

DEFAULT_OUT = "gpucost-out"


def _env(name: str, default: str) -> str:
    return os.environ.get(name, default)


def _env_flag(p: argparse.ArgumentParser, flag: str, env: str, kind: type, default: str | None, what: str) -> None:
    """A flag that falls back to an environment variable; the help says both, and the default."""
    shown = "unset" if default is None else default
    p.add_argument(flag, type=kind, default=os.environ.get(env, default),
                   help=f"{what} (env {env}; default {shown})".replace("%", "%%"))


def _library(value: str) -> Path | str | None:
    """A library's path, ``auto`` (where the linker cache has it) or ``none`` (not probed)."""
    return None if value == "none" else value if value == "auto" else Path(value)


def _add_out(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--out", type=Path, default=Path(_env("GPUCOST_OUT", DEFAULT_OUT)),
                   help=f"{what} (env GPUCOST_OUT; default ./{DEFAULT_OUT})")


def _add_settings(p: argparse.ArgumentParser, writes_out: bool = True) -> None:
    p.add_argument("--config", type=Path, default=os.environ.get("GPUCOST_CONFIG"),
                   help="TOML file of audit settings (env GPUCOST_CONFIG)")
    if writes_out:
        p.add_argument("--overwrite", action="store_true", help="replace output already in --out")
    _env_flag(p, "--audit-key-file", "GPUCOST_AUDIT_KEY_FILE", Path, None,
              "sign every health record's snapshot hash with the one key in this file, '<key_id> <secret hex>' "
              "(unset: health records unsigned)")
    g = p.add_argument_group("audit settings (each also env GPUCOST_<NAME>, e.g. GPUCOST_PANE_S)")
    for name in FLAG_FIELDS:
        info = AuditSettings.model_fields[name]
        g.add_argument(f"--{name.replace('_', '-')}", dest=name, metavar="V",
                       help=f"{info.description} (default {info.default})".replace("%", "%%"))


def _add_opex(p: argparse.ArgumentParser) -> None:
    """The audit setting ``opex_usd_per_gpu_hour`` (the same environment variable), for the commands that only read."""
    info = AuditSettings.model_fields["opex_usd_per_gpu_hour"]
    _env_flag(p, "--opex-usd-per-gpu-hour", "GPUCOST_OPEX_USD_PER_GPU_HOUR", _decimal, str(info.default),
              f"{info.description}, in view unit_cost")


def _decimal(text: str) -> Decimal:
    """A non-negative decimal flag, exactly as written."""
    try:
        value = Decimal(text)
    except InvalidOperation:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value.is_finite() or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number ≥ 0, got {text!r}")
    return value


def _date(text: str) -> dt.date:
    try:
        return dt.date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a date YYYY-MM-DD: {text!r}") from None


def _add_metrics(p: argparse.ArgumentParser) -> None:
    _env_flag(p, "--metrics-address", "GPUCOST_METRICS_ADDRESS", str, None,
              "serve Prometheus metrics at /metrics and a health check at /healthz on HOST:PORT (unset: off)")


def _series_cap(text: str) -> int:
    """A cap on a metric family's label sets: its one ``_other`` series needs room, so at least 1."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number ≥ 1, got {text!r}")
    return int(text)


def _add_cost_series(p: argparse.ArgumentParser) -> None:
    _env_flag(p, "--cost-series", "GPUCOST_COST_SERIES", _series_cap, "2000",
              "with --metrics-address: the most label sets each cost metric family keeps (cost, credit, idle cost, "
              "reclaim triggers, GPUs), its _other series included; the rest is counted in that series")


def _add_kafka(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("Kafka (each also env GPUCOST_KAFKA_<NAME>, e.g. GPUCOST_KAFKA_BOOTSTRAP)")
    for name, info in KafkaSettings.model_fields.items():
        g.add_argument(f"--{name.replace('_', '-')}", dest=f"kafka_{name}", metavar="V",
                       help=f"{info.description} (default {info.default})")


def _attribution(text: str) -> tuple[str, ...]:
    """``--attribution``'s sources, in their precedence (a pod's binding before an environment's), or ()."""
    names = {n.strip() for n in text.split(",") if n.strip()}
    if names == {"none"}:
        return ()
    if not names or not names <= set(ATTRIBUTION_SOURCES):
        raise argparse.ArgumentTypeError(f"{text!r}: name 'none', or one or more of "
                                         f"{', '.join(ATTRIBUTION_SOURCES)}, separated by commas")
    return tuple(n for n in ATTRIBUTION_SOURCES if n in names)


def _kube_label(text: str) -> tuple[str, tuple[str, ...]]:
    name, sep, keys = text.partition("=")
    found = tuple(k for k in keys.split(",") if k)
    if not sep or name not in LABELS or not found:
        raise argparse.ArgumentTypeError(f"{text!r}: write FIELD=KEY[,KEY…] with FIELD one of {', '.join(LABELS)}")
    return name, found


def _add_live(p: argparse.ArgumentParser) -> None:
    """Flags of the live sources (nvml, dcgm, ebpf), shared by run and produce."""
    p.add_argument("--url", default=os.environ.get("GPUCOST_DCGM_URL"),
                   help="with --source dcgm: the exporter's /metrics URL (env GPUCOST_DCGM_URL)")
    p.add_argument("--dcgm-sla", choices=["Gold", "Silver", "Bronze"], default=_env("GPUCOST_DCGM_SLA", "Bronze"),
                   help="with --source dcgm: SLA of the tenants made from pod labels (env GPUCOST_DCGM_SLA)")
    p.add_argument("--node-id", default=_env("GPUCOST_NODE_ID", socket.gethostname()),
                   help="this node's id in NVML events (env GPUCOST_NODE_ID; default the host name)")
    p.add_argument("--period-s", type=float, default=_env("GPUCOST_PERIOD_S", "1.0"),
                   help="sampling period of a live source (env GPUCOST_PERIOD_S; default 1.0)")
    p.add_argument("--ebpf-sample-every", type=int, default=_env("GPUCOST_EBPF_SAMPLE_EVERY", "16"),
                   help="with --source ebpf: report 1 page fault in N (env GPUCOST_EBPF_SAMPLE_EVERY; default 16)")
    _env_flag(p, "--libcuda", "GPUCOST_LIBCUDA", _library, "none",
              "with --source ebpf: probe the kernel launches and allocations of this CUDA driver library, or of "
              "libcuda.so.1 from the linker cache with 'auto' ('none': not probed, as a uprobe on every launch can "
              "double a launch-bound program's time, and launches enter no figure)")
    _env_flag(p, "--libcublas", "GPUCOST_LIBCUBLAS", _library, "auto",
              "with --source ebpf: the cuBLAS library whose GEMM calls to probe for their FLOPs ('auto': the "
              "newest libcublas.so.N from the linker cache, if the node has one; 'none': not probed)")
    p.add_argument("--attribution", type=_attribution, default=_env("GPUCOST_ATTRIBUTION", "environ"),
                   help="with a live source: where each GPU process's tenant is found, ahead of its first sample: "
                        "'environ' (GPUCOST_TEAM…, GIT_COMMIT, CI_PIPELINE_ID, Slurm's job variables), 'kubernetes' "
                        "(its pod's labels), both as 'kubernetes,environ' (a pod's binding first), or 'none' (only "
                        "bindings given) (env GPUCOST_ATTRIBUTION; default environ)")
    g = p.add_argument_group("Kubernetes attribution (with --attribution kubernetes: docs/operations.md)")
    _env_flag(g, "--kube-pods-url", "GPUCOST_KUBE_PODS_URL", str, None,
              "a URL answering a PodList of this node's pods, with the service account's token (unset: the API "
              "server the pod runs under, pods of --kube-node)")
    _env_flag(g, "--kube-node", "NODE_NAME", str, None, "this node's name in Kubernetes (the Downward API's "
              "spec.nodeName)")
    _env_flag(g, "--kube-token-file", "GPUCOST_KUBE_TOKEN_FILE", Path, str(KubernetesSettings.token_file),
              "a bearer token for the pods' URL (a pod's service account's, by default), sent where the file exists")
    _env_flag(g, "--kube-ca-file", "GPUCOST_KUBE_CA_FILE", Path, str(KubernetesSettings.ca_file),
              "the CA that signed the pods' URL's certificate (the cluster's, by default), where the file exists")
    _env_flag(g, "--kube-pod-resources", "GPUCOST_KUBE_POD_RESOURCES", Path,
              str(KubernetesSettings.pod_resources), "the kubelet's pod-resources socket, which tells the pod a GPU "
              "was given to")
    g.add_argument("--kube-label", type=_kube_label, action="append", metavar="FIELD=KEY[,KEY…]",
                   default=[_kube_label(v) for v in os.environ.get("GPUCOST_KUBE_LABELS", "").split()],
                   help="the pod label or annotation keys that give a binding field, first set wins; again for each "
                        "field (env GPUCOST_KUBE_LABELS, space-separated; default: "
                        + "; ".join(f"{k}={','.join(v)}" for k, v in LABELS.items()) + ")")
    p.add_argument("--attribution-sla", choices=SLAS, default=_env("GPUCOST_ATTRIBUTION_SLA", "Bronze"),
                   help="the SLA of a process whose environment names none (env GPUCOST_ATTRIBUTION_SLA; "
                        "default Bronze)")
    p.add_argument("--prices", type=Path, nargs="+", default=[],
                   help="JSON Lines of price (and tenant_binding) events, read before a live source")
    p.add_argument("--duration-s", type=float, default=None,
                   help="stop a live source after this long (default: at Ctrl-C); results are written either way")


def _add_fleet(p: argparse.ArgumentParser) -> None:
    # string defaults go through ``type`` too, so a bad environment value is a usage error
    d = FleetSpec()
    for flag, kind, env, default, what in [
        ("--gpus", int, "GPUCOST_SIM_GPUS", d.gpus, "GPUs in the fleet"),
        ("--hours", float, "GPUCOST_SIM_HOURS", d.hours, "hours of fleet time"),
        ("--seed", int, "GPUCOST_SIM_SEED", d.seed, "random seed"),
        ("--interval-s", float, "GPUCOST_SIM_INTERVAL_S", d.interval_s, "sampling period, seconds"),
        ("--late-binding-fraction", float, "GPUCOST_SIM_LATE_BINDING_FRACTION", d.late_binding_fraction,
         "share of jobs whose binding arrives after their first samples (revisions)"),
    ]:
        p.add_argument(flag, type=kind, default=_env(env, str(default)), help=f"{what} (env {env}; default {default})")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpucost", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="audit a fleet embedded (no broker): NVML if present, else simulated")
    run.add_argument("--source", choices=["auto", "simulate", "nvml", "dcgm", "ebpf"], default=_env("GPUCOST_SOURCE", "auto"),
                     help="where events come from: auto = nvml where NVML works, else simulate (env GPUCOST_SOURCE)")
    _add_live(run)
    _add_fleet(run)
    _add_out(run, "output directory")
    _add_settings(run)
    _add_metrics(run)
    _add_cost_series(run)

    sim = sub.add_parser("simulate", help="write a simulated fleet's events as JSON Lines or Parquet")
    _add_fleet(sim)
    sim.add_argument("--out", type=Path, required=True, help="directory for events-NNNNN.jsonl (or .parquet)")
    sim.add_argument("--overwrite", action="store_true", help="replace the event files already in --out")
    sim.add_argument("--format", choices=["jsonl", "parquet"], default="jsonl",
                     help="JSON Lines (the wire form), or Parquet with one column per wire field")

    rep = sub.add_parser("replay", help="run recorded events (JSON Lines or Parquet) through the pipeline")
    rep.add_argument("input", type=Path, nargs="+", help="JSON Lines or Parquet files, or directories of them")
    _add_out(rep, "output directory")
    _add_settings(rep)

    qry = sub.add_parser("query", help="run SQL over the views idle_index, mae, cost, health, quota, reclaim, "
                                       "efficiency, dlq and unit_cost")
    qry.add_argument("sql")
    qry.add_argument("--format", choices=["table", "csv", "json", "lines"], default="table",
                     help="lines: one value per line, of a one-column query (e.g. dead letters' raw text to replay)")
    qry.add_argument("--unsafe", action="store_true",
                     help="run any statement with DuckDB's full file access (by default: SELECT or EXPLAIN only, "
                          "reading files under --out only)")
    _add_out(qry, "directory holding the output to query")
    _add_opex(qry)

    prices = sub.add_parser("prices", help="price authority: sign price events so workers with a keyring take them")
    price_sub = prices.add_subparsers(dest="action", required=True)
    sign = price_sub.add_parser("sign", help="write each price of FILE(s) with the authority's key id and signature "
                                             "as JSON Lines on stdout (other lines: refused)")
    sign.add_argument("files", nargs="+", type=Path)
    sign.add_argument("--signing-key-file", type=Path, required=True,
                      help="the price authority's one key, '<key_id> <secret hex> @prices' (or '*')")

    views = sub.add_parser("views", help="print the CREATE VIEW statements for use in any DuckDB")
    _add_out(views, "directory holding the output")
    _add_opex(views)

    topics = sub.add_parser("topics", help="the Kafka topic contract: create the topics, or write JSON Schemas")
    topics.add_argument("action", choices=["create", "list", "schemas"])
    topics.add_argument("--schemas-out", type=Path, default=Path("json-schemas"),
                        help="directory for `schemas` (default ./json-schemas)")
    _add_kafka(topics)

    prod = sub.add_parser("produce", help="publish events to Kafka (idempotent, batched per key)")
    prod.add_argument("--source", choices=["simulate", "replay", "nvml", "dcgm", "ebpf"], required=True)
    prod.add_argument("--flush-interval-s", type=float, default=1.0,
                      help="send a key's batch after this long even if not full (default 1.0)")
    prod.add_argument("input", type=Path, nargs="*", help="with --source replay: JSON Lines files or directories")
    prod.add_argument("--no-end-of-input", dest="end_of_input", action="store_false",
                      help="do not mark the end of the input (the panes of a finite input then stay open)")
    _env_flag(prod, "--spool", "GPUCOST_SPOOL", Path, None,
              "file where messages wait, past --buffer-mb, while the broker is unreachable; a later run sends "
              "what it holds first (unset: ~/.local/state/gpucost/<topic prefix>produce.spool)")
    _env_flag(prod, "--buffer-mb", "GPUCOST_BUFFER_MB", float, "64",
              "memory for messages not yet acknowledged, before spilling to the spool")
    _env_flag(prod, "--signing-key-file", "GPUCOST_SIGNING_KEY_FILE", Path, None,
              "sign every message with the one key in this file, '<key_id> <secret hex> [nodes]' (unset: unsigned)")
    _add_fleet(prod)
    _add_live(prod)
    _add_metrics(prod)
    _add_kafka(prod)

    work = sub.add_parser("worker", help="run a worker: input topics → operators → output topics, exactly once")
    _env_flag(work, "--group", "GPUCOST_GROUP", str, "gpucost",
              "consumer group shared by all workers; also names their transactions")
    _env_flag(work, "--session-timeout-s", "GPUCOST_SESSION_TIMEOUT_S", float, "30",
              "seconds before a silent worker's partitions move to another")
    _env_flag(work, "--max-batch", "GPUCOST_MAX_BATCH", int, "200",
              "input messages per poll at most, each partition's share applied in one transaction: fewer "
              "commit sooner, more cost less per event")
    _env_flag(work, "--verify-keys", "GPUCOST_VERIFY_KEYS", Path, None,
              "apply only messages signed by a key in this keyring file (re-read when it changes); others are "
              "dead-lettered (unset: no verification)")
    _env_flag(work, "--output-signing-key-file", "GPUCOST_OUTPUT_SIGNING_KEY_FILE", Path, None,
              "sign every published record with the one key in this file, for sinks and billing consumers to "
              "verify (unset: unsigned)")
    _add_settings(work, writes_out=False)
    _add_metrics(work)
    _add_kafka(work)

    sink = sub.add_parser("sink", help="consume the output topics into Parquet (each record once)")
    _add_out(sink, "output directory (appended to)")
    sink.add_argument("--group", default=_env("GPUCOST_SINK_GROUP", "gpucost-sink"),
                      help="consumer group (env GPUCOST_SINK_GROUP; default gpucost-sink)")
    sink.add_argument("--flush-interval-s", type=float, default=2.0, help="seconds between file flushes (default 2)")
    _env_flag(sink, "--retry-s", "GPUCOST_SINK_RETRY_S", float, "5",
              "while the output cannot be written, retry this often")
    _env_flag(sink, "--compact-min-files", "GPUCOST_SINK_COMPACT_MIN_FILES", int, "64",
              "merge a partition's small files once it has gained this many (0: never)")
    _env_flag(sink, "--verify-keys", "GPUCOST_SINK_VERIFY_KEYS", Path, None,
              "write only records signed by a key in this keyring file (the workers' output keys); others are "
              "dead-lettered (unset: no verification)")
    _add_metrics(sink)
    _add_cost_series(sink)
    _add_kafka(sink)

    disc = sub.add_parser("discovery", help="the nodes in service as a Prometheus file_sd file, from the health "
                                            "records (removed or probation GPUs take their node out)")
    _env_flag(disc, "--file-sd", "GPUCOST_FILE_SD", Path, None, "the file_sd JSON file to keep (replaced atomically)")
    disc.add_argument("--out", type=Path, default=_env("GPUCOST_DISCOVERY_OUT", None),
                      help="read the health view of this output directory once (env GPUCOST_DISCOVERY_OUT; unset: "
                           "follow the Kafka health topic, and publish each node's entry to the discovery topic)")
    _env_flag(disc, "--target-port", "GPUCOST_DISCOVERY_PORT", int, str(TARGET_PORT),
              "each target is node:PORT, the exporter Prometheus should scrape (9400: the DCGM exporter's port); "
              "a node whose name is not a host name or a routable IP address is left out")
    disc.add_argument("--label", action="append", default=[], metavar="NAME=VALUE",
                      help="a label for every target group (repeatable)")
    _env_flag(disc, "--verify-keys", "GPUCOST_DISCOVERY_VERIFY_KEYS", Path, None,
              "apply only health messages signed by a key in this keyring file (the workers' output keys; the "
              "Kafka topic only)")
    _env_flag(disc, "--audit-keys", "GPUCOST_DISCOVERY_AUDIT_KEYS", Path, None,
              "count only health records whose hash holds and whose signature is by a key in this file (the audit "
              "keys, as for health verify --key-file); others are refused and counted")
    _add_kafka(disc)

    recl = sub.add_parser("reclaim", help="act on reclaim triggers once each: POST them to a webhook and/or write "
                                          "them to a file (from the Kafka reclaim topic, or once from --out)")
    recl.add_argument("--out", type=Path, default=_env("GPUCOST_RECLAIM_OUT", None),
                      help="act on the reclaim view of this output directory once (env GPUCOST_RECLAIM_OUT; unset: "
                           "follow the Kafka reclaim topic)")
    _env_flag(recl, "--webhook", "GPUCOST_RECLAIM_WEBHOOK", str, None,
              "POST each action as JSON here (http or https), with Idempotency-Key: <trigger_id>; retried until a "
              "2xx, up to --max-attempts")
    _env_flag(recl, "--actions-file", "GPUCOST_RECLAIM_ACTIONS_FILE", Path, None,
              "append each action, with its outcome, to this JSON Lines file")
    _env_flag(recl, "--ledger", "GPUCOST_RECLAIM_LEDGER", Path, "reclaim-ledger.txt",
              "the trigger ids already acted on (never acted on again)")
    recl.add_argument("--dry-run", action="store_true", help="print what would be done; act on nothing, commit nothing")
    _env_flag(recl, "--group", "GPUCOST_RECLAIM_GROUP", str, "gpucost-reclaim", "the Kafka consumer group")
    _env_flag(recl, "--verify-keys", "GPUCOST_RECLAIM_VERIFY_KEYS", Path, None,
              "act only on triggers signed by a key in this keyring file (the workers' output keys)")
    bounds = recl.add_argument_group("each webhook attempt's bounds and the retries (a redirect is a failed attempt, "
                                     "never followed)")
    for f in dataclasses.fields(WebhookSettings):
        _env_flag(bounds, f"--{f.name.replace('_', '-')}", f"GPUCOST_RECLAIM_{f.name.upper()}", type(f.default),
                  str(f.default), f.metadata["help"])
    _add_kafka(recl)

    health = sub.add_parser("health", help="health snapshots for admission: write a GPU's latest, or verify one")
    hsub = health.add_subparsers(dest="health_command", required=True)
    snap = hsub.add_parser("snapshot", help="write a GPU's latest health record, with its device, as a JSON file")
    snap.add_argument("--gpu", required=True, help="the GPU's UUID")
    _add_out(snap, "output directory holding the health records")
    snap.add_argument("--file", type=Path, default=Path("health-snapshot.json"),
                      help="the snapshot file to write (default ./health-snapshot.json)")
    ver = hsub.add_parser("verify", help="check a snapshot's hash, device and (with --key-file) signature; exit 1 if "
                                         "it fails, saying why")
    ver.add_argument("file", type=Path, help="a snapshot, or an OTLP JSON export (then: does it cover --admission-h?)")
    _env_flag(ver, "--key-file", "GPUCOST_AUDIT_KEY_FILE", Path, None,
              "the audit key(s) the signature must be one of, '<key_id> <secret hex>' per line (unset: hash only)")
    _env_flag(ver, "--admission-h", "GPUCOST_ADMISSION_H", int, "48",
              "hours an OTLP export must cover without a gap, up to each GPU's latest window")
    otlp = hsub.add_parser("export-otlp", help="the health figures as OpenTelemetry metrics (OTLP/HTTP protobuf), "
                                                "each point at its window's event time")
    _add_out(otlp, "output directory holding the health records")
    _env_flag(otlp, "--endpoint", "GPUCOST_OTLP_ENDPOINT", str, None,
              "the receiver's OTLP/HTTP metrics URL, e.g. http://collector:4318/v1/metrics")
    otlp.add_argument("--json", type=Path, help="also write the request as OTLP JSON to this file")
    otlp.add_argument("--gpu", help="one GPU's windows only")

    fit = sub.add_parser("fit-weights", help="fit α, β, γ to the GPUs' power over recorded events (METRICS.md, "
                                             "Weights fit): prints them with R² and writes a settings snippet")
    fit.add_argument("input", type=Path, nargs="+", help="JSON Lines or Parquet event files, or directories of them")
    fit.add_argument("--write", type=Path, help="write the snippet to this TOML file (default: print it)")
    _add_settings(fit, writes_out=False)

    what = sub.add_parser("whatif", help="bill the published cost records again under other prices, weights or idle "
                                         "policy: per team, base µ$, scenario µ$, difference (exact, from --out alone)")
    _add_out(what, "output directory holding the cost records")
    what.add_argument("--prices", type=Path, nargs="+", default=[],
                      help="JSON Lines of price events in force instead of the records' own prices")
    what.add_argument("--idle-policy", choices=IDLE_POLICIES, default="separate",
                      help="separate: idle is its own party (as billed); share: each pane's idle µ$ go to its tenants "
                           "by weight")
    what.add_argument("--format", choices=["table", "csv", "json"], default="table")
    _add_settings(what, writes_out=False)

    rep_html = sub.add_parser("report", help="the output as one self-contained HTML page of plots (cost by team, "
                                             "idle share, an idle heatmap, health, reclaims, MAE, dead letters)")
    _add_out(rep_html, "output directory holding the records")
    rep_html.add_argument("--html", type=Path, required=True, help="the HTML file to write")
    rep_html.add_argument("--since", type=_date, help="first UTC date to show, YYYY-MM-DD (default: the first)")
    rep_html.add_argument("--until", type=_date, help="last UTC date to show, YYYY-MM-DD (default: the last)")

    export = sub.add_parser("export", help="the cost records in a standard other tools read")
    export_sub = export.add_subparsers(dest="export_format", required=True)
    focus = export_sub.add_parser("focus", help="a month of cost records as a FinOps FOCUS 1.2 Cost and Usage file "
                                                "(exact decimal costs)")
    focus.add_argument("file", type=Path, help="the file to write")
    _add_out(focus, "output directory holding the cost records")
    focus.add_argument("--month", required=True, help="the billing period, YYYY-MM (UTC)")
    focus.add_argument("--format", choices=FORMATS, default="csv")
    focus.add_argument("--overwrite", action="store_true", help="replace FILE if it exists")
    _env_flag(focus, "--provider", "GPUCOST_FOCUS_PROVIDER", str, "gpucost",
              "ProviderName, PublisherName and InvoiceIssuerName: who runs the fleet")
    _env_flag(focus, "--billing-account", "GPUCOST_FOCUS_BILLING_ACCOUNT", str, "gpucost",
              "BillingAccountId and BillingAccountName")

    squash = sub.add_parser("compact", help="merge the small Parquet files of an output directory, atomically")
    _add_out(squash, "output directory")
    squash.add_argument("--min-files", type=int, default=2,
                        help="merge a partition's files under 1 Mi rows once it has this many (default 2)")
    return parser


COMMANDS = {"run": cmd_run, "simulate": cmd_simulate, "replay": cmd_replay, "query": cmd_query,
            "views": cmd_views, "topics": cmd_topics, "produce": cmd_produce, "worker": cmd_worker,
            "sink": cmd_sink, "compact": cmd_compact, "prices": cmd_prices, "health": cmd_health,
            "discovery": cmd_discovery, "reclaim": cmd_reclaim, "fit-weights": cmd_fit_weights, "whatif": cmd_whatif,
            "export": cmd_export, "report": cmd_report}


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
