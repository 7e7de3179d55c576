"""The commands that read an output directory or recorded events to answer a question: fit the weights, bill again
under other terms (what-if), draw the report, export FOCUS."""

from __future__ import annotations

import argparse
import datetime as dt
import decimal
import json
import sys
from collections import Counter
from pathlib import Path

import duckdb

from gpucost.calibration import as_json, as_text, calibrate
from gpucost.command import Command
from gpucost.commands import price_events
from gpucost.csv_cells import write_rows
from gpucost.fit import RESOURCES, pane_features
from gpucost.flags import WEIGHT_FIELDS, add_out, add_settings, date_arg, env_flag
from gpucost.focus import FORMATS, MONTH, VERSIONS, cost_months, export_focus, usage_only
from gpucost.focus13 import BASES
from gpucost.output_files import check_writable, write_whole
from gpucost.report import format_table
from gpucost.sinks.views import query
from gpucost.whatif import IDLE_POLICIES, Scenario, bills, lacking_numerators
from gpucost.wiring import (
    UsageError,
    audit_settings,
    event_files,
    output_to_read,
)

__all__ = [
    "cmd_fit_weights",
    "cmd_whatif",
    "cmd_export",
    "cmd_report",
    "FIT_WEIGHTS",
    "WHATIF",
    "HTML_REPORT",
    "EXPORT",
]


def cmd_fit_weights(args: argparse.Namespace) -> int:
    """The fleet-wide weights, as ever, then each platform's fit scored on its held-out panes (gpucost/calibration.py);
    ``--write`` writes the fleet-wide snippet only, since a bill splits every pane with one α, β, γ."""
    settings = audit_settings(args)
    if args.write is not None:
        check_writable(args.write, "--write")
    try:
        cal = calibrate(pane_features(event_files(args.input), settings))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    fit = cal.fleet
    if args.format == "json":
        print(json.dumps({**as_json(cal), "snippet": fit.snippet()}, indent=1))
    else:
        print(f"panes used: {fit.panes:,}   R² = {fit.r2:.4f}   idle draw {fit.intercept_w:.1f} W")
        for name, resource, slope in zip(("alpha", "beta", "gamma"), RESOURCES, fit.slopes.tolist()):
            value = fit.weights[name]
            print(
                f"{name:5} = {value if value is not None else 'not estimated: ' + fit.why_not[name]}"
                f"   (power slope on {resource}: {slope:.6g})"
            )
        print("\n" + as_text(cal), end="")
    if args.write is not None:
        write_whole(args.write, fit.snippet(), "--write")
        # on stderr under --format json, so that stdout stays one JSON document
        print(
            f"settings written to {args.write}; use it with --config {args.write}",
            file=sys.stderr if args.format == "json" else sys.stdout,
        )
    elif args.format != "json":
        print("\n" + fit.snippet(), end="")
    return 0


