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
of a percent) as a process sample with no binding, billed to ``unattributed``, never to idle. The
host's figure is the GPU's busy time: containers that claim more of it (read at other instants)
share it in proportion to their claims, so their figures never turn the GPU's idle time into theirs.
One bad figure costs that figure only (``_held``), never its GPU's bill.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from gpucost.producers.scrape import Scraper, container_binding, families
from gpucost.producers.synthetic import busy_as, container_pid, unclaimed_pid
from gpucost.schemas.bounds import field_bounds
from gpucost.schemas.codec import explain
from gpucost.schemas.events import Event, GpuSample
from gpucost.schemas.exact import round_scaled
from gpucost.streams.money import split_in_order

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


#: each figure's field of a GPU sample, whose declared bounds it must meet (``gpucost.schemas.bounds``)
_FIELDS = {
    "sm": "sm_util_pct",
    "mem_bw": "mem_bw_util_pct",
    "mem_used": "mem_used_bytes",
    "mem_limit": "mem_total_bytes",
    "power": "power_w",
    "temp": "temp_c",
}


def _held(name: str, what: str, value: float, counts: Counter[str]) -> float | None:
    """``value`` as a figure: a percentage past 100 (a rounding, or HAMi's figure of a container over several
    processes) is 100, counted ``clamped:<metric>``; a value its field cannot hold (NaN, infinite, negative, a
    byte count past 2^63 such as an unsigned underflow of HAMi's) is no figure, counted ``unreadable:<metric>``.
    So one bad figure costs that figure, never its GPU's bill."""
    if what in ("sm", "mem_bw") and value > 100:
        counts[f"clamped:{name}"] += 1
        return 100.0
    if not field_bounds(GpuSample, _FIELDS[what]).holds(np.array([value], dtype=float)).all():
        counts[f"unreadable:{name}"] += 1
        return None
    return value


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
            value = _held(sample.name, what, sample.value, counts)
            if value is None:
                continue
            gpu = gpus.setdefault(uuid, _Gpu())
            if sample.name in HOST_METRICS:
                gpu.figures.take(sample.name, what, value)
                gpu.node = gpu.node or labels.get("node")
                gpu.model = gpu.model or labels.get("device_type")
                continue
            owner = (labels.get("namespace", ""), labels.get("pod", ""), labels.get("container", ""))
            if not owner[0] or not owner[1]:
                counts["container_without_pod"] += 1
                continue
            gpu.containers.setdefault(owner, _Figures()).take(sample.name, what, value)
    return gpus


def scrape_to_events(
    text: str, ts_ns: int, interval_s: float, default_node: str, counts: Counter[str] | None = None, sla: str = "Bronze"
) -> list[Event]:
    """The events of one scrape (the module's docstring says which); what cannot be billed is counted by
    reason in ``counts`` (a GPU without its host figures, a value out of range), never raised."""
    counts = counts if counts is not None else Counter()
    out: list[Event] = []
    owners: dict[int, tuple[str, str, str]] = {}  # the containers bound in this scrape, by pid: one binding each
    for uuid, gpu in sorted(_read(text, counts).items()):
        if "sm" not in gpu.figures.values:
            counts["gpu_without_host_figures"] += 1  # no device utilisation: its containers cannot be billed
            continue
        try:
            events, bound = _gpu_events(uuid, gpu, ts_ns, interval_s, default_node, sla, owners, counts)
        except ValueError as exc:  # a name or model no event field may hold (over 256 characters): counted
            counts["gpu_sample_invalid"] += 1
            log.warning("hami: GPU %s skipped this scrape: %s", uuid, explain(exc))
            continue
        out += events
        owners |= bound  # only once its GPU's events are kept: a container's other GPUs then bind it
    return out


def _gpu_events(
    uuid: str,
    gpu: _Gpu,
    ts_ns: int,
    interval_s: float,
    default_node: str,
    sla: str,
    owners: dict[int, tuple[str, str, str]],
    counts: Counter[str],
) -> tuple[list[Event], dict[int, tuple[str, str, str]]]:
    """One GPU's events and the containers they bind (``owners``: those bound already in this scrape)."""
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
        mem_total_bytes=min(max(used, limits), 2**63 - 1),  # HAMi reports no device total; no figure reads it
        power_w=host.get("power", 0.0),
        temp_c=host.get("temp", 0.0),
    )
    events: list[Event] = [sample]
    bound: dict[int, tuple[str, str, str]] = {}
    claims: dict[int, int] = {}  # busy claimed per pid, hundredths of a percent; unclaimed_pid for no one's
    memory: dict[int, int] = {}
    nobody = unclaimed_pid(uuid)
    for owner, figures in sorted(gpu.containers.items()):
        if "sm" not in figures.values:
            counts["container_without_utilisation"] += 1
            continue
        pid = _bound_pid(owner, sample, sla, owners | bound, events, counts)
        if pid is None:
            pid = nobody  # not bound: its busy time no one's, billed to unattributed
        else:
            bound[pid] = owner
            memory[pid] = int(figures.values.get("mem_used", 0))
        claims[pid] = claims.get(pid, 0) + round_scaled(figures.values["sm"], 100)
    for pid, busy_cp in _busy_split(sample.sm_util_cp, claims, nobody, counts).items():
        if busy_cp or pid != nobody:
            events.append(busy_as(sample, pid, memory.get(pid, 0), busy_cp))
    return events, bound


def _bound_pid(
    owner: tuple[str, str, str],
    sample: GpuSample,
    sla: str,
    owners: dict[int, tuple[str, str, str]],
    events: list[Event],
    counts: Counter[str],
) -> int | None:
    """The synthetic pid of ``owner``, its binding appended to ``events`` unless bound already; None where it
    cannot be bound: a name no tenant field may hold, or a pid another container of the scrape hashed to."""
    pid = container_pid(*owner)
    if pid in owners:
        if owners[pid] == owner:
            return pid
        counts["container_pid_collision"] += 1
        log.warning("hami: containers %s and %s share a synthetic pid: the second not bound", owners[pid], owner)
        return None
    try:
        events.append(container_binding(sample.node_id, pid, sample.ts_ns, *owner, sla, "hami"))
    except ValueError as exc:
        counts["container_name_invalid"] += 1
        log.warning("hami: container %s not bound: %s", "/".join(owner), explain(exc))
        return None
    return pid


def _busy_split(host_cp: int, claims: dict[int, int], nobody: int, counts: Counter[str]) -> dict[int, int]:
    """The GPU's busy time (the host's figure, in hundredths of a percent) per pid: each container's own figure,
    and what they leave to ``nobody``; where they claim more than the host saw (read at other instants), the
    host's figure split in proportion to their claims, by largest remainder, so the GPU's idle time stays idle."""
    total = sum(claims.values())
    if total <= host_cp:
        counts["busy_unclaimed"] += host_cp > total
        return claims | {nobody: claims.get(nobody, 0) + host_cp - total}
    counts["containers_above_host"] += 1
    return dict(zip(claims, split_in_order(host_cp, list(claims.values()), total)))


class HamiScraper(Scraper):
    """HAMi's vGPU monitor, scraped each period."""

    name = "hami"

    def parse(self, text: str, ts_ns: int, interval_s: float) -> list[Event]:
        return scrape_to_events(text, ts_ns, interval_s, self.default_node, self.counts, self.sla)
