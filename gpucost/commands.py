"""The commands that need no broker: run, simulate, replay, query, views, prices, compact, fit-weights, whatif,
export."""

from __future__ import annotations

import argparse
import datetime as dt
import decimal
import itertools
import json
import sys
from pathlib import Path

import duckdb
import pyarrow.parquet as pq

from gpucost.command import Command
from gpucost.config import ConfigError
from gpucost.csv_cells import write_rows
from gpucost.embedded import RunStats, run_embedded
from gpucost.flags import add_fleet, add_log_format, add_opex, add_out, add_report, add_settings
from gpucost.kafka.signing import Signer
from gpucost.output_files import made_folder, write_whole
from gpucost.producers.replay import read_batches
from gpucost.producers.simulate import simulate
from gpucost.progress import Progress
from gpucost.report import format_table, summary
from gpucost.schemas.arrow import events_table
from gpucost.schemas.codec import Rejected, decode_line, encode_event
from gpucost.schemas.events import Price
from gpucost.schemas.records import OUTPUT_KINDS
from gpucost.sinks.landlock import WritesNotRefused
from gpucost.sinks.lock import OutputLock
from gpucost.sinks.statements import read_only_problem
from gpucost.sinks.views import VIEW_NAMES, query, views_sql
from gpucost.streams.scope import PRICE_SCOPE, price_mac
from gpucost.times import raw_times_env, readable_times
from gpucost.wiring import (
    UsageError,
    audit_key,
    audit_settings,
    event_files,
    fleet_spec,
    invoked_as,
    load_keys,
    output_dir,
    output_to_read,
)

__all__ = [
    "cmd_simulate",
    "cmd_replay",
    "cmd_query",
    "cmd_views",
    "cmd_prices",
    "cmd_compact",
    "finish",
    "price_events",
    "SIMULATE",
    "REPLAY",
    "QUERY",
    "PRICES",
    "VIEWS",
    "COMPACT",
]

SIM_LINES_PER_FILE = 1_000_000
REPORT = "report.html"  # what run and replay leave beside their output


def cmd_simulate(args: argparse.Namespace) -> int:
    spec = fleet_spec(args)
    made_folder(args.out, "--out")
    earlier = sorted(args.out.glob("events-*.*"))
    if earlier and not args.overwrite:  # a second fleet beside the first would replay as one, mostly refused
        raise UsageError(
            f"{args.out} already holds simulated events ({earlier[0].name}…); pass --overwrite to "
            "replace them, or choose another --out"
        )
    for path in earlier:
        path.unlink()
    events, written, n = simulate(spec), [], 0
    try:
        while chunk := list(itertools.islice(events, SIM_LINES_PER_FILE)):
            written.append(args.out / f"events-{len(written):05d}.{args.format}")
            write_whole(
                written[-1],
                "".join(encode_event(ev) + "\n" for ev in chunk)
                if args.format == "jsonl"
                else lambda tmp, c=chunk: pq.write_table(events_table(c), tmp, compression="zstd"),
                "--out",
            )
            n += len(chunk)
    except UsageError:
        for path in written:  # a fleet in part would replay as a shorter one
            path.unlink(missing_ok=True)
        raise
    print(f"wrote {n:,} events to {len(written)} file(s) in {args.out}")
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    settings, key = audit_settings(args), audit_key(args)  # refused before --out is made
    files = event_files(args.input)
    total = sum(f.stat().st_size for f in files)
    with (
        output_dir(args.out, args.overwrite, "gpucost replay"),
        Progress("replay", "bytes", total=total, log_format=args.log_format) as bar,
    ):
        stats = run_embedded(
            read_batches(files),
            settings,
            args.out,
            audit_key=key,
            on_batch=lambda b: bar.update(sum(item.nbytes for item in b)),
        )  # type: ignore[union-attr]
    return finish(args.out, stats, settings.opex_usd_per_gpu_hour, args.report)


