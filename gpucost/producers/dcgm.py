"""The dcgm-exporter source: GPU samples from a ``/metrics`` scrape (Prometheus text).

Where a cluster already runs NVIDIA's dcgm-exporter, its scrape gives the GPU-level figures
(no per-process ones: DCGM has none). Parsed with prometheus_client's parser; label names of
every release are accepted (``Hostname`` became ``hostname``); blank values, which the
exporter writes as huge sentinels, count as missing. The device faults on its GPU samples come
from the neutral reading of the same scrape (``gpucost.producers.accelerators.dcgm_exporter``), so
the fault metrics are mapped in one place.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from dataclasses import replace

from gpucost.producers.accelerators import dcgm_exporter
from gpucost.producers.accelerators.dcgm_exporter import SENTINEL_MIN, device_of
from gpucost.producers.accelerators.events import FaultBaseline
from gpucost.producers.scrape import Scraper, container_binding, families
from gpucost.producers.synthetic import busy_as, container_pid, unclaimed_pid
from gpucost.schemas.codec import explain
from gpucost.schemas.devices import FAULT_FIELDS, DeviceSample
from gpucost.schemas.events import Event, GpuSample

__all__ = ["DcgmScraper", "scrape_to_events"]

log = logging.getLogger("gpucost.dcgm")
MIB = 1 << 20


def _value(v: float) -> float | None:
    return None if math.isnan(v) or math.isinf(v) or abs(v) >= SENTINEL_MIN else v


def _pct(ratio: object) -> float | None:
    """A profiling ratio (0–1) as a percentage, clamped as the exporter's rounding may pass 1."""
    return None if ratio is None else min(100.0, max(0.0, float(ratio) * 100))  # type: ignore[arg-type]


def scrape_to_events(
    text: str, ts_ns: int, interval_s: float, default_node: str, counts: Counter[str] | None = None, sla: str = "Bronze"
) -> list[Event]:
    """One GPU sample per device in the scrape (the last value of each field wins): per ``UUID``, or
    with MIG per instance (``UUID`` and ``GPU_I_ID``, named ``UUID/GI-<id>``, model ``<model> MIG
    <GPU_I_PROFILE>``), the parent GPU then not billed itself (its power and temperature go to its
    instances), as the NVML source bills MIG instances.

    Where dcgm-exporter maps devices to Kubernetes pods (labels ``namespace``, ``pod``,
    ``container``), the container owns the device: a tenant binding (team = namespace, app = pod,
    tier = container, the given SLA), once per container and scrape however many devices it owns,
    and a process sample with the device's utilisation, under a synthetic pid, follow the GPU
    sample. A busy device no pod claims gets the same process sample under a pid of its own with
    no binding: its busy time is billed to ``unattributed``, never counted as idle.
    """
    counts = counts if counts is not None else Counter()
    gpus: dict[str, dict[str, object]] = {}
    parents_of_instances: set[str] = set()
    for family in families(text, counts):
        for sample in family.samples:
            uuid = sample.labels.get("UUID")
            if not sample.name.startswith("DCGM_FI_"):
                continue  # the exporter's own metrics
            if not uuid:
                counts["sample_without_uuid"] += 1
                continue
            device, parent, mig = device_of(sample.labels)
            if parent:
                parents_of_instances.add(parent)
            gpu = gpus.setdefault(device, {})
            gpu["parent"] = parent
            gpu["model"] = sample.labels.get("modelName", "unknown") + mig
            if sample.labels.get("pod") and sample.labels.get("namespace"):
                gpu["owner"] = (sample.labels["namespace"], sample.labels["pod"], sample.labels.get("container", ""))
            gpu["node"] = sample.labels.get("Hostname") or sample.labels.get("hostname") or default_node
            value = _value(sample.value)
            if value is None:
                counts[f"blank:{sample.name}"] += 1
            else:
                gpu[sample.name] = value
    for uuid in parents_of_instances & set(gpus):  # a MIG parent: its time is its instances'
        parent = gpus.pop(uuid)
        counts["mig_parent_not_billed"] += 1
        for g in gpus.values():
            if g["parent"] == uuid:
                for field in ("DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_TEMP"):
                    if field in parent:
                        g.setdefault(field, parent[field])
    out: list[Event] = []
    bound: set[int] = set()  # containers bound in this scrape: one binding each, however many devices
    for device, g in sorted(gpus.items()):
        try:
            out += _gpu_events(device, g, ts_ns, interval_s, counts, sla, bound)
        except ValueError as exc:  # a value no GPU can have (negative memory, a 'pod' with ':'): counted
            counts["gpu_sample_invalid"] += 1
            log.warning("dcgm: GPU %s skipped this scrape: %s", device, explain(exc))
    return out


