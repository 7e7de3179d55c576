"""A node's Kubernetes, without a cluster: the kubelet's pod-resources gRPC service on a Unix socket
(the service of ``podresources.proto``, answering in the kubelet's fuller message layout) and an API
server answering a ``PodList`` of the node's pods over HTTP, with a bearer token checked.

The pods are described once (``FakePod``) and both servers answer from that description, as a real
node's kubelet and API server answer about the same pods.
"""

from __future__ import annotations

import importlib.util
import json
import secrets
import tempfile
import threading
import uuid
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from urllib.parse import parse_qs, urlparse

import grpc
from grpc_tools import protoc

from gpucost.producers.pod_resources import pod_resources_api

#: the kubelet's own messages carry more than gpucost declares (exclusive CPUs, memory, NUMA topology): the
#: fake kubelet answers with them, field numbers as in k8s.io/kubelet/pkg/apis/podresources/v1, so that a
#: client that cannot skip them fails here
KUBELET_LAYOUT = """
syntax = "proto3";
package fakekubelet;  // a name of its own in protobuf's one descriptor pool: names never go on the wire
message ListPodResourcesResponse { repeated PodResources pod_resources = 1; }
message PodResources { string name = 1; string namespace = 2; repeated ContainerResources containers = 3;
                       repeated int64 cpu_ids = 4; }
message ContainerResources { string name = 1; repeated ContainerDevices devices = 2; repeated int64 cpu_ids = 3;
                             repeated ContainerMemory memory = 4; }
message ContainerMemory { string memory_type = 1; uint64 size = 2; TopologyInfo topology = 3; }
message ContainerDevices { string resource_name = 1; repeated string device_ids = 2; TopologyInfo topology = 3; }
message TopologyInfo { repeated NUMANode nodes = 1; }
message NUMANode { int64 ID = 1; }
"""


@dataclass
class FakeContainer:
    name: str
    devices: dict[str, list[str]] = field(default_factory=dict)  # resource name → device ids
    limits: dict[str, str] = field(default_factory=dict)  # resource limits beside the devices' (HAMi's gpucores)
    env: dict[str, str] = field(default_factory=dict)  # the spec's environment (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE)
    container_id: str = field(default_factory=lambda: secrets.token_hex(32))


@dataclass
class FakePod:
    namespace: str
    name: str
    containers: list[FakeContainer]
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    listed: bool = True  # in the API server's answer (a pod just created may not be yet)
    #: a static pod runs under its config's hash, which its mirror in the API server (another UID) annotates
    static_hash: str | None = None
    started: str = "2026-11-30T08:00:01Z"  # status.startTime: when the kubelet admitted the pod

    def __post_init__(self) -> None:
        if self.static_hash is not None:
            self.annotations = {
                **self.annotations,
                "kubernetes.io/config.mirror": self.static_hash,
                "kubernetes.io/config.hash": self.static_hash,
            }

    def item(self, node: str) -> dict:
        """The pod as the API server lists it (``kubectl get pods -o json``'s ``items``)."""
        return {
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "uid": self.uid,
                "resourceVersion": "4711",
                "creationTimestamp": "2026-11-30T08:00:00Z",
                "labels": self.labels,
                "annotations": self.annotations,
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": self.name[:20],
                        "uid": str(uuid.uuid4()),
                        "controller": True,
                    }
                ],
            },
            "spec": {
                "nodeName": node,
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": c.name,
                        "image": "nvcr.io/nvidia/pytorch:25.10-py3",
                        "resources": {"limits": {**{r: str(len(ids)) for r, ids in c.devices.items()}, **c.limits}},
                        "env": [{"name": k, "value": v} for k, v in c.env.items()],
                    }
                    for c in self.containers
                ],
            },
            "status": {
                "phase": "Running",
                "podIP": "10.1.2.3",
                "qosClass": "Burstable",
                "startTime": self.started,
                "containerStatuses": [
                    {
                        "name": c.name,
                        "ready": True,
                        "restartCount": 0,
                        "image": "nvcr.io/nvidia/pytorch:25.10-py3",
                        "containerID": f"containerd://{c.container_id}",
                        "state": {"running": {"startedAt": "2026-11-30T08:00:05Z"}},
                    }
                    for c in self.containers
                ],
            },
        }

    def cgroup(self, container: FakeContainer) -> str:
        """A process of ``container``'s ``/proc/<pid>/cgroup`` (cgroup v2, the systemd driver, containerd)."""
        uid = (self.static_hash or self.uid).replace("-", "_")
        return (
            f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice/"
            f"cri-containerd-{container.container_id}.scope\n"
        )


