"""Smoke check of ``gpucost collect-kernels`` on a real GPU: a tiny torch job, then checks on what it wrote.

Checks: kernels present with end ≥ start and epoch times near now (the clock offset), launch links present
(launch_ns ≤ start_ns), NVTX ranges present and named, and that every kernel launched inside the "smoke"
range on its thread falls in it by the launch rule.  Then, in a process of its own, the collector reads the
same buffers twice, from the records' bytes (as it does) and attribute by attribute (``layouts=None``):
every record type must be read from its bytes and both readings must give the same objects.  The same job is
collected again as a program (``env python job.py``), through the injection library: the same checks, and the
same kernels.  Prints a JSON verdict; exit 1 on any failed check.

    python benchmarks/cupti_smoke.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

JOB = """
import torch
a = torch.randn(512, 512, device="cuda")
torch.cuda.nvtx.range_push("smoke")
for _ in range(20):
    torch.cuda.nvtx.range_push("mm")
    a = torch.tanh(a @ a) * 0.5
    torch.cuda.nvtx.range_pop()
torch.cuda.nvtx.range_pop()
torch.cuda.synchronize()
b = a.cpu()
"""

BOTH_READINGS = """
import json, os, torch
from cupti import cupti
from gpucost.collect_kernels import _nvtx_injection
from gpucost.producers.cupti import Collector, Identity
_nvtx_injection()
got, plain = [], []
ident = Identity("smoke", os.getpid())
collector, other = Collector(cupti, ident, got.extend), Collector(cupti, ident, plain.extend)
other.records._layouts, other.records._offset_ns = None, collector.records._offset_ns
fast = collector._buffer_completed
def both(activities):
    activities = list(activities)
    plain.extend(other.records.objects(other.records.add(activities)))
    fast(activities)
collector._buffer_completed = both
collector.start()
a = torch.randn(256, 256, device="cuda")
for _ in range(50):
    torch.cuda.nvtx.range_push("r")
    a = torch.tanh(a @ a) * 0.5
    torch.cuda.nvtx.range_pop()
torch.cuda.synchronize()
a.cpu()
collector.stop()
plain.extend(other.records.objects(other.records.finish()))
readers = {t.__name__: kind for t, kind in collector.records.bytes_readers().items()}
print(json.dumps({"readers": readers, "same": got == plain, "objects": len(got)}))
"""


def both_readings() -> dict:
    done = subprocess.run([sys.executable, "-c", BOTH_READINGS], capture_output=True, text=True)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith('{"readers"')]
    return json.loads(lines[-1]) if lines else {"error": done.stderr[-2000:]}


def _open_at(ranges: list[dict], tid: int, at_ns: int) -> list[str] | None:
    """The names of the ranges open on ``tid`` at ``at_ns``, the earliest begun first; None for none."""
    names = [r["name"] for r in sorted(ranges, key=lambda r: (r["start_ns"], r["name"])) if r["tid"] == tid
             and r["start_ns"] <= at_ns < r["end_ns"]]  # fmt: skip
    return names or None


def collect(job: list[str], tmp: Path, name: str) -> tuple[subprocess.CompletedProcess[str], list[dict], int, int]:
    """``gpucost collect-kernels -- job``: its process, its rows, and the wall clock before and after."""
    out = tmp / f"{name}.jsonl"
    command = [sys.executable, "-m", "gpucost.cli", "collect-kernels", "--out", str(out), "--node-id", "smoke", "--"]
    t0 = time.time_ns()
    done = subprocess.run([*command, *job], capture_output=True, text=True)
    t1 = time.time_ns()
    rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    return done, rows, t0, t1


def checks_of(done: subprocess.CompletedProcess[str], rows: list[dict], t0: int, t1: int) -> dict[str, bool]:
    kernels = [r for r in rows if r["kind"] == "kernel_activity"]
    ranges = [r for r in rows if r["kind"] == "annotation_range"]
    gemms = [k for k in kernels if k["category"] == "kernel"]
    smoke = [r for r in ranges if r["name"] == "smoke"]
    inside = [
        k
        for k in gemms
        if smoke
        and "launch_ns" in k
        and k["launch_tid"] == smoke[0]["tid"]
        and smoke[0]["start_ns"] <= k["launch_ns"] <= smoke[0]["end_ns"]
    ]
    return {
        "exit_0": done.returncode == 0,
        "kernels_present": len(gemms) >= 20,
        "times_ordered": all(k["start_ns"] <= k["end_ns"] for k in kernels),
        "epoch_times": all(t0 <= k["start_ns"] <= t1 for k in kernels),
        "launch_links": bool(kernels) and all("launch_ns" in k and k["launch_ns"] <= k["start_ns"] for k in gemms),
        "ranges_present": len(smoke) == 1 and sum(r["name"] == "mm" for r in ranges) == 20,
        "ranges_ordered": all(r["start_ns"] <= r["end_ns"] for r in ranges),
        "kernels_in_smoke_range": len(inside) >= 20,
        # the path the collector wrote at each launch is the ranges open on its thread then (docs/collecting.md)
        "range_paths_by_launch": bool(inside)
        and all(k.get("range_path") == _open_at(ranges, k["launch_tid"], k["launch_ns"]) for k in gemms),
        "memcpy_present": any(k["category"] == "memcpy" for k in kernels),
        # devices are named by CUPTI's DEVICE records (docs/collecting.md): a UUID, never the index fallback
        "devices_named": bool(kernels) and all(k["gpu_uuid"].startswith(("GPU-", "MIG-")) for k in kernels),
    }


def _names(rows: list[dict]) -> list[str]:
    return sorted(r["name"] for r in rows if r["kind"] == "kernel_activity")


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "job.py"
        script.write_text(JOB)
        done, rows, t0, t1 = collect(["python", str(script)], Path(tmp), "in_process")
        # the same job as a program that is not `python script.py`: through the injection library (built here)
        n_done, n_rows, n0, n1 = collect(["env", sys.executable, str(script)], Path(tmp), "native")
    checks = checks_of(done, rows, t0, t1)
    native = checks_of(n_done, n_rows, n0, n1)
    checks |= {f"native_{k}": v for k, v in native.items()}
    checks["native_same_kernels"] = bool(rows) and _names(n_rows) == _names(rows)
    readings = both_readings()
    readers = readings.get("readers", {})
    checks["read_from_bytes"] = {"ActivityKernel10", "ActivityAPI", "ActivityMarker2"} <= set(readers) and all(
        readers.values()
    )
    checks["bytes_reading_equals_attributes"] = readings.get("same") is True and readings.get("objects", 0) > 100
    kernels = [r for r in rows if r["kind"] == "kernel_activity"]
    print(
        json.dumps(
            {
                "smoke": "cupti",
                "ok": all(checks.values()),
                "checks": checks,
                "kernels": len(kernels),
                "ranges": sum(r["kind"] == "annotation_range" for r in rows),
                "native_kernels": len(_names(n_rows)),
                "stderr_tail": done.stderr[-2000:],
                "native_stderr_tail": n_done.stderr[-2000:],
                "readings": readings,
                "sample": (kernels[:1] + [r for r in rows if r["kind"] == "annotation_range"][:1]),
            }
        )
    )
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