def _gpu_events(
    uuid: str, g: dict[str, object], ts_ns: int, interval_s: float, counts: Counter[str], sla: str, bound: set[int]
) -> list[Event]:
    sm = g.get("DCGM_FI_DEV_GPU_UTIL")
    if sm is None and "DCGM_FI_PROF_GR_ENGINE_ACTIVE" in g:
        sm = float(g["DCGM_FI_PROF_GR_ENGINE_ACTIVE"]) * 100  # type: ignore[arg-type]
    bw = g.get("DCGM_FI_DEV_MEM_COPY_UTIL")
    if bw is None and "DCGM_FI_PROF_DRAM_ACTIVE" in g:
        bw = float(g["DCGM_FI_PROF_DRAM_ACTIVE"]) * 100  # type: ignore[arg-type]
    if sm is None or "DCGM_FI_DEV_FB_USED" not in g:
        counts["gpu_sample_skipped"] += 1  # no utilisation or memory: nothing to bill, counted
        return []
    fb = [
        float(g.get(f, 0.0))  # type: ignore[arg-type]
        for f in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED")
    ]
    tx, rx = g.get("DCGM_FI_PROF_PCIE_TX_BYTES"), g.get("DCGM_FI_PROF_PCIE_RX_BYTES")
    gpu = GpuSample(
        node_id=str(g["node"]),
        gpu_uuid=uuid,
        gpu_model=str(g["model"]),
        ts_ns=ts_ns,
        interval_s=interval_s,
        sm_util_pct=min(100.0, float(sm)),
        mem_bw_util_pct=min(100.0, float(bw or 0.0)),  # type: ignore[arg-type]
        mem_used_bytes=int(fb[0]) * MIB,
        mem_total_bytes=int(sum(fb)) * MIB,
        power_w=float(g.get("DCGM_FI_DEV_POWER_USAGE", 0.0)),  # type: ignore[arg-type]
        temp_c=float(g.get("DCGM_FI_DEV_GPU_TEMP", 0.0)),  # type: ignore[arg-type]
        pcie_tx_bytes_s=None if tx is None else int(tx),  # type: ignore[call-overload]
        pcie_rx_bytes_s=None if rx is None else int(rx),  # type: ignore[call-overload]
        tensor_active_pct=_pct(g.get("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")),
        dram_active_pct=_pct(g.get("DCGM_FI_PROF_DRAM_ACTIVE")),
    )
    out: list[Event] = [gpu]
    owner = g.get("owner")
    if owner is not None:
        namespace, pod, container = owner  # type: ignore[misc]
        pid = container_pid(namespace, pod, container)
        if pid not in bound:
            bound.add(pid)
            out.append(container_binding(gpu.node_id, pid, ts_ns, namespace, pod, container, sla, "dcgm"))
    elif gpu.sm_util_pct > 0:
        pid = unclaimed_pid(uuid)
        counts["busy_unclaimed"] += 1
    else:
        return out
    out.append(busy_as(gpu, pid, gpu.mem_used_bytes))
    return out


class DcgmScraper(Scraper):
    """dcgm-exporter, scraped each period; its GPU samples carry the device faults new since the device's previous
    scrape (``with_faults``)."""

    name = "dcgm"

    def __init__(self, url: str, default_node: str, timeout_s: float = 5.0, sla: str = "Bronze") -> None:
        super().__init__(url, default_node, timeout_s, sla)
        self.faults = FaultBaseline()

    def parse(self, text: str, ts_ns: int, interval_s: float) -> list[Event]:
        events = scrape_to_events(text, ts_ns, interval_s, self.default_node, self.counts, self.sla)
        return with_faults(events, dcgm_exporter.parse(text).samples, self.faults)


def with_faults(events: list[Event], readings: list[DeviceSample], baseline: FaultBaseline) -> list[Event]:
    """``events`` with each GPU sample's ``fault_fatal`` and ``fault_warning``: the faults of its device's reading in
    ``readings`` (``dcgm_exporter.parse`` of the same scrape) new since ``baseline.since`` it, which then takes it.
    A device's first reading, and each counter's first value, is its own baseline, so what DCGM held before the run
    (ECC counts since the driver loaded or for the device's lifetime, the last XID) is not the run's, nor counted
    again at each restart; throttling, a state, counts in every sample it is in. A MIG instance takes each fault
    field its own series lack from its GPU's (DCGM keeps faults per GPU). Only a reading whose sample is sent moves
    the baseline on, so the faults of a scrape whose sample was skipped (no utilisation: a GPU fallen off the bus)
    come with the device's next sample. A device whose reading has no fault field gets neither field."""
    by_id = {s.device_id: s for s in readings}
    out: list[Event] = []
    for e in events:
        reading = by_id.get(e.gpu_uuid) if isinstance(e, GpuSample) else None
        if reading is not None:
            gpu = by_id.get(reading.parent_id or "")
            if gpu is not None:
                reading = replace(reading, **{f: getattr(gpu, f) for f in FAULT_FIELDS if getattr(reading, f) is None})
            got = baseline.take(reading)
            if got is not None:
                e = e.model_copy(update={"fault_fatal": got[0], "fault_warning": got[1]})
        out.append(e)
    return out
