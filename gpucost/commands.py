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

from gpucost.config import ConfigError
from gpucost.csv_cells import write_rows
from gpucost.embedded import RunStats, run_embedded
from gpucost.progress import Progress
from gpucost.fit import RESOURCES, fit_weights, pane_features
from gpucost.focus import MONTH, cost_months, export_focus
from gpucost.kafka.signing import Signer
from gpucost.output_files import check_writable, made_folder, write_whole
from gpucost.producers.replay import read_batches
from gpucost.producers.simulate import simulate
from gpucost.report import format_table, summary
from gpucost.schemas.arrow import events_table
from gpucost.schemas.codec import Rejected, decode_line, encode_event
from gpucost.schemas.events import Price
from gpucost.sinks.lock import OutputLock
from gpucost.sinks.landlock import WritesNotRefused
from gpucost.sinks.statements import read_only_problem
from gpucost.sinks.views import query, views_sql
from gpucost.streams.scope import PRICE_SCOPE, price_mac
from gpucost.times import raw_times_env, readable_times
from gpucost.whatif import IDLE_POLICIES, Scenario, bills
from gpucost.wiring import (UsageError, audit_key, audit_settings, event_files, fleet_spec, invoked_as, load_keys,
                            output_dir, output_to_read)

__all__ = ["cmd_simulate", "cmd_replay", "cmd_query", "cmd_views", "cmd_prices", "cmd_compact",
           "cmd_fit_weights", "cmd_whatif", "cmd_export", "cmd_report", "finish", "IDLE_POLICIES"]

SIM_LINES_PER_FILE = 1_000_000
REPORT = "report.html"  # what run and replay leave beside their output


def cmd_simulate(args: argparse.Namespace) -> int:
    spec = fleet_spec(args)
    made_folder(args.out, "--out")
    earlier = sorted(args.out.glob("events-*.*"))
    if earlier and not args.overwrite:  # a second fleet beside the first would replay as one, mostly refused
        raise UsageError(f"{args.out} already holds simulated events ({earlier[0].name}…); pass --overwrite to "
                         "replace them, or choose another --out")
    for path in earlier:
        path.unlink()
    events, written, n = simulate(spec), [], 0
    try:
        while chunk := list(itertools.islice(events, SIM_LINES_PER_FILE)):
            written.append(args.out / f"events-{len(written):05d}.{args.format}")
            write_whole(written[-1], "".join(encode_event(ev) + "\n" for ev in chunk) if args.format == "jsonl" else
                        lambda tmp, c=chunk: pq.write_table(events_table(c), tmp, compression="zstd"), "--out")
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
    with output_dir(args.out, args.overwrite, "gpucost replay"), \
            Progress("replay", "bytes", total=total, log_format=args.log_format) as bar:
        stats = run_embedded(read_batches(files), settings, args.out, audit_key=key,
                             on_batch=lambda b: bar.update(sum(item.nbytes for item in b)))  # type: ignore[union-attr]
    return finish(args.out, stats, settings.opex_usd_per_gpu_hour)


def finish(out: Path, stats: RunStats, opex_usd_per_gpu_hour: decimal.Decimal) -> int:
    from gpucost.report_html import build_report

    print(summary(out, stats, opex_usd_per_gpu_hour))
    try:
        write_whole(out / REPORT, build_report(out), "--out")
    except UsageError as exc:  # every record is in place: only the page is missing
        raise UsageError(f"{exc}; every record is written: build the page later with `{invoked_as()} report "
                         f"--out {out} --html FILE`") from None
    print(f"\nreport: {out / REPORT} (plots of all of the above; open it in a browser)")
    print(f"\noutput: {out}/{{idle_index,mae,cost,health,quota,reclaim,efficiency,dlq}}/date=YYYY-MM-DD/*.parquet; "
          f"try: {invoked_as()} query --out {out} \"SELECT team, sum(cost_micro_usd) FROM cost GROUP BY team\"")
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
        columns, rows = query(args.out, args.sql, confined=not args.unsafe, read_only=not args.unsafe,
                              opex_usd_per_gpu_hour=args.opex_usd_per_gpu_hour)
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
    """Sign each price line with the authority's key (``gpucost.streams.scope.price_mac``); any other line is an error."""
    signer = load_keys(Signer.from_file, args.signing_key_file)
    if signer.key.nodes is not None and PRICE_SCOPE not in signer.key.nodes:
        raise ConfigError(f"key {signer.key.key_id!r} may not sign prices: its node list needs {PRICE_SCOPE} (or *)")
    out = []
    for event in _price_events(args.files):
        unsigned = event.model_copy(update={"key_id": None, "signature": None})
        signed = unsigned.model_copy(update={"key_id": signer.key.key_id,
                                             "signature": price_mac(signer.key.secret, unsigned)})
        out.append(encode_event(signed))
    sys.stdout.write("".join(f"{line}\n" for line in out))
    return 0


