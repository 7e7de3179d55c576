"""What each pod on a Kubernetes node holds of its GPUs, as ``allocation`` events (docs/definitions.md,
"Allocation basis"): the allocation basis's source on a Kubernetes node.

The kubelet's pod-resources API (``list_pod_devices``, the listing attribution reads) names each device id a
container was given; the node's ``PodList`` (``list_pods``) gives the pod's UID, its tenant (``pod_tenant``,
attribution's rule), when the kubelet admitted it, and its containers' limits and environment. Polled every
``refresh_ns`` of event time, a hold (pod, container, device id) first listed is an allocation, and a hold no
longer listed is the same allocation again with its end. Why the pod's ``status.startTime`` as the start when
it is earlier than the poll: the kubelet allocates a pod's devices when it admits the pod, so the hold began
then (image pulls included), and that time stays the same across polls and restarts of this source, so a
restart re-sends a start the auditor takes as a ``duplicate``, harmless.

What the kubelet says and what it does not (docs/sources.md, "Allocations from the kubelet"): a device id is a
GPU's UUID (``GPU-…``), a MIG device's (``MIG-…``), a shared GPU's replica (``<uuid>::<n>``, NVIDIA's device
plugin under time-slicing or MPS), or a HAMi vGPU slot (``<uuid>-<n>``, with ``nvidia.com/gpucores`` in the
container's limits). How many replicas a shared GPU has, and whether they are time slices or MPS clients, is in
the device plugin's config, not in any answer here: ``SharingSettings`` says it, from that config's file where
``--kube-sharing-config`` names it (``gpucost.producers.device_plugin_config``), by the resource name the kubelet
lists each device under, else from ``--kube-replicas`` and ``--kube-sharing``.

Why a ledger of the holds sent: ``gpucost.producers.allocation_ledger``.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, NamedTuple

from pydantic import ValidationError

from gpucost.producers.allocation_ledger import Holds, polled_among
from gpucost.producers.attribution import AttributionSettings, tenant_values
from gpucost.producers.device_plugin_config import SharingConfigFile
from gpucost.producers.kubernetes import (
    KubernetesSettings,
    Pod,
    list_pods,
    pod_labels,
    pod_tenant,
    pods_from,
)
from gpucost.producers.pod_resources import list_pod_devices
from gpucost.schemas.events import Allocation, Event

__all__ = ["SHARED_MODES", "Held", "KubernetesAllocations", "Share", "SharingSettings", "share"]

log = logging.getLogger("gpucost.kubernetes")

#: the sharing modes of NVIDIA's device plugin whose replicas the kubelet lists as ``<uuid>::<n>``
SHARED_MODES: tuple[str, ...] = ("time_slicing", "mps")
#: a device the fleet knows: a GPU's or a MIG device's UUID (the device plugin's DEVICE_ID_STRATEGY=uuid)
_DEVICE = re.compile(r"(?:GPU|MIG)-[0-9A-Za-z/_-]+")
#: HAMi's vGPU slots: the GPU's UUID, then ``-<slot>``
_HAMI_SLOT = re.compile(r"(GPU-[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12})-[0-9]+")
HAMI_CORES = "nvidia.com/gpucores"
MPS_PERCENTAGE = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"


@dataclass(frozen=True)
class SharingSettings:
    """What the node's device plugin config says of its shared GPUs and the kubelet does not: its file's
    (``--kube-sharing-config``) where it says, else the flags' (``--kube-replicas``, ``--kube-sharing``)."""

    #: the config's ``sharing.timeSlicing`` (or ``sharing.mps``) ``replicas``; None: a replica is not sent
    replicas: int | None = None
    mode: str = "time_slicing"  # which of SHARED_MODES the config's ``sharing`` section is
    #: the device plugin's config file; None: the two above for every shared GPU
    config: Path | None = None
    _file: dict[Path, SharingConfigFile] = field(default_factory=dict, compare=False, repr=False)

    def replicated(self, resource: str, gpu: str, counts: Counter[str]) -> tuple[str, int | None]:
        """The mode and replicas of ``gpu`` (a GPU's or MIG device's UUID) shared as ``resource``: the config
        file's entry for that resource (its name or rename) and GPU, else the flags' (docs/sources.md)."""
        if self.config is None:
            return self.mode, self.replicas
        table = self._file.setdefault(self.config, SharingConfigFile(self.config)).table(counts)
        if table is None:  # unreadable, or not the plugin's schema: counted and logged as it was read
            return self.mode, self.replicas
        found = table.lookup(resource, gpu)
        if isinstance(found, str):  # the file does not say, or says two things: the flags', counted
            counts[found] += 1
            return self.mode, self.replicas
        return found.mode, found.replicas


