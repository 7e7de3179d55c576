"""A fake Kubernetes node the attribution tests share (tests/test_kubernetes.py, tests/test_kubernetes_pods.py):
its pods, each a case of the documented rule, and the settings that point the source at it."""

from __future__ import annotations

import secrets
from pathlib import Path

from gpucost.producers.kubernetes import KubernetesSettings
from tests.fake_kubernetes import FakeContainer, FakeNode, FakePod

__all__ = ["GPU", "S", "pod_node", "settings_for"]

GPU = "nvidia.com/gpu"
S = 10**9


def pod_node(tmp_path: Path) -> FakeNode:
    """A node of seven pods, each a case of the documented rule: labels and annotations (a label wins), a bare pod
    with an FPGA too, two pods time-slicing one GPU, a MIG profile, a pod the API server does not list yet, and a
    static pod (listed as its mirror)."""
    search = FakePod(
        "search-prod",
        "ranker-7d9f-x2k4",
        [FakeContainer("trainer", {GPU: ["GPU-aaa"]}), FakeContainer("sidecar")],
        labels={"gpucost.io/team": "search", "app.kubernetes.io/name": "ranker", "env": "prod"},
        annotations={
            "gpucost.io/git-commit": "9fbe6a5",
            "gpucost.io/sla": "Gold",
            "gpucost.io/ci-pipeline-id": "88231",
            "gpucost.io/team": "a label wins",
        },
    )
    bare = FakePod(
        "research", "notebook-0", [FakeContainer("jupyter", {GPU: ["GPU-bbb"], "example.com/fpga": ["fpga-0"]})]
    )
    shared_a = FakePod("vision", "infer-a", [FakeContainer("server", {GPU: ["GPU-ccc"]})])
    shared_b = FakePod("speech", "infer-b", [FakeContainer("server", {GPU: ["GPU-ccc"]})])
    mig = FakePod(
        "batch",
        "mig-job",
        [FakeContainer("worker", {"nvidia.com/mig-1g.10gb": ["MIG-ddd"]})],
        labels={"team": "batch-team", "tier": "spot"},
    )
    late = FakePod(
        "search-prod",
        "ranker-new",
        [FakeContainer("trainer", {GPU: ["GPU-eee"]})],
        labels={"gpucost.io/team": "search"},
        listed=False,
    )
    static = FakePod(
        "kube-system", "gpu-burn-node-7", [FakeContainer("burn", {GPU: ["GPU-fff"]})], static_hash=secrets.token_hex(16)
    )
    return FakeNode(tmp_path, [search, bare, shared_a, shared_b, mig, late, static])


def settings_for(node: FakeNode, url: str) -> KubernetesSettings:
    """The source's settings for ``node`` served at ``url``: its token, its kubelet's socket, a 5 s refresh."""
    return KubernetesSettings(pods_url=url, token_file=node.token_file, pod_resources=node.socket, refresh_ns=5 * S)
