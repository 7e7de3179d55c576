"""What a Kubernetes node tells the attribution source, against a fake kubelet (the pod-resources gRPC service)
and a fake API server (a ``PodList`` over HTTP): a process's pod and container from its cgroup under every
driver, each GPU's containers from the kubelet, the pods' labels from the API server, and whatever a hostile
pods URL answers. Binding processes to those pods is in tests/test_kubernetes.py.

What is expected comes from the pods the test describes, by the documented rule, never from the code under test.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gpucost.producers.kubernetes import cgroup_pod, list_pods, pods_from
from gpucost.producers.pod_resources import list_pod_devices
from tests.support.kubernetes_node import pod_node, settings_for

_hex = st.text("0123456789abcdef", min_size=64, max_size=64)


@settings(max_examples=200, deadline=None)
@given(
    st.uuids(),
    _hex,
    st.sampled_from(["", "burstable", "besteffort"]),
    st.sampled_from(["cgroupfs-v1", "cgroupfs-v2", "systemd-v1", "systemd-v2"]),
    st.sampled_from(["cri-containerd-", "crio-", "docker-"]),
    st.sampled_from(["", "/../.."]),
)
def test_a_cgroup_names_its_pod_and_container_under_every_driver(
    pod: object, container: str, qos: str, layout: str, runtime: str, namespaced: str
) -> None:
    """The kubelet's cgroup layouts (cgroupfs and systemd drivers, v1 and v2, each runtime's scope, a path seen
    from another cgroup namespace): the pod UID and container id come back as they were put in."""
    uid = str(pod)
    if layout.startswith("cgroupfs"):
        path = "/".join(p for p in ("/kubepods", qos, f"pod{uid}", container) if p)
    else:
        u = uid.replace("-", "_")
        slices = "kubepods.slice/" + (
            f"kubepods-{qos}.slice/kubepods-{qos}-pod{u}.slice" if qos else f"kubepods-pod{u}.slice"
        )
        path = f"/{slices}/{runtime}{container}.scope"
    path = namespaced + path
    if layout.endswith("v1"):
        text = "".join(f"{i}:{c}:{path}\n" for i, c in enumerate(["cpu,cpuacct", "memory", "pids"], 1))
        text = "12:name=systemd:/system.slice/containerd.service\n" + text if "systemd" in layout else text
    else:
        text = f"0::{path}\n"
    assert cgroup_pod(text) == (uid, container)


@pytest.mark.parametrize(
    "text",
    [
        "0::/\n",
        "0::/user.slice/user-1000.slice/session-4.scope\n",
        "0::/system.slice/docker-" + "ab" * 32 + ".scope\n",  # a container, but no pod's
        "4:memory:/process_api/5ad3b08a8f4945964e99e5f7f9bff8c4\n",
    ],
)
def test_a_process_in_no_pod_has_none(text: str) -> None:
    assert cgroup_pod(text) is None


def test_the_kubelet_s_answer_names_each_gpu_s_pods(tmp_path: Path) -> None:
    """``List`` in the kubelet's fuller layout (CPU ids, memory, NUMA topology): each GPU device (whole, or a MIG
    profile's) maps to the containers it was given to, the FPGA is no GPU, a time-sliced GPU has two."""
    node = pod_node(tmp_path)
    with node.serving() as url:
        owners = list_pod_devices(settings_for(node, url))
    want: dict[str, list[tuple[str, str, str]]] = {}
    for pod in node.pods:
        for c in pod.containers:
            for resource, ids in c.devices.items():
                if resource.startswith("nvidia.com/"):
                    for device in ids:
                        want.setdefault(device, []).append((pod.namespace, pod.name, c.name))
    assert owners == want and len(want["GPU-ccc"]) == 2 and node.grpc_calls == 1