class Held(NamedTuple):
    """One hold as the kubelet lists it."""

    namespace: str
    pod: str
    container: str
    device: str


class Share(NamedTuple):
    """What a hold is of: the fleet's device and the fraction of it, by which sharing mode."""

    gpu_uuid: str
    sharing: str
    num: int
    den: int


def _percent(text: str | None) -> int | None:
    """A whole percentage 1 to 100 (HAMi's cores, an MPS client's threads), or None if ``text`` is not one."""
    return int(text) if text is not None and text.isascii() and text.isdigit() and 1 <= int(text) <= 100 else None


def share(
    device: str,
    limits: Mapping[str, str],
    env: Mapping[str, str],
    sharing: SharingSettings,
    resource: str = "",
    counts: Counter[str] | None = None,
) -> Share | str:
    """What ``device`` (an id as pod-resources lists it, under ``resource``) is of, given its container's limits
    and environment; or the reason it cannot be billed (a ``kube_alloc_*`` count). ``counts`` gets the config
    file's (``kube_sharing_config_*``)."""
    if HAMI_CORES in limits:  # HAMi's slots are placeholders for a GPU: its cores limit is the share
        cores = _percent(limits[HAMI_CORES])
        if cores is None:
            return "kube_alloc_gpucores_invalid"
        slot = _HAMI_SLOT.fullmatch(device)
        gpu = slot.group(1) if slot else device.partition("::")[0]
        return Share(gpu, "hami", cores, 100) if _DEVICE.fullmatch(gpu) else "kube_alloc_device_not_gpu"
    gpu, replica, _ = device.partition("::")
    if not _DEVICE.fullmatch(gpu):
        return "kube_alloc_device_not_gpu"  # an index (DEVICE_ID_STRATEGY=index), another plugin's id
    if not replica:
        return Share(gpu, "mig" if gpu.startswith("MIG-") else "exclusive", 1, 1)
    if MPS_PERCENTAGE in env:  # the pod spec caps its MPS client: that is its share
        percent = _percent(env[MPS_PERCENTAGE])
        return "kube_alloc_mps_percentage_invalid" if percent is None else Share(gpu, "mps", percent, 100)
    mode, replicas = sharing.replicated(resource, gpu, Counter() if counts is None else counts)
    return "kube_alloc_replicas_unset" if replicas is None else Share(gpu, mode, 1, replicas)


