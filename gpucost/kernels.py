"""``gpucost kernels FILE…``: what each kernel and host range cost, from profiler traces alone (no fleet).

Figures follow docs/definitions.md, section "Kernel cost"; the split rules are in ``streams.kernel_split``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from decimal import Decimal, InvalidOperation
from pathlib import Path

from gpucost.command import Command
from gpucost.flags import env_flag
from gpucost.producers.kineto import read_kineto
from gpucost.producers.nsys import read_nsys
from gpucost.schemas.exact import micro_usd_per_hour
from gpucost.schemas.kernels import AnnotationRange, KernelActivity
from gpucost.streams.kernel_split import (
    Interval,
    Span,
    busy_shares,
    device_cost,
    range_paths,
    split_by_name,
    split_tree,
)
from gpucost.wiring import UsageError

__all__ = ["KERNELS", "cmd_kernels", "kernel_report", "read_trace"]

_COMPUTE = ("kernel", "communication")  # what makes a GPU busy; memcpy and memset are transfers, apart


def _kernels_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="+", type=Path, metavar="FILE", help="Kineto JSON (.json, .json.gz) or nsys .sqlite")
    env_flag(
        p,
        "--usd-per-gpu-hour",
        "GPUCOST_KERNELS_USD_PER_GPU_HOUR",
        str,
        "0",
        "the price of one GPU hour of busy time, at most 6 decimal places",
    )
    p.add_argument("--format", choices=("json", "text"), default="json")


def read_trace(path: Path) -> tuple[list[KernelActivity], list[AnnotationRange], dict, Counter]:
    """One file's kernels, ranges, GPU models by (node, device) and rejects; the kind is read from its first bytes."""
    with path.open("rb") as f:
        magic = f.read(16)
    if magic.startswith(b"SQLite format 3"):
        t = read_nsys(path)
        return t.kernels, t.ranges, {(t.node_id, d): m for d, m in t.gpu_models.items()}, t.rejected
    t = read_kineto(path)
    return t.kernels, t.ranges, {(path.name, d): m for d, m in t.gpu_models.items()}, t.rejected


def kernel_report(
    kernels: list[KernelActivity], ranges: list[AnnotationRange], models: dict, micro_per_hour: int
) -> dict:
    """The ``devices`` figures of docs/definitions.md "Kernel cost", keyed by (node, device), in key order."""
    by_device: dict[tuple[str, int], list[KernelActivity]] = {}
    for k in kernels:
        by_device.setdefault((k.node_id, k.device), []).append(k)
    devices = []
    for key in sorted(by_device):
        devices.append(
            _device(key, by_device[key], [r for r in ranges if r.node_id == key[0]], models.get(key), micro_per_hour)
        )
    return {"devices": devices}


