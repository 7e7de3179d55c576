"""Who a GPU process belongs to on a Kubernetes node: its pod, and the pod's labels.

A process is mapped to its pod through its cgroup (``/proc/<pid>/cgroup`` names the pod's UID and
the container's id under every cgroup driver and runtime a kubelet uses). Where it names none (a
process in a cgroup namespace of its own, a runtime that hides it), the pod the kubelet gave the
process's GPU to answers instead, from the kubelet's pod-resources API (``List`` of the
``v1.PodResourcesLister`` service on its Unix socket, as dcgm-exporter reads it; the service is
declared in ``podresources.proto``). The pod's labels and annotations, listed from the API server
(or the kubelet), give the tenant by configurable keys (``LABELS``); a pod without them is its
namespace's, as dcgm-exporter's pods are.

What each pod holds of the node's GPUs, for the allocation basis, is read from the same two answers by
``gpucost.producers.kubernetes_allocations``.

Nothing here is fatal: what cannot be read is counted and, where it may be there later (the API
server away, a pod not yet listed), ``LATER`` asks ``Attribution`` to look again. docs/sources.md,
"Kubernetes", is the user's account; docs/operations.md has the DaemonSet's RBAC and mounts.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import re
import ssl
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpucost.producers.attribution import LATER, AttributionSettings, Later, first_set, labels_of, tenant_binding
from gpucost.producers.pod_resources import list_pod_devices
from gpucost.schemas.events import Event, TenantBinding

__all__ = [
    "KubernetesSettings",
    "KubernetesPods",
    "LABELS",
    "Pod",
    "cgroup_pod",
    "pods_from",
    "list_pods",
    "pod_labels",
    "pod_tenant",
    "EXPORTER_ORIGINS",
]

log = logging.getLogger("gpucost.kubernetes")

#: where an exporter bound a pod's container by its names alone (``gpucost.producers.scrape.container_binding``)
EXPORTER_ORIGINS = ("dcgm", "hami")

#: each binding field and the pod label or annotation keys that give it, first set wins (labels before
#: annotations). A pod none of them names a team of is its namespace's; with no app, its pod's name; with
#: no tier, its container's name (dcgm-exporter's rule, so both sources bill a pod alike)
LABELS: Mapping[str, tuple[str, ...]] = {
    "team": ("gpucost.io/team", "team"),
    "env": ("gpucost.io/env", "env", "environment"),
    "app": ("gpucost.io/app", "app.kubernetes.io/name", "app"),
    "tier": ("gpucost.io/tier", "tier"),
    "sla": ("gpucost.io/sla",),
    "git_commit": ("gpucost.io/git-commit",),
    "ci_pipeline_id": ("gpucost.io/ci-pipeline-id",),
}
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_STATIC = "kubernetes.io/config.mirror"  # on a static pod's mirror: the UID the kubelet runs it under


@dataclass(frozen=True)
class KubernetesSettings:
    """Where the node's pods and devices are read (``--kube-*`` flags: docs/operations.md)."""

    #: a URL answering a ``PodList`` of this node's pods; None: the API server the pod runs under
    #: (``KUBERNETES_SERVICE_HOST``), its pods on ``node_name``
    pods_url: str | None = None
    node_name: str | None = None  # the Downward API's spec.nodeName, as NODE_NAME
    token_file: Path = SERVICE_ACCOUNT / "token"  # sent as a bearer token, where it exists
    ca_file: Path = SERVICE_ACCOUNT / "ca.crt"  # the API server's CA, where it exists
    pod_resources: Path = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    labels: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: dict(LABELS))
    #: the device plugin resources that are GPUs (prefixes: a MIG profile is ``nvidia.com/mig-1g.10gb``)
    gpu_resources: tuple[str, ...] = ("nvidia.com/gpu", "nvidia.com/mig-")
    #: the least event time between two listings of the pods (or devices) for something not found in the last
    refresh_ns: int = 10_000_000_000
    timeout_s: float = 5.0

    def url(self) -> str:
        """The pods' URL, or a ValueError that says what to set."""
        if self.pods_url:
            return self.pods_url
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host or not self.node_name:
            raise ValueError(
                "Kubernetes attribution needs the node's pods: set --kube-pods-url "
                "(GPUCOST_KUBE_PODS_URL), or run in a pod (KUBERNETES_SERVICE_HOST) with NODE_NAME "
                "from the Downward API"
            )
        selector = urllib.parse.quote(f"spec.nodeName={self.node_name}")
        return f"https://{host}:{port}/api/v1/pods?fieldSelector={selector}"


