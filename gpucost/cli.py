"""``gpucost``: run the audit, simulate a fleet, replay recordings, query the output."""
from __future__ import annotations

import argparse
import asyncio
import csv
import datetime as dt
import decimal
import itertools
import json
import logging
import os
import shutil
import signal
import socket
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import duckdb
import pyarrow.parquet as pq
from aiokafka.errors import KafkaConnectionError
from prometheus_client.core import Metric
from pydantic import ValidationError

from gpucost.config import FLAG_FIELDS, KAFKA_ENV_PREFIX, ConfigError, environment, load_settings
from gpucost.embedded import Item, RunStats, run_embedded
from gpucost.kafka.settings import KafkaSettings
from gpucost.kafka.signing import Keyring, Signer
from gpucost.kafka.worker import StateError
from gpucost.metrics import Health, MetricsServer
from gpucost.producers.live import LIVE_SOURCES, LiveSettings, LiveSource, SourceUnavailable, open_live, open_nvml
from gpucost.producers.nvml import NvmlSampler, NvmlUnavailable
from gpucost.producers.replay import input_files, read_batches, read_inputs
from gpucost.producers.simulate import FleetSpec, simulate
from gpucost.report import format_table, summary
from gpucost.schemas.arrow import events_table
from gpucost.schemas.codec import Rejected, decode_line, encode_event, explain, raw_text
from gpucost.schemas.events import Event, Price
from gpucost.schemas.records import OUTPUT_KINDS
from gpucost.sinks.compact import CompactError
from gpucost.sinks.lock import OutputBusyError, OutputLock
from gpucost.sinks.parquet import SinkWriteError
from gpucost.sinks.views import query, read_only_problem, views_sql
from gpucost.streams.scope import PRICE_SCOPE, price_mac
from gpucost.streams.settings import AuditSettings

T = TypeVar("T")

__all__ = ["main"]

DEFAULT_OUT = "gpucost-out"
SIM_LINES_PER_FILE = 1_000_000


class UsageError(Exception):
    """A problem with what the user asked for; printed as one line, exit status 2."""


def _env(name: str, default: str) -> str:
    return os.environ.get(name, default)


def _env_flag(p: argparse.ArgumentParser, flag: str, env: str, kind: type, default: str | None, what: str) -> None:
    """A flag that falls back to an environment variable; the help says both, and the default."""
    shown = "unset" if default is None else default
    p.add_argument(flag, type=kind, default=os.environ.get(env, default),
                   help=f"{what} (env {env}; default {shown})".replace("%", "%%"))


def _add_out(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--out", type=Path, default=Path(_env("GPUCOST_OUT", DEFAULT_OUT)),
                   help=f"{what} (env GPUCOST_OUT; default ./{DEFAULT_OUT})")


def _add_settings(p: argparse.ArgumentParser, writes_out: bool = True) -> None:
    p.add_argument("--config", type=Path, default=os.environ.get("GPUCOST_CONFIG"),
                   help="TOML file of audit settings (env GPUCOST_CONFIG)")
    if writes_out:
        p.add_argument("--overwrite", action="store_true", help="replace output already in --out")
    g = p.add_argument_group("audit settings (each also env GPUCOST_<NAME>, e.g. GPUCOST_PANE_S)")
    for name in FLAG_FIELDS:
        info = AuditSettings.model_fields[name]
        g.add_argument(f"--{name.replace('_', '-')}", dest=name, metavar="V",
                       help=f"{info.description} (default {info.default})".replace("%", "%%"))


def _add_metrics(p: argparse.ArgumentParser) -> None:
    _env_flag(p, "--metrics-address", "GPUCOST_METRICS_ADDRESS", str, None,
              "serve Prometheus metrics at /metrics and a health check at /healthz on HOST:PORT (unset: off)")