def _price_events(files: list[Path]) -> list[Price]:
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


def cmd_fit_weights(args: argparse.Namespace) -> int:
    settings = audit_settings(args)
    if args.write is not None:
        check_writable(args.write, "--write")
    try:
        fit = fit_weights(pane_features(event_files(args.input), settings))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    print(f"panes used: {fit.panes:,}   R² = {fit.r2:.4f}   idle draw {fit.intercept_w:.1f} W")
    for name, resource, slope in zip(("alpha", "beta", "gamma"), RESOURCES, fit.slopes.tolist()):
        value = fit.weights[name]
        print(f"{name:5} = {value if value is not None else 'not estimated: ' + fit.why_not[name]}"
              f"   (power slope on {resource}: {slope:.6g})")
    if args.write is not None:
        write_whole(args.write, fit.snippet(), "--write")
        print(f"settings written to {args.write}; use it with --config {args.write}")
    else:
        print("\n" + fit.snippet(), end="")
    return 0


def cmd_whatif(args: argparse.Namespace) -> int:
    output_to_read(args.out)
    s = audit_settings(args)  # the scenario's weights: --alpha/--beta/--gamma, else the config and environment's
    try:
        scenario = Scenario.of(s.alpha, s.beta, s.gamma, prices=_price_events(args.prices) if args.prices else (),
                               idle_policy=args.idle_policy)
        rows = bills(args.out, scenario)
    except (ValueError, decimal.InvalidOperation) as exc:
        raise UsageError(str(exc)) from None
    except duckdb.BinderException as exc:  # cost records written before they carried their numerators
        raise UsageError(f"the cost records in {args.out} lack the numerators a what-if needs (t_num, b_num, l_num, "
                         f"busy_num, covered_ms: written by a gpucost before them); replay their events with this "
                         f"one first ({str(exc).splitlines()[0]})") from None
    columns = ["team", "base_micro_usd", "scenario_micro_usd", "difference_micro_usd"]
    table = [[b.team, b.base_micro_usd, b.scenario_micro_usd, b.difference_micro_usd] for b in rows]
    table.append(["(total)", *(sum(r[i] for r in table) for i in (1, 2, 3))])
    if args.format == "json":
        print(json.dumps([dict(zip(columns, r)) for r in table], indent=1))
    elif args.format == "csv":
        write_rows(sys.stdout, columns, table)
    else:
        print(format_table(columns, [[t, *(f"{v:,}" for v in vs)] for t, *vs in table]))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """``gpucost export focus``: the month's cost records as a FOCUS 1.2 Cost and Usage file, written whole; a
    month with no cost record is an error, not an empty file."""
    output_to_read(args.out, holding=True)
    if not MONTH.match(args.month):
        raise UsageError(f"--month {args.month!r} is not YYYY-MM")
    if args.file.exists() and not args.overwrite:
        raise UsageError(f"{args.file} exists; pass --overwrite to replace it")
    rows = 0

    def write(tmp: Path) -> None:
        nonlocal rows
        try:
            rows = export_focus(args.out, args.month, tmp, args.format, args.provider, args.billing_account)
        except (ValueError, duckdb.Error) as exc:
            raise UsageError(f"FILE {args.file}: {exc}".replace("\n", " ")) from None
        if not rows:
            raise UsageError(f"no cost record of {args.month} in {args.out}; nothing written (its months: "
                             f"{', '.join(cost_months(args.out)) or 'none'})")
    write_whole(args.file, write, "FILE")
    print(f"wrote {rows:,} FOCUS 1.2 rows of {args.month} to {args.file}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """``gpucost report``: the output as one self-contained HTML page of plots."""
    from gpucost.report_html import build_report

    output_to_read(args.out, holding=True)
    if args.since and args.until and args.since > args.until:
        raise UsageError(f"--since {args.since} is after --until {args.until}")
    check_writable(args.html, "--html")
    page = build_report(args.out, args.since, args.until)
    write_whole(args.html, page, "--html")
    print(f"wrote {args.html} ({len(page.encode()) / 1e6:.1f} MB, self-contained: open it in any browser)")
    return 0


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
    print(f"compacted {stats.partitions:,} partition(s): {stats.files_merged:,} files → {stats.files_written:,} "
          f"({stats.rows:,} rows)")
    for folder, why in stats.skipped.items():
        print(f"left as it is: {folder}: {why}", file=sys.stderr)
    return 0