def cmd_whatif(args: argparse.Namespace) -> int:
    output_to_read(args.out)
    s = audit_settings(args)  # the scenario's weights: --alpha/--beta/--gamma, else the config and environment's
    try:
        scenario = Scenario.of(
            s.alpha,
            s.beta,
            s.gamma,
            prices=price_events(args.prices) if args.prices else (),
            idle_policy=args.idle_policy,
        )
        unpriced: Counter[str] = Counter()
        rows = bills(args.out, scenario, unpriced)
    except (ValueError, decimal.InvalidOperation) as exc:
        raise UsageError(str(exc)) from None
    except duckdb.BinderException as exc:  # cost records written before they carried their numerators
        raise UsageError(lacking_numerators(args.out, str(exc).splitlines()[0])) from None
    if unpriced:  # said, as run says its unpriced panes: a model missing from --prices bills 0 µ$ in the scenario
        print(
            f"gpucost: whatif: {sum(unpriced.values()):,} GPU-pane(s) of {', '.join(sorted(unpriced))} have no price "
            "among --prices (under no name of their platform row, nor a 'default' one): billed 0 µ$ in the scenario; "
            "add their prices to bill them",
            file=sys.stderr,
        )
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
    """``gpucost export focus``: the month's cost records as a FOCUS 1.2 or 1.3 Cost and Usage file, written whole; a
    month with no cost record is an error, not an empty file."""
    output_to_read(args.out, holding=True)
    if not MONTH.match(args.month):
        raise UsageError(f"--month {args.month!r} is not YYYY-MM")
    if args.focus_version not in VERSIONS:
        raise UsageError(
            f"--focus-version {args.focus_version!r} (or env GPUCOST_FOCUS_VERSION): choose {' or '.join(VERSIONS)}"
        )
    weights = None
    if args.basis not in BASES:
        raise UsageError(f"--basis {args.basis!r} (or env GPUCOST_FOCUS_BASIS): choose {' or '.join(BASES)}")
    if args.basis != "usage" and args.focus_version != "1.3":
        raise UsageError(
            f"--basis {args.basis} (or env GPUCOST_FOCUS_BASIS) is written as FOCUS 1.3 split cost allocation: add "
            "--focus-version 1.3"
        )
    if args.focus_version == "1.3":  # AllocatedMethodDetails names the weights the records were split with
        try:
            s = audit_settings(args)
        except ValueError as exc:
            raise UsageError(str(exc).replace("\n", " ")) from None
        weights = (s.alpha, s.beta, s.gamma)
    if args.file.exists() and not args.overwrite:
        raise UsageError(f"{args.file} exists; pass --overwrite to replace it")
    named = {f".{f}": f for f in FORMATS}.get(args.file.suffix.lower())
    if args.format is not None and named is not None and args.format != named:
        raise UsageError(f"FILE {args.file} is named {named} but --format is {args.format}; make them agree")
    fmt = args.format or named or "csv"
    rows = 0

    def write(tmp: Path) -> None:
        nonlocal rows
        try:
            rows = export_focus(
                args.out,
                args.month,
                tmp,
                fmt,
                args.provider,
                args.billing_account,
                args.invoice_id or None,
                args.focus_version,
                weights,
                args.basis,
            )
        except (ValueError, duckdb.Error) as exc:
            raise UsageError(f"FILE {args.file}: {exc}".replace("\n", " ")) from None
        if not rows:
            table = "cost" if args.basis == "usage" else "allocation"
            raise UsageError(
                f"no {table} record of {args.month} in {args.out}; nothing written (its months: "
                f"{', '.join(cost_months(args.out, table)) or 'none'})"
            )

    write_whole(args.file, write, "FILE")
    print(f"wrote {rows:,} FOCUS {args.focus_version} rows of {args.month} to {args.file}")
    if args.basis == "allocation" and (left := usage_only(args.out, args.month))[0]:
        print(
            f"{left[0]:,} panes (${left[1] / 1e6:,.2f}) of {args.month} are on the usage basis only (before their "
            "device's first hold, or on devices with none): not in this file; the usage export has them"
        )
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """``gpucost report``: the output as one self-contained HTML page of plots."""
    from gpucost.report_html import build_report

    output_to_read(args.out, holding=True)
    if args.since and args.until and args.since > args.until:
        raise UsageError(f"--since {args.since} is after --until {args.until}")
    check_writable(args.html, "--html")
    if args.since or args.until:  # a period with no cost record is an error, as export focus's month is
        since, until = (d.isoformat() for d in (args.since or dt.date.min, args.until or dt.date.max))  # dates
        _, ((first, last, within),) = query(
            args.out,
            f"SELECT min(date), max(date), count(*) FILTER (WHERE date BETWEEN DATE '{since}' AND DATE '{until}') "
            "FROM cost",
        )
        if not within:
            raise UsageError(
                f"no cost record from {args.since or 'the start'} to {args.until or 'the end'} in {args.out}; "
                f"nothing written (its dates: {first} to {last})"
            )
    page = build_report(args.out, args.since, args.until)
    write_whole(args.html, page, "--html")
    print(f"wrote {args.html} ({len(page.encode()) / 1e6:.1f} MB, self-contained: open it in any browser)")
    return 0


# --- the command line: each command's flags and its entry in the table of gpucost.cli ---


def _fit_weights_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", type=Path, nargs="+", help="JSON Lines or Parquet event files, or directories of them")
    p.add_argument("--write", type=Path, help="write the snippet to this TOML file (default: print it)")
    p.add_argument(
        "--format",
        choices=["text", "json"],
        default="text",
        help="text: the fleet-wide weights, the per-platform table, the snippet; json: all of it as one object",
    )
    add_settings(p, writes_out=False)


