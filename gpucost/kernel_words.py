"""``gpucost kernels``' words for a person: the report as text, and the notes on stderr about GPU models (one the
platform table lacks or none named, operators faster than the part named can go). The figures are
``gpucost.kernels``'; nothing here computes one."""

from __future__ import annotations

import sys

from gpucost.streams.kernel_work import PRECISIONS, peaks

__all__ = ["print_text", "say_notes", "unknown_model"]


def say_notes(report: dict, given: str | None) -> None:
    """The notes on stderr for a report, ``given`` the ``--gpu-model`` (None: not given)."""
    _say_unknown_models(report, given)
    _say_faster_than_peak(report)


def print_text(report: dict) -> None:
    for d in report["devices"]:
        print(
            f"{d['device']['node']} GPU {d['device']['device']} ({d['gpu_model'] or 'model unknown'}): busy "
            f"{d['busy_ns']} ns of {d['window_ns']} ns, {d['cost_micro_usd']} µ$; launch gaps "
            f"{d['launch_gaps']['idle_ns']} ns, {d['launch_gaps']['cost_micro_usd']} µ$"
        )
        for k in d["kernels"][:20]:
            print(
                f"  {k['cost_micro_usd']:>12} µ$ {k['busy_ns']:>14} ns {k['calls']:>7}× {k['category']:<13} "
                f"{_tail(k['name'])}"
            )
        for section in ("ranges", "operators"):
            for r in d[section][:20]:
                print(f"  {section[:-1]:<8} {r['cost_micro_usd']:>12} µ$ {r['busy_ns']:>14} ns  {_tail(r['path'])}")
        if "whatif" in d:
            w = d["whatif"]
            print(
                f"  what if {w['gpu_model']}: busy {w['busy_ns']} ns, {w['cost_micro_usd']} µ$ "
                f"({len(w['retimed'])} GEMM operator paths re-timed by the roofline, the rest as measured)"
            )
            for r in w["not_retimed"]:
                print(f"  not re-timed: {_tail(r['path'])}: {r['reason']}")
        for w in d["work"][:20]:
            print(
                f"  work     {w['cost_micro_usd']:>12} µ$ {w['calls']:>7}× {w['precision'] or 'mixed':<5} "
                f"{_rounded(w['achieved_tflops'], ' TFLOP/s')} EFU {_rounded(w['efu'])} "
                f"{w['bound'] or 'bound unknown'}  {_tail(w['path'])}"
            )
    for reason, n in report.get("rejected", {}).items():
        print(f"read with a note or left out: {n} × {reason}", file=sys.stderr)


def _say_unknown_models(report: dict, given: str | None) -> None:
    """On stderr, each GPU model whose operators get no peak: one the table lacks, or none named."""
    unknown = {d["gpu_model"] for d in report["devices"] if d["work"] and unknown_model(d["gpu_model"])}
    unknown |= {given} if given and unknown_model(given) else set()
    for model in sorted(unknown, key=str):
        what = (
            "no GPU model is named (the trace names none and --gpu-model is not given)"
            if model is None
            else f"GPU model {model!r} is in no row of the platform table (gpucost/schemas/platforms.toml)"
        )
        print(
            f"gpucost kernels: {what}: its operators get no peak and no EFU; name a part the table has, such as "
            "H100 or NVIDIA A100-SXM4-80GB, with --gpu-model (a trace that names its GPU keeps its name)",
            file=sys.stderr,
        )


def _say_faster_than_peak(report: dict) -> None:
    """On stderr, each device whose GEMM operators ran faster than its GPU's peak or bandwidth: the part named
    (by the trace or ``--gpu-model``) is then not the one the trace ran on."""
    for d in report["devices"]:
        fast = [w for w in d["work"] if (w["efu"] or 0) > 1 or (w["bw_util"] or 0) > 1]
        if fast:
            print(
                f"gpucost kernels: {d['device']['node']} GPU {d['device']['device']}: {len(fast)} GEMM operator "
                f"paths ran faster than {d['gpu_model']}'s peak or bandwidth (EFU or bw_util above 1): the trace "
                "ran on another part; check --gpu-model",
                file=sys.stderr,
            )


def unknown_model(model: str | None) -> bool:
    """Whether the platform table gives ``model`` (None: no model) no peak at any precision."""
    return all(peaks(model, p)[0] is None for p in PRECISIONS)


def _tail(text: str, width: int = 100) -> str:
    """A name or path cut to ``width`` from its start, so its innermost part (what tells two apart) stays."""
    return text if len(text) <= width else "…" + text[len(text) - width + 1 :]


def _rounded(value: float | None, unit: str = "") -> str:
    return ("n/a" if value is None else f"{value:.3g}") + unit
