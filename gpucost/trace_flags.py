"""The flags of ``gpucost trace-events`` and what they are checked against: the node, the trace's devices named as
the fleet's samples name them, a container's pids as the host's, and what a kernel's range path is made of.

Each falls back to an environment variable, and each is refused with what to give where it would put a kernel on
the wrong GPU or process: two devices on one UUID would stack two GPUs' kernels on one, two trace pids on one host
pid would merge two processes, and host pid 0 is no process.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

from gpucost.env_flags import env_flag
from gpucost.wiring import UsageError

__all__ = ["PATH_SPANS", "TraceFlags", "add_trace_flags", "trace_flags"]

#: which host spans make a kernel's range path: ``user_annotation`` / NVTX ranges, PyTorch ``cpu_op`` operators (as
#: ``torch.autograd.profiler.emit_nvtx`` would make them NVTX ranges), or both nested by time on the thread
PATH_SPANS = ("ranges", "operators", "both")
#: a node id leaves room for the fallback GPU id ``<node>/<device>`` (device < 1024) within an id's 256 characters
NODE_MAX_CHARS = 251
_PID_MAX = 2**32


def add_trace_flags(p: argparse.ArgumentParser) -> None:
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
        f"the node the traces were taken on, as the fleet's samples name it, 1 to {NODE_MAX_CHARS} characters; "
        "required",
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
    env_flag(
        p,
        "--paths",
        "GPUCOST_TRACE_PATHS",
        str,
        "ranges",
        f"what a kernel's range_path is made of: the ranges open on its launching thread at its launch (NVTX, "
        f"record_function), the PyTorch operators open there, or both: one of {', '.join(PATH_SPANS)}",
    )


@dataclass(frozen=True)
class TraceFlags:
    """The checked flags: the node, each device index's UUID, each trace pid's host pid, and ``PATH_SPANS``' one."""

    node: str
    uuids: dict[int, str]
    pids: dict[int, int]
    paths: str


def trace_flags(args: argparse.Namespace) -> TraceFlags:
    if args.paths not in PATH_SPANS:  # argparse checks a flag's choices, not its variable's: checked here for both
        raise UsageError(f"--paths (or GPUCOST_TRACE_PATHS) {args.paths!r}: give one of {', '.join(PATH_SPANS)}")
    if not args.node_id or len(args.node_id) > NODE_MAX_CHARS:
        raise UsageError(
            f"trace-events needs --node-id (or GPUCOST_NODE_ID), 1 to {NODE_MAX_CHARS} characters: the node the "
            "traces were taken on, as the fleet's samples name it, since a kernel's tenant is its process's binding "
            "on that node"
        )
    return TraceFlags(args.node_id, _uuids(args.gpu_uuid), _pids(args.pid), args.paths)


def _pairs(flag: str, given: list[str] | None, env: str, example: str) -> list[tuple[str, str]]:
    """``A=B`` pairs from a repeated flag, or its variable's comma-separated list."""
    items = given if given is not None else [w for w in os.environ.get(env, "").split(",") if w.strip()]
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise UsageError(f"{flag} (or {env}) {item!r} is not KEY=VALUE; give one such as {flag} {example}")
        out.append((key.strip(), value.strip()))
    return out


def _whole(flag: str, text: str, below: int, what: str) -> int:
    """``text`` as a whole number from 0 to ``below`` − 1, or a usage error saying ``what`` it is."""
    value = int(text) if text.isascii() and text.isdigit() else -1  # not int()'s "+5" or "1_000"
    if not 0 <= value < below:
        raise UsageError(f"{flag} {text!r}: {what}")
    return value


def _uuids(given: list[str] | None) -> dict[int, str]:
    out: dict[int, str] = {}
    for device, uuid in _pairs("--gpu-uuid", given, "GPUCOST_TRACE_GPU_UUIDS", "0=GPU-8a1f…"):
        index = _whole("--gpu-uuid", device, 1024, "the device is the trace's index, 0 to 1023, such as 0")
        if len(uuid) > 256:
            raise UsageError(f"--gpu-uuid {uuid[:40]!r}…: a UUID is 1 to 256 characters")
        _one_to_one(out, index, uuid, "--gpu-uuid", ("device", "UUIDs", "devices", "their kernels would be one GPU's"))
    return out


def _pids(given: list[str] | None) -> dict[int, int]:
    out: dict[int, int] = {}
    for trace, host in _pairs("--pid", given, "GPUCOST_TRACE_PIDS", "4242=1873104"):
        a = _whole("--pid", trace, _PID_MAX, "a process id is a whole number, 0 to 2^32 − 1")
        b = _whole("--pid", host, _PID_MAX, "a process id is a whole number, 0 to 2^32 − 1")
        if b == 0:
            raise UsageError(f"--pid {trace}={host}: host pid 0 is no process; give the host's pid of the traced job")
        _one_to_one(out, a, b, "--pid", ("trace process", "host pids", "trace processes", "they would be one process"))
    return out


def _one_to_one(out: dict, key: object, value: object, flag: str, words: tuple[str, str, str, str]) -> None:
    """``out[key] = value``, refused where ``key`` already has another value or ``value`` another key: a mapping of
    the trace's names onto the fleet's must keep two apart (``words``: a key, values, keys, what merging does)."""
    one, values, keys, merged = words
    if out.get(key, value) != value:
        raise UsageError(f"{flag} gives {one} {key} two {values} ({out[key]}, {value}): give it one")
    if (other := next((k for k, v in out.items() if v == value and k != key), None)) is not None:
        raise UsageError(
            f"{flag} gives {keys} {other} and {key} one {values[:-1]} ({value}): {merged}; give each its own"
        )
    out[key] = value
