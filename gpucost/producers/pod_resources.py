"""The kubelet's pod-resources API (``v1.PodResourcesLister`` on its Unix socket, as dcgm-exporter reads it): which
container was given which device. Its messages are declared once, in ``podresources.proto``, compiled at first
use; grpcio and grpcio-tools come with the ``kubernetes`` extra. ``gpucost.producers.kubernetes`` binds processes
with it, ``gpucost.producers.kubernetes_allocations`` reads what each pod holds."""

from __future__ import annotations

import functools
import importlib.util
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Protocol

__all__ = ["PodResourcesSettings", "list_pod_devices", "pod_resources_api"]


class PodResourcesSettings(Protocol):
    """What the client reads of ``gpucost.producers.kubernetes.KubernetesSettings`` (a protocol, not an import:
    that module uses this one)."""

    @property
    def pod_resources(self) -> Path: ...
    @property
    def gpu_resources(self) -> tuple[str, ...]: ...
    @property
    def timeout_s(self) -> float: ...


@functools.cache
def pod_resources_api() -> ModuleType:
    """The messages of ``podresources.proto``, compiled on first use (grpcio-tools), so the one
    declaration serves the client here and the tests' server."""
    try:
        from grpc_tools import protoc
    except ImportError as exc:
        raise ImportError(
            "the kubelet's pod-resources API needs grpcio and grpcio-tools: pip install 'gpucost[kubernetes]'"
        ) from exc
    proto = Path(__file__).with_name("podresources.proto")
    with tempfile.TemporaryDirectory() as out:
        if protoc.main(["protoc", f"-I{proto.parent}", f"--python_out={out}", proto.name]) != 0:
            raise ImportError(f"cannot compile {proto} (a damaged installation: reinstall gpucost)")
        spec = importlib.util.spec_from_file_location("gpucost_podresources_pb2", Path(out) / "podresources_pb2.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module


def list_pod_devices(
    settings: PodResourcesSettings, resources: dict[str, str] | None = None
) -> dict[str, list[tuple[str, str, str]]]:
    """Each GPU device id the kubelet allocated, and the (namespace, pod, container) it went to (more
    than one where a GPU is shared by time-slicing); a ``grpc.RpcError`` where the kubelet cannot answer.
    ``resources``, where given, is refilled with each device id's resource name (``nvidia.com/gpu.shared``)."""
    import grpc

    api = pod_resources_api()
    service = api.DESCRIPTOR.services_by_name["PodResourcesLister"]
    with grpc.insecure_channel(f"unix://{settings.pod_resources}") as channel:
        call = channel.unary_unary(
            f"/{service.full_name}/List",
            request_serializer=api.ListPodResourcesRequest.SerializeToString,
            response_deserializer=api.ListPodResourcesResponse.FromString,
        )
        response = call(api.ListPodResourcesRequest(), timeout=settings.timeout_s)
    owners: dict[str, list[tuple[str, str, str]]] = {}
    named = {} if resources is None else resources
    named.clear()
    for pod in response.pod_resources:
        for container in pod.containers:
            for devices in container.devices:
                if devices.resource_name.startswith(settings.gpu_resources):
                    for device in devices.device_ids:
                        owners.setdefault(device, []).append((pod.namespace, pod.name, container.name))
                        named[device] = devices.resource_name
    return owners