def finish(out: Path, stats: RunStats, opex_usd_per_gpu_hour: decimal.Decimal, report: bool) -> int:
    """The run's summary, and with ``report`` (``--report on``) the HTML page beside the output."""
    print(summary(out, stats, opex_usd_per_gpu_hour))
    later = f"{invoked_as()} report --out {out} --html FILE"
    if report:
        from gpucost.report_html import build_report  # Plotly's page: only when it is asked for

        try:
            write_whole(out / REPORT, build_report(out), "--out")
        except UsageError as exc:  # every record is in place: only the page is missing
            raise UsageError(f"{exc}; every record is written: build the page later with `{later}`") from None
        print(f"\nreport: {out / REPORT} (plots of the bill, idle index, health and efficiency; open it in a browser)")
    else:
        print(f"\nreport: not built (--report off); build the page of plots with `{later}`")
    print(
        f"\noutput: {out}/{{{','.join(OUTPUT_KINDS)}}}/date=YYYY-MM-DD/*.parquet; "
        f'try: {invoked_as()} query --out {out} "SELECT team, sum(cost_micro_usd) FROM cost GROUP BY team"'
    )
    return 0


def _jsonable(value: object) -> object:
    if isinstance(value, (decimal.Decimal, dt.date, dt.datetime)):
        return str(value)
    return value


def cmd_query(args: argparse.Namespace) -> int:
    output_to_read(args.out, holding=True)
    if not args.unsafe and (problem := read_only_problem(args.sql)) is not None:
        raise UsageError(problem)
    try:
        columns, rows = query(
            args.out,
            args.sql,
            confined=not args.unsafe,
            read_only=not args.unsafe,
            opex_usd_per_gpu_hour=args.opex_usd_per_gpu_hour,
        )
    except (duckdb.Error, WritesNotRefused) as exc:
        raise UsageError(f"query failed: {exc}".replace("\n", " ")) from None
    try:
        raw = args.raw_times or raw_times_env()
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    rows = rows if raw else readable_times(columns, rows)
    if args.format == "lines" and len(columns) != 1:
        raise UsageError(f"--format lines needs a query of one column, this one has {len(columns)}: {columns}")
    if args.format == "lines":
        sys.stdout.writelines(f"{r[0]}\n" for r in rows)
    elif args.format == "csv":
        write_rows(sys.stdout, columns, rows)
    elif args.format == "json":
        print(json.dumps([{c: _jsonable(v) for c, v in zip(columns, r)} for r in rows], indent=1))
    else:
        print(format_table(columns, rows))
    return 0


def cmd_prices(args: argparse.Namespace) -> int:
    """Sign each price line with the authority's key (``gpucost.streams.scope.price_mac``); any other line is an
    error."""
    signer = load_keys(Signer.from_file, args.signing_key_file)
    if signer.key.nodes is not None and PRICE_SCOPE not in signer.key.nodes:
        raise ConfigError(f"key {signer.key.key_id!r} may not sign prices: its node list needs {PRICE_SCOPE} (or *)")
    out = []
    for event in price_events(args.files):
        unsigned = event.model_copy(update={"key_id": None, "signature": None})
        signed = unsigned.model_copy(
            update={"key_id": signer.key.key_id, "signature": price_mac(signer.key.secret, unsigned)}
        )
        out.append(encode_event(signed))
    sys.stdout.write("".join(f"{line}\n" for line in out))
    return 0


def price_events(files: list[Path]) -> list[Price]:
    """The price events of JSON Lines files; any other line, or none at all, is a usage error naming it."""
    prices = []
    for path in event_files(files):
        for n, line in enumerate(path.read_bytes().splitlines(), 1):
            if line.strip():
                event = decode_line(line)
                if not isinstance(event, Price):
                    why = event.detail if isinstance(event, Rejected) else f"a {event.kind}, not a price"
                    raise UsageError(f"{path}:{n}: {why}; give JSON Lines of price events only")
                prices.append(event)
    if not prices:  # an empty file would bill or sign nothing new, and say so nowhere
        raise UsageError(f"no price event in {', '.join(map(str, files))}; give JSON Lines of price events")
    return prices


def cmd_views(args: argparse.Namespace) -> int:
    output_to_read(args.out, holding=True)
    print(views_sql(args.out, args.opex_usd_per_gpu_hour), end="")
    return 0


