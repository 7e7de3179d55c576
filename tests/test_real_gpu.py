"""The producers and a live run against a real NVIDIA GPU (marker ``gpu``): skipped, with the reason, wherever
NVML finds no device, so the suite never depends on one. ``scripts/device_check.sh`` runs them on a lent GPU.

Independent readings: ``nvidia-smi`` (a separate program over the same driver) for each device's name and memory,
a CUDA job of our own whose process id and load we know, and the pane cost rule of docs/definitions.md
("Apportionment") recomputed from each record's own price and covered time.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
import time
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.gpu

#: a CUDA job: bf16 matrix products (tensor cores) for argv[1] seconds, "ready" on stdout once its first has run
BURNER = """
import sys, time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16); b = torch.randn_like(a)
(a @ b).sum().item(); print("ready", flush=True)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    for _ in range(20): c = a @ b
    torch.cuda.synchronize()
"""


def smi() -> list[dict[str, str]]:
    """Each GPU as nvidia-smi reads it (skip where there is none)."""
    if shutil.which("nvidia-smi") is None:
        pytest.skip("no nvidia-smi: this machine has no NVIDIA driver")
    done = subprocess.run(
        ["nvidia-smi", "--query-gpu=uuid,name,memory.total,mig.mode.current", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode != 0 or not done.stdout.strip():
        pytest.skip(f"nvidia-smi found no GPU: {done.stderr.strip() or done.stdout.strip()}")
    keys = ("uuid", "name", "memory_mib", "mig")
    return [dict(zip(keys, (c.strip() for c in row), strict=True)) for row in csv.reader(io.StringIO(done.stdout))]


def burner(seconds: float) -> subprocess.Popen[str]:
    try:
        import torch  # noqa: F401, PLC0415 (only to know the job can run)
    except ImportError:
        pytest.skip("no PyTorch to load the GPU with")
    proc = subprocess.Popen([sys.executable, "-c", BURNER, str(seconds)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready", "the CUDA job did not start"
    return proc


def test_nvml_samples_every_device_and_sees_our_job() -> None:
    from gpucost.producers.nvml import NvmlSampler  # noqa: PLC0415
    from gpucost.schemas.events import GpuSample, ProcessSample  # noqa: PLC0415

    gpus = smi()
    sampler = NvmlSampler("device-check")
    sampler.open()
    if all(g["mig"] != "Enabled" for g in gpus):  # without MIG the billed devices are the GPUs themselves
        assert sorted(d.uuid for d in sampler.devices) == sorted(g["uuid"] for g in gpus)
    job = burner(12)
    samples: list[GpuSample | ProcessSample] = []
    try:
        for _ in range(8):
            time.sleep(1)
            samples += [e for e in sampler.sample(time.time_ns(), 1.0) if isinstance(e, GpuSample | ProcessSample)]
    finally:
        job.kill()
        job.wait()
    by_uuid = {g["uuid"]: g for g in gpus}
    gpu_samples = [e for e in samples if isinstance(e, GpuSample)]
    for ev in gpu_samples:
        assert ev.gpu_model == by_uuid[ev.gpu_uuid]["name"]
        assert ev.mem_total_bytes == int(by_uuid[ev.gpu_uuid]["memory_mib"]) << 20
        assert ev.power_w > 0 and 0 < ev.temp_c < 120
        # a data-centre GPU reports its ECC and PCIe replay counters: faults are reported; a healthy GPU shows
        # none new while it runs a job
        assert ev.fault_fatal == 0 and ev.fault_warning is not None, (ev.fault_fatal, ev.fault_warning)
    assert max(e.sm_util_pct for e in gpu_samples) > 50, "a GPU running bf16 products for seconds read as idle"
    ours = [e for e in samples if isinstance(e, ProcessSample) and e.pid == job.pid]
    assert ours, f"the job's process {job.pid} never appeared in the process samples"
    assert max(e.sm_util_pct for e in ours) > 50 and max(e.mem_used_bytes for e in ours) > 256 << 20
    gpm = [e for e in gpu_samples if e.tensor_active_pct is not None]
    if sampler.counts["gpm_unavailable"] == 0 and any(d.gpm is not None for d in sampler.devices):
        assert gpm and max(e.tensor_active_pct or 0.0 for e in gpm) > 5, "GPM read no tensor activity"
    print(
        json.dumps(
            {
                "devices": [d.uuid for d in sampler.devices],
                "gpm": bool(gpm),
                "max_sm_util_pct": max(e.sm_util_pct for e in gpu_samples),
                "max_tensor_active_pct": max((e.tensor_active_pct or 0.0 for e in gpm), default=None),
                "max_dram_active_pct": max((e.dram_active_pct or 0.0 for e in gpm), default=None),
                "job_max_sm_util_pct": max(e.sm_util_pct for e in ours),
                "counts": dict(sampler.counts),
            }
        )
    )


def test_a_live_run_bills_our_job_on_the_real_gpu(tmp_path: Path) -> None:
    import duckdb  # noqa: PLC0415

    gpus = smi()
    job = burner(45)
    now_ns = time.time_ns()
    events = [
        {"kind": "price", "gpu_model": g["name"], "ts_ns": now_ns - 3600 * 10**9, "usd_per_gpu_hour": "3.72"}
        for g in {g["name"]: g for g in gpus}.values()
    ]
    events.append(
        {
            "kind": "tenant_binding",
            "node_id": "device-check",
            "pid": job.pid,
            "ts_ns": now_ns - 10**9,
            "team": "ml-research",
            "env": "prod",
            "app": "burner",
            "tier": "training",
            "sla": "Gold",
        }
    )
    prices = tmp_path / "prices.jsonl"
    prices.write_text("".join(json.dumps(e) + "\n" for e in events))
    out = tmp_path / "out"
    try:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "gpucost.cli",
                "run",
                "--source",
                "nvml",
                "--node-id",
                "device-check",
                "--duration-s",
                "40",
                "--pane-s",
                "10",
                "--prices",
                str(prices),
                "--out",
                str(out),
                "--overwrite",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "GPUCOST_LOG_FORMAT": "text"},
        )
    finally:
        job.kill()
        job.wait()
    assert done.returncode == 0, done.stderr[-3000:]
    rows = duckdb.sql(
        f"SELECT gpu_uuid, pane_start_ns, revision, team, cost_micro_usd, pane_cost_micro_usd, "
        f"usd_per_gpu_hour, covered_ms, pane_end_ns - pane_start_ns FROM "
        f"read_parquet('{out}/cost/date=*/part-*.parquet')"
    ).fetchall()
    assert rows, f"no cost records; the run said: {done.stderr[-2000:]}"
    panes: dict[tuple[str, int, int], list[tuple[str, int]]] = {}
    for uuid, start, rev, team, cost, pane_cost, price, covered_ms, pane_ns in rows:
        expected = (Decimal(price) * 10**6 * covered_ms / 3_600_000).quantize(Decimal(1), ROUND_HALF_EVEN)
        assert pane_cost == int(expected) and 0 < covered_ms <= pane_ns // 10**6 + 1_500
        panes.setdefault((uuid, start, rev), []).append((team, cost))
        assert cost >= 0
    for key, parties in panes.items():
        pane_cost = next(r[5] for r in rows if (r[0], r[1], r[2]) == key)
        assert sum(c for _, c in parties) == pane_cost, f"pane {key}: parties {parties} do not sum to {pane_cost}"
    ours = sum(c for parties in panes.values() for t, c in parties if t == "ml-research")
    total = sum(c for parties in panes.values() for _, c in parties)
    assert ours > total // 2, f"the job that kept the GPU busy was billed {ours} of {total} µ$"
    print(json.dumps({"panes": len(panes), "records": len(rows), "billed_micro_usd": total, "job_micro_usd": ours}))