def _whatif_arguments(p: argparse.ArgumentParser) -> None:
    add_out(p, "output directory holding the cost records")
    p.add_argument(
        "--prices",
        type=Path,
        nargs="+",
        default=[],
        help="JSON Lines of price events in force instead of the records' own prices",
    )
    p.add_argument(
        "--idle-policy",
        choices=IDLE_POLICIES,
        default="separate",
        help="separate: idle is its own party (as billed); share: each pane's idle µ$ go to its tenants by weight",
    )
    p.add_argument("--format", choices=["table", "csv", "json"], default="table")
    # the weights alone: a what-if bills the published panes again, so the settings that made them (pane length,
    # idle threshold, lateness…) cannot change here, and a flag for one would be silently ignored
    add_settings(p, writes_out=False, fields=WEIGHT_FIELDS, signs=False)


def _report_arguments(p: argparse.ArgumentParser) -> None:
    add_out(p, "output directory holding the records")
    p.add_argument("--html", type=Path, required=True, help="the HTML file to write")
    p.add_argument("--since", type=date_arg, help="first UTC date to show, YYYY-MM-DD (default: the first)")
    p.add_argument("--until", type=date_arg, help="last UTC date to show, YYYY-MM-DD (default: the last)")


def _export_arguments(p: argparse.ArgumentParser) -> None:
    export_sub = p.add_subparsers(dest="export_format", required=True)
    focus = export_sub.add_parser(
        "focus",
        help="a month of cost records as a FinOps FOCUS 1.2 or 1.3 (split cost allocation) Cost and Usage file "
        "(exact decimal costs)",
    )
    focus.add_argument("file", type=Path, help="the file to write")
    add_out(focus, "output directory holding the cost records")
    focus.add_argument("--month", required=True, help="the billing period, YYYY-MM (UTC)")
    focus.add_argument(
        "--format",
        choices=FORMATS,
        default=None,
        help="csv or parquet (default: as FILE is named, .parquet or .csv; else csv)",
    )
    focus.add_argument("--overwrite", action="store_true", help="replace FILE if it exists")
    env_flag(
        focus,
        "--provider",
        "GPUCOST_FOCUS_PROVIDER",
        str,
        "gpucost",
        "ProviderName, PublisherName and InvoiceIssuerName: who runs the fleet",
    )
    env_flag(
        focus,
        "--billing-account",
        "GPUCOST_FOCUS_BILLING_ACCOUNT",
        str,
        "gpucost",
        "BillingAccountId and BillingAccountName",
    )
    env_flag(
        focus,
        "--invoice-id",
        "GPUCOST_FOCUS_INVOICE_ID",
        str,
        None,
        "InvoiceId of every row: the invoice these charges are billed on; without one it is null, as FOCUS "
        "wants for charges no invoice carries",
    )
    env_flag(
        focus,
        "--focus-version",
        "GPUCOST_FOCUS_VERSION",
        str,
        "1.2",
        "1.2, or 1.3: each pane's cost split into allocated rows (AllocatedMethodId gpucost-usage), idle its own; "
        "1.3 takes the weights the records were split with from --config / --alpha --beta --gamma",
    )
    env_flag(
        focus,
        "--basis",
        "GPUCOST_FOCUS_BASIS",
        str,
        "usage",
        "usage (the cost records), or allocation (the allocation records: each pane's cost split by what tenants "
        "held, AllocatedMethodId gpucost-allocation, unallocated its own row); allocation needs --focus-version 1.3",
    )
    # the weights the records were split with (FOCUS 1.3 states them); no other setting changes an export
    add_settings(focus, writes_out=False, fields=WEIGHT_FIELDS, signs=False)


FIT_WEIGHTS = Command(
    "fit-weights",
    "fit α, β, γ to the GPUs' power over recorded events (docs/definitions.md, "
    "Weights fit): prints them with R², each platform's fit scored on held-out panes, and a settings snippet",
    _fit_weights_arguments,
    cmd_fit_weights,
)
WHATIF = Command(
    "whatif",
    "bill the published cost records again under other prices, weights or idle "
    "policy: per team, base µ$, scenario µ$, difference (exact, from --out alone)",
    _whatif_arguments,
    cmd_whatif,
)
HTML_REPORT = Command(
    "report",
    "the output as one self-contained HTML page of plots (cost by team, "
    "idle share, an idle heatmap, health, reclaims, MAE, dead letters, costliest kernels and ranges)",
    _report_arguments,
    cmd_report,
)
EXPORT = Command("export", "the cost records in a standard other tools read", _export_arguments, cmd_export)
