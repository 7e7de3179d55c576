"""``gpucost trace-events FILE…``: a profiler trace's kernels as the pipeline's ``kernel_activity`` events, each with
the range path it was launched in, for ``gpucost replay`` or ``gpucost produce --source replay``.

``gpucost kernels`` prices a trace alone; this puts the same kernels into the fleet's bill, where each tenant's cost
of a pane is split over its kernels and ranges (docs/definitions.md, "Kernel cost in the pipeline" and "Range cost in
the pipeline"). A trace names its GPUs by index and its processes as its own pid namespace saw them, while the
fleet's samples name them by NVML UUID and host pid: ``--gpu-uuid`` and ``--pid`` say which is which, and the
summary warns of every device left under the fallback id, whose kernels would bill no one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import numpy as np
from pydantic import TypeAdapter, ValidationError

from gpucost.command import Command
from gpucost.env_flags import env_flag
from gpucost.kernels import launch_spans
from gpucost.producers.kernel_table import KernelTable, RangeTable
from gpucost.schemas.codec import encode_event
from gpucost.schemas.event_base import Ident, Pid
from gpucost.schemas.kernels import KERNEL_CATEGORIES, MAX_RANGE_DEPTH, KernelActivity
from gpucost.streams.kernel_split import range_paths
from gpucost.trace_files import read_readable, trace_labels, trace_source
from gpucost.wiring import UsageError

__all__ = ["TRACE_EVENTS", "cmd_trace_events", "kernel_events"]

#: which host spans make a kernel's range path: ``user_annotation`` / NVTX ranges, PyTorch ``cpu_op`` operators (as
#: ``torch.autograd.profiler.emit_nvtx`` would make them NVTX ranges), or both nested by time on the thread
PATH_SPANS = ("ranges", "operators", "both")
_IDENT, _PID = TypeAdapter(Ident), TypeAdapter(Pid)


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "files", nargs="+", type=Path, metavar="FILE", help="Kineto JSON (.json, .json.gz) or nsys .sqlite of one node"
    )
    env_flag(
        p, "--out", "GPUCOST_TRACE_EVENTS_OUT", str, "kernels.jsonl", "JSON Lines file to write, - for standard output"
    )
    env_flag(
        p,
        "--node-id",
        "GPUCOST_NODE_ID",
        str,
        None,
        "the node the traces were taken on, as the fleet's samples name it; required",
    )
    p.add_argument(
        "--gpu-uuid",
        action="append",
        metavar="DEVICE=UUID",
        help="the UUID the fleet's samples give the trace's device index DEVICE (nvidia-smi --query-gpu=index,uuid "
        "--format=csv); once per device (env GPUCOST_TRACE_GPU_UUIDS, comma-separated; default: <node-id>/<DEVICE>, "
        "which bills no one unless the samples use it)",
    )
    p.add_argument(
        "--pid",
        action="append",
        metavar="TRACE=HOST",
        help="a process id as the trace has it and as the node's samples have it, for a job traced inside a "
        "container's pid namespace (env GPUCOST_TRACE_PIDS, comma-separated; default: as in the trace)",
    )
    p.add_argument(
        "--paths",
        choices=PATH_SPANS,
        default=os.environ.get("GPUCOST_TRACE_PATHS", "ranges"),
        help="what a kernel's range_path is made of: the ranges open on its launching thread at its launch "
        "(NVTX, record_function), the PyTorch operators open there, or both (env GPUCOST_TRACE_PATHS; default "
        "ranges)",
    )


def _pairs(flag: str, given: list[str] | None, env: str) -> list[tuple[str, str]]:
    """``A=B`` pairs from a repeated flag, or its variable's comma-separated list."""
    items = given if given is not None else [w for w in os.environ.get(env, "").split(",") if w.strip()]
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise UsageError(f"{flag} (or {env}) {item!r} is not KEY=VALUE; give one such as {flag} 0=GPU-8a1f…")
        out.append((key.strip(), value.strip()))
    return out


