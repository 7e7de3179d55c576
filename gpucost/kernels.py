"""``gpucost kernels FILE…``: what each kernel, host range and PyTorch operator cost, from profiler traces alone
(no fleet).

Figures follow docs/definitions.md, section "Kernel cost"; the split rules are in ``streams.kernel_split``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation
from pathlib import Path

import numpy as np

from gpucost.command import Command
from gpucost.flags import env_flag
from gpucost.producers.kernel_table import KernelTable, OperatorTable, RangeTable
from gpucost.producers.kineto import read_kineto
from gpucost.producers.nsys import read_nsys
from gpucost.schemas.exact import micro_usd_per_hour
from gpucost.schemas.kernels import KERNEL_CATEGORIES, AnnotationRange, KernelActivity
from gpucost.streams.kernel_split import (
    Interval,
    Spans,
    busy_shares,
    device_cost,
    range_paths,
    split_by_name,
    split_tree,
)
from gpucost.streams.kernel_work import PRECISIONS, operator_work, peaks, work_row
from gpucost.wiring import UsageError

__all__ = ["KERNELS", "NO_OPERATOR", "cmd_kernels", "kernel_report", "read_trace"]

_COMPUTE = ("kernel", "communication")  # what makes a GPU busy; memcpy and memset are transfers, apart
# the operator path of kernels launched in no cpu_op (or whose launch is not in the trace): named, so that the
# operators' top level sums to the device as the kernels' does
NO_OPERATOR = "(no operator)"


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
    env_flag(
        p,
        "--gpu-model",
        "GPUCOST_KERNELS_GPU_MODEL",
        str,
        None,
        "the GPU model of devices whose trace names none (Kineto writes deviceProperties only since 2023): the "
        "platform table's peaks for the operators' EFU are read for it",
    )
    p.add_argument("--format", choices=("json", "text"), default="json")


def read_trace(path: Path) -> tuple[KernelTable, RangeTable, OperatorTable, dict, Counter]:
    """One file's kernels, ranges, operators, GPU models by (node, device) and rejects; the kind is read from its
    first bytes. Nsight Systems exports have no PyTorch operators: their table is empty."""
    with path.open("rb") as f:
        magic = f.read(16)
    if magic.startswith(b"SQLite format 3"):
        t = read_nsys(path)
        models = {(t.node_id, d): m for d, m in t.gpu_models.items()}
        return KernelTable.of(t.kernels), RangeTable.of(t.ranges), OperatorTable(), models, t.rejected
    k = read_kineto(path)
    return k.kernels, k.ranges, k.operators, {(path.name, d): m for d, m in k.gpu_models.items()}, k.rejected


def kernel_report(
    kernels: KernelTable | list[KernelActivity],
    ranges: RangeTable | list[AnnotationRange],
    models: dict,
    micro_per_hour: int,
    operators: OperatorTable | Sequence[AnnotationRange] = (),
    gpu_model: str | None = None,
) -> dict:
    """The ``devices`` figures of docs/definitions.md "Kernel cost", keyed by (node, device), in key order;
    without ``operators`` every kernel is in the ``(no operator)`` party. ``gpu_model`` names the GPU of a device
    whose trace names none (the peaks of its operators' work are read for it)."""
    if not isinstance(kernels, KernelTable):
        kernels = KernelTable.of(kernels)
    if not isinstance(ranges, RangeTable):
        ranges = RangeTable.of(ranges)
    if not isinstance(operators, OperatorTable):
        operators = OperatorTable.of(operators)
    node, device = kernels.column("node"), kernels.column("device")
    keys = sorted({(kernels.nodes.values[n], d) for n, d in set(zip(node.tolist(), device.tolist()))})
    devices = []
    for key in keys:
        rows = np.flatnonzero((node == kernels.nodes.index(key[0])) & (device == key[1]))
        model = models.get(key) or gpu_model
        devices.append(_device(key, kernels, rows, (ranges, operators), model, micro_per_hour))
    return {"devices": devices}


def _spans(rt: RangeTable, node: str, pids: np.ndarray) -> tuple[Spans, np.ndarray]:
    """The spans of ``rt`` on ``node`` in the processes that launched the device's kernels, as columns, and
    their rows in ``rt``."""
    in_node = rt.column("node") == (rt.nodes.index(node) if node in rt.nodes.values else -1)
    at = np.flatnonzero(in_node & np.isin(rt.column("pid"), pids))
    return Spans(*(rt.column(c)[at] for c in ("tid", "name", "start_ns", "end_ns")), names=rt.names.values), at


def _tree(
    busy: int, micro: int, paths: list[tuple[str, ...]], shares: list[int]
) -> dict[tuple[str, ...], tuple[int, int]]:
    """Busy ns and µ$ of every path (``split_tree``)."""
    weights: dict[tuple[str, ...], int] = {}
    for path, s in zip(paths, shares):
        weights[path] = weights.get(path, 0) + s
    return split_tree(busy, micro, weights)


def _listed(tree: dict[tuple[str, ...], tuple[int, int]]) -> list[dict]:
    """A tree's paths, largest µ$ first, as the report lists them."""
    return [
        {"path": "/".join(p), "busy_ns": tree[p][0], "cost_micro_usd": tree[p][1]}
        for p in sorted(tree, key=lambda p: (-tree[p][1], -tree[p][0], p))
        if p
    ]


def _device(
    key, kt: KernelTable, rows: np.ndarray, spans: tuple[RangeTable, OperatorTable], model, micro_per_hour: int
) -> dict:
    names = kt.names.values
    compute_codes = [KERNEL_CATEGORIES.index(c) for c in _COMPUTE]
    is_compute = np.isin(kt.column("category")[rows], compute_codes)
    compute = rows[is_compute]
    name_of = kt.column("name")[compute].tolist()
    start, end = kt.column("start_ns")[compute].tolist(), kt.column("end_ns")[compute].tolist()
    ivs = [Interval(names[n], s, e) for n, s, e in zip(name_of, start, end)]
    busy, denominator, shares = busy_shares(ivs)
    del ivs
    micro = device_cost(busy, micro_per_hour)
    by_name: dict[str, int] = {}
    calls: Counter = Counter()
    category = {}
    for n, c, s in zip(name_of, kt.column("category")[compute].tolist(), shares):
        by_name[names[n]] = by_name.get(names[n], 0) + s
        calls[names[n]] += 1
        category[names[n]] = KERNEL_CATEGORIES[c]
    ns, mu = split_by_name(busy, by_name), split_by_name(micro, by_name)
    kernels = sorted(
        (
            {"name": n, "category": category[n], "calls": calls[n], "busy_ns": ns[n], "cost_micro_usd": mu[n]}
            for n in by_name
        ),
        key=lambda r: (-r["cost_micro_usd"], -r["busy_ns"], r["name"]),
    )
    pids = np.unique(kt.column("pid")[compute])
    launch = kt.column("launch_tid")[compute], kt.column("launch_ns")[compute]
    ranges, _ = range_paths(*launch, _spans(spans[0], key[0], pids)[0])
    op_spans, op_rows = _spans(spans[1], key[0], pids)
    operators, innermost = range_paths(*launch, op_spans)
    del op_spans
    paths = [p or (NO_OPERATOR,) for p in operators]
    op_tree = _tree(busy, micro, paths, shares)
    ot = spans[1]
    work = operator_work(
        paths,
        np.where(innermost >= 0, op_rows[np.maximum(innermost, 0)] if len(op_rows) else -1, -1),
        np.asarray(end, dtype=np.int64) - np.asarray(start, dtype=np.int64),
        ot.column("flops"),
        ot.column("bytes"),
        ot.column("precision"),
    )
    window = (max(end) - min(start)) if compute.size else 0
    transfers: dict[tuple[str, str], list[int]] = {}
    others = rows[~is_compute]
    for c, n, s, e, b in zip(
        *(kt.column(col)[others].tolist() for col in ("category", "name", "start_ns", "end_ns", "bytes"))
    ):
        t = transfers.setdefault((KERNEL_CATEGORIES[c], names[n]), [0, 0, 0])
        t[0] += 1
        t[1] += e - s
        t[2] += max(b, 0)
    return {
        "device": {"node": key[0], "device": key[1]},
        "gpu_model": model,
        "busy_ns": busy,
        "window_ns": window,
        "cost_micro_usd": micro,
        "launch_gaps": {"idle_ns": window - busy, "cost_micro_usd": device_cost(window, micro_per_hour) - micro},
        "kernels": kernels,
        "ranges": _listed(_tree(busy, micro, ranges, shares)),
        "operators": _listed(op_tree),
        "work": sorted(
            (work_row("/".join(p), w, model, *op_tree[p]) for p, w in work.items()),
            key=lambda r: (-r["cost_micro_usd"], -r["busy_ns"], r["path"]),
        ),
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
    except InvalidOperation:  # its text is a list of decimal's internal classes, no use to a person
        raise UsageError(
            f"--usd-per-gpu-hour {args.usd_per_gpu_hour!r} is not a number; give a price such as 2.5"
        ) from None
    except ValueError as exc:
        raise UsageError(f"--usd-per-gpu-hour {args.usd_per_gpu_hour!r}: {exc}; give a price such as 2.5") from None
    kernels, ranges, operators, models, rejected = KernelTable(), RangeTable(), RangeTable(), {}, Counter()
    for path in args.files:
        if not path.is_file():
            raise UsageError(f"{path}: no such file; give Kineto JSON traces or nsys SQLite exports")
        try:
            k, r, o, m, bad = read_trace(path)
        except Exception as exc:  # a file that is neither format: say which and why, no traceback
            why = " ".join(str(exc).split()).removesuffix(" (right here) ------^")  # one line: ijson draws a caret
            raise UsageError(
                f"{path}: not a Kineto trace or nsys SQLite export ({type(exc).__name__}: {why})"
            ) from None
        if len(kernels) or len(ranges) or len(operators):
            kernels.extend(k)
            ranges.extend(r)
            operators.extend(o)
        else:  # the first file's tables are taken as they are, not copied
            kernels, ranges, operators = k, r, o
        del k, r, o
        models |= m
        rejected.update({f"{path.name}: {reason}": n for reason, n in bad.items()})
    if args.gpu_model and not any(peaks(args.gpu_model, p) != (None, None) for p in PRECISIONS):
        print(
            f"gpucost kernels: --gpu-model {args.gpu_model!r} is in no row of the platform table "
            "(gpucost/schemas/platforms.toml): its operators get no peak and no EFU; give a name the table has, "
            "such as H100 or NVIDIA A100-SXM4-80GB",
            file=sys.stderr,
        )
    report = kernel_report(kernels, ranges, models, micro_per_hour, operators, args.gpu_model or None)
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
        for section in ("ranges", "operators"):
            for r in d[section][:20]:
                print(f"  {section[:-1]:<8} {r['cost_micro_usd']:>12} µ$ {r['busy_ns']:>14} ns  {r['path'][:100]}")
        for w in d["work"][:20]:
            print(
                f"  work     {w['cost_micro_usd']:>12} µ$ {w['calls']:>7}× {w['precision'] or 'mixed':<5} "
                f"{_rounded(w['achieved_tflops'], ' TFLOP/s')} EFU {_rounded(w['efu'])} "
                f"{w['bound'] or 'bound unknown'}  {w['path'][:100]}"
            )
    for reason, n in report.get("rejected", {}).items():
        print(f"read with a note or left out: {n} × {reason}", file=sys.stderr)


def _rounded(value: float | None, unit: str = "") -> str:
    return "n/a" if value is None else f"{value:.3g}{unit}"


KERNELS = Command(
    "kernels",
    "cost per kernel, host range and PyTorch operator from PyTorch profiler (Kineto) traces and Nsight Systems "
    "SQLite exports alone",
    _kernels_arguments,
    cmd_kernels,
)
