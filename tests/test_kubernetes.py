"""Attribution on a Kubernetes node, against a fake kubelet (the pod-resources gRPC service) and a fake
API server (a ``PodList`` over HTTP): no cluster needed. Each process is bound to its pod (by its cgroup, or by
the GPU the kubelet gave a pod), through the source and through ``gpucost run``'s wiring; what the node itself
answers (cgroups, devices, pod lists) is in tests/test_kubernetes_pods.py.

What is expected comes from the pods the test describes (their labels, namespaces, containers, the GPUs
given to them), by the documented rule, never from the code under test.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest

from gpucost.cli import build_parser
from gpucost.embedded import run_embedded
from gpucost.producers.attribution import Attribution, AttributionSettings, ProcessEnvironment
from gpucost.producers.kubernetes import KubernetesPods
from gpucost.producers.live import LiveSettings, open_live
from gpucost.producers.nvml import NvmlSampler
from gpucost.schemas.events import TS_MIN_NS, Price, ProcessSample, TenantBinding
from gpucost.sinks.views import connect
from gpucost.streams.settings import AuditSettings
from gpucost.wiring import attributed
from tests.fake_kubernetes import FakeContainer, FakeNode, FakePod
from tests.fake_nvml import FakeState, fake_pynvml, parse
from tests.strategies import BASE_NS
from tests.support.kubernetes_node import GPU, S, pod_node, settings_for


def _proc(root: Path, pid: int, cgroup: str, environ: dict[str, str] | None = None) -> None:
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "stat").write_text(f"{pid} (python3) S " + " ".join(["0"] * 18) + f" {1000 + pid} 0 0\n")
    (d / "cgroup").write_text(cgroup)
    (d / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in (environ or {}).items()))


def _sample(pid: int, gpu: str, t_s: int) -> ProcessSample:
    return ProcessSample(
        node_id="node-0",
        gpu_uuid=gpu,
        pid=pid,
        ts_ns=BASE_NS + t_s * S,
        interval_s=1.0,
        sm_util_pct=50.0,
        mem_bw_util_pct=10.0,
        mem_used_bytes=1,
    )


def _expected(pod: FakePod, container: str) -> tuple[str, str, str, str, str, str | None, str | None]:
    """The documented rule, from the pod's own description: gpucost.io/ keys, then the common ones; labels
    before annotations; else namespace, pod name, container name; SLA Bronze where none is named."""
    tags = [pod.labels, pod.annotations]

    def first(*keys: str) -> str | None:
        return next((t[k] for t in tags for k in keys if t.get(k)), None)

    return (
        first("gpucost.io/team", "team") or pod.namespace,
        first("gpucost.io/env", "env", "environment") or "",
        first("gpucost.io/app", "app.kubernetes.io/name", "app") or pod.name,
        first("gpucost.io/tier", "tier") or container,
        first("gpucost.io/sla") or "Bronze",
        first("gpucost.io/git-commit"),
        first("gpucost.io/ci-pipeline-id"),
    )


def _tenant(b: TenantBinding) -> tuple[str, str, str, str, str, str | None, str | None]:
    return b.team, b.env, b.app, b.tier, b.sla, b.git_commit, b.ci_pipeline_id


def test_each_process_is_bound_to_its_pod_by_cgroup_or_by_its_gpu(tmp_path: Path) -> None:
    """Processes in pods (by their cgroups), in no pod on a GPU given to one pod (by the kubelet), on a shared GPU
    (left unattributed, counted), in a pod not listed yet (bound once it is), and with both a pod and a tagged
    environment (the pod wins: the stated precedence)."""
    (tmp_path / "k8s").mkdir()
    node = pod_node(tmp_path / "k8s")
    search, bare, _, _, mig, late, static = node.pods
    proc = tmp_path / "proc"
    host = "0::/system.slice/slurmd.service\n"
    _proc(proc, 11, search.cgroup(search.containers[0]), {"GPUCOST_TEAM": "not-this-one"})
    _proc(proc, 12, search.cgroup(search.containers[1]))
    _proc(proc, 13, host)  # in no pod, on GPU-bbb: the notebook's
    _proc(proc, 14, host)  # in no pod, on GPU-ccc: two pods share it
    _proc(proc, 15, mig.cgroup(mig.containers[0]))
    _proc(proc, 16, late.cgroup(late.containers[0]))
    _proc(proc, 17, host, {"GPUCOST_TEAM": "slurm-users", "GIT_COMMIT": "abc"})  # no pod: its environment
    _proc(proc, 18, static.cgroup(static.containers[0]))  # a static pod, listed as its mirror
    attribution_settings = AttributionSettings(proc=proc)
    with node.serving() as url:
        pods = KubernetesPods(settings_for(node, url), attribution_settings)
        attribution = Attribution([pods, ProcessEnvironment(attribution_settings)], attribution_settings)
        first = [
            _sample(11, "GPU-aaa", 0),
            _sample(12, "GPU-aaa", 0),
            _sample(13, "GPU-bbb", 0),
            _sample(14, "GPU-ccc", 0),
            _sample(15, "MIG-ddd", 0),
            _sample(16, "GPU-eee", 0),
            _sample(17, "GPU-ggg", 0),
            _sample(18, "GPU-fff", 0),
        ]
        out = list(attribution.bind(first))
        late.listed = True  # the API server now lists it; looked at again only once refresh_ns has passed
        out += attribution.bind([_sample(16, "GPU-eee", 2)])
        out += attribution.bind([_sample(16, "GPU-eee", 6)])
        out += attribution.bind([_sample(p, "GPU-aaa", 8) for p in (11, 12, 13, 14, 15, 17)])  # nothing new
    bound = {b.pid: b for b in out if isinstance(b, TenantBinding)}
    assert sorted(bound) == [11, 12, 13, 15, 16, 17, 18]
    assert _tenant(bound[11]) == _expected(search, "trainer")
    assert _tenant(bound[12]) == _expected(search, "sidecar")
    assert _tenant(bound[13]) == _expected(bare, "jupyter")
    assert _tenant(bound[15]) == _expected(mig, "worker")
    assert _tenant(bound[18]) == _expected(static, "burn")
    assert _tenant(bound[16]) == _expected(late, "trainer") and bound[16].ts_ns == BASE_NS + 6 * S
    assert (bound[17].team, bound[17].git_commit, bound[17].origin) == ("slurm-users", "abc", "environ")
    assert {b.origin for p, b in bound.items() if p != 17} == {"kubernetes"}
    for b in bound.values():  # each binding just before its process's first bound event
        i = out.index(b)
        assert isinstance(out[i + 1], ProcessSample) and out[i + 1].pid == b.pid and out[i + 1].ts_ns == b.ts_ns
    assert pods.counts["kube_gpu_shared"] == 1
    assert attribution.counts["unattributed"] == 2  # 14 (shared GPU), and 16 until its pod was listed
    assert node.list_calls == 2 and node.grpc_calls == 1  # listed again for the unknown pod, once refresh_ns passed


def test_an_api_server_away_is_counted_and_its_pods_bound_once_it_answers(tmp_path: Path) -> None:
    node = pod_node(tmp_path)
    search = node.pods[0]
    proc = tmp_path / "proc"
    _proc(proc, 21, search.cgroup(search.containers[0]))
    settings = AttributionSettings(proc=proc)
    with node.serving() as url:
        node.api_up = False
        pods = KubernetesPods(settings_for(node, url), settings)
        attribution = Attribution([pods], settings)
        out = list(attribution.bind([_sample(21, "GPU-aaa", t) for t in range(0, 5)]))
        node.api_up = True
        out += attribution.bind([_sample(21, "GPU-aaa", t) for t in range(5, 12)])
    bound = [b for b in out if isinstance(b, TenantBinding)]
    assert [(b.pid, b.ts_ns) for b in bound] == [(21, BASE_NS + 5 * S)]  # looked at again at refresh_ns (5 s)
    assert pods.counts["kube_pods_unavailable"] == 1 and _tenant(bound[0]) == _expected(search, "trainer")


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Real processes: one with a tagged environment, two without."""
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    envs = [{"GPUCOST_TEAM": "from-environ", "GIT_COMMIT": "e1e1e1"}, {}, {}]
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env=base | env) for env in envs]
    try:
        yield procs
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_a_live_nvml_run_bills_the_pod_the_kubelet_gave_the_gpu(
    children: list[subprocess.Popen[bytes]], shared_data: Path, tmp_path: Path
) -> None:
    """The fake NVML serving a real H100 capture, its processes swapped for real children (in no pod: this host's
    cgroups), through ``gpucost run``'s wiring with ``--attribution kubernetes,environ`` and no bindings file:
    the GPU's pod, by the kubelet, bills every process on it; its labels give the tenant."""
    path = shared_data / "nvidia-smi" / "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"
    if not path.exists():
        pytest.skip(f"{path} is absent")
    cap = parse(path, "load")
    pids = sorted({pid for pid, _, _ in cap.pmon} | set(cap.apps))
    swap = dict(zip(pids, [c.pid for c in children]))
    cap = dataclasses.replace(
        cap, pmon=[(swap[p], sm, mem) for p, sm, mem in cap.pmon], apps={swap[p]: mib for p, mib in cap.apps.items()}
    )
    pod = FakePod(
        "search-prod",
        "ranker-0",
        [FakeContainer("trainer", {GPU: [cap.gpu_uuid]})],
        labels={"gpucost.io/team": "search", "app.kubernetes.io/name": "ranker"},
        annotations={"gpucost.io/git-commit": "c0ffee1"},
    )
    node = FakeNode(tmp_path, [pod])
    sampler = NvmlSampler("node-0", fake_pynvml(FakeState(cap)))
    sampler.open()
    live = open_live("nvml", LiveSettings(node_id="node-0", period_s=0.05, duration_s=1.0), nvml=sampler)
    with node.serving() as url:
        # as a user writes it, in either order: the pod's binding comes first all the same
        args = build_parser().parse_args(
            [
                "run",
                "--source",
                "nvml",
                "--attribution",
                "environ,kubernetes",
                "--kube-pods-url",
                url,
                "--kube-token-file",
                str(node.token_file),
                "--kube-pod-resources",
                str(node.socket),
            ]
        )
        events = list(attributed(args, live))
    price = Price(gpu_model="default", ts_ns=TS_MIN_NS, usd_per_gpu_hour=Decimal("4"))
    run_embedded(
        [(price, "prices")] + [(e, "nvml") for e in events], AuditSettings(pane_s=1, lateness_s=0), tmp_path / "out"
    )
    billed = dict(
        connect(tmp_path / "out")
        .execute(
            "SELECT team || '/' || app || '/' || coalesce(git_commit, ''), sum(cost_micro_usd) FROM cost "
            "WHERE team <> 'idle' GROUP BY ALL"
        )
        .fetchall()
    )
    assert set(billed) == {"search/ranker/c0ffee1"}, billed  # every process, the tagged one too: the pod wins
    assert live.counts["bound:kubernetes"] == len(children)