@dataclass(frozen=True)
class Pod:
    uid: str
    namespace: str
    name: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    containers: Mapping[str, str]  # container id (no runtime prefix) → container name
    #: when the kubelet admitted the pod (``status.startTime``), which is when its devices were allocated
    started_ns: int | None = None
    #: each container's resource limits and the environment variables its spec sets to a literal, by its name
    limits: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    env: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    #: the controller that owns it, as ``Kind/name`` (``ReplicaSet/trainer-7f9c``, ``Job/eval``), if any
    controller: str | None = None


# a pod's UID (a static pod's is its config's 32-digit hash)
_POD_UID = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32})")
_CONTAINER_ID = re.compile(r"(?:^|[/-])([0-9a-f]{64})(?:\.scope)?$")


def cgroup_pod(text: str) -> tuple[str, str | None] | None:
    """The pod UID and container id a ``/proc/<pid>/cgroup`` names, or None for a process in no pod.

    cgroupfs puts a container at ``kubepods/<qos>/pod<uid>/<id>``; systemd at
    ``kubepods-<qos>-pod<uid_with_underscores>.slice/<runtime>-<id>.scope`` (``cri-containerd-``,
    ``crio-``, ``docker-``); cgroup v2 has one line, v1 one per controller, alike for this."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        pod = _POD_UID.search(path)
        if pod is not None:
            container = _CONTAINER_ID.search(path)
            return pod.group(1).replace("_", "-"), container.group(1) if container else None
    return None


def pods_from(doc: object, counts: Counter[str]) -> dict[str, Pod]:
    """The pods of a ``PodList`` (the API server's or the kubelet's ``/pods``), by UID; an item without
    a UID, name or namespace is counted (``kube_pod_invalid``) and left out."""
    items = doc.get("items") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        raise ValueError("not a PodList: no 'items' list")
    pods = {}
    for item in items:
        meta = item.get("metadata") if isinstance(item, dict) else None
        meta = meta if isinstance(meta, dict) else {}
        uid, namespace, name = meta.get("uid"), meta.get("namespace"), meta.get("name")
        if not all(isinstance(v, str) and v for v in (uid, namespace, name)):
            counts["kube_pod_invalid"] += 1
            continue
        status = item.get("status") if isinstance(item.get("status"), dict) else {}
        containers = {}
        for c in [*_dicts(status.get("containerStatuses")), *_dicts(status.get("initContainerStatuses"))]:
            if isinstance(c.get("containerID"), str) and isinstance(c.get("name"), str):
                containers[c["containerID"].rpartition("://")[2]] = c["name"]
        spec = item.get("spec") if isinstance(item.get("spec"), dict) else {}
        specs = [c for c in _dicts(spec.get("containers")) if isinstance(c.get("name"), str)]
        pods[uid] = Pod(
            uid=uid,
            namespace=namespace,
            name=name,
            labels=_strings(meta.get("labels")),
            annotations=_strings(meta.get("annotations")),
            containers=containers,
            started_ns=_rfc3339_ns(status.get("startTime")),
            limits={c["name"]: _strings(_dict(c.get("resources")).get("limits")) for c in specs},
            env={c["name"]: {e["name"]: e["value"] for e in _dicts(c.get("env")) if _literal(e)} for c in specs},
            controller=next(
                (
                    f"{o['kind']}/{o['name']}"
                    for o in _dicts(meta.get("ownerReferences"))
                    if o.get("controller") is True and isinstance(o.get("kind"), str) and isinstance(o.get("name"), str)
                ),
                None,
            ),
        )
    return pods


def _literal(variable: dict[str, Any]) -> bool:
    """An ``env`` entry with a name and a literal value (not one ``valueFrom`` a ConfigMap, a Secret, a field)."""
    return isinstance(variable.get("name"), str) and isinstance(variable.get("value"), str)


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _dicts(value: object) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _rfc3339_ns(value: object) -> int | None:
    """A Kubernetes time (``2026-11-30T08:00:05Z``, whole seconds) in ns since the epoch; None if absent or not one."""
    if not isinstance(value, str):
        return None
    try:
        at = dt.datetime.fromisoformat(value)
    except ValueError:
        return None
    if at.tzinfo is None:
        return None
    return (at - _EPOCH) // dt.timedelta(microseconds=1) * 1000


def _strings(value: object) -> dict[str, str]:
    if not isinstance(value, dict):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}


def pod_tenant(pod: Pod, container: str, settings: KubernetesSettings) -> dict[str, str]:
    """The tenant's fields of ``pod``'s ``container``: its labels' and annotations' (a label first), the
    namespace, pod and container names where none is set (dcgm-exporter's rule)."""
    found, _ = first_set(settings.labels, pod.labels, pod.annotations)
    return {"team": pod.namespace, "app": pod.name, "tier": container, **found}


def pod_labels(
    pod: Pod, container: str, settings: AttributionSettings, counts: Counter[str] | None = None
) -> dict[str, str] | None:
    """The labels named in ``--label-keys`` for ``pod``'s ``container`` (``labels_of``): ``namespace``, ``pod``,
    ``container`` and ``controller`` (its owner, ``Kind/name``) are the pod's own; any other key is a pod label of
    that name, else an annotation. The same for a pod's bindings and its allocations, so both name one tenant."""
    own = {"namespace": pod.namespace, "pod": pod.name, "container": container}
    if pod.controller is not None:
        own["controller"] = pod.controller
    return labels_of(settings, own, pod.labels, pod.annotations, counts=counts)


def list_pods(settings: KubernetesSettings) -> object:
    """The node's ``PodList``, as JSON (an ``OSError`` or ``ValueError`` where it cannot be had)."""
    url = settings.url()
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    if settings.token_file.exists():
        request.add_header("Authorization", f"Bearer {settings.token_file.read_text().strip()}")
    context = None
    if url.startswith("https:"):
        context = ssl.create_default_context(cafile=str(settings.ca_file) if settings.ca_file.exists() else None)
    with urllib.request.urlopen(request, timeout=settings.timeout_s, context=context) as response:
        return json.load(response)


class KubernetesPods:
    """Bindings from a process's pod (``BindingSource``, origin ``kubernetes``)."""

    origin = "kubernetes"

    def __init__(
        self, settings: KubernetesSettings, attribution: AttributionSettings, counts: Counter[str] | None = None
    ) -> None:
        self.settings, self.attribution = settings, attribution
        self.counts: Counter[str] = Counter() if counts is None else counts
        self._pods: dict[str, Pod] = {}
        self._named: dict[tuple[str, str], Pod] = {}
        self._devices: dict[str, list[tuple[str, str, str]]] = {}
        self._pods_at: int | None = None  # event time of the last listing (tried), pods and devices
        self._devices_at: int | None = None
        self._devices_failed = False

    def binding(self, node_id: str, pid: int, ts_ns: int, gpu_uuid: str | None) -> TenantBinding | Later | None:
        try:
            text = (self.attribution.proc / str(pid) / "cgroup").read_text(errors="replace")
        except OSError:
            self.counts["kube_cgroup_unreadable"] += 1
            return None
        where = cgroup_pod(text)
        if where is not None:
            pod = self._pod(where[0], ts_ns)
            if pod is None:
                return LATER  # listed later (or the API server is away): looked at again
            return self._binding(pod, pod.containers.get(where[1] or "", ""), node_id, pid, ts_ns)
        if gpu_uuid is None:
            return None  # not in a pod, and no GPU to ask the kubelet about: a process of the node's own
        owners = self._owners(gpu_uuid, ts_ns)
        if owners is None:
            return LATER
        if len(owners) != 1:
            self.counts["kube_gpu_shared" if owners else "kube_gpu_unallocated"] += 1
            return None  # shared by time-slicing: which pod the process is in, only its cgroup can tell
        namespace, name, container = owners[0]
        pod = self._named.get((namespace, name)) or self._relisted_by_name(namespace, name, ts_ns)
        if pod is None:
            return LATER
        return self._binding(pod, container, node_id, pid, ts_ns)

    def named(self, events: Iterable[Event]) -> Iterator[Event]:
        """``events``, each binding an exporter made of a pod's container (``EXPORTER_ORIGINS``: team = namespace,
        app = pod, tier = container) replaced by the binding this pod's labels give it, so that its use is named as
        its allocation and its processes' bindings are; kept as it came where the pod is not listed (yet, or the API
        server is away) or its labels make no tenant, counted either way. The pods are listed again once a refresh
        (``refresh_ns``), so a pod made again under its name with other labels is named by its new ones."""
        for event in events:
            if isinstance(event, TenantBinding) and event.origin in EXPORTER_ORIGINS:
                b = event
                self._relist(b.ts_ns)  # when due: a pod made again under its name, with other labels, is seen
                pod = self._named.get((b.team, b.app))
                found = None if pod is None else self._binding(pod, b.tier, b.node_id, b.pid, b.ts_ns)
                self.counts["kube_exporter_named" if found else "kube_exporter_pod_unnamed"] += 1
                event = found or event
            yield event

    def _due(self, last: int | None, ts_ns: int) -> bool:
        return last is None or ts_ns - last >= self.settings.refresh_ns

    def _relist(self, ts_ns: int) -> bool:
        """Whether the pods were listed now (not too soon after the last time, and answered)."""
        if not self._due(self._pods_at, ts_ns):
            return False
        self._pods_at = ts_ns
        try:
            pods = pods_from(list_pods(self.settings), self.counts)
        except (OSError, ValueError) as exc:  # unreachable, refused, not JSON, not a PodList
            if not self.counts["kube_pods_unavailable"]:
                log.warning(
                    "cannot list the node's pods (%s); their processes wait unattributed and are looked at "
                    "again (check --kube-pods-url and the service account's RBAC: docs/operations.md)",
                    exc,
                )
            self.counts["kube_pods_unavailable"] += 1
            return False
        # a static pod's processes run under its own UID, which its mirror in the API server keeps as an annotation
        self._pods = pods | {p.annotations[_STATIC]: p for p in pods.values() if p.annotations.get(_STATIC)}
        self._named = {(p.namespace, p.name): p for p in pods.values()}
        return True

    def _pod(self, uid: str, ts_ns: int) -> Pod | None:
        if uid not in self._pods and self._relist(ts_ns) and uid not in self._pods:
            self.counts["kube_pod_unknown"] += 1  # counted once a listing, not at every look
        return self._pods.get(uid)

    def _relisted_by_name(self, namespace: str, name: str, ts_ns: int) -> Pod | None:
        if self._relist(ts_ns) and (namespace, name) not in self._named:
            self.counts["kube_pod_unknown"] += 1
        return self._named.get((namespace, name))

    def _owners(self, gpu_uuid: str, ts_ns: int) -> list[tuple[str, str, str]] | None:
        if gpu_uuid not in self._devices and self._due(self._devices_at, ts_ns):
            self._devices_at = ts_ns
            try:
                self._devices, self._devices_failed = list_pod_devices(self.settings), False
            except Exception as exc:  # grpc.RpcError, or grpc itself missing: counted, said once
                if not self.counts["kube_pod_resources_unavailable"]:
                    log.warning(
                        "cannot ask the kubelet which pod holds a GPU (%s: %s); check the pod-resources "
                        "socket mount (--kube-pod-resources, docs/operations.md)",
                        type(exc).__name__,
                        exc,
                    )
                self.counts["kube_pod_resources_unavailable"] += 1
                self._devices_failed = True
        return None if self._devices_failed else self._devices.get(gpu_uuid, [])

    def _binding(self, pod: Pod, container: str, node_id: str, pid: int, ts_ns: int) -> TenantBinding | None:
        return tenant_binding(
            node_id,
            pid,
            ts_ns,
            pod_tenant(pod, container, self.settings),
            self.attribution,
            self.origin,
            self.counts,
            "kube_labels_invalid",
            pod_labels(pod, container, self.attribution, self.counts),
        )
