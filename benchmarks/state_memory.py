"""3. Operator state per GPU: resident memory after 72 h of panes, as the fleet grows.

Each size runs in a fresh process: it feeds the auditor one GPU sample and one process
sample per GPU per 60 s pane for 72 h (the window full, three panes open), then reports how
much its resident memory grew. Bytes per GPU is the slope between the sizes.
"""
from __future__ import annotations

import gc
import json
import subprocess
import sys
from pathlib import Path

from benchmarks.common import Result

ROOT = Path(__file__).resolve().parent.parent
NS = 1_000_000_000
T0 = 1_736_121_600 * NS


def _rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * 4096


def child(gpus: int, hours: int = 72) -> int:
    """Build the state of ``gpus`` GPUs; the growth of resident memory, in bytes."""
    from schemas.events import GpuSample, ProcessSample, TenantBinding
    from streams.audit import Auditor
    from streams.settings import AuditSettings

    gc.collect()
    before = _rss_bytes()
    auditor = Auditor(AuditSettings())
    for g in range(gpus):
        auditor.update(TenantBinding(node_id=f"node-{g // 8}", pid=1000 + g, ts_ns=T0, team="team", env="prod",
                                     app="app", tier="online", sla="Gold"))
    for k in range(hours * 60 + 3):
        ts = T0 + k * 60 * NS
        for g in range(gpus):
            node, gpu = f"node-{g // 8}", f"GPU-{g:06d}"
            auditor.update(GpuSample.model_construct(
                node_id=node, gpu_uuid=gpu, gpu_model="H100", ts_ns=ts, interval_s=60.0, sm_util_pct=float(k % 100),
                mem_bw_util_pct=10.0, mem_used_bytes=1, mem_total_bytes=2, power_w=300.0, temp_c=50.0))
            auditor.update(ProcessSample.model_construct(
                node_id=node, gpu_uuid=gpu, pid=1000 + g, ts_ns=ts, interval_s=60.0, sm_util_pct=float(k % 100),
                mem_bw_util_pct=10.0, mem_used_bytes=1))
    gc.collect()
    return _rss_bytes() - before


def run(sizes: tuple[int, ...] = (100, 400)) -> Result:
    grown = {}
    for n in sizes:
        out = subprocess.run([sys.executable, "-m", "benchmarks.state_memory", str(n)], cwd=ROOT, check=True,
                             capture_output=True, text=True)
        grown[n] = json.loads(out.stdout)
    lo, hi = min(sizes), max(sizes)
    per_gpu = (grown[hi] - grown[lo]) / (hi - lo)
    rows = [(f"{n:,} GPUs", f"{grown[n] / 2**20:,.1f} MiB more resident memory") for n in sizes]
    rows.append(("per GPU (slope)", f"{per_gpu / 1024:,.1f} KiB"))
    return Result("3. State memory per GPU", "≤ 64 KiB per GPU with 72 h windows", per_gpu <= 64 * 1024, rows,
                  ["Resident memory (RSS) of a process holding only the operators' state, measured after "
                   "garbage collection: Python's allocator keeps some freed memory, so this errs high."])


if __name__ == "__main__":
    print(json.dumps(child(int(sys.argv[1]))))