def _compiled(source: str) -> ModuleType:
    with tempfile.TemporaryDirectory() as out:
        (Path(out) / "kubelet.proto").write_text(source)
        assert protoc.main(["protoc", f"-I{out}", f"--python_out={out}", "kubelet.proto"]) == 0
        spec = importlib.util.spec_from_file_location("fake_kubelet_pb2", Path(out) / "kubelet_pb2.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module


class FakeNode:
    """The pods of one node, served by a fake kubelet (gRPC) and API server (HTTP)."""

    def __init__(self, tmp: Path, pods: list[FakePod], node: str = "gpu-node-7") -> None:
        self.pods, self.node = pods, node
        self.socket = tmp / "kubelet.sock"
        self.token = secrets.token_urlsafe(24)
        self.token_file = tmp / "token"
        self.token_file.write_text(self.token + "\n")
        self.api_up = True
        self.list_calls = 0  # PodList requests answered
        self.grpc_calls = 0
        self.refused: list[str] = []  # why a request was refused (a wrong token, another node)
        self._layout = _compiled(KUBELET_LAYOUT)

    def run_flags(self, url: str, *more: str) -> list[str]:
        """``gpucost run``'s flags that attribute by this node's pods (``url``: ``serving``'s), then ``more``."""
        where = ["--kube-pods-url", url, "--kube-token-file", str(self.token_file)]
        return ["run", "--attribution", "kubernetes", *where, "--kube-pod-resources", str(self.socket), *more]

    def response(self) -> bytes:
        """``List``'s answer, in the kubelet's layout (with CPU ids and NUMA topology)."""
        m = self._layout
        out = m.ListPodResourcesResponse()
        for pod in self.pods:
            p = out.pod_resources.add(name=pod.name, namespace=pod.namespace, cpu_ids=[2, 3])
            for c in pod.containers:
                cr = p.containers.add(name=c.name, cpu_ids=[4])
                cr.memory.add(memory_type="memory", size=1 << 30).topology.nodes.add(ID=0)
                for resource, ids in c.devices.items():
                    d = cr.devices.add(resource_name=resource, device_ids=ids)
                    d.topology.nodes.add(ID=1)
        return out.SerializeToString()

    @contextmanager
    def serving(self) -> Iterator[str]:
        """Both servers up; yields the PodList URL."""
        api = pod_resources_api()
        service = api.DESCRIPTOR.services_by_name["PodResourcesLister"]

        def list_(request: object, context: grpc.ServicerContext) -> bytes:
            self.grpc_calls += 1
            return self.response()

        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        server.add_generic_rpc_handlers(
            [
                grpc.method_handlers_generic_handler(
                    service.full_name,
                    {
                        "List": grpc.unary_unary_rpc_method_handler(
                            list_,
                            request_deserializer=api.ListPodResourcesRequest.FromString,
                            response_serializer=lambda b: b,
                        )
                    },
                )
            ]
        )
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        node = self

        class Api(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
                url = urlparse(self.path)
                selector = parse_qs(url.query).get("fieldSelector", [""])[0]
                if not node.api_up:
                    self.send_error(503, "the API server is away")
                    return
                if self.headers.get("Authorization") != f"Bearer {node.token}":
                    node.refused.append("token")
                    self.send_error(401, "Unauthorized")
                    return
                if url.path != "/api/v1/pods" or selector != f"spec.nodeName={node.node}":
                    node.refused.append(f"{url.path}?{selector}")
                    self.send_error(400, "this fake lists one node's pods")
                    return
                node.list_calls += 1
                body = json.dumps(
                    {
                        "kind": "PodList",
                        "apiVersion": "v1",
                        "metadata": {"resourceVersion": "4711"},
                        "items": [p.item(node.node) for p in node.pods if p.listed],
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: object) -> None:
                pass

        http = ThreadingHTTPServer(("127.0.0.1", 0), Api)
        thread = threading.Thread(target=http.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{http.server_address[1]}/api/v1/pods?fieldSelector=spec.nodeName%3D{self.node}"
        finally:
            http.shutdown()
            http.server_close()
            server.stop(grace=None)