def cmd_compact(args: argparse.Namespace) -> int:
    from gpucost.kafka.sink import JOURNAL
    from gpucost.sinks.compact import compact
    from gpucost.sinks.parquet import Journal

    if args.min_files < 2:
        raise UsageError(f"--min-files must be at least 2, got {args.min_files}")
    output_to_read(args.out, holding=True)
    with OutputLock(args.out, "gpucost compact"):
        pending, _ = Journal(args.out / JOURNAL, dict).pending()  # a sink that died before committing needs these
        stats = compact(args.out, args.min_files, exclude=pending)
    print(
        f"compacted {stats.partitions:,} partition(s): {stats.files_merged:,} files → {stats.files_written:,} "
        f"({stats.rows:,} rows)"
    )
    for folder, why in stats.skipped.items():
        print(f"left as it is: {folder}: {why}", file=sys.stderr)
    return 0


# --- the command line: each command's flags and its entry in the table of gpucost.cli ---


def _simulate_arguments(p: argparse.ArgumentParser) -> None:
    add_fleet(p)
    p.add_argument("--out", type=Path, required=True, help="directory for events-NNNNN.jsonl (or .parquet)")
    p.add_argument("--overwrite", action="store_true", help="replace the event files already in --out")
    p.add_argument(
        "--format",
        choices=["jsonl", "parquet"],
        default="jsonl",
        help="JSON Lines (the wire form), or Parquet with one column per wire field",
    )


def _replay_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", type=Path, nargs="+", help="JSON Lines or Parquet files, or directories of them")
    add_out(p, "output directory")
    add_settings(p)
    add_report(p, "off")
    add_log_format(p)


def _query_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "sql",
        metavar="SQL",
        help='one statement over the views, e.g. "SELECT team, sum(cost_micro_usd) FROM cost GROUP BY team"',
    )
    p.add_argument(
        "--format",
        choices=["table", "csv", "json", "lines"],
        default="table",
        help="lines: one value per line, of a one-column query (e.g. dead letters' raw text to replay)",
    )
    p.add_argument(
        "--unsafe",
        action="store_true",
        help="run any statement with DuckDB's full file access (by default: reads only, SELECT, WITH, DESCRIBE, "
        "SUMMARIZE, SHOW, PIVOT, and EXPLAIN or PREPARE of one, reading files under --out only)",
    )
    p.add_argument(
        "--raw-times",
        action="store_true",
        help="show event times (the records' *_ns columns) as the integer nanoseconds stored, not as "
        "ISO-8601 UTC (env GPUCOST_QUERY_RAW_TIMES=1)",
    )
    add_out(p, "directory holding the output to query")
    add_opex(p)


def _prices_arguments(p: argparse.ArgumentParser) -> None:
    price_sub = p.add_subparsers(dest="action", required=True)
    sign = price_sub.add_parser(
        "sign",
        help="write each price of FILE(s) with the authority's key id and signature "
        "as JSON Lines on stdout (other lines: refused)",
    )
    sign.add_argument("files", nargs="+", type=Path)
    sign.add_argument(
        "--signing-key-file",
        type=Path,
        required=True,
        help="the price authority's one key, '<key_id> <secret hex> @prices' (or '*')",
    )


def _views_arguments(p: argparse.ArgumentParser) -> None:
    add_out(p, "directory holding the output")
    add_opex(p)


def _compact_arguments(p: argparse.ArgumentParser) -> None:
    add_out(p, "output directory")
    p.add_argument(
        "--min-files",
        type=int,
        default=2,
        help="merge a partition's files under 1 Mi rows once it has this many (default 2)",
    )


SIMULATE = Command(
    "simulate", "write a simulated fleet's events as JSON Lines or Parquet", _simulate_arguments, cmd_simulate
)
REPLAY = Command(
    "replay", "run recorded events (JSON Lines or Parquet) through the pipeline", _replay_arguments, cmd_replay
)
QUERY = Command(
    "query",
    f"run SQL over the views {', '.join(VIEW_NAMES[:-1])} and {VIEW_NAMES[-1]}",
    _query_arguments,
    cmd_query,
)
PRICES = Command(
    "prices", "price authority: sign price events so workers with a keyring take them", _prices_arguments, cmd_prices
)
VIEWS = Command("views", "print the CREATE VIEW statements for use in any DuckDB", _views_arguments, cmd_views)
COMPACT = Command(
    "compact", "merge the small Parquet files of an output directory, atomically", _compact_arguments, cmd_compact
)
