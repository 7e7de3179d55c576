"""``gpucost devices FILE…``: the neutral samples of any accelerator tool's capture.

Prints one JSON object per device or partition and sample time (``--format json``) or an aligned
table (``text``); what a capture held that could not be used goes to stderr, counted by reason.
The exit status is 0 when every file was read, 1 when a file held nothing usable, 2 for a file
that cannot be opened.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from gpucost.producers.accelerators.detect import FORMATS, parse
from gpucost.schemas.devices import DeviceSample, sample_json

__all__ = ["add_devices", "cmd_devices"]

_COLUMNS = ("vendor", "model", "device_id", "parent_id", "ts_ns", "busy_pct", "power_w", "mem_used_bytes",
            "mem_total_bytes", "temperature_c")


def add_devices(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``devices`` on the CLI's sub-parsers."""
    cmd = sub.add_parser("devices", help="print the neutral device samples of AMD, AWS Neuron, Google TPU, "
                                         "Intel Gaudi and Alveo tool captures (format detected from content)")
    cmd.add_argument("files", nargs="+", type=Path, metavar="FILE", help="captured tool output")
    cmd.add_argument("--format", choices=("json", "text"), default=os.environ.get("GPUCOST_DEVICES_FORMAT", "json"),
                     help="json: one object per line (default; env GPUCOST_DEVICES_FORMAT); text: a table")
    cmd.add_argument("--input-format", choices=sorted(FORMATS), default=os.environ.get("GPUCOST_INPUT_FORMAT"),
                     help="force the parser instead of detecting it (env GPUCOST_INPUT_FORMAT)")


def _text_row(sample: DeviceSample) -> str:
    cells = ["-" if getattr(sample, c) is None else str(getattr(sample, c)) for c in _COLUMNS]
    procs = "-" if sample.processes is None else ",".join(str(p.pid) for p in sample.processes) or "none"
    return "\t".join([*cells, procs])


def cmd_devices(args: argparse.Namespace) -> int:
    """Parse each file and print its samples; dead letters to stderr."""
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
        for sample in parsed.samples:
            print(sample_json(sample) if args.format == "json" else _text_row(sample))
        for reason, count in sorted(parsed.dead_letters.items()):
            print(f"gpucost devices: {path}: {count} × {reason}", file=sys.stderr)
        if not parsed.samples:
            print(f"gpucost devices: {path}: no device samples ({name or 'format not recognised'})",
                  file=sys.stderr)
            status = max(status, 1)
    return status