def _whole(flag: str, text: str, adapter: TypeAdapter, what: str) -> int:
    try:
        return adapter.validate_python(int(text))
    except (ValueError, ValidationError):
        raise UsageError(f"{flag} {text!r}: {what}") from None


def _uuids(given: list[str] | None) -> dict[int, str]:
    out: dict[int, str] = {}
    for device, uuid in _pairs("--gpu-uuid", given, "GPUCOST_TRACE_GPU_UUIDS"):
        index = _whole("--gpu-uuid", device, TypeAdapter(int), "the device is the trace's index, such as 0")
        if not 0 <= index < 1024:
            raise UsageError(f"--gpu-uuid {device!r}: a device index is 0 to 1023")
        if index in out and out[index] != uuid:
            raise UsageError(f"--gpu-uuid gives device {index} two UUIDs ({out[index]}, {uuid}): give it one")
        try:
            out[index] = _IDENT.validate_python(uuid)
        except ValidationError:
            raise UsageError(f"--gpu-uuid {uuid[:40]!r}: a UUID is 1 to 256 characters") from None
    return out


def _pids(given: list[str] | None) -> dict[int, int]:
    out: dict[int, int] = {}
    for trace, host in _pairs("--pid", given, "GPUCOST_TRACE_PIDS"):
        a = _whole("--pid", trace, _PID, "a process id is a whole number, 0 to 2^32 − 1")
        b = _whole("--pid", host, _PID, "a process id is a whole number, 0 to 2^32 − 1")
        if out.get(a, b) != b:
            raise UsageError(f"--pid gives trace process {a} two host ids ({out[a]}, {b}): give it one")
        out[a] = b
    return out


def _spans(path_spans: str, ranges: RangeTable, operators: RangeTable) -> RangeTable:
    if path_spans == "ranges":
        return ranges
    if path_spans == "operators":
        return operators
    both = RangeTable()
    both.extend(ranges)
    both.extend(operators)
    return both


def kernel_events(
    kernels: KernelTable,
    spans: RangeTable,
    node: str,
    source: str,
    uuids: dict[int, str],
    pids: dict[int, int],
    notes: Counter,
) -> Iterator[KernelActivity]:
    """Each kernel of one file as an event, in order of start (then device, stream, correlation id): its path the
    names of ``spans`` open on its launching thread at its launch (``range_paths``, the rule of ``gpucost
    kernels``), cut to its outermost ``MAX_RANGE_DEPTH``; its GPU ``uuids``' or ``<node>/<device>``; its pid as
    ``pids`` map it. A kernel of pid 0 (no launch in the trace names its process) is left out, counted in
    ``notes``: it would bill a process of the node that never ran it."""
    pid, tid, launch_ns = (kernels.column(c) for c in ("pid", "launch_tid", "launch_ns"))
    span_table, _, threads = launch_spans(spans, node, pid, tid)
    paths, _ = range_paths(threads, launch_ns, span_table)
    del span_table, threads
    columns = {c: kernels.column(c) for c in ("device", "category", "name", "start_ns", "end_ns", "bytes")}
    columns |= {"correlation": kernels.column("correlation"), "stream": kernels.column("stream")}
    order = np.lexsort((columns["correlation"], columns["stream"], columns["device"], columns["start_ns"]))
    names = kernels.names.values
    for i in order.tolist():
        if pid[i] == 0:
            notes["kernels left out: no launch in the trace names their process (pid 0)"] += 1
            continue
        path = paths[i]
        if len(path) > MAX_RANGE_DEPTH:
            notes[f"range paths cut to their outermost {MAX_RANGE_DEPTH} levels"] += 1
            path = path[:MAX_RANGE_DEPTH]
        device, launch = int(columns["device"][i]), int(launch_ns[i])
        size = int(columns["bytes"][i])
        yield KernelActivity(
            node_id=node,
            pid=pids.get(int(pid[i]), int(pid[i])),
            gpu_uuid=uuids.get(device, f"{node}/{device}"),
            device=device,
            stream=int(columns["stream"][i]),
            correlation_id=int(columns["correlation"][i]),
            category=KERNEL_CATEGORIES[columns["category"][i]],
            name=names[columns["name"][i]],
            start_ns=int(columns["start_ns"][i]),
            end_ns=int(columns["end_ns"][i]),
            launch_tid=None if launch < 0 else int(tid[i]),
            launch_ns=None if launch < 0 else launch,
            bytes=None if size < 0 else size,
            range_path=path or None,
            source=source,  # type: ignore[arg-type]  # trace_source's two kinds are Source's
        )


