"""Work and efficiency per PyTorch operator path (docs/definitions.md, "Kernel cost", "Work and EFU per operator"),
pure: no I/O, no clock.

A GEMM operator call's FLOPs and least bytes (``gpucost.schemas.gemm``) are set against the GPU time of the kernels
it launched itself (those whose innermost open operator at launch is that call): the achieved rate, its share of
the device's peak at the call's precision (EFU) and of its memory bandwidth, and which of the two bounds it by the
roofline. Why per call and not per kernel: one ``aten::mm`` may launch a GEMM kernel and a reduction (split-K), and
its FLOPs belong to the call; a call is counted once however many kernels it launched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache
from typing import get_args

import numpy as np

from gpucost.schemas.devices import platforms
from gpucost.schemas.exact import div_half_even
from gpucost.schemas.gemm import Precision
from gpucost.streams.health import peak_tops
from gpucost.streams.kernel_split import NS_PER_HOUR

__all__ = ["PRECISIONS", "OperatorWork", "operator_work", "peaks", "retimed", "roofline_ns", "whatif_bill", "work_row"]

PRECISIONS: tuple[Precision, ...] = get_args(Precision)


@dataclass
class OperatorWork:
    """The sums of one operator path: calls with work, their FLOPs and bytes, their kernels' GPU ns, and the
    precisions met (one, for an EFU)."""

    calls: int = 0
    flops: int = 0
    bytes: int = 0
    kernel_ns: int = 0
    precisions: set[str] = field(default_factory=set)


@lru_cache(maxsize=256)
def peaks(gpu_model: str | None, precision: str | None) -> tuple[Fraction | None, Fraction | None]:
    """The platform table's dense peak TFLOPS at ``precision`` and memory GB/s for ``gpu_model``, found by the
    health audit's rule (the longest row name or alias the model contains, a partition's share of it); None for
    each the table does not give, never a guess."""
    if gpu_model is None:
        return None, None
    rows = platforms().items()
    found = []
    for figure in (precision, "mem_bw_gbps"):
        table: dict[str, object] = {"default": 0}
        if figure is not None:
            for name, row in rows:
                if figure in row:
                    table |= dict.fromkeys([name, *row.get("aliases", [])], Fraction(str(row[figure])))
        value = peak_tops(table, gpu_model)
        found.append(value if value else None)
    return found[0], found[1]


def operator_work(
    paths: list[tuple[str, ...]],
    calls: np.ndarray,
    launch_ns: np.ndarray,
    duration_ns: np.ndarray,
    flops: np.ndarray,
    moved: np.ndarray,
    precision: np.ndarray,
) -> tuple[dict[tuple[str, ...], OperatorWork], list[tuple[str, ...] | None]]:
    """Per operator path, the work of the calls that launched the device's kernels: kernel ``i`` has the path
    ``paths[i]``, was launched at ``launch_ns[i]`` by operator call ``calls[i]`` (a row of the operator columns
    ``flops``, ``moved``, ``precision`` (codes into ``PRECISIONS``); -1: in no operator) and ran ``duration_ns[i]``.
    Kernels of calls with no work (-1 FLOPs) are left out. Where operators cross instead of nesting, one call's
    kernels can be launched under different paths: the call and all its kernels go with the path of its first
    launch (the earliest, then the first kernel), so that it is counted once. With the sums, each kernel's work
    path (None: no work)."""
    known = np.flatnonzero(calls >= 0)
    known = known[flops[calls[known]] >= 0]
    path_of: dict[int, tuple[str, ...]] = {}
    for i in known[np.lexsort((known, launch_ns[known]))].tolist():
        path_of.setdefault(int(calls[i]), paths[i])
    out: dict[tuple[str, ...], OperatorWork] = {}
    for call, path in path_of.items():
        w = out.get(path)
        if w is None:
            w = out[path] = OperatorWork()
        w.calls += 1
        w.flops += int(flops[call])
        w.bytes += int(moved[call])
        w.precisions.add(PRECISIONS[int(precision[call])])
    kernel_paths: list[tuple[str, ...] | None] = [None] * len(calls)
    for i, call, ns in zip(known.tolist(), calls[known].tolist(), duration_ns[known].tolist()):
        kernel_paths[i] = path = path_of[call]
        out[path].kernel_ns += ns
    return out, kernel_paths


def roofline_ns(flops: int, moved: int, precision: str | None, gpu_model: str | None) -> Fraction | None:
    """The least time ``gpu_model`` can do the work in by the roofline, ``max(flops / peak, bytes / bandwidth)``
    ns (TFLOP/s × 1000 is FLOP per ns, GB/s byte per ns); None where the table lacks either figure."""
    peak, bandwidth = peaks(gpu_model, precision)
    if peak is None or bandwidth is None:
        return None
    return max(Fraction(flops) / (peak * 1000), Fraction(moved) / bandwidth)


def retimed(
    kernel_paths: list[tuple[str, ...] | None], shares: list[int], scales: dict[tuple[str, ...], Fraction]
) -> tuple[Fraction, dict[tuple[str, ...], int]]:
    """The busy time's exact sum (× the shares' denominator) had each kernel with work taken its work path's
    factor ``scales[path]`` of the time it took (a kernel without work, or of a path without a factor, as long as
    it did), and each scaled path's own share (× the denominator) before scaling."""
    total, own = Fraction(0), dict.fromkeys(scales, 0)
    for path, share in zip(kernel_paths, shares):
        scale = None if path is None else scales.get(path)
        if scale is None:
            total += share
        else:
            total += share * scale
            own[path] += share  # type: ignore[index]  # a path with a scale is no None
    return total, own


