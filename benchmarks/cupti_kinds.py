"""Where the CUPTI collector's overhead comes from (needs a GPU): the job of ``cupti_overhead.py`` timed under
CUPTI set up in steps, each step adding one cost, so that the step where the loop slows down names the culprit.

Modes, each in its own process, interleaved over the repetitions:

- ``base``: no CUPTI;
- ``kernel``: kernel records only, buffers discarded unread;
- ``kernel_launch_api``: and runtime records for the kernel-launch calls alone (``activity_enable_runtime_api``);
- ``kernel_runtime``: and runtime records for every runtime call (what the collector enables);
- ``all_kinds``: every kind the collector enables, NVTX markers included, buffers discarded unread;
- ``all_kinds_read``: the same, each record read once in Python (cupti-python's cost per record);
- ``collector``: the collector itself, its records handed to a sink that drops them.

    python benchmarks/cupti_kinds.py --repetitions 2 --steps 100
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

MODES = (
    "base",
    "kernel",
    "kernel_launch_api",
    "launch_marker",
    "launch_marker_data",
    "kernel_runtime",
    "all_kinds",
    "all_kinds_read",
    "collector",
)
LAUNCH_CALLS = (
    "cudaLaunchKernel_v7000",
    "cudaLaunchKernel_ptsz_v7000",
    "cudaLaunchKernelExC_v11060",
    "cudaLaunchKernelExC_ptsz_v11060",
    "cudaLaunchCooperativeKernel_v9000",
    "cudaGraphLaunch_v10000",
    "cudaMemcpyAsync_v3020",
    "cudaMemsetAsync_v3020",
)


def _setup(mode: str) -> Any:
    from cupti import cupti  # noqa: PLC0415 — the optional extra, on the GPU machine only

    from gpucost.collect_kernels import _nvtx_injection  # noqa: PLC0415

    kind = cupti.ActivityKind
    records = [0]

    def requested() -> tuple[int, int]:
        return 8 * 1024 * 1024, 0

    def discard(activities: Any) -> None:
        if mode == "all_kinds_read":
            for activity in activities:
                records[0] += 1 if activity.kind else 0

    if mode == "collector":
        from gpucost.producers.cupti import Collector, Identity  # noqa: PLC0415

        _nvtx_injection()
        collector = Collector(cupti, Identity("bench", os.getpid(), {}), lambda lines: None, text=True)
        collector.start()
        return collector.stop
    kinds = [kind.CONCURRENT_KERNEL]
    if mode in ("kernel_launch_api", "kernel_runtime") or mode.startswith("launch_marker"):
        kinds.append(kind.RUNTIME)
    if mode.startswith("launch_marker"):
        _nvtx_injection()
        kinds += [kind.MARKER] + ([kind.MARKER_DATA, kind.NAME] if mode == "launch_marker_data" else [])
    if mode.startswith("all_kinds"):
        _nvtx_injection()
        kinds += [kind.RUNTIME, kind.MARKER, kind.MARKER_DATA, kind.NAME, kind.MEMCPY, kind.MEMSET]
    cupti.activity_register_callbacks(requested, discard)
    for k in kinds:
        cupti.activity_enable(k)
    if mode == "kernel_launch_api" or mode.startswith("launch_marker"):
        keep = {
            int(getattr(cupti.runtime_api_trace_cbid, n))
            for n in LAUNCH_CALLS
            if hasattr(cupti.runtime_api_trace_cbid, n)
        }
        for cbid in cupti.runtime_api_trace_cbid:
            if int(cbid) not in keep and int(cbid) > 0:
                try:
                    cupti.activity_enable_runtime_api(int(cbid), 0)
                except Exception:  # noqa: BLE001, S112 — ids CUPTI rejects (INVALID, SIZE) stay as they are
                    continue

    def stop() -> int:
        cupti.activity_flush_all(1)
        return records[0]

    return stop


def child(mode: str, steps: int) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from cupti_overhead import job  # noqa: PLC0415

    stop = None if mode == "base" else _setup(mode)
    job(steps, 40, 256)
    if stop is not None:
        stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", choices=MODES)
    parser.add_argument("--repetitions", type=int, default=2)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated subset, base first")
    args = parser.parse_args()
    if args.child:
        child(args.child, args.steps)
        return 0
    modes = args.modes.split(",")
    loops: dict[str, list[float]] = {m: [] for m in modes}
    errors: dict[str, str] = {}
    for _ in range(args.repetitions):
        for mode in modes:
            done = subprocess.run(
                [sys.executable, __file__, "--child", mode, "--steps", str(args.steps)],
                capture_output=True,
                text=True,
                timeout=300,
            )
            lines = [ln for ln in done.stdout.splitlines() if ln.startswith('{"loop_s"')]
            if done.returncode != 0 or not lines:
                errors[mode] = done.stderr[-600:]
                continue
            loops[mode].append(json.loads(lines[-1])["loop_s"])
    base = statistics.median(loops["base"])
    print(
        json.dumps(
            {
                "benchmark": "cupti_kinds",
                "steps": args.steps,
                "repetitions": args.repetitions,
                "median_loop_s": {m: statistics.median(v) for m, v in loops.items() if v},
                "overhead_ratio": {m: statistics.median(v) / base - 1 for m, v in loops.items() if v},
                "errors": errors,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
