"""``gpucost devices FILE…``: the neutral samples of any accelerator tool's capture.

Prints one JSON object per device or partition and sample time (``--format json``) or an aligned
table (``text``); what a capture held that could not be used goes to stderr, counted by reason.
``--live NAME`` also runs the vendor's tool now (when installed, with a timeout). The exit status
is 0 when every source gave samples, 1 when one gave none, 2 for a file that cannot be opened.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from gpucost.command import Command
from gpucost.producers.accelerators.detect import FORMATS, parse
from gpucost.producers.accelerators.live import COMMANDS, run_tool
from gpucost.schemas.devices import DeviceSample, Parsed, sample_json

__all__ = ["cmd_devices", "DEVICES"]

_COLUMNS = (
    "vendor",
    "model",
    "device_id",
    "parent_id",
    "ts_ns",
    "busy_pct",
    "power_w",
    "mem_used_bytes",
    "mem_total_bytes",
    "temperature_c",
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
    cmd.add_argument(
        "--timeout-s",
        type=float,
        default=float(os.environ.get("GPUCOST_DEVICES_TIMEOUT_S", "10")),
        help="seconds a live tool may take (default 10; env GPUCOST_DEVICES_TIMEOUT_S)",
    )
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


def _text_row(sample: DeviceSample) -> str:
    cells = ["-" if getattr(sample, c) is None else str(getattr(sample, c)) for c in _COLUMNS]
    procs = "-" if sample.processes is None else ",".join(str(p.pid) for p in sample.processes) or "none"
    return "\t".join([*cells, procs])


def _emit(source: str, name: str | None, parsed: Parsed, fmt: str) -> int:
    """Print the samples and the counted reasons; 1 when the source gave no sample."""
    for sample in parsed.samples:
        print(sample_json(sample) if fmt == "json" else _text_row(sample))
    for reason, count in sorted(parsed.dead_letters.items()):
        print(f"gpucost devices: {source}: {count} × {reason}", file=sys.stderr)
    if parsed.samples:
        return 0
    print(f"gpucost devices: {source}: no device samples ({name or 'format not recognised'})", file=sys.stderr)
    return 1


def cmd_devices(args: argparse.Namespace) -> int:
    """Parse each file, run each live tool, print the samples; dead letters to stderr."""
    if not args.files and not args.live:
        print("gpucost devices: name a FILE or --live NAME", file=sys.stderr)
        return 2
    status = 0
    if args.format == "text":
        print("\t".join([*_COLUMNS, "pids"]))
    for path in args.files:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            print(f"gpucost devices: cannot read {path}: {exc.strerror}", file=sys.stderr)
            status = 2
            continue
        name, parsed = parse(text, args.input_format)
        status = max(status, _emit(str(path), name, parsed, args.format))
    for fmt in args.live:
        status = max(status, _emit(f"live {fmt}", fmt, run_tool(fmt, args.timeout_s), args.format))
    return status


DEVICES = Command(
    "devices",
    "print the neutral device samples of AMD, AWS Neuron, Google TPU, Intel Gaudi and Alveo "
    "tool captures (format detected from content)",
    _devices_arguments,
    cmd_devices,
)
