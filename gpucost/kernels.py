"""``gpucost kernels FILE…``: what each kernel, host range and PyTorch operator cost, from profiler traces alone
(no fleet).

Figures follow docs/definitions.md, section "Kernel cost"; the split rules are in ``streams.kernel_split``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation
from pathlib import Path

import numpy as np

from gpucost.command import Command
from gpucost.flags import env_flag
from gpucost.kernel_words import print_text, say_notes, unknown_model
from gpucost.producers.kernel_table import KernelTable, OperatorTable, RangeTable
from gpucost.schemas.events import MAX_USD_PER_GPU_HOUR
from gpucost.schemas.exact import micro_usd_per_hour
from gpucost.schemas.kernels import KERNEL_CATEGORIES, AnnotationRange, KernelActivity
from gpucost.streams.kernel_split import (
    Spans,
    busy_shares,
    device_cost,
    range_paths,
    split_by_name,
    split_tree,
    sums_by,
)
from gpucost.streams.kernel_work import operator_work, peaks, whatif_bill, work_row
from gpucost.trace_files import read_traces
from gpucost.wiring import UsageError

__all__ = ["KERNELS", "NO_OPERATOR", "cmd_kernels", "kernel_report", "launch_spans"]

_COMPUTE = ("kernel", "communication")  # what makes a GPU busy; memcpy and memset are transfers, apart
# the operator path of kernels launched in no cpu_op (or whose launch is not in the trace): named, so that the
# operators' top level sums to the device as the kernels' does
NO_OPERATOR = "(no operator)"


#: the price flags' environment variables, which their refusals name too
_PRICE_VARIABLES = {
    "--usd-per-gpu-hour": "GPUCOST_KERNELS_USD_PER_GPU_HOUR",
    "--whatif-usd-per-gpu-hour": "GPUCOST_KERNELS_WHATIF_USD_PER_GPU_HOUR",
}


def _kernels_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="+", type=Path, metavar="FILE", help="Kineto JSON (.json, .json.gz) or nsys .sqlite")
    env_flag(
        p,
        "--usd-per-gpu-hour",
        _PRICE_VARIABLES["--usd-per-gpu-hour"],
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
    env_flag(
        p,
        "--whatif-gpu",
        "GPUCOST_KERNELS_WHATIF_GPU",
        str,
        None,
        "a GPU model of the platform table to re-time the GEMM operators on by the roofline, and bill the device "
        "as if it had run there (each device's 'whatif')",
    )
    env_flag(
        p,
        "--whatif-usd-per-gpu-hour",
        _PRICE_VARIABLES["--whatif-usd-per-gpu-hour"],
        str,
        None,
        "the price of a GPU hour of --whatif-gpu (unset: --usd-per-gpu-hour's)",
    )
    p.add_argument("--format", choices=("json", "text"), default="json", help="the report as JSON (default) or text")


def kernel_report(
    kernels: KernelTable | list[KernelActivity],
    ranges: RangeTable | list[AnnotationRange],
    models: dict,
    micro_per_hour: int,
    operators: OperatorTable | Sequence[AnnotationRange] = (),
    gpu_model: str | None = None,
    whatif: tuple[str, int] | None = None,
) -> dict:
    """The ``devices`` figures of docs/definitions.md "Kernel cost", keyed by (node, device), in key order;
    without ``operators`` every kernel is in the ``(no operator)`` party. ``gpu_model`` names the GPU of a device
    whose trace names none (the peaks of its operators' work are read for it); ``whatif``, a GPU model and its price
    in µ$ an hour, adds each device's bill had its GEMM operators run there."""
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
        devices.append(_device(key, kernels, rows, (ranges, operators), model, micro_per_hour, whatif))
    return {"devices": devices}


def launch_spans(rt: RangeTable, node: str, pid: np.ndarray, tid: np.ndarray) -> tuple[Spans, np.ndarray, np.ndarray]:
    """The spans of ``rt`` on ``node`` in the processes that launched the device's kernels, as columns, their rows
    in ``rt``, and the kernels' launching threads (``pid``, ``tid``) as codes of the spans' ``tid`` column: a
    thread is its process and its id, since two processes have threads of the same number."""
    in_node = rt.column("node") == (rt.nodes.index(node) if node in rt.nodes.values else -1)
    at = np.flatnonzero(in_node & np.isin(rt.column("pid"), pid))
    spans, launches = np.column_stack([rt.column("pid")[at], rt.column("tid")[at]]), np.column_stack([pid, tid])
    _, codes = np.unique(np.concatenate([spans, launches]), axis=0, return_inverse=True)
    codes = codes.reshape(-1).astype(np.int64)
    columns = (rt.column(c)[at] for c in ("name", "start_ns", "end_ns"))
    return Spans(codes[: len(at)], *columns, names=rt.names.values), at, codes[len(at) :]


def _tree(
    busy: int, micro: int, paths: list[tuple[str, ...]], shares: np.ndarray
) -> dict[tuple[str, ...], tuple[int, int]]:
    """Busy ns and µ$ of every path (``split_tree``), the shares summed by path as columns."""
    index: dict[tuple[str, ...], int] = {}
    codes = np.fromiter((index.setdefault(p, len(index)) for p in paths), dtype=np.int64, count=len(paths))
    return split_tree(busy, micro, dict(zip(index, sums_by(codes, shares, len(index)))))


def _listed(tree: dict[tuple[str, ...], tuple[int, int]]) -> list[dict]:
    """A tree's paths, largest µ$ first, as the report lists them."""
    return [
        {"path": "/".join(p), "busy_ns": tree[p][0], "cost_micro_usd": tree[p][1]}
        for p in sorted(tree, key=lambda p: (-tree[p][1], -tree[p][0], p))
        if p
    ]


def _device(
    key,
    kt: KernelTable,
    rows: np.ndarray,
    spans: tuple[RangeTable, OperatorTable],
    model,
    micro_per_hour: int,
    whatif: tuple[str, int] | None,
) -> dict:
    names = kt.names.values
    compute_codes = [KERNEL_CATEGORIES.index(c) for c in _COMPUTE]
    is_compute = np.isin(kt.column("category")[rows], compute_codes)
    compute = rows[is_compute]
    start, end = kt.column("start_ns")[compute], kt.column("end_ns")[compute]
    busy, denominator, shares = busy_shares(start, end)
    micro = device_cost(busy, micro_per_hour)
    used, by_code = np.unique(kt.column("name")[compute], return_inverse=True)
    by_code = by_code.reshape(-1)
    by_name = dict(zip((names[u] for u in used.tolist()), sums_by(by_code, shares, len(used))))
    calls = np.bincount(by_code, minlength=len(used)).tolist()
    category = np.zeros(len(used), dtype=np.int64)
    category[by_code] = kt.column("category")[compute]  # a compute kernel's category follows from its name
    ns, mu = split_by_name(busy, by_name), split_by_name(micro, by_name)
    kernels = sorted(
        (
            {"name": n, "category": KERNEL_CATEGORIES[c], "calls": k, "busy_ns": ns[n], "cost_micro_usd": mu[n]}
            for n, c, k in zip(by_name, category.tolist(), calls)
        ),
        key=lambda r: (-r["cost_micro_usd"], -r["busy_ns"], r["name"]),
    )
    pid, tid, launch_ns = (kt.column(c)[compute] for c in ("pid", "launch_tid", "launch_ns"))
    range_spans, _, threads = launch_spans(spans[0], key[0], pid, tid)
    ranges, _ = range_paths(threads, launch_ns, range_spans)
    op_spans, op_rows, threads = launch_spans(spans[1], key[0], pid, tid)
    operators, innermost = range_paths(threads, launch_ns, op_spans)
    del op_spans, range_spans
    paths = [p or (NO_OPERATOR,) for p in operators]
    op_tree = _tree(busy, micro, paths, shares)
    ot = spans[1]
    work, work_paths = operator_work(
        paths,
        np.where(innermost >= 0, op_rows[np.maximum(innermost, 0)] if len(op_rows) else -1, -1),
        launch_ns,
        end - start,
        ot.column("flops"),
        ot.column("bytes"),
        ot.column("precision"),
    )
    window = int(end.max() - start.min()) if compute.size else 0
    transfers: dict[tuple[str, str], list[int]] = {}
    others = rows[~is_compute]
    for c, n, s, e, b in zip(
        *(kt.column(col)[others].tolist() for col in ("category", "name", "start_ns", "end_ns", "bytes"))
    ):
        t = transfers.setdefault((KERNEL_CATEGORIES[c], names[n]), [0, 0, 0])
        t[0] += 1
        t[1] += e - s
        t[2] += max(b, 0)
    work_rows = {p: work_row("/".join(p), w, model, *op_tree[p]) for p, w in work.items()}
    out = {
        "device": {"node": key[0], "device": key[1]},
        "gpu_model": model,
        "busy_ns": busy,
        "window_ns": window,
        "cost_micro_usd": micro,
        "launch_gaps": {"idle_ns": window - busy, "cost_micro_usd": device_cost(window, micro_per_hour) - micro},
        "kernels": kernels,
        "ranges": _listed(_tree(busy, micro, ranges, shares)),
        "operators": _listed(op_tree),
        "work": sorted(work_rows.values(), key=lambda r: (-r["cost_micro_usd"], -r["busy_ns"], r["path"])),
        "transfers": [
            {"category": c, "name": n, "calls": v[0], "duration_ns": v[1], "bytes": v[2]}
            for (c, n), v in sorted(transfers.items())
        ],
    }
    if whatif is not None:
        out["whatif"] = whatif_bill(whatif, model, work_rows, work_paths, shares, denominator)
    return out


def _micro_per_hour(flag: str, text: str) -> int:
    """A price flag's µ$ an hour; a usage error that says what is wrong, naming the flag and its variable."""
    flag = f"{flag} (or {_PRICE_VARIABLES[flag]})"
    try:
        price = Decimal(text)
        if not price.is_finite() or not 0 <= price < MAX_USD_PER_GPU_HOUR:
            raise ValueError(f"a price is a finite number of dollars, 0 or more and under {MAX_USD_PER_GPU_HOUR:,}")
        return micro_usd_per_hour(price)
    except InvalidOperation:  # its text is a list of decimal's internal classes, no use to a person
        raise UsageError(f"{flag} {text!r} is not a number; give a price such as 2.5") from None
    except ValueError as exc:
        raise UsageError(f"{flag} {text!r}: {exc}; give a price such as 2.5") from None


def cmd_kernels(args: argparse.Namespace) -> int:
    micro_per_hour = _micro_per_hour("--usd-per-gpu-hour", args.usd_per_gpu_hour)
    whatif = None
    if args.whatif_usd_per_gpu_hour is not None and not args.whatif_gpu:
        raise UsageError("--whatif-usd-per-gpu-hour prices the part of --whatif-gpu: give that part too")
    if args.whatif_gpu:
        if unknown_model(args.whatif_gpu) or peaks(args.whatif_gpu, None)[1] is None:
            raise UsageError(
                f"--whatif-gpu {args.whatif_gpu!r}: the platform table (gpucost/schemas/platforms.toml) has no peak "
                "and bandwidth for it; give a part it has, such as H100, H200, A100 or L4"
            )
        price = args.usd_per_gpu_hour if args.whatif_usd_per_gpu_hour is None else args.whatif_usd_per_gpu_hour
        whatif = args.whatif_gpu, _micro_per_hour("--whatif-usd-per-gpu-hour", price)
    kernels, ranges, operators, models, rejected = read_traces(args.files)
    report = kernel_report(kernels, ranges, models, micro_per_hour, operators, args.gpu_model or None, whatif)
    say_notes(report, args.gpu_model)
    report["rejected"] = dict(sorted(rejected.items()))
    if args.format == "json":
        print(json.dumps(report, indent=1))
    else:
        print_text(report)
    return 0


KERNELS = Command(
    "kernels",
    "cost per kernel, host range and PyTorch operator from PyTorch profiler (Kineto) traces and Nsight Systems "
    "SQLite exports alone",
    _kernels_arguments,
    cmd_kernels,
)
