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
import contextlib
import json
import os
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from gpucost.command import Command
from gpucost.kernels import launch_spans
from gpucost.output_files import write_whole
from gpucost.producers.kernel_table import KernelTable, RangeTable
from gpucost.schemas.codec import encode_event
from gpucost.schemas.kernels import KERNEL_CATEGORIES, MAX_RANGE_DEPTH, KernelActivity
from gpucost.streams.kernel_split import range_paths
from gpucost.trace_files import read_readable, trace_labels, trace_source
from gpucost.trace_flags import TraceFlags, add_trace_flags, trace_flags
from gpucost.wiring import UsageError

__all__ = ["TRACE_EVENTS", "Summary", "cmd_trace_events", "kernel_events"]


class Summary:
    """What the command wrote and left out, for the line it prints on stderr: events by kind, the devices and trace
    pids their kernels came from, what was left out or cut, what the readers refused or noted, and warnings."""

    def __init__(self, flags: TraceFlags) -> None:
        self.flags = flags
        self.events: Counter = Counter()
        self.devices: set[int] = set()
        self.trace_pids: set[int] = set()
        self.left_out: Counter = Counter()
        self.rejected: Counter = Counter()

    def count(self, event: KernelActivity) -> None:
        self.events["kernel_activity"] += 1
        self.events["with_range_path"] += event.range_path is not None
        self.devices.add(event.device)

    def warnings(self) -> list[str]:
        node, uuids, pids = self.flags.node, self.flags.uuids, self.flags.pids
        said = [
            f"device {d} has no --gpu-uuid: its kernels carry gpu_uuid {node}/{d}, which bills no one unless the "
            "fleet's samples name the GPU so"
            for d in sorted(self.devices - uuids.keys())
        ]
        said += [
            f"--gpu-uuid {d}={uuids[d]}: no kernel of device {d} in the traces"
            for d in sorted(uuids.keys() - self.devices)
        ]
        said += [
            f"--pid {p}={pids[p]}: no kernel of process {p} in the traces"
            for p in sorted(pids.keys() - self.trace_pids)
        ]
        said += [  # a host pid that is also a trace pid left as it is: two processes written as one
            f"--pid {p}={pids[p]}: the traces have a process {pids[p]} too, not mapped: both are written as that pid"
            for p in sorted(pids)
            if pids[p] in self.trace_pids - pids.keys()
        ]
        fallbacks = {f"{node}/{d}": d for d in self.devices - uuids.keys()}
        said += [  # a UUID given that is another device's fallback id: two GPUs written as one
            f"--gpu-uuid {d}={uuids[d]}: device {fallbacks[uuids[d]]} has no --gpu-uuid and falls back to that id: "
            "both are written as one GPU"
            for d in sorted(uuids)
            if uuids[d] in fallbacks
        ]
        if not self.events:
            said.append("no kernel_activity written: the traces hold no kernel this command could write (see left_out)")
        return said

    def as_json(self, out: str) -> dict:
        return {
            "out": out,
            "events": dict(self.events),
            "devices": {str(d): self.flags.uuids.get(d, f"{self.flags.node}/{d}") for d in sorted(self.devices)},
            "left_out": dict(self.left_out),
            "rejected": dict(sorted(self.rejected.items())),
            "warnings": self.warnings(),
        }


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
    kernels: KernelTable, spans: RangeTable, flags: TraceFlags, source: str, summary: Summary
) -> Iterator[KernelActivity]:
    """Each kernel of one file as an event, in order of start (then device, stream, correlation id): its path the
    names of ``spans`` open on its launching thread at its launch (``range_paths``, the rule of ``gpucost
    kernels``), cut to its outermost ``MAX_RANGE_DEPTH``; its GPU the flags' UUID or ``<node>/<device>``; its pid
    as the flags map it. A kernel of pid 0 (no launch in the trace names its process) is left out, counted in
    ``summary``: it would bill a process of the node that never ran it."""
    pid, tid, launch_ns = (kernels.column(c) for c in ("pid", "launch_tid", "launch_ns"))
    node, uuids, pids = flags.node, flags.uuids, flags.pids
    span_table, _, threads = launch_spans(spans, node, pid, tid)
    paths, _ = range_paths(threads, launch_ns, span_table)
    del span_table, threads
    columns = {c: kernels.column(c) for c in ("device", "category", "name", "start_ns", "end_ns", "bytes")}
    columns |= {"correlation": kernels.column("correlation"), "stream": kernels.column("stream")}
    order = np.lexsort((columns["correlation"], columns["stream"], columns["device"], columns["start_ns"]))
    names = kernels.names.values
    for i in order.tolist():
        if pid[i] == 0:
            summary.left_out["kernels left out: no launch in the trace names their process (pid 0)"] += 1
            continue
        path = paths[i]
        if len(path) > MAX_RANGE_DEPTH:
            summary.left_out[f"range paths cut to their outermost {MAX_RANGE_DEPTH} levels"] += 1
            path = path[:MAX_RANGE_DEPTH]
        device, launch, trace_pid = int(columns["device"][i]), int(launch_ns[i]), int(pid[i])
        summary.trace_pids.add(trace_pid)
        size = int(columns["bytes"][i])
        yield KernelActivity(
            node_id=node,
            pid=pids.get(trace_pid, trace_pid),
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
    flags = trace_flags(args)
    labels = trace_labels(args.files)  # refuses folders, missing files and a file given twice, before any is read
    out = None if args.out == "-" else Path(args.out)
    for path in args.files:
        if out is not None and out.exists() and os.path.samefile(out, path):
            raise UsageError(f"--out {out} is the trace {path}: writing the events there would destroy it")
    summary = Summary(flags)

    def write(target: Path | None) -> None:
        with target.open("w", encoding="utf-8") if target else contextlib.nullcontext(sys.stdout) as f:
            for path, label in zip(args.files, labels):
                kernels, ranges, operators, _, bad = read_readable(path, flags.node)
                summary.rejected.update({f"{label}: {reason}": n for reason, n in bad.items()})
                spans = _spans(flags.paths, ranges, operators)
                for event in kernel_events(kernels, spans, flags, trace_source(path), summary):
                    f.write(encode_event(event) + "\n")
                    summary.count(event)
                del kernels, ranges, operators, spans

    if out is None:
        write(None)
    else:
        write_whole(out, write, "--out")
    print(json.dumps({"trace_events": summary.as_json(args.out)}), file=sys.stderr)
    return 0


TRACE_EVENTS = Command(
    "trace-events",
    "write profiler traces' kernels (Kineto JSON, nsys SQLite) as kernel_activity events with their range paths, "
    "for replay or produce",
    add_trace_flags,
    cmd_trace_events,
)
