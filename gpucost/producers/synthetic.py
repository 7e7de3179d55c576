"""Synthetic process ids, for sources that see a device's busy time but not the processes behind it
(dcgm-exporter, NVML under MIG): stable across scrapes and restarts, above any Linux pid (at most
2^22), so never mistaken for a real process."""

from __future__ import annotations

import zlib

from gpucost.schemas.events import GpuSample, ProcessSample

__all__ = ["SYNTHETIC_PID_BASE", "container_pid", "unclaimed_pid", "busy_as"]

SYNTHETIC_PID_BASE = 1 << 31


def container_pid(namespace: str, pod: str, container: str) -> int:
    """A stable process id standing for a Kubernetes container, for its binding and samples."""
    return SYNTHETIC_PID_BASE | (zlib.crc32(f"{namespace}/{pod}/{container}".encode()) & 0x7FFFFFFF)


def unclaimed_pid(device: str) -> int:
    """The synthetic process that stands for a device's busy time no process or pod claims (no binding:
    billed to ``unattributed``)."""
    return SYNTHETIC_PID_BASE | (zlib.crc32(f"unclaimed/{device}".encode()) & 0x7FFFFFFF)


def busy_as(gpu: GpuSample, pid: int, mem_used_bytes: int, busy_cp: int | None = None) -> ProcessSample:
    """The device's sample as a process sample of ``pid``: its utilisation, so that its busy time is billed
    to whoever ``pid`` stands for (a pod's container, the one process on a MIG instance, or no one). With
    ``busy_cp``, the process's own busy time instead (hundredths of a percent: a HAMi container's figure), and
    no memory bandwidth, which no source measures per container."""
    return ProcessSample(
        node_id=gpu.node_id,
        gpu_uuid=gpu.gpu_uuid,
        pid=pid,
        ts_ns=gpu.ts_ns,
        interval_s=gpu.interval_s,
        sm_util_pct=gpu.sm_util_pct if busy_cp is None else busy_cp / 100,
        mem_bw_util_pct=gpu.mem_bw_util_pct if busy_cp is None else 0.0,
        mem_used_bytes=mem_used_bytes,
    )