def _device(key, acts: list[KernelActivity], ranges: list[AnnotationRange], model, micro_per_hour: int) -> dict:
    compute = [k for k in acts if k.category in _COMPUTE]
    ivs = [Interval(k.name, k.start_ns, k.end_ns, k.launch_tid, k.launch_ns) for k in compute]
    busy, denominator, shares = busy_shares(ivs)
    micro = device_cost(busy, micro_per_hour)
    by_name: dict[str, int] = {}
    calls: Counter = Counter()
    category = {}
    for k, s in zip(compute, shares):
        by_name[k.name] = by_name.get(k.name, 0) + s
        calls[k.name] += 1
        category[k.name] = k.category
    ns, mu = split_by_name(busy, by_name), split_by_name(micro, by_name)
    kernels = sorted(
        (
            {"name": n, "category": category[n], "calls": calls[n], "busy_ns": ns[n], "cost_micro_usd": mu[n]}
            for n in by_name
        ),
        key=lambda r: (-r["cost_micro_usd"], -r["busy_ns"], r["name"]),
    )
    pids = {k.pid for k in compute}
    spans = [Span(r.tid, r.name, r.start_ns, r.end_ns) for r in ranges if r.pid in pids]
    weights: dict[tuple[str, ...], int] = {}
    for path, s in zip(range_paths(ivs, spans), shares):
        weights[path] = weights.get(path, 0) + s
    tree = split_tree(busy, micro, weights)
    window = (max(k.end_ns for k in compute) - min(k.start_ns for k in compute)) if compute else 0
    transfers: dict[tuple[str, str], list[int]] = {}
    for k in acts:
        if k.category not in _COMPUTE:
            t = transfers.setdefault((k.category, k.name), [0, 0, 0])
            t[0] += 1
            t[1] += k.end_ns - k.start_ns
            t[2] += k.bytes or 0
    return {
        "device": {"node": key[0], "device": key[1]},
        "gpu_model": model,
        "busy_ns": busy,
        "window_ns": window,
        "cost_micro_usd": micro,
        "launch_gaps": {"idle_ns": window - busy, "cost_micro_usd": device_cost(window, micro_per_hour) - micro},
        "kernels": kernels,
        "ranges": [
            {"path": "/".join(p), "busy_ns": tree[p][0], "cost_micro_usd": tree[p][1]}
            for p in sorted(tree, key=lambda p: (-tree[p][1], -tree[p][0], p))
            if p
        ],
        "transfers": [
            {"category": c, "name": n, "calls": v[0], "duration_ns": v[1], "bytes": v[2]}
            for (c, n), v in sorted(transfers.items())
        ],
    }


def cmd_kernels(args: argparse.Namespace) -> int:
    try:
        price = Decimal(args.usd_per_gpu_hour)
        if not price.is_finite() or price < 0:
            raise ValueError("a price is a finite number of dollars, 0 or more")
        micro_per_hour = micro_usd_per_hour(price)
    except (InvalidOperation, ValueError) as exc:
        raise UsageError(f"--usd-per-gpu-hour {args.usd_per_gpu_hour!r}: {exc}; give a price such as 2.5") from None
    kernels, ranges, models, rejected = [], [], {}, Counter()
    for path in args.files:
        if not path.is_file():
            raise UsageError(f"{path}: no such file; give Kineto JSON traces or nsys SQLite exports")
        try:
            k, r, m, bad = read_trace(path)
        except Exception as exc:  # a file that is neither format: say which and why, no traceback
            raise UsageError(
                f"{path}: not a Kineto trace or nsys SQLite export ({type(exc).__name__}: {exc})"
            ) from None
        kernels += k
        ranges += r
        models |= m
        rejected.update({f"{path.name}: {reason}": n for reason, n in bad.items()})
    report = kernel_report(kernels, ranges, models, micro_per_hour)
    report["rejected"] = dict(sorted(rejected.items()))
    if args.format == "json":
        print(json.dumps(report, indent=1))
    else:
        _print_text(report)
    return 0


def _print_text(report: dict) -> None:
    for d in report["devices"]:
        print(
            f"{d['device']['node']} GPU {d['device']['device']} ({d['gpu_model'] or 'model unknown'}): busy "
            f"{d['busy_ns']} ns of {d['window_ns']} ns, {d['cost_micro_usd']} µ$; launch gaps "
            f"{d['launch_gaps']['idle_ns']} ns, {d['launch_gaps']['cost_micro_usd']} µ$"
        )
        for k in d["kernels"][:20]:
            print(
                f"  {k['cost_micro_usd']:>12} µ$ {k['busy_ns']:>14} ns {k['calls']:>7}× {k['category']:<13} "
                f"{k['name'][:100]}"
            )
        for r in d["ranges"][:20]:
            print(f"  range {r['cost_micro_usd']:>12} µ$ {r['busy_ns']:>14} ns  {r['path'][:100]}")
    for reason, n in report.get("rejected", {}).items():
        print(f"read with a note or left out: {n} × {reason}", file=sys.stderr)


KERNELS = Command(
    "kernels",
    "cost per kernel and per host range from PyTorch profiler (Kineto) traces and Nsight Systems SQLite exports alone",
    _kernels_arguments,
    cmd_kernels,
)
