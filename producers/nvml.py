"""The NVML producer: GPU and per-process samples from every GPU and MIG instance of a node.

The NVML module is injected (``pynvml`` by default), so tests run against a fake with the
same function names and error codes. With MIG enabled, the MIG instances (each with its
own UUID) are what tenants use and get billed; the parent GPU is not sampled.
"""
from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from gpucost.schemas.events import Event, GpuSample, ProcessSample

__all__ = ["NvmlUnavailable", "NvmlSampler"]

log = logging.getLogger("gpucost.nvml")
MIB = 1 << 20


class NvmlUnavailable(Exception):
    """NVML cannot be used on this machine; the message says why and what to do."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"NVML is not available ({reason}): install or load the NVIDIA driver, "
                         "or use --source simulate")
        self.reason = reason


@dataclass
class _Device:
    handle: Any
    uuid: str
    name: str
    parent: Any | None  # the physical GPU of a MIG instance, for its power and temperature
    last_seen_us: int = 0  # newest per-process sample already read, so none is counted twice


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


class NvmlSampler:
    def __init__(self, node_id: str, nvml: ModuleType | None = None) -> None:
        if nvml is None:
            import pynvml as nvml  # noqa: PLC0415 (only where the real library is wanted)
        self.nvml = nvml
        self.node_id = node_id
        self.devices: list[_Device] = []
        self.counts: Counter[str] = Counter()
        self._warned: set[tuple[str, str]] = set()

    def open(self) -> None:
        nv = self.nvml
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            raise NvmlUnavailable(str(exc)) from None
        for i in range(nv.nvmlDeviceGetCount()):
            handle = nv.nvmlDeviceGetHandleByIndex(i)
            name = _text(nv.nvmlDeviceGetName(handle))
            if self._mig_enabled(handle):
                for j in range(nv.nvmlDeviceGetMaxMigDeviceCount(handle)):
                    try:
                        mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, j)
                    except nv.NVMLError_NotFound:
                        continue  # an empty slot
                    self.devices.append(_Device(mig, _text(nv.nvmlDeviceGetUUID(mig)),
                                                _text(nv.nvmlDeviceGetName(mig)), handle))
            else:
                self.devices.append(_Device(handle, _text(nv.nvmlDeviceGetUUID(handle)), name, None))

    def gpus_of(self, pid: int) -> list[str]:
        """The devices a process runs on now, from NVML's running-process lists."""
        nv, out = self.nvml, []
        for dev in self.devices:
            try:
                if any(int(p.pid) == pid for p in nv.nvmlDeviceGetComputeRunningProcesses(dev.handle)):
                    out.append(dev.uuid)
            except nv.NVMLError:
                continue  # a device that cannot answer now owns no process for this event
        return out

    def close(self) -> None:
        self.nvml.nvmlShutdown()

    def _mig_enabled(self, handle: Any) -> bool:
        try:
            current, _pending = self.nvml.nvmlDeviceGetMigMode(handle)
        except self.nvml.NVMLError_NotSupported:
            return False
        return bool(current == self.nvml.NVML_DEVICE_MIG_ENABLE)

    def _optional(self, dev: _Device, what: str, call: Callable[[], Any]) -> Any:
        """A reading this device may not support: None (warned once per device and field)."""
        try:
            return call()
        except self.nvml.NVMLError_NotSupported:
            if (dev.uuid, what) not in self._warned:
                self._warned.add((dev.uuid, what))
                log.warning("%s (%s) does not support %s", dev.uuid, dev.name, what)
            self.counts[f"not_supported:{what}"] += 1
            return None

    def sample(self, ts_ns: int, interval_s: float) -> list[Event]:
        """One sample of every device; a device that fell off the bus is dropped, with a warning."""
        out: list[Event] = []
        for dev in list(self.devices):
            try:
                out += self._sample_device(dev, ts_ns, interval_s)
            except self.nvml.NVMLError_GpuIsLost:
                log.error("%s (%s) fell off the bus; no longer sampled", dev.uuid, dev.name)
                self.devices.remove(dev)
                self.counts["gpu_lost"] += 1
        return out

    def _sample_device(self, dev: _Device, ts_ns: int, interval_s: float) -> list[Event]:
        nv, h = self.nvml, dev.handle
        physical = dev.parent if dev.parent is not None else h
        util = self._optional(dev, "utilization", lambda: nv.nvmlDeviceGetUtilizationRates(h))
        mem = nv.nvmlDeviceGetMemoryInfo(h)
        power_mw = self._optional(dev, "power", lambda: nv.nvmlDeviceGetPowerUsage(physical))
        temp = self._optional(dev, "temperature",
                              lambda: nv.nvmlDeviceGetTemperature(physical, nv.NVML_TEMPERATURE_GPU))
        tx = self._optional(dev, "pcie", lambda: nv.nvmlDeviceGetPcieThroughput(physical, nv.NVML_PCIE_UTIL_TX_BYTES))
        rx = self._optional(dev, "pcie", lambda: nv.nvmlDeviceGetPcieThroughput(physical, nv.NVML_PCIE_UTIL_RX_BYTES))
        out: list[Event] = []
        if util is None:
            self.counts["gpu_sample_skipped"] += 1  # no utilisation, nothing to bill: counted, not guessed
        else:
            out.append(GpuSample(
                node_id=self.node_id, gpu_uuid=dev.uuid, gpu_model=dev.name, ts_ns=ts_ns, interval_s=interval_s,
                sm_util_pct=float(util.gpu), mem_bw_util_pct=float(util.memory), mem_used_bytes=int(mem.used),
                mem_total_bytes=int(mem.total), power_w=0.0 if power_mw is None else power_mw / 1000,
                temp_c=0.0 if temp is None else float(temp),
                pcie_tx_bytes_s=None if tx is None else int(tx) * 1024,  # NVML reports KB/s
                pcie_rx_bytes_s=None if rx is None else int(rx) * 1024))
        return out + self._processes(dev, ts_ns, interval_s)

    def _processes(self, dev: _Device, ts_ns: int, interval_s: float) -> list[Event]:
        """Per-process utilisation since the last read (mean of NVML's samples) and memory."""
        nv = self.nvml
        try:
            samples = nv.nvmlDeviceGetProcessUtilization(dev.handle, dev.last_seen_us)
        except (nv.NVMLError_NotFound, nv.NVMLError_NotSupported):
            samples = []  # NOT_FOUND: no sample newer than last_seen
        util: dict[int, list[tuple[int, int]]] = {}
        for s in samples:
            if s.timeStamp > dev.last_seen_us or dev.last_seen_us == 0:
                util.setdefault(int(s.pid), []).append((int(s.smUtil), int(s.memUtil)))
        if samples:
            dev.last_seen_us = max(dev.last_seen_us, max(int(s.timeStamp) for s in samples))
        memory = {int(p.pid): int(p.usedGpuMemory or 0) for p in nv.nvmlDeviceGetComputeRunningProcesses(dev.handle)}
        out: list[Event] = []
        for pid in sorted(set(util) | set(memory)):
            readings = util.get(pid, [])  # a running process without a sample used no SM this period
            sm = sum(r[0] for r in readings) / len(readings) if readings else 0.0
            bw = sum(r[1] for r in readings) / len(readings) if readings else 0.0
            out.append(ProcessSample(node_id=self.node_id, gpu_uuid=dev.uuid, pid=pid, ts_ns=ts_ns,
                                     interval_s=interval_s, sm_util_pct=round(min(sm, 100.0), 2),
                                     mem_bw_util_pct=round(min(bw, 100.0), 2), mem_used_bytes=memory.get(pid, 0)))
        return out
