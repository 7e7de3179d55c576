"""The dcgm-exporter source: GPU samples from a ``/metrics`` scrape (Prometheus text).

Where a cluster already runs NVIDIA's dcgm-exporter, its scrape gives the GPU-level figures
(no per-process ones: DCGM has none). The scrape is read once, as the neutral reading of
``gpucost.producers.accelerators.dcgm_exporter`` reads it (label names of every release, blank
values written as huge sentinels counted as missing): each device's neutral sample gives the busy
time, memory, power, temperature and faults billed, and its series only what the neutral model has
no field for (memory-copy and profiling activity, PCIe rates, host and pod labels). So each DCGM
metric is mapped in one place, for ``gpucost devices`` and the bill alike.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from decimal import Decimal

from gpucost.producers.accelerators.dcgm_exporter import Series, ratio_pct, read, sample_of
from gpucost.producers.accelerators.events import FaultBaseline
from gpucost.producers.scrape import Scraper, container_binding
from gpucost.producers.synthetic import busy_as, container_pid, unclaimed_pid
from gpucost.schemas.codec import explain
from gpucost.schemas.devices import FAULT_FIELDS, DeviceSample, Parsed, to_bytes, to_pct
from gpucost.schemas.events import Event, GpuSample

__all__ = ["DcgmScraper", "scrape_to_events"]

log = logging.getLogger("gpucost.dcgm")
#: read from each device's series beside its neutral sample (what the GPU sample has and the neutral model has not),
#: each with its conversion: a value that is no reading is counted and read as missing
_BILLED_RAW: dict[str, Callable[[Decimal], object]] = {
    "DCGM_FI_DEV_MEM_COPY_UTIL": to_pct,
    "DCGM_FI_PROF_DRAM_ACTIVE": ratio_pct,
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ratio_pct,
    "DCGM_FI_PROF_PCIE_TX_BYTES": lambda value: to_bytes(value, "B"),
    "DCGM_FI_PROF_PCIE_RX_BYTES": lambda value: to_bytes(value, "B"),
}
#: what a MIG instance lacking it takes from its GPU's reading: DCGM keeps power, temperature and faults per GPU
_FROM_GPU = ("power_w", "temperature_c", *FAULT_FIELDS)


def _float(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]


def scrape_to_events(
    text: str,
    ts_ns: int,
    interval_s: float,
    default_node: str,
    counts: Counter[str] | None = None,
    sla: str = "Bronze",
    faults: FaultBaseline | None = None,
) -> list[Event]:
    """One GPU sample per device in the scrape (the last value of each field wins): per ``UUID``, or
    with MIG per instance (``UUID`` and ``GPU_I_ID``, named ``UUID/GI-<id>``, model ``<model> MIG
    <GPU_I_PROFILE>``), the parent GPU then not billed itself (its power, temperature and faults go to
    its instances where theirs are missing), as the NVML source bills MIG instances.

    Where dcgm-exporter maps devices to Kubernetes pods (labels ``namespace``, ``pod``,
    ``container``), the container owns the device: a tenant binding (team = namespace, app = pod,
    tier = container, the given SLA), once per container and scrape however many devices it owns,
    and a process sample with the device's utilisation, under a synthetic pid, follow the GPU
    sample. A busy device no pod claims gets the same process sample under a pid of its own with
    no binding: its busy time is billed to ``unattributed``, never counted as idle.

    With ``faults``, each GPU sample carries ``fault_fatal`` and ``fault_warning``: its reading's faults new
    since ``faults.since`` it, which then takes it. A device's first reading, and each counter's first value, is
    its own baseline, so what DCGM held before the run (ECC counts since the driver loaded or for the device's
    lifetime, the last XID) is not the run's, nor counted again at each restart; throttling, a state, counts in
    every sample it is in. Only a sample that is sent moves the baseline on, so the faults of a scrape whose
    sample was skipped (no utilisation: a GPU fallen off the bus) come with the device's next sample.
    """
    counts = counts if counts is not None else Counter()
    parsed = Parsed()
    found = read(text, parsed, _BILLED_RAW, strict=True)
    parsed.count_into(counts)
    readings = {device: sample_of(device, s) for device, s in found.items()}
    gpus = {s.parent_id for s in found.values()} & set(found)  # a MIG parent: its time is its instances'
    if gpus:
        counts["mig_parent_not_billed"] += len(gpus)
    out: list[Event] = []
    bound: set[int] = set()  # containers bound in this scrape: one binding each, however many devices
    for device, s in sorted(found.items()):
        if device in gpus:
            continue
        reading, gpu = readings[device], readings.get(s.parent_id or "")
        if gpu is not None:
            reading = replace(reading, **{f: getattr(gpu, f) for f in _FROM_GPU if getattr(reading, f) is None})
        try:
            out += _gpu_events(reading, s, ts_ns, interval_s, default_node, counts, sla, bound, faults)
        except ValueError as exc:  # a value no GPU can have (negative memory, a 'pod' with ':'): counted
            counts["gpu_sample_invalid"] += 1
            log.warning("dcgm: GPU %s skipped this scrape: %s", device, explain(exc))
    return out


def _gpu_events(
    reading: DeviceSample,
    s: Series,
    ts_ns: int,
    interval_s: float,
    default_node: str,
    counts: Counter[str],
    sla: str,
    bound: set[int],
    faults: FaultBaseline | None,
) -> list[Event]:
    if reading.busy_pct is None or reading.mem_used_bytes is None:
        counts["gpu_sample_skipped"] += 1  # no utilisation or memory: nothing to bill, counted
        return []
    v = s.values
    bw = v.get("DCGM_FI_DEV_MEM_COPY_UTIL", v.get("DCGM_FI_PROF_DRAM_ACTIVE"))  # both percentages by now
    gpu = GpuSample(
        node_id=s.host or default_node,
        gpu_uuid=reading.device_id,
        gpu_model=reading.model or f"unknown{s.mig}",
        ts_ns=ts_ns,
        interval_s=interval_s,
        sm_util_pct=float(reading.busy_pct),
        mem_bw_util_pct=_float(bw) or 0.0,
        mem_used_bytes=reading.mem_used_bytes,
        # without FB_FREE the scrape does not say the device's memory: what is used stands in for it
        mem_total_bytes=reading.mem_used_bytes if reading.mem_total_bytes is None else reading.mem_total_bytes,
        power_w=_float(reading.power_w) or 0.0,
        temp_c=_float(reading.temperature_c) or 0.0,
        pcie_tx_bytes_s=v.get("DCGM_FI_PROF_PCIE_TX_BYTES"),
        pcie_rx_bytes_s=v.get("DCGM_FI_PROF_PCIE_RX_BYTES"),
        tensor_active_pct=_float(v.get("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")),
        dram_active_pct=_float(v.get("DCGM_FI_PROF_DRAM_ACTIVE")),
    )
    out: list[Event] = [gpu]
    pid = None
    if s.pod is not None:
        namespace, pod, container = s.pod
        pid = container_pid(namespace, pod, container)
        if pid not in bound:
            out.append(container_binding(gpu.node_id, pid, ts_ns, namespace, pod, container, sla, "dcgm"))
    elif gpu.sm_util_pct > 0:
        pid = unclaimed_pid(gpu.gpu_uuid)
    if pid is not None:
        out.append(busy_as(gpu, pid, gpu.mem_used_bytes))
    # every event of the sample made (each may raise): only now does it count, and move the fault baseline on
    if s.pod is not None:
        bound.add(pid)  # type: ignore[arg-type]
    elif pid is not None:
        counts["busy_unclaimed"] += 1
    if faults is not None and (got := faults.take(reading)) is not None:
        out[0] = gpu.model_copy(update={"fault_fatal": got[0], "fault_warning": got[1]})
    return out


class DcgmScraper(Scraper):
    """dcgm-exporter, scraped each period; its GPU samples carry the device faults new since the device's previous
    sample sent (``scrape_to_events``' ``faults``)."""

    name = "dcgm"

    def __init__(self, url: str, default_node: str, timeout_s: float = 5.0, sla: str = "Bronze") -> None:
        super().__init__(url, default_node, timeout_s, sla)
        self.faults = FaultBaseline()

    def parse(self, text: str, ts_ns: int, interval_s: float) -> list[Event]:
        return scrape_to_events(text, ts_ns, interval_s, self.default_node, self.counts, self.sla, self.faults)