@contextmanager
def _metrics(address: str | None, collect: Callable[[], Iterable[Metric]], health: Health) -> Iterator[None]:
    """The metrics server of a long-running command, for as long as it runs (nothing without an address)."""
    if address is None:
        yield
        return
    try:
        server = MetricsServer(address, collect, health)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(f"cannot serve metrics on {address}: {exc.strerror}; choose another --metrics-address"
                         ) from None
    print(f"gpucost: metrics at http://{address.rpartition(':')[0] or '0.0.0.0'}:{server.port}/metrics",
          file=sys.stderr)
    try:
        yield
    finally:
        server.close()


def _add_kafka(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("Kafka (each also env GPUCOST_KAFKA_<NAME>, e.g. GPUCOST_KAFKA_BOOTSTRAP)")
    for name, info in KafkaSettings.model_fields.items():
        g.add_argument(f"--{name.replace('_', '-')}", dest=f"kafka_{name}", metavar="V",
                       help=f"{info.description} (default {info.default})")


def _kafka(args: argparse.Namespace) -> KafkaSettings:
    flags = {n: getattr(args, f"kafka_{n}") for n in KafkaSettings.model_fields}
    try:
        return KafkaSettings(**{**environment(KafkaSettings, KAFKA_ENV_PREFIX),
                                **{k: v for k, v in flags.items() if v is not None}})
    except ValidationError as exc:
        raise ConfigError(f"invalid Kafka setting: {explain(exc)}") from None


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
    _env_flag(p, "--libcuda", "GPUCOST_LIBCUDA", Path, None,
              "with --source ebpf: the CUDA driver library whose kernel launches and allocations to probe "
              "(unset: libcuda.so.1 from the linker cache, if the node has one)")
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

    qry = sub.add_parser("query", help="run SQL over the views idle_index, mae, cost, dlq")
    qry.add_argument("sql")
    qry.add_argument("--format", choices=["table", "csv", "json", "lines"], default="table",
                     help="lines: one value per line, of a one-column query (e.g. dead letters' raw text to replay)")
    qry.add_argument("--unsafe", action="store_true",
                     help="run any statement with DuckDB's full file access (by default: SELECT or EXPLAIN only, "
                          "reading files under --out only)")
    _add_out(qry, "directory holding the output to query")

    prices = sub.add_parser("prices", help="price authority: sign price events so workers with a keyring take them")
    price_sub = prices.add_subparsers(dest="action", required=True)
    sign = price_sub.add_parser("sign", help="write each price of FILE(s) with the authority's key id and signature "
                                             "as JSON Lines on stdout (other lines: refused)")
    sign.add_argument("files", nargs="+", type=Path)
    sign.add_argument("--signing-key-file", type=Path, required=True,
                      help="the price authority's one key, '<key_id> <secret hex> @prices' (or '*')")

    views = sub.add_parser("views", help="print the CREATE VIEW statements for use in any DuckDB")
    _add_out(views, "directory holding the output")

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
    _add_kafka(sink)

    squash = sub.add_parser("compact", help="merge the small Parquet files of an output directory, atomically")
    _add_out(squash, "output directory")
    squash.add_argument("--min-files", type=int, default=2,
                        help="merge a partition's files under 1 Mi rows once it has this many (default 2)")
    return parser


@contextmanager
def _output(out: Path, overwrite: bool, holder: str) -> Iterator[None]:
    """``out`` emptied of earlier output (only with ``overwrite``), this process its only writer meanwhile:
    a sink writing there is never overwritten under its feet."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file, not a directory; choose a directory for the output")
    with OutputLock(out, holder):
        existing = [out / k for k in OUTPUT_KINDS if (out / k).exists()]
        if existing and not overwrite:
            raise UsageError(f"{out} already holds gpucost output ({', '.join(p.name for p in existing)}); "
                             "pass --overwrite to replace it, or choose another --out")
        for path in existing:
            shutil.rmtree(path)
        yield


def _settings(args: argparse.Namespace) -> AuditSettings:
    return load_settings(args.config, **{f: getattr(args, f) for f in FLAG_FIELDS})


def _fleet(args: argparse.Namespace) -> FleetSpec:
    try:
        return FleetSpec(gpus=args.gpus, hours=args.hours, seed=args.seed, interval_s=args.interval_s)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _me() -> str:
    """How the user invoked gpucost (e.g. .venv/bin/gpucost), for hints they can paste."""
    return sys.argv[0] if Path(sys.argv[0]).name == "gpucost" else "gpucost"


def _finish(out: Path, stats: RunStats) -> int:
    print(summary(out, stats))
    print(f"\noutput: {out}/{{idle_index,mae,cost,dlq}}/date=YYYY-MM-DD/*.parquet; "
          f"try: {_me()} query --out {out} \"SELECT team, sum(cost_micro_usd) FROM cost GROUP BY team\"")
    return 0


def _live(args: argparse.Namespace, source: str, nvml: NvmlSampler | None = None) -> LiveSource:
    """The live source of ``--source``, opened now (or one clear usage error); it says what it does."""
    settings = LiveSettings(node_id=args.node_id, period_s=args.period_s, duration_s=args.duration_s,
                            dcgm_url=args.url, dcgm_sla=args.dcgm_sla, ebpf_sample_every=args.ebpf_sample_every,
                            libcuda=args.libcuda)
    try:
        live = open_live(source, settings, nvml, say=lambda text: print(f"gpucost: {text}", file=sys.stderr))
    except SourceUnavailable as exc:
        raise UsageError(str(exc)) from None
    print(f"gpucost: {live.what}" + (f" for {args.duration_s:g} s" if args.duration_s is not None
                                     else "; Ctrl-C to stop and write the results"), file=sys.stderr)
    return live


class _Signals:
    """SIGINT and SIGTERM, handled here and nowhere else: the first ends a live source's input cleanly
    (what it sampled is still written or delivered); the next, or the first when nothing is live, stops
    now (``stop_now``)."""

    def __init__(self, live: LiveSource | None, stop_now: Callable[[], None]) -> None:
        self.live, self.stop_now, self.received = live, stop_now, 0

    def __call__(self, *_: object) -> None:
        self.received += 1
        if self.received == 1 and self.live is not None:
            self.live.stop()
        else:
            self.stop_now()

    @contextmanager
    def installed(self) -> Iterator[None]:
        """For a synchronous run (an event loop's: ``_stop_on_signals``)."""
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        for sig in previous:
            signal.signal(sig, self)
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _source_counts(live: LiveSource | None) -> None:
    """What the live source could not turn into events, so that a run never hides it behind a warning."""
    if live is not None and +live.counts:
        print("gpucost: the source counted " + ", ".join(f"{k} {v:,}" for k, v in sorted(live.counts.items()) if v),
              file=sys.stderr)


def _interrupt() -> None:
    raise KeyboardInterrupt


def cmd_run(args: argparse.Namespace) -> int:
    settings, spec = _settings(args), _fleet(args)
    source, nvml = args.source, None
    if source == "auto":
        try:
            nvml, source = open_nvml(args.node_id), "nvml"
        except NvmlUnavailable as exc:
            source = "simulate"
            print(f"gpucost: NVML is not available ({exc.reason}); running the simulated fleet: {spec.gpus} GPUs, "
                  f"{spec.hours:g} h, seed {spec.seed}", file=sys.stderr)
    live = _live(args, source, nvml) if source in LIVE_SOURCES else None
    items: Iterator[Item] = ((ev, "simulate") for ev in simulate(spec)) if live is None else itertools.chain(
        read_inputs(_files(args.prices)) if args.prices else [], ((ev, source) for ev in live.events()))
    stats = RunStats(source=live.counts if live is not None else Counter())
    with _Signals(live, _interrupt).installed(), _output(args.out, args.overwrite, "gpucost run"), \
            _progress("run", unit=" events") as bar, _metrics(args.metrics_address, stats.metrics, stats.health):
        run_embedded(items, settings, args.out, on_batch=lambda b: bar.update(len(b)), stats=stats)
    _source_counts(live)
    return _finish(args.out, stats)


def cmd_simulate(args: argparse.Namespace) -> int:
    spec = _fleet(args)
    args.out.mkdir(parents=True, exist_ok=True)
    earlier = sorted(args.out.glob("events-*.*"))
    if earlier and not args.overwrite:  # a second fleet beside the first would replay as one, mostly refused
        raise UsageError(f"{args.out} already holds simulated events ({earlier[0].name}…); pass --overwrite to "
                         "replace them, or choose another --out")
    for path in earlier:
        path.unlink()
    events, files, n = simulate(spec), 0, 0
    while chunk := list(itertools.islice(events, SIM_LINES_PER_FILE)):
        path = args.out / f"events-{files:05d}.{args.format}"
        if args.format == "parquet":
            pq.write_table(events_table(chunk), path, compression="zstd")
        else:
            path.write_text("".join(encode_event(ev) + "\n" for ev in chunk))
        files, n = files + 1, n + len(chunk)
    print(f"wrote {n:,} events to {files} file(s) in {args.out}")
    return 0


def _files(paths: list[Path]) -> list[Path]:
    """The event files to read, or a usage error naming what is missing."""
    try:
        files = input_files(paths)
    except FileNotFoundError as exc:
        raise UsageError(str(exc)) from None
    if not files:
        raise UsageError(f"no event files (*.jsonl, *.ndjson, *.json, their .gz, *.parquet) in "
                         f"{', '.join(map(str, paths))}")
    return files


def cmd_replay(args: argparse.Namespace) -> int:
    settings = _settings(args)
    files = _files(args.input)
    total = sum(f.stat().st_size for f in files)
    with _output(args.out, args.overwrite, "gpucost replay"), _progress("replay", total=total, unit="B") as bar:
        stats = run_embedded(read_batches(files), settings, args.out,
                             on_batch=lambda b: bar.update(sum(item.nbytes for item in b)))  # type: ignore[union-attr]
    return _finish(args.out, stats)


def _progress(desc: str, unit: str, total: int | None = None) -> Any:
    """A progress bar on stderr when it is a terminal (nothing otherwise): replay by bytes read, run by
    events taken."""
    from tqdm import tqdm

    return tqdm(total=total, unit=unit, unit_scale=True, disable=not sys.stderr.isatty(), desc=desc)


def _jsonable(value: object) -> object:
    if isinstance(value, (decimal.Decimal, dt.date, dt.datetime)):
        return str(value)
    return value


def cmd_query(args: argparse.Namespace) -> int:
    _written(args.out)
    if not args.unsafe and (problem := read_only_problem(args.sql)) is not None:
        raise UsageError(problem)
    try:
        columns, rows = query(args.out, args.sql, confined=not args.unsafe)
    except duckdb.Error as exc:
        raise UsageError(f"query failed: {exc}".replace("\n", " ")) from None
    if args.format == "lines" and len(columns) != 1:
        raise UsageError(f"--format lines needs a query of one column, this one has {len(columns)}: {columns}")
    if args.format == "lines":
        sys.stdout.writelines(f"{r[0]}\n" for r in rows)
    elif args.format == "csv":
        writer = csv.writer(sys.stdout)
        writer.writerow(columns)
        writer.writerows(rows)
    elif args.format == "json":
        print(json.dumps([{c: _jsonable(v) for c, v in zip(columns, r)} for r in rows], indent=1))
    else:
        print(format_table(columns, rows))
    return 0


def cmd_prices(args: argparse.Namespace) -> int:
    """Sign each price line with the authority's key (``gpucost.streams.scope.price_mac``); any other line is an error."""
    signer = _load_keys(Signer.from_file, args.signing_key_file)
    if signer.key.nodes is not None and PRICE_SCOPE not in signer.key.nodes:
        raise ConfigError(f"key {signer.key.key_id!r} may not sign prices: its node list needs {PRICE_SCOPE} (or *)")
    out = []
    for path in _files(args.files):
        for n, line in enumerate(path.read_bytes().splitlines(), 1):
            if not line.strip():
                continue
            event = decode_line(line)
            if not isinstance(event, Price):
                why = event.detail if isinstance(event, Rejected) else f"a {event.kind}, not a price"
                raise UsageError(f"{path}:{n}: {why}")
            unsigned = event.model_copy(update={"key_id": None, "signature": None})
            signed = unsigned.model_copy(update={"key_id": signer.key.key_id,
                                                 "signature": price_mac(signer.key.secret, unsigned)})
            out.append(encode_event(signed))
    sys.stdout.write("".join(f"{line}\n" for line in out))
    return 0


def _written(out: Path) -> None:
    """``out`` is an output directory to read, or a usage error saying how to make one."""
    if not out.is_dir():
        raise UsageError(f"output directory {out} does not exist; run `gpucost run` or `gpucost replay` first")


def cmd_views(args: argparse.Namespace) -> int:
    _written(args.out)
    print(views_sql(args.out), end="")
    return 0


def cmd_topics(args: argparse.Namespace) -> int:
    kafka = _kafka(args)
    if args.action == "schemas":
        from gpucost.schemas.json_schemas import write_json_schemas

        for path in write_json_schemas(args.schemas_out):
            print(path)
        return 0
    from gpucost.kafka.publish import create_topics

    if args.action == "create":
        created = asyncio.run(create_topics(kafka))
        print(f"created {len(created)} topic(s): {', '.join(created) or 'none missing'}")
        return 0
    from gpucost.schemas.topics import topic_specs

    rows = [(kafka.topic(t.suffix), t.key, "compact" if t.compacted else "delete",
             1 if t.single_partition else kafka.partitions, t.value) for t in topic_specs()]
    print(format_table(["topic", "key", "cleanup", "partitions", "value"], rows))
    return 0


def _replay_events(files: list[Path], rejected: list[tuple[Rejected, str, str]]) -> Iterator[Event]:
    for line, label in read_inputs(files):
        decoded = decode_line(line)
        if isinstance(decoded, Rejected):
            rejected.append((decoded, label, raw_text(line)))
        else:
            yield decoded


def cmd_produce(args: argparse.Namespace) -> int:
    from gpucost.kafka.publish import ProducerStats, Stopped, create_topics, publish, publish_dead_letters

    kafka = _kafka(args)
    rejected: list[tuple[Rejected, str, str]] = []
    events: Iterator[Event]
    live: LiveSource | None = None
    if args.source == "simulate":
        events = simulate(_fleet(args))
    elif args.source == "replay":
        if not args.input:
            raise UsageError("--source replay needs at least one INPUT file or directory")
        events = _replay_events(_files(args.input), rejected)
    else:
        reference = _replay_events(_files(args.prices), rejected) if args.prices else iter(())
        live = _live(args, args.source)
        events = itertools.chain(reference, live.events())
    signer = _load_keys(Signer.from_file, args.signing_key_file) if args.signing_key_file else None
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(create_topics(kafka))
    except KafkaConnectionError as exc:  # a node's producer must not stop sampling because the broker is away
        logging.getLogger("gpucost.kafka.publish").warning("cannot reach Kafka to create the topics (%s); publishing "
                                                     "anyway, buffered until the broker is back", exc)

    async def main() -> Counter[str]:
        """Stopped now (the second signal, or the first without a live source), what the broker has not
        acknowledged is kept in the spool."""
        stop = _stop_on_signals(live)
        stats = ProducerStats(source=live.counts if live is not None else Counter())
        with _metrics(args.metrics_address, stats.metrics, stats.health):
            return await publish(events, kafka, end_of_input=args.end_of_input, flush_interval_s=args.flush_interval_s,
                                 signer=signer, spool=args.spool, buffer_bytes=int(args.buffer_mb * (1 << 20)),
                                 stop=stop, stats=stats)

    try:
        sent = asyncio.run(main())
    except Stopped:
        _source_counts(live)
        print("gpucost: producer stopped; anything not yet acknowledged is in the spool and goes first next time",
              file=sys.stderr)
        return 130
    _source_counts(live)
    if rejected:
        asyncio.run(publish_dead_letters(rejected, kafka))
    print(f"published to {kafka.bootstrap}: " + ", ".join(f"{t}: {n:,} messages" for t, n in sorted(sent.items()))
          + (f"; {len(rejected):,} bad line(s) sent to {kafka.topic('dlq')}" if rejected else ""))
    return 0


def _load_keys(load: Callable[[Path], T], path: Path) -> T:
    try:
        return load(path)
    except OSError as exc:
        raise ConfigError(f"cannot read the key file {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _stop_on_signals(live: LiveSource | None = None) -> asyncio.Event:
    """An event set by SIGINT or SIGTERM (by the second, when the first ends ``live``'s input): the async
    commands (producer, worker, sink) stop cleanly on it."""
    stop = asyncio.Event()
    signals = _Signals(live, stop.set)
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, signals)
    return stop


def cmd_worker(args: argparse.Namespace) -> int:
    from gpucost.kafka.publish import create_topics
    from gpucost.kafka.worker import Worker

    kafka, settings = _kafka(args), _settings(args)
    if args.max_batch < 1:
        raise UsageError(f"--max-batch must be at least 1 message, got {args.max_batch}")
    keyring = _load_keys(Keyring, args.verify_keys) if args.verify_keys else None
    signer = _load_keys(Signer.from_file, args.output_signing_key_file) if args.output_signing_key_file else None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("aiokafka").setLevel(logging.WARNING)

    async def main() -> None:
        await create_topics(kafka)
        stop = _stop_on_signals()
        worker = Worker(kafka, settings, args.group, args.session_timeout_s, max_batch=args.max_batch, keyring=keyring,
                        output_signer=signer)
        with _metrics(args.metrics_address, worker.metrics, worker.health):
            await worker.run(stop)
        print(f"worker stopped after {worker.processed:,} input messages", file=sys.stderr)

    asyncio.run(main())
    return 0


def cmd_sink(args: argparse.Namespace) -> int:
    from gpucost.kafka.sink import SinkStats, run_kafka_sink

    kafka = _kafka(args)
    if args.compact_min_files == 1 or args.compact_min_files < 0:
        raise UsageError(f"--compact-min-files must be 0 (never) or at least 2, got {args.compact_min_files}")
    keyring = _load_keys(Keyring, args.verify_keys) if args.verify_keys else None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("aiokafka").setLevel(logging.WARNING)

    async def main() -> None:
        stop = _stop_on_signals()
        stats = SinkStats()
        with _metrics(args.metrics_address, stats.metrics, stats.health):
            await run_kafka_sink(kafka.client_options(), {k: kafka.topic(k) for k in OUTPUT_KINDS}, args.out,
                                 args.group, stop, args.flush_interval_s, args.retry_s, args.compact_min_files,
                                 keyring, stats)
        print(f"sink stopped: consumed {stats.consumed:,}, written {dict(stats.written)}, "
              f"duplicates dropped {dict(stats.duplicates)}, unverified {stats.unverified:,}, "
              f"small files merged {stats.compacted_files:,}",
              file=sys.stderr)

    asyncio.run(main())
    return 0


def cmd_compact(args: argparse.Namespace) -> int:
    from gpucost.kafka.sink import JOURNAL
    from gpucost.sinks.compact import compact
    from gpucost.sinks.parquet import Journal

    if args.min_files < 2:
        raise UsageError(f"--min-files must be at least 2, got {args.min_files}")
    if not any((args.out / k).is_dir() for k in OUTPUT_KINDS):
        raise UsageError(f"{args.out} holds no gpucost output; give the sink's or a run's --out")
    with OutputLock(args.out, "gpucost compact"):
        pending, _ = Journal(args.out / JOURNAL, dict).pending()  # a sink that died before committing needs these
        stats = compact(args.out, args.min_files, exclude=pending)
    print(f"compacted {stats.partitions:,} partition(s): {stats.files_merged:,} files → {stats.files_written:,} "
          f"({stats.rows:,} rows)")
    for folder, why in stats.skipped.items():
        print(f"left as it is: {folder}: {why}", file=sys.stderr)
    return 0


COMMANDS = {"run": cmd_run, "simulate": cmd_simulate, "replay": cmd_replay, "query": cmd_query,
            "views": cmd_views, "topics": cmd_topics, "produce": cmd_produce, "worker": cmd_worker,
            "sink": cmd_sink, "compact": cmd_compact, "prices": cmd_prices}


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