def work_row(path: str, w: OperatorWork, gpu_model: str | None, busy_ns: int, micro: int) -> dict[str, object]:
    """One row of the report's ``work``: the sums, the path's busy ns and µ$ from the operator tree, and the
    figures derived from them, each exact until it is rounded once to a float (null where not known)."""
    precision = next(iter(w.precisions)) if len(w.precisions) == 1 else None
    peak, bandwidth = peaks(gpu_model, precision)
    rate = Fraction(w.flops, w.kernel_ns * 1000) if w.kernel_ns else None  # FLOP/ns ÷ 1000 = TFLOP/s
    if precision == "fp32" and rate is not None and peak is not None and rate > peak:
        tf32, _ = peaks(gpu_model, "tf32")  # faster than FP32 can go: the calls ran on tensor cores as TF32
        if tf32 is not None:
            precision, peak = "tf32", tf32
    moved = Fraction(w.bytes, w.kernel_ns) if w.kernel_ns else None  # byte/ns = GB/s
    intensity = Fraction(w.flops, w.bytes) if w.bytes else None
    ridge = peak * 1000 / bandwidth if peak is not None and bandwidth is not None else None  # FLOP per byte
    return {
        "path": path,
        "precision": precision,
        "calls": w.calls,
        "flops": w.flops,
        "bytes": w.bytes,
        "kernel_ns": w.kernel_ns,
        "busy_ns": busy_ns,
        "cost_micro_usd": micro,
        "achieved_tflops": _float(rate),
        "arithmetic_intensity": _float(intensity),
        "peak_tflops": _float(peak),
        "efu": _float(rate / peak if rate is not None and peak is not None else None),
        "bw_util": _float(moved / bandwidth if moved is not None and bandwidth is not None else None),
        "bound": None if ridge is None or intensity is None else ("compute" if intensity >= ridge else "memory"),
    }


def _float(value: Fraction | None) -> float | None:
    return None if value is None else float(value)


def whatif_bill(
    whatif: tuple[str, int],
    model: str | None,
    rows: dict[tuple[str, ...], dict[str, object]],
    work_paths: list[tuple[str, ...] | None],
    shares: np.ndarray,
    denominator: int,
) -> dict[str, object]:
    """A device's bill had it been ``whatif``'s GPU at its price in µ$ an hour (docs/definitions.md, "Kernel cost",
    "What-if per operator"): each work row's kernels take the ratio of the two parts' roofline times for its work;
    the rows that cannot be re-timed are listed with why."""
    target, micro_per_hour = whatif
    scales, skipped = {}, []
    for path, r in rows.items():
        scale, why = _scale(r, model, target)
        if scale is None:
            skipped.append({"path": "/".join(path), "precision": r["precision"], "reason": why})
        else:
            scales[path] = scale
    total, own = retimed(work_paths, shares.tolist(), scales)
    busy = total / denominator
    listed: list[dict[str, object]] = [
        {
            "path": "/".join(p),
            "scale": float(scale),
            "busy_ns": div_half_even(own[p], denominator),
            "projected_busy_ns": _half_even(own[p] * scale / denominator),
        }
        for p, scale in sorted(scales.items(), key=lambda item: (-own[item[0]], item[0]))
    ]
    return {
        "gpu_model": target,
        "busy_ns": _half_even(busy),
        "cost_micro_usd": _half_even(busy * micro_per_hour / NS_PER_HOUR),
        "retimed": listed,  # the largest share of busy time first
        "not_retimed": sorted(skipped, key=lambda r: str(r["path"])),
    }


def _scale(row: dict[str, object], model: str | None, target: str) -> tuple[Fraction | None, str | None]:
    """A work row's ratio of roofline times, ``target``'s over ``model``'s, or None and why not. A part without
    TF32 runs a float32 GEMM on its FP32 cores, so a ``tf32`` row is re-timed at the target's ``fp32`` there."""
    precision, flops, moved = row["precision"], row["flops"], row["bytes"]
    assert isinstance(flops, int) and isinstance(moved, int)
    if not isinstance(precision, str):
        return None, "its calls have several precisions"
    now = roofline_ns(flops, moved, precision, model)
    if now is None:
        return None, f"the device's GPU ({model or 'not named'}) has no {precision} peak and bandwidth in the table"
    if not now:
        return None, "its calls do no work (0 FLOPs, 0 bytes)"
    there = roofline_ns(flops, moved, precision, target)
    if there is None and precision == "tf32":
        there = roofline_ns(flops, moved, "fp32", target)
    if there is None:
        return None, f"{target} has no {precision} peak and bandwidth in the table"
    return there / now, None


def _half_even(value: Fraction) -> int:
    return div_half_even(value.numerator, value.denominator)