def test_labels_no_tenant_can_hold_and_a_garbled_kubelet_answer_are_counted_not_billed(tmp_path: Path) -> None:
    """A team label with the key separator, a team label naming a reserved party (the idle one), and a kubelet
    whose answer is not its message: no binding, each counted, nothing raised."""
    node = FakeNode(
        tmp_path,
        [
            FakePod("ns", "colon", [FakeContainer("c", {GPU: ["GPU-1"]})], labels={"gpucost.io/team": "a:b"}),
            FakePod("ns", "reserved", [FakeContainer("c", {GPU: ["GPU-2"]})], labels={"gpucost.io/team": "idle"}),
        ],
    )
    proc = tmp_path / "proc"
    for pid, pod in enumerate(node.pods, 31):
        _proc(proc, pid, pod.cgroup(pod.containers[0]))
    _proc(proc, 33, "0::/\n")  # in no pod: asks the kubelet about its GPU
    settings_ = AttributionSettings(proc=proc)
    node.response = lambda: b"\xff\xff\xff not a ListPodResourcesResponse"  # type: ignore[method-assign]
    with node.serving() as url:
        pods = KubernetesPods(settings_for(node, url), settings_)
        out = list(
            Attribution([pods], settings_).bind(
                [_sample(31, "GPU-1", 0), _sample(32, "GPU-2", 0), _sample(33, "GPU-9", 0)]
            )
        )
    assert not [e for e in out if isinstance(e, TenantBinding)]
    assert pods.counts["kube_labels_invalid"] == 2 and pods.counts["kube_pod_resources_unavailable"] == 1