def test_the_api_server_s_pod_list_is_read_with_the_token_for_this_node(tmp_path: Path) -> None:
    node = pod_node(tmp_path)
    with node.serving() as url:
        pods = pods_from(list_pods(settings_for(node, url)), counts := Counter[str]())
        with pytest.raises(OSError):  # without the token: refused, and said as an error to count, not a crash
            list_pods(dataclasses.replace(settings_for(node, url), token_file=tmp_path / "absent"))
    assert node.refused == ["token"]
    listed = [p for p in node.pods if p.listed]
    assert {uid: (p.namespace, p.name) for uid, p in pods.items()} == {p.uid: (p.namespace, p.name) for p in listed}
    for p in listed:
        assert dict(pods[p.uid].containers) == {c.container_id: c.name for c in p.containers}
        assert dict(pods[p.uid].labels) == p.labels and dict(pods[p.uid].annotations) == p.annotations
    assert not counts


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
_meta = st.fixed_dictionaries(
    {},
    optional={
        "uid": _json | st.uuids().map(str) | st.just(""),
        "namespace": _json | st.sampled_from(["ns", ""]),
        "name": _json | st.sampled_from(["p", ""]),
        "labels": _json,
        "annotations": _json,
    },
)
_status = _json | st.fixed_dictionaries({"startTime": _json | st.sampled_from(["2026-11-30T08:00:01Z", "08:00"])})
_item = _json | st.fixed_dictionaries({"metadata": _meta | _json}, optional={"status": _status})
_variable = st.fixed_dictionaries({"name": st.just("V") | _json}, optional={"value": _json, "valueFrom": _json})
_container = st.fixed_dictionaries(
    {"name": st.just("main")},
    optional={
        "resources": st.fixed_dictionaries({"limits": st.dictionaries(st.text(max_size=4), _json)}) | _json,
        "env": st.lists(_variable | _json, max_size=3) | _json,
    },
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(_json, st.fixed_dictionaries({"items": st.lists(_item, max_size=6)})))
def test_a_hostile_pod_list_is_refused_or_counted_never_fatal(doc: object) -> None:
    """Whatever a pods URL answers: not a PodList is a ValueError (counted by the source, never fatal); in a
    PodList, an item without a string UID, namespace and name is counted and left out, and labels that are not
    strings are dropped."""
    counts: Counter[str] = Counter()
    items = doc.get("items") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        with pytest.raises(ValueError):
            pods_from(doc, counts)
        return
    pods = pods_from(doc, counts)

    def valid(item: object) -> bool:
        meta = item.get("metadata") if isinstance(item, dict) else None
        fields = ("uid", "namespace", "name")
        return isinstance(meta, dict) and all(isinstance(meta.get(f), str) and meta[f] for f in fields)

    good = [i for i in items if valid(i)]
    assert counts["kube_pod_invalid"] == len(items) - len(good)
    assert set(pods) == {i["metadata"]["uid"] for i in good}
    for pod in pods.values():
        assert all(
            isinstance(k, str) and isinstance(v, str) for tags in (pod.labels, pod.annotations) for k, v in tags.items()
        )
        assert pod.started_ns in (None, 1_796_025_601 * 10**9)  # only a Kubernetes time is one


@settings(max_examples=200, deadline=None)
@given(st.lists(_container | _json, max_size=3) | _json)
@example([{"name": "main", "resources": 1, "env": [{"name": "V", "value": 1}, {"name": 2, "value": "x"}]}])
def test_a_hostile_container_spec_keeps_only_string_limits_and_literal_variables(containers: object) -> None:
    """A pod's containers as a pods URL may garble them: never fatal, and what is kept of each named container
    (its limits, the variables its spec sets to a literal: what allocations read) is strings only."""
    item = {"metadata": {"uid": "u", "namespace": "ns", "name": "p"}, "spec": {"containers": containers}}
    pod = pods_from({"items": [item]}, Counter())["u"]
    for tags in (*pod.limits.values(), *pod.env.values()):
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in tags.items())