def cmd_trace_events(args: argparse.Namespace) -> int:
    if args.paths not in PATH_SPANS:  # argparse checks a flag's choices, not its variable's
        raise UsageError(f"GPUCOST_TRACE_PATHS {args.paths!r}: give one of {', '.join(PATH_SPANS)}")
    if not args.node_id or len(args.node_id) > 256:
        raise UsageError(
            "trace-events needs --node-id (or GPUCOST_NODE_ID), 1 to 256 characters: the node the traces were taken "
            "on, as the fleet's samples name it, since a kernel's tenant is its process's binding on that node"
        )
    node, uuids, pids = args.node_id, _uuids(args.gpu_uuid), _pids(args.pid)
    devices: set[int] = set()
    counts, notes, rejected = Counter(), Counter(), Counter()
    with _Output(args.out) as out:
        for path, label in zip(args.files, trace_labels(args.files)):
            kernels, ranges, operators, _, bad = read_readable(path, node)
            rejected.update({f"{label}: {reason}": n for reason, n in bad.items()})
            spans = _spans(args.paths, ranges, operators)
            for event in kernel_events(kernels, spans, node, trace_source(path), uuids, pids, notes):
                out.write(encode_event(event) + "\n")
                devices.add(event.device)
                counts["kernel_activity"] += 1
                counts["with_range_path"] += event.range_path is not None
            del kernels, ranges, operators, spans
    summary = {
        "out": args.out,
        "events": dict(counts),
        "devices": {str(d): uuids.get(d, f"{node}/{d}") for d in sorted(devices)},
        "left_out": dict(notes),
        "rejected": dict(sorted(rejected.items())),
        "warnings": [
            f"device {d} has no --gpu-uuid: its kernels carry gpu_uuid {node}/{d}, which bills no one unless the "
            "fleet's samples name the GPU so"
            for d in sorted(devices - uuids.keys())
        ],
    }
    print(json.dumps({"trace_events": summary}), file=sys.stderr)
    return 0


class _Output:
    """The file ``--out`` names, or standard output for ``-``; a file is written whole or not at all (a temporary
    file renamed at the end), so a refused trace leaves no half-written events behind."""

    def __init__(self, out: str) -> None:
        self._out = out
        self._tmp = None if out == "-" else Path(f"{out}.tmp-{os.getpid()}")

    def __enter__(self) -> IO[str]:
        if self._tmp is None:
            return sys.stdout
        try:
            self._f = self._tmp.open("w", encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"--out {self._out}: cannot be written ({exc.strerror}); give a writable path") from None
        return self._f

    def __exit__(self, kind, *_: object) -> None:
        if self._tmp is None:
            sys.stdout.flush()
            return
        self._f.close()
        if kind is None:
            os.replace(self._tmp, self._out)
        else:
            self._tmp.unlink(missing_ok=True)


TRACE_EVENTS = Command(
    "trace-events",
    "write profiler traces' kernels (Kineto JSON, nsys SQLite) as kernel_activity events with their range paths, "
    "for replay or produce",
    _arguments,
    cmd_trace_events,
)
