"""``gpucost devices FILE…``: the neutral samples of any accelerator tool's capture.

Prints one JSON object per device or partition and sample time (``--format json``) or an aligned
table (``text``, its ``faults`` column the fault fields reported), what a capture held that could not
be used to stderr, counted by reason.
``--live NAME`` also runs the vendor's tool now (when installed, with a timeout). The exit status
is 0 when every source gave samples, 1 when one gave none, 2 for a file that cannot be opened.
``--events OUT --node NODE`` writes the billed devices' ``gpu_sample`` and ``process_sample`` events
instead (``gpucost.producers.accelerators.events``), for ``gpucost replay`` or ``produce --source replay``,
each ``gpu_sample`` with the faults new in it where the tool reports fault fields (``events.with_faults``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, TextIO

from gpucost.command import Command
from gpucost.env_flags import add_tool_timeout
from gpucost.output_files import write_whole
from gpucost.producers.accelerators.detect import FORMATS, parse
from gpucost.producers.accelerators.events import Placement, at_ns, to_events, with_faults
from gpucost.producers.accelerators.live import COMMANDS, run_tool
from gpucost.schemas.devices import FAULT_FIELDS, DeviceSample, Parsed, sample_json
from gpucost.wiring import UsageError

__all__ = ["cmd_devices", "DEVICES"]

#: the text format's columns: the sample's fields, its processes (a ``pids`` column) and faults apart
_COLUMNS = tuple(
    f.name for f in dataclasses.fields(DeviceSample) if f.name != "processes" and f.name not in FAULT_FIELDS
)


def _devices_arguments(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("files", nargs="*", type=Path, metavar="FILE", help="captured tool output")
    cmd.add_argument(
        "--live",
        action="append",
        default=[],
        choices=sorted(COMMANDS),
        metavar="NAME",
        help=f"also run the vendor tool of NAME now, if installed (one of {', '.join(sorted(COMMANDS))})",
    )
    add_tool_timeout(cmd, "--timeout-s", "seconds a live tool may take")
    cmd.add_argument(
        "--format",
        choices=("json", "text"),
        default=os.environ.get("GPUCOST_DEVICES_FORMAT", "json"),
        help="json: one object per line (default; env GPUCOST_DEVICES_FORMAT); text: a table",
    )
    cmd.add_argument(
        "--input-format",
        choices=sorted(FORMATS),
        default=os.environ.get("GPUCOST_INPUT_FORMAT"),
        help="force the parser instead of detecting it (env GPUCOST_INPUT_FORMAT)",
    )
    bill = cmd.add_argument_group("billing: write the pipeline's events instead of printing samples")
    bill.add_argument("--events", type=Path, metavar="OUT", help="write gpu_sample/process_sample JSON Lines to OUT")
    bill.add_argument("--node", help="the node the captures were taken on (needed with --events)")
    bill.add_argument("--interval-s", metavar="S", help="sampling step of a capture that shows each device once")
    bill.add_argument("--at", metavar="ISO-TIME", help="time of a capture without times, e.g. 2026-12-04T18:00:00Z")
    bill.add_argument("--model", help="the platforms.toml model of devices whose capture names none")


def _text_row(sample: DeviceSample) -> str:
    cells = ["-" if getattr(sample, c) is None else str(getattr(sample, c)) for c in _COLUMNS]
    procs = "-" if sample.processes is None else ",".join(str(p.pid) for p in sample.processes) or "none"
    return "\t".join([*cells, procs, _faults_cell(sample)])


def _faults_cell(sample: DeviceSample) -> str:
    """The fault fields the tool reported with something in them (``ecc_uncorrected=2,xid=79``); ``none``
    when it reported them all clear, ``-`` when it reported none, so a clean device is not an unknown one."""
    reported = {name: getattr(sample, name) for name in FAULT_FIELDS if getattr(sample, name) is not None}
    shown = [
        f"{name}={'+'.join(value) if isinstance(value, tuple) else str(value).lower()}"
        for name, value in reported.items()
        if value
    ]
    return ",".join(shown) or ("none" if reported else "-")


def _placement(args: argparse.Namespace) -> Placement:
    """The ``--events`` flags checked; UsageError saying what to give."""
    if not args.node:
        raise UsageError("--events needs --node NODE, the node the captures were taken on")
    step = None
    if args.interval_s is not None:
        try:
            step = Decimal(args.interval_s)
        except InvalidOperation:
            step = Decimal("NaN")
        if not step.is_finite() or not 0 < step <= 3600:
            raise UsageError(
                f"--interval-s {args.interval_s!r}: give the sampling step in seconds, above 0, at most 3600"
            )
    try:
        at = None if args.at is None else at_ns(args.at)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return Placement(args.node, step, at, args.model)


def _emit(source: str, name: str | None, parsed: Parsed, fmt: str, events: tuple[TextIO, Placement] | None) -> int:
    """Print the samples (or write their events) and the counted reasons; 2 (an input error, README's status)
    when the source gave no sample or no billable event, said in one ``gpucost: error:`` line."""
    wire: list[dict[str, Any]] = []
    if events is not None:
        wire = with_faults(to_events(parsed.samples, events[1], parsed), parsed.samples, events[1])
        events[0].writelines(json.dumps(e, separators=(",", ":")) + "\n" for e in wire)
        print(f"gpucost devices: {source}: {len(wire)} events", file=sys.stderr)
    for sample in parsed.samples if events is None else ():
        print(sample_json(sample) if fmt == "json" else _text_row(sample))
    for reason, count in sorted(parsed.dead_letters.items()):
        if name is not None or parsed.samples:  # an unrecognised file's one reason is the error line below
            print(f"gpucost devices: {source}: {count} × {reason}", file=sys.stderr)
    if parsed.samples and (events is None or wire):
        return 0
    if name is None and not parsed.samples:
        print(
            f"gpucost: error: {source}: no device samples, its format not recognised (none of {', '.join(FORMATS)}); "
            "force one with --input-format NAME",
            file=sys.stderr,
        )
    else:
        what = "device samples" if not parsed.samples else "billable events (the reasons above say why)"
        print(f"gpucost: error: {source}: no {what} ({name})", file=sys.stderr)
    return 2


def cmd_devices(args: argparse.Namespace) -> int:
    """Parse each file, run each live tool, print the samples; dead letters to stderr."""
    if not args.files and not args.live:
        raise UsageError("name a FILE or --live NAME (see gpucost devices --help)")
    if args.events is None:
        return _each(args, None)
    placement = _placement(args)
    status = 0

    def write(tmp: Path) -> None:
        """The events into the file written whole: a failed run leaves the file it would have replaced."""
        nonlocal status
        with tmp.open("w", encoding="utf-8") as out:
            status = _each(args, (out, placement))
        if status:
            raise _Failed

    with contextlib.suppress(_Failed):
        write_whole(args.events, write, "--events")
    return status


class _Failed(Exception):
    """A capture gave no billable events: nothing replaces the --events file."""


def _each(args: argparse.Namespace, events: tuple[TextIO, Placement] | None) -> int:
    status = 0
    if args.format == "text" and events is None:
        print("\t".join([*_COLUMNS, "pids", "faults"]))
    for path in args.files:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            print(f"gpucost: error: cannot read {path}: {exc.strerror}", file=sys.stderr)
            status = 2
            continue
        name, parsed = parse(text, args.input_format)
        status = max(status, _emit(str(path), name, parsed, args.format, events))
    for fmt in args.live:
        status = max(status, _emit(f"live {fmt}", fmt, run_tool(fmt, args.timeout_s), args.format, events))
    return status


DEVICES = Command(
    "devices",
    "print the neutral device samples, faults included, of AMD, AWS Neuron, Google TPU, Intel Gaudi, Alveo "
    "and dcgm-exporter captures (format detected from content); --events OUT writes them as billable events",
    _devices_arguments,
    cmd_devices,
)