class KubernetesAllocations:
    """Allocation events from the node's kubelet, polled as a live source's events pass (``interleave``): one
    source serves one node, the producer's, and keeps its ledger under that node's name."""

    origin: Literal["kubernetes"] = "kubernetes"

    def __init__(
        self,
        settings: KubernetesSettings,
        sharing: SharingSettings,
        attribution: AttributionSettings,
        counts: Counter[str] | None = None,
        ledger_dir: Path | None = None,
    ) -> None:
        self.settings, self.sharing, self.attribution = settings, sharing, attribution
        #: the holds sent and not ended, their ledger (None: nothing outlives this source), and the source's counts
        self.holds: Holds[Held] = Holds(
            "kube-allocations", "kube_alloc", Held, Counter() if counts is None else counts, ledger_dir
        )
        self.resources: dict[str, str] = {}  # each device id's resource name, as the last poll listed it

    def interleave(self, events: Iterable[Event]) -> Iterator[Event]:
        """``events``, with the allocations of a poll every ``refresh_ns`` of event time among them."""
        return polled_among(events, self.settings.refresh_ns, self.poll)

    @property
    def counts(self) -> Counter[str]:
        return self.holds.counts

    @counts.setter
    def counts(self, counts: Counter[str]) -> None:
        self.holds.counts = counts

    def poll(self, node_id: str, ts_ns: int) -> list[Allocation]:
        """The holds first listed now, as allocations, then those no longer listed, ended at ``ts_ns``. Where the
        kubelet or the pods' listing does not answer, nothing: no hold is ended for want of an answer."""
        self.holds.load(node_id)
        listed = self._listed()
        if listed is None:
            return []
        devices, pods = listed
        named = {(p.namespace, p.name): p for p in pods.values()}
        held = {Held(ns, pod, c, d) for d, owners in devices.items() for ns, pod, c in owners}

        def start(h: Held) -> Allocation | None:
            pod = named.get((h.namespace, h.pod))
            if pod is None:
                self.counts["kube_alloc_pod_unlisted"] += 1  # listed by the kubelet before the API server: next poll
                return None
            return self._started(h, pod, node_id, ts_ns)

        return self.holds.poll(node_id, ts_ns, held, start)

    def _listed(self) -> tuple[dict[str, list[tuple[str, str, str]]], dict[str, Pod]] | None:
        try:
            devices = list_pod_devices(self.settings, self.resources)
        except Exception as exc:  # grpc.RpcError, or grpc itself missing: counted, said once
            self._unavailable("kube_pod_resources_unavailable", exc, "the pod-resources socket (--kube-pod-resources)")
            return None
        try:
            return devices, pods_from(list_pods(self.settings), self.counts)
        except (OSError, ValueError) as exc:
            self._unavailable("kube_pods_unavailable", exc, "--kube-pods-url and the service account's RBAC")
            return None

    def _unavailable(self, count: str, exc: Exception, check: str) -> None:
        if not self.counts[count]:
            log.warning(
                "cannot list what the node's pods hold (%s: %s); allocations wait for the next poll (check %s: "
                "docs/operations.md)",
                type(exc).__name__,
                exc,
                check,
            )
        self.counts[count] += 1

    def _started(self, h: Held, pod: Pod, node_id: str, ts_ns: int) -> Allocation | None:
        """The allocation ``h`` begins, or None, counted with its reason, for one that cannot be billed."""
        limits, env = pod.limits.get(h.container, {}), pod.env.get(h.container, {})
        found = share(h.device, limits, env, self.sharing, self.resources.get(h.device, ""), self.counts)
        if isinstance(found, str):
            self.counts[found] += 1
            self.holds.refused.add(h)
            return None
        try:
            allocation = Allocation(
                node_id=node_id,
                gpu_uuid=found.gpu_uuid,
                allocation_id=f"{pod.uid}/{h.container}/{h.device}",
                ts_ns=ts_ns if pod.started_ns is None else min(ts_ns, pod.started_ns),
                sharing=found.sharing,  # type: ignore[arg-type]
                fraction_num=found.num,
                fraction_den=found.den,
                origin=self.origin,
                **tenant_values(
                    pod_tenant(pod, h.container, self.settings),
                    self.attribution,
                    pod_labels(pod, h.container, self.attribution, self.counts),
                ),
            )
        except ValidationError:  # a label no tenant can hold (':', too long, a reserved team), a start out of range
            self.counts["kube_alloc_invalid"] += 1
            self.holds.refused.add(h)
            return None
        self.counts[f"kube_alloc_{found.sharing}"] += 1
        return allocation
