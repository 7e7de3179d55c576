"""HAMi's vGPU monitor: each GPU's figures and each container's use of it, from a ``/metrics`` scrape.

Where HAMi shares a GPU between pods (``nvidia.com/gpucores``, ``nvidia.com/gpumem``), its vGPU
monitor reports the host's figures per GPU and, per container and device it holds, what HAMi-core
measured inside the container: its SM utilisation and its device memory. That is the usage of a
shared GPU per tenant without a per-process reading on the host (docs/sources.md, "Usage on a
shared GPU"). Both spellings of its metrics are read, the ``hami_*`` names and the older ones the
monitor still writes with ``--legacy-metrics``; where a scrape has both, the ``hami_*`` one wins.

Per scrape, per GPU: a GPU sample (the host's utilisation, memory-controller utilisation, memory,
power and temperature); per container on it, its binding (once a scrape, however many GPUs it holds)
and a process sample under the container's synthetic pid with its SM utilisation and memory; and
the GPU's busy time no container claims (the host's utilisation less the containers', in hundredths
of a percent) as a process sample with no binding, billed to ``unattributed``, never to idle.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from dataclasses import dataclass, field

from gpucost.producers.scrape import Scraper, container_binding, families
from gpucost.producers.synthetic import busy_as, container_pid, unclaimed_pid
from gpucost.schemas.codec import explain
from gpucost.schemas.events import Event, GpuSample
from gpucost.schemas.exact import round_scaled

__all__ = ["HamiScraper", "scrape_to_events", "HOST_METRICS", "CONTAINER_METRICS"]

log = logging.getLogger("gpucost.hami")

#: per GPU: each metric's field, the ``hami_*`` spelling before the older one (the earlier wins)
HOST_METRICS = {
    "hami_host_gpu_utilization_ratio": "sm",
    "HostCoreUtilization": "sm",
    "hami_host_gpu_memory_used_bytes": "mem_used",
    "HostGPUMemoryUsage": "mem_used",
    "hami_host_gpu_memory_controller_utilization_ratio": "mem_bw",
    "hami_host_gpu_power_usage_watts": "power",
    "hami_host_gpu_temperature_celsius": "temp",
}
#: per container and device it holds, as ``HOST_METRICS``
CONTAINER_METRICS = {
    "hami_container_device_utilization_ratio": "sm",
    "Device_utilization_desc_of_container": "sm",
    "hami_container_device_memory_bytes": "mem_used",
    "vGPU_device_memory_usage_in_bytes": "mem_used",
    "hami_vgpu_memory_limit_bytes": "mem_limit",
    "vGPU_device_memory_limit_in_bytes": "mem_limit",
}
_RANK = {name: rank for rank, name in enumerate([*HOST_METRICS, *CONTAINER_METRICS])}
#: the older label names, as the ``hami_*`` metrics name them
_LABELS = {
    "deviceuuid": "device_uuid",
    "devicetype": "device_type",
    "nodeid": "node",
    "podnamespace": "namespace",
    "podname": "pod",
    "ctrname": "container",
}


@dataclass
class _Figures:
    """One GPU's or one container's readings of a scrape, each with the rank of the metric it came from."""

    values: dict[str, float] = field(default_factory=dict)
    ranks: dict[str, int] = field(default_factory=dict)

    def take(self, name: str, what: str, value: float) -> None:
        if _RANK[name] < self.ranks.get(what, len(_RANK)):
            self.values[what], self.ranks[what] = value, _RANK[name]


@dataclass
class _Gpu:
    figures: _Figures = field(default_factory=_Figures)
    node: str | None = None
    model: str | None = None
    containers: dict[tuple[str, str, str], _Figures] = field(default_factory=dict)


def _labels(raw: dict[str, str]) -> dict[str, str]:
    return {_LABELS.get(k, k): v for k, v in raw.items() if v != ""}


def _model(device_type: str | None) -> str:
    """HAMi's ``device_type`` is the vendor, a dash, then NVML's name (``NVIDIA-NVIDIA H200``): the name."""
    if not device_type:
        return "unknown"
    vendor, _, name = device_type.partition("-")
    return name if vendor == "NVIDIA" and name else device_type


def _read(text: str, counts: Counter[str]) -> dict[str, _Gpu]:
    gpus: dict[str, _Gpu] = {}
    for family in families(text, counts):
        for sample in family.samples:
            what = HOST_METRICS.get(sample.name) or CONTAINER_METRICS.get(sample.name)
            if what is None:
                continue  # the monitor's other metrics (temperature's peers, ECC, MIG info, Go's own)
            labels = _labels(sample.labels)
            uuid = labels.get("device_uuid")
            if not uuid:
                counts["sample_without_device_uuid"] += 1
                continue
            if math.isnan(sample.value) or math.isinf(sample.value) or sample.value < 0:
                counts[f"unreadable:{sample.name}"] += 1
                continue
            gpu = gpus.setdefault(uuid, _Gpu())
            if sample.name in HOST_METRICS:
                gpu.figures.take(sample.name, what, sample.value)
                gpu.node = gpu.node or labels.get("node")
                gpu.model = gpu.model or labels.get("device_type")
                continue
            owner = (labels.get("namespace", ""), labels.get("pod", ""), labels.get("container", ""))
            if not owner[0] or not owner[1]:
                counts["container_without_pod"] += 1
                continue
            gpu.containers.setdefault(owner, _Figures()).take(sample.name, what, sample.value)
    return gpus


def scrape_to_events(
    text: str, ts_ns: int, interval_s: float, default_node: str, counts: Counter[str] | None = None, sla: str = "Bronze"
) -> list[Event]:
    """The events of one scrape (the module's docstring says which); what cannot be billed is counted by
    reason in ``counts`` (a GPU without its host figures, a value out of range), never raised."""
    counts = counts if counts is not None else Counter()
    out: list[Event] = []
    bound: set[int] = set()  # containers bound in this scrape: one binding each, however many devices
    for uuid, gpu in sorted(_read(text, counts).items()):
        if "sm" not in gpu.figures.values:
            counts["gpu_without_host_figures"] += 1  # no device utilisation: its containers cannot be billed
            continue
        try:
            out += _gpu_events(uuid, gpu, ts_ns, interval_s, default_node, sla, bound, counts)
        except ValueError as exc:  # a value no GPU can have (over 100 %), a pod name with ':': counted
            counts["gpu_sample_invalid"] += 1
            log.warning("hami: GPU %s skipped this scrape: %s", uuid, explain(exc))
    return out


def _gpu_events(
    uuid: str,
    gpu: _Gpu,
    ts_ns: int,
    interval_s: float,
    default_node: str,
    sla: str,
    bound: set[int],
    counts: Counter[str],
) -> list[Event]:
    host = gpu.figures.values
    used = int(host.get("mem_used", 0))
    limits = sum(int(c.values.get("mem_limit", 0)) for c in gpu.containers.values())
    sample = GpuSample(
        node_id=gpu.node or default_node,
        gpu_uuid=uuid,
        gpu_model=_model(gpu.model),
        ts_ns=ts_ns,
        interval_s=interval_s,
        sm_util_pct=host["sm"],
        mem_bw_util_pct=host.get("mem_bw", 0.0),
        mem_used_bytes=used,
        mem_total_bytes=max(used, limits),  # HAMi reports no device total: a lower bound, which no figure reads
        power_w=host.get("power", 0.0),
        temp_c=host.get("temp", 0.0),
    )
    events: list[Event] = [sample]
    claimed_cp = 0
    for (namespace, pod, container), figures in sorted(gpu.containers.items()):
        if "sm" not in figures.values:
            counts["container_without_utilisation"] += 1
            continue
        busy_cp = min(10_000, round_scaled(figures.values["sm"], 100))
        pid = container_pid(namespace, pod, container)
        if pid not in bound:
            try:
                events.append(container_binding(sample.node_id, pid, ts_ns, namespace, pod, container, sla, "hami"))
            except ValueError as exc:  # a name no tenant field may hold: its busy time stays unclaimed, counted
                counts["container_name_invalid"] += 1
                log.warning("hami: container %s/%s/%s not bound: %s", namespace, pod, container, explain(exc))
                continue
            bound.add(pid)
        events.append(busy_as(sample, pid, int(figures.values.get("mem_used", 0)), busy_cp))
        claimed_cp += busy_cp
    rest_cp = sample.sm_util_cp - claimed_cp
    if rest_cp > 0:
        counts["busy_unclaimed"] += 1
        events.append(busy_as(sample, unclaimed_pid(uuid), 0, rest_cp))
    elif rest_cp < 0:
        counts["containers_above_host"] += 1  # read at other instants: the containers' own figures are billed
    return events


class HamiScraper(Scraper):
    """HAMi's vGPU monitor, scraped each period."""

    name = "hami"

    def parse(self, text: str, ts_ns: int, interval_s: float) -> list[Event]:
        return scrape_to_events(text, ts_ns, interval_s, self.default_node, self.counts, self.sla)
