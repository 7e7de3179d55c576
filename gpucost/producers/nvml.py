"""The NVML producer: GPU and per-process samples from every GPU and MIG instance of a node.

The NVML module is injected (``pynvml`` by default), so tests run against a fake with the
same function names and error codes. With MIG enabled, the MIG instances (each with its
own UUID) are what tenants use and get billed; the parent GPU is not sampled.

Where the GPU supports GPM (Hopper and later: ``nvmlGpmQueryDeviceSupport``), each device's GPM
counters are read every period, between the previous sample and this one: tensor and DRAM
activity for every device (``tensor_active_pct``, ``dram_active_pct``), and for a MIG
instance, which has no utilisation counters of its own, its utilisation too (GPM per GPU
instance, ``nvmlGpmMigSampleGet``).

Each GPU sample carries the device faults new since the GPU's last sample sent (``gpucost.producers.nvml_faults``),
the GPUs' readings at open being the baseline.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any

from gpucost.producers.accelerators.events import FaultBaseline
from gpucost.producers.nvml_faults import NvmlFaults
from gpucost.producers.synthetic import busy_as, unclaimed_pid
from gpucost.schemas.codec import explain
from gpucost.schemas.devices import DeviceSample, number, to_watts
from gpucost.schemas.events import Event, GpuSample, ProcessSample

__all__ = ["NvmlUnavailable", "NvmlSampler"]

log = logging.getLogger("gpucost.nvml")
MIB = 1 << 20


class NvmlUnavailable(Exception):
    """NVML cannot be used on this machine; the message says why and what to do."""

    def __init__(self, reason: str) -> None:
        super().__init__(
            f"NVML is not available ({reason}): install or load the NVIDIA driver, or use --source simulate"
        )
        self.reason = reason


#: the GPM metrics read, by what they fill. ``busy``: % of time any kernel ran, as the ``gpu`` of
#: ``nvmlDeviceGetUtilizationRates`` is; ``tensor``: % of time any tensor pipe was active; ``dram``: DRAM
#: bandwidth used, % of the most (a MIG instance's memory utilisation as well)
GPM_METRICS = {
    "busy": "NVML_GPM_METRIC_GRAPHICS_UTIL",
    "tensor": "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
    "dram": "NVML_GPM_METRIC_DRAM_BW_UTIL",
}


@dataclass
class _Device:
    handle: Any
    uuid: str
    name: str
    parent: Any | None  # the physical GPU of a MIG instance, for its power and temperature
    physical_uuid: str  # the UUID of the physical GPU (its own, or a MIG instance's parent's): whose faults it has
    last_seen_us: int = 0  # newest per-process sample already read, so none is counted twice
    gpu_instance: int | None = None  # a MIG instance's GPU instance, whose GPM counters it reads
    gpm: list[Any] | None = None  # two GPM sample buffers, the older first, where GPM is supported
    gpm_shared: bool = False  # its GPU instance holds other compute instances: its GPM is theirs too

    @property
    def physical(self) -> Any:
        """The physical GPU's handle: its own, or a MIG instance's parent's."""
        return self.parent if self.parent is not None else self.handle


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
        self.faults = NvmlFaults(nvml, self.counts)
        #: each device's faults as last sent: a device's first reading this run is its baseline
        self._baseline = FaultBaseline()

    def open(self) -> None:
        nv = self.nvml
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            raise NvmlUnavailable(str(exc)) from None
        physical: dict[str, Any] = {}
        for i in range(nv.nvmlDeviceGetCount()):
            handle = nv.nvmlDeviceGetHandleByIndex(i)
            name = _text(nv.nvmlDeviceGetName(handle))
            uuid = _text(nv.nvmlDeviceGetUUID(handle))
            physical[uuid] = handle
            if self._mig_enabled(handle):
                for j in range(nv.nvmlDeviceGetMaxMigDeviceCount(handle)):
                    try:
                        mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, j)
                    except nv.NVMLError_NotFound:
                        continue  # an empty slot
                    dev = _Device(mig, _text(nv.nvmlDeviceGetUUID(mig)), _text(nv.nvmlDeviceGetName(mig)), handle, uuid)
                    with contextlib.suppress(nv.NVMLError):  # unknown: it has every XID of its GPU
                        dev.gpu_instance = int(nv.nvmlDeviceGetGpuInstanceId(mig))
                    self.devices.append(dev)
            else:
                self.devices.append(_Device(handle, uuid, name, None, uuid))
        self.faults.open(physical)
        for dev in self.devices:  # the faults the GPUs had before the run are the baseline, not the run's
            self._baseline.remember([self.faults.read(dev.uuid, dev.physical, dev.physical_uuid, dev.gpu_instance)])
        for dev in self.devices:
            self._open_gpm(dev)
        instances = Counter((id(d.parent), d.gpu_instance) for d in self.devices if d.gpu_instance is not None)
        for dev in self.devices:
            dev.gpm_shared = instances[(id(dev.parent), dev.gpu_instance)] > 1

    def _open_gpm(self, dev: _Device) -> None:
        """GPM sample buffers for the device, and its first sample, where its GPU supports GPM."""
        nv = self.nvml
        try:
            if not nv.nvmlGpmQueryDeviceSupport(dev.physical).isSupportedDevice:
                return
            if dev.parent is not None:
                dev.gpu_instance = int(nv.nvmlDeviceGetGpuInstanceId(dev.handle))
            gpm = [nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()]
            self._gpm_sample(dev, gpm[1])
        except (nv.NVMLError, AttributeError) as exc:  # AttributeError: a pynvml without GPM
            self.counts["gpm_unavailable"] += 1
            log.warning("%s (%s): no GPM counters (%s)", dev.uuid, dev.name, exc)
            return
        dev.gpm = gpm

    def _gpm_sample(self, dev: _Device, buffer: Any) -> None:
        nv = self.nvml
        if dev.gpu_instance is None:
            nv.nvmlGpmSampleGet(dev.handle, buffer)
        else:
            nv.nvmlGpmMigSampleGet(dev.parent, dev.gpu_instance, buffer)

    def _gpm_read(self, dev: _Device) -> dict[str, float]:
        """The GPM metrics between the device's previous GPM sample and one taken now, in % (those
        NVML could compute; none without GPM)."""
        if dev.gpm is None:
            return {}
        nv = self.nvml
        older, newer = dev.gpm
        try:
            self._gpm_sample(dev, older)  # the older buffer takes the new sample
            dev.gpm = [newer, older]
            get = nv.c_nvmlGpmMetricsGet_t()
            get.version = nv.NVML_GPM_METRICS_GET_VERSION
            get.numMetrics = len(GPM_METRICS)
            get.sample1, get.sample2 = newer, older
            for i, metric in enumerate(GPM_METRICS.values()):
                get.metrics[i].metricId = getattr(nv, metric)
            nv.nvmlGpmMetricsGet(get)
        except nv.NVMLError as exc:
            self.counts["gpm_failed"] += 1
            log.warning("%s (%s): GPM read failed (%s)", dev.uuid, dev.name, exc)
            return {}
        out = {}
        for i, name in enumerate(GPM_METRICS):
            value = float(get.metrics[i].value)
            if get.metrics[i].nvmlReturn != nv.NVML_SUCCESS:
                self.counts[f"gpm_not_supported:{name}"] += 1
            elif not math.isfinite(value):  # a NaN would otherwise clamp to 0 %: not measured, and said so
                self.counts[f"gpm_not_finite:{name}"] += 1
            else:
                out[name] = round(min(100.0, max(0.0, value)), 2)
        return out

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
        self.faults.close()
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
        """One sample of every device; a device that fell off the bus is dropped, with a warning, and one whose
        reading makes no valid event (a power above 10 kW) has no events this period, counted
        (``gpu_sample_invalid``; warned once per device)."""
        out: list[Event] = []
        self.faults.begin()
        for dev in list(self.devices):
            try:
                out += self._sample_device(dev, ts_ns, interval_s)
            except self.nvml.NVMLError_GpuIsLost:
                log.error("%s (%s) fell off the bus; no longer sampled", dev.uuid, dev.name)
                self.devices.remove(dev)
                self.counts["gpu_lost"] += 1
            except ValueError as exc:  # a reading no event can hold (a power above 10 kW): this device, this period
                if (dev.uuid, "invalid") not in self._warned:  # once per device: a broken sensor stays broken
                    self._warned.add((dev.uuid, "invalid"))
                    log.warning("%s (%s) skipped (counted gpu_sample_invalid): %s", dev.uuid, dev.name, explain(exc))
                self.counts["gpu_sample_invalid"] += 1
        return out

    def _sample_device(self, dev: _Device, ts_ns: int, interval_s: float) -> list[Event]:
        nv, h = self.nvml, dev.handle
        physical = dev.physical
        gpm = self._gpm_read(dev)
        util = self._optional(dev, "utilization", lambda: nv.nvmlDeviceGetUtilizationRates(h))
        if util is None and "busy" in gpm and "dram" in gpm:
            if dev.gpm_shared:  # one GPU instance's counters cannot say which of its compute instances was busy
                self.counts["gpm_shared_instance"] += 1
            else:
                util = _Util(gpm["busy"], gpm["dram"])
        mem = nv.nvmlDeviceGetMemoryInfo(h)
        power_mw = self._optional(dev, "power", lambda: nv.nvmlDeviceGetPowerUsage(physical))
        temp = self._optional(
            dev, "temperature", lambda: nv.nvmlDeviceGetTemperature(physical, nv.NVML_TEMPERATURE_GPU)
        )
        tx = self._optional(dev, "pcie", lambda: nv.nvmlDeviceGetPcieThroughput(physical, nv.NVML_PCIE_UTIL_TX_BYTES))
        rx = self._optional(dev, "pcie", lambda: nv.nvmlDeviceGetPcieThroughput(physical, nv.NVML_PCIE_UTIL_RX_BYTES))
        out: list[Event] = []
        if util is None:
            self.counts["gpu_sample_skipped"] += 1  # no utilisation, nothing to bill: counted, not guessed
        else:
            reading = replace(
                self.faults.read(dev.uuid, physical, dev.physical_uuid, dev.gpu_instance),
                model=dev.name,
                parent_id=None if dev.parent is None else dev.physical_uuid,
                busy_pct=number(float(util.gpu)),  # float first: a wrapper's numpy scalar reads as its value
                power_w=None if power_mw is None else to_watts(float(power_mw), "mW"),
                mem_used_bytes=int(mem.used),
                mem_total_bytes=int(mem.total),
                temperature_c=None if temp is None else number(float(temp)),
            )
            out.append(self._gpu_sample(reading, float(util.memory), (tx, rx), gpm, ts_ns, interval_s))
        processes, per_process = self._processes(dev, ts_ns, interval_s)
        if out and not per_process and out[0].sm_util_pct > 0:
            processes = self._claimed(out[0], processes)  # type: ignore[arg-type]
        # every event of the device made (each may raise): only now do its faults move the baseline on
        if out and (got := self._baseline.take(reading)) is not None:
            out[0] = out[0].model_copy(update={"fault_fatal": got[0], "fault_warning": got[1]})
        return out + processes

    def _gpu_sample(
        self,
        reading: DeviceSample,
        mem_bw_pct: float,
        pcie_kb_s: tuple[int | None, int | None],
        gpm: dict[str, float],
        ts_ns: int,
        interval_s: float,
    ) -> GpuSample:
        """The GPU sample of a device's neutral reading with a busy time (its busy time, memory, power and
        temperature), with what the neutral model has no field for: memory-interface busy, PCIe rates, GPM's tensor
        and DRAM activity. Its faults, new since the device's last sample sent, are added once the device's events
        are all made."""
        tx, rx = pcie_kb_s
        gpu = GpuSample(
            node_id=self.node_id,
            gpu_uuid=reading.device_id,
            gpu_model=reading.model,
            ts_ns=ts_ns,
            interval_s=interval_s,
            sm_util_pct=float(reading.busy_pct),  # type: ignore[arg-type]
            mem_bw_util_pct=mem_bw_pct,
            mem_used_bytes=reading.mem_used_bytes,
            mem_total_bytes=reading.mem_total_bytes,
            power_w=0.0 if reading.power_w is None else float(reading.power_w),
            temp_c=0.0 if reading.temperature_c is None else float(reading.temperature_c),
            pcie_tx_bytes_s=None if tx is None else int(tx) * 1024,  # NVML reports KB/s
            pcie_rx_bytes_s=None if rx is None else int(rx) * 1024,
            tensor_active_pct=gpm.get("tensor"),
            dram_active_pct=gpm.get("dram"),
        )
        return gpu

    def _claimed(self, gpu: GpuSample, processes: list[ProcessSample]) -> list[ProcessSample]:
        """A busy device without per-process utilisation (a MIG instance): its utilisation goes to its one
        running process, or, with none or several, to a synthetic process no binding names (billed
        ``unattributed``), as the dcgm source does; otherwise the busy time would be billed as idle."""
        if len(processes) == 1:
            return [busy_as(gpu, processes[0].pid, processes[0].mem_used_bytes)]
        self.counts["busy_unclaimed"] += 1
        return processes + [busy_as(gpu, unclaimed_pid(gpu.gpu_uuid), 0)]  # its processes hold the memory

    def _processes(self, dev: _Device, ts_ns: int, interval_s: float) -> tuple[list[ProcessSample], bool]:
        """Per-process utilisation since the last read (mean of NVML's samples) and memory; and whether
        the device has per-process utilisation at all (MIG instances have none)."""
        nv = self.nvml
        per_process = True
        try:
            samples = nv.nvmlDeviceGetProcessUtilization(dev.handle, dev.last_seen_us)
        except nv.NVMLError_NotFound:
            samples = []  # no sample newer than last_seen
        except nv.NVMLError_NotSupported:
            samples, per_process = [], False
        util: dict[int, list[tuple[int, int]]] = {}
        for s in samples:
            if s.timeStamp > dev.last_seen_us or dev.last_seen_us == 0:
                util.setdefault(int(s.pid), []).append((int(s.smUtil), int(s.memUtil)))
        if samples:
            dev.last_seen_us = max(dev.last_seen_us, max(int(s.timeStamp) for s in samples))
        memory = {int(p.pid): int(p.usedGpuMemory or 0) for p in nv.nvmlDeviceGetComputeRunningProcesses(dev.handle)}
        out: list[ProcessSample] = []
        for pid in sorted(set(util) | set(memory)):
            readings = util.get(pid, [])  # a running process without a sample used no SM this period
            sm = sum(r[0] for r in readings) / len(readings) if readings else 0.0
            bw = sum(r[1] for r in readings) / len(readings) if readings else 0.0
            out.append(
                ProcessSample(
                    node_id=self.node_id,
                    gpu_uuid=dev.uuid,
                    pid=pid,
                    ts_ns=ts_ns,
                    interval_s=interval_s,
                    sm_util_pct=round(min(sm, 100.0), 2),
                    mem_bw_util_pct=round(min(bw, 100.0), 2),
                    mem_used_bytes=memory.get(pid, 0),
                )
            )
        return out, per_process


@dataclass
class _Util:
    """GPM's readings in the shape of ``nvmlDeviceGetUtilizationRates``' answer."""

    gpu: float
    memory: float
