"""The shared GPUs' mode and replicas read from NVIDIA's device plugin config (``--kube-sharing-config``,
gpucost/producers/device_plugin_config.py), through the kubelet allocation source against the fake kubelet and API
server of tests/fake_kubernetes.py. The configs are the plugin's documented examples (its README's "Shared Access
to GPUs", time-slicing and MPS; the GPU Operator's time-slicing ConfigMap), written here as an operator would; each
expected fraction is worked out from the config's own ``replicas``, never from the code under test. The flags are
set to values the file contradicts (8 replicas where the file says 4), so a file ignored for the flags shows.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpucost.cli import build_parser
from gpucost.producers.attribution import AttributionSettings
from gpucost.producers.device_plugin_config import ConfigInvalid, Replicated, parse_plugin_config, read_plugin_config
from gpucost.producers.kubernetes import KubernetesSettings
from gpucost.producers.kubernetes_allocations import KubernetesAllocations, SharingSettings
from gpucost.schemas.events import Allocation
from gpucost.wiring import attributed
from tests.fake_kubernetes import FakeContainer, FakeNode, FakePod
from tests.support.allocations import T0, S, samples

GPU, SHARED = "nvidia.com/gpu", "nvidia.com/gpu.shared"
MIG1G, MIG2G = "nvidia.com/mig-1g.10gb", "nvidia.com/mig-2g.20gb"
A, B, C = (f"GPU-{n * 8}-0000-4000-8000-00000000000{n}" for n in "abc")
MIGX, MIGY = "MIG-1g-0000-4000-8000-00000000000d", "MIG-2g-0000-4000-8000-00000000000e"
FLAGS = SharingSettings(replicas=8, mode="time_slicing")  # what the file's entries must override

TIME_SLICING_RENAMED = """\
version: v1
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      rename: nvidia.com/gpu.shared
      replicas: 4
"""
RENAME_BY_DEFAULT = """\
version: v1
sharing:
  timeSlicing:
    renameByDefault: true
    failRequestsGreaterThanOne: true
    resources:
    - name: nvidia.com/gpu
      replicas: 4
"""
MPS_10 = """\
version: v1
sharing:
  mps:
    resources:
    - name: nvidia.com/gpu
      replicas: 10
"""
DEVICES_LISTED = f"""\
version: v1
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      devices: ["{A}"]
      replicas: 2
    - name: nvidia.com/gpu
      devices: ["{B}", "{C}"]
      replicas: 5
"""
TWO_RESOURCES = """\
version: v1
flags:
  migStrategy: mixed
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 4
    - name: nvidia.com/mig-1g.10gb
      replicas: 2
"""


def held(name: str, resource: str, device: str, **container: dict[str, str]) -> FakePod:
    return FakePod("team", name, [FakeContainer("main", {resource: [device]}, **container)])


def polled(
    tmp_path: Path, pods: list[FakePod], sharing: SharingSettings, polls: int = 1
) -> tuple[dict[str, tuple[str, str, int, int]], Counter[str]]:
    """Each pod's allocation as (gpu, sharing, num, den) after ``polls`` polls, and the source's counts."""
    node = FakeNode(Path(tempfile.mkdtemp(dir=tmp_path)), pods, node="gpu-a")
    with node.serving() as url:
        settings = KubernetesSettings(
            pods_url=url, token_file=node.token_file, pod_resources=node.socket, refresh_ns=10 * S
        )
        source = KubernetesAllocations(settings, sharing, AttributionSettings())
        got = [a for i in range(polls) for a in source.poll("gpu-a", T0 + i * 10 * S)]
    return {a.app: (a.gpu_uuid, a.sharing, a.fraction_num, a.fraction_den) for a in got}, source.counts


def config(tmp_path: Path, text: str, name: str = "config.yaml") -> SharingSettings:
    path = tmp_path / name
    path.write_text(text)
    return SharingSettings(replicas=FLAGS.replicas, mode=FLAGS.mode, config=path)


def test_time_slicing_renamed_to_gpu_shared_gives_each_replica_a_quarter_field_by_field(tmp_path: Path) -> None:
    """The rename is the resource the kubelet lists the replicas under: the entry is found by it."""
    node = FakeNode(tmp_path, [held("ts", SHARED, f"{A}::3")], node="gpu-a")
    with node.serving() as url:
        settings = KubernetesSettings(
            pods_url=url, token_file=node.token_file, pod_resources=node.socket, refresh_ns=10 * S
        )
        source = KubernetesAllocations(settings, config(tmp_path, TIME_SLICING_RENAMED), AttributionSettings())
        [got] = source.poll("gpu-a", T0)
    p = node.pods[0]
    assert got == Allocation(
        node_id="gpu-a",
        gpu_uuid=A,
        allocation_id=f"{p.uid}/main/{A}::3",
        ts_ns=got.ts_ns,  # the pod's start: tests/test_kubernetes_allocations.py checks it
        sharing="time_slicing",
        fraction_num=1,
        fraction_den=4,
        team="team",
        env="",
        app="ts",
        tier="main",
        sla="Bronze",
        origin="kubernetes",
    )
    assert source.counts["kube_alloc_time_slicing"] == 1 and not source.counts["kube_sharing_config_unmatched"]


def test_rename_by_default_lists_gpu_shared_and_the_bare_name_is_the_flags(tmp_path: Path) -> None:
    pods = [held("shared", SHARED, f"{A}::0"), held("bare", GPU, f"{B}::0")]
    got, counts = polled(tmp_path, pods, config(tmp_path, RENAME_BY_DEFAULT))
    assert got == {"shared": (A, "time_slicing", 1, 4), "bare": (B, "time_slicing", 1, 8)}
    assert counts["kube_sharing_config_unmatched"] == 1  # nvidia.com/gpu is not what renameByDefault advertises


def test_mps_replicas_give_mps_tenths_unless_the_container_sets_its_thread_percentage(tmp_path: Path) -> None:
    pods = [
        held("client", GPU, f"{A}::0"),
        held("capped", GPU, f"{A}::1", env={"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"}),
        held("whole", GPU, B),  # not a replica: exclusive, whatever the config
    ]
    got, counts = polled(tmp_path, pods, config(tmp_path, MPS_10))
    assert got == {"client": (A, "mps", 1, 10), "capped": (A, "mps", 25, 100), "whole": (B, "exclusive", 1, 1)}
    assert counts["kube_alloc_mps"] == 2 and counts["kube_alloc_exclusive"] == 1


def test_mps_wins_over_time_slicing_as_in_the_plugin(tmp_path: Path) -> None:
    mps = "  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 3\n"
    both = TIME_SLICING_RENAMED.replace("sharing:\n", "sharing:\n" + mps)
    got, _ = polled(tmp_path, [held("p", GPU, f"{A}::0")], config(tmp_path, both))
    assert got == {"p": (A, "mps", 1, 3)}


def test_a_devices_list_tells_two_entries_of_one_resource_apart(tmp_path: Path) -> None:
    pods = [held("on-a", GPU, f"{A}::1"), held("on-b", GPU, f"{B}::4"), held("on-c", GPU, f"{C}::0")]
    got, counts = polled(tmp_path, pods, config(tmp_path, DEVICES_LISTED))
    assert got == {
        "on-a": (A, "time_slicing", 1, 2),
        "on-b": (B, "time_slicing", 1, 5),
        "on-c": (C, "time_slicing", 1, 5),
    }
    assert not counts["kube_sharing_config_ambiguous"]
    # a list of UUIDs that does not name the GPU is not its entry; one by index may be, and is the only one left
    mixed = DEVICES_LISTED.replace(f'["{B}", "{C}"]', "[1, 2]")
    got, counts = polled(tmp_path, pods[1:], config(tmp_path, mixed, "mixed.yaml"))
    assert got == {"on-b": (B, "time_slicing", 1, 5), "on-c": (C, "time_slicing", 1, 5)}


def test_devices_by_index_cannot_tell_entries_apart_so_the_flags_say_and_it_is_counted(tmp_path: Path) -> None:
    by_index = DEVICES_LISTED.replace(f'["{A}"]', "[0]").replace(f'["{B}", "{C}"]', '["1", "2"]')
    got, counts = polled(tmp_path, [held("p", GPU, f"{A}::0")], config(tmp_path, by_index))
    assert got == {"p": (A, "time_slicing", 1, 8)}
    assert counts["kube_sharing_config_ambiguous"] == 1
    one_entry = TIME_SLICING_RENAMED.replace("      replicas: 4", "      devices: 2\n      replicas: 4")
    got, _ = polled(tmp_path, [held("q", SHARED, f"{A}::0")], config(tmp_path, one_entry, "one.yaml"))
    assert got == {"q": (A, "time_slicing", 1, 4)}  # one entry: a replica listed is one it made


def test_two_resources_with_different_replicas_on_one_node(tmp_path: Path) -> None:
    """What one --kube-replicas could not say: whole GPUs in quarters and 1g MIG devices in halves; a resource
    the file does not replicate (2g) gets the flags', counted."""
    pods = [held("gpu", GPU, f"{A}::1"), held("mig1", MIG1G, f"{MIGX}::1"), held("mig2", MIG2G, f"{MIGY}::0")]
    got, counts = polled(tmp_path, pods, config(tmp_path, TWO_RESOURCES))
    assert got == {
        "gpu": (A, "time_slicing", 1, 4),
        "mig1": (MIGX, "time_slicing", 1, 2),
        "mig2": (MIGY, "time_slicing", 1, 8),
    }
    assert counts["kube_sharing_config_unmatched"] == 1


def test_a_json_config_reads_as_the_yaml_one(tmp_path: Path) -> None:
    doc = {"version": "v1", "sharing": {"timeSlicing": {"resources": [{"name": GPU, "rename": SHARED, "replicas": 4}]}}}
    sharing = config(tmp_path, json.dumps(doc), "config.json")
    got, _ = polled(tmp_path, [held("p", SHARED, f"{A}::0")], sharing)
    assert got == {"p": (A, "time_slicing", 1, 4)}


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("version: v1\nsharing: [1, 2\n", "not YAML or JSON"),
        ("- just\n- a list\n", "not a mapping"),
        ("version: v2\nsharing: {}\n", "unknown version"),
        (TIME_SLICING_RENAMED.replace("replicas: 4", "replicas: 1"), "replicas"),
        (TIME_SLICING_RENAMED.replace("replicas: 4", "replicas: four"), "replicas"),
        (TIME_SLICING_RENAMED.replace("    resources:\n", "    resources: []\n").split("    - ")[0], "no resources"),
        (TIME_SLICING_RENAMED.replace("      rename", "      devices: some\n      rename"), "devices"),
        (TIME_SLICING_RENAMED.replace("      rename", "      devices: [gpu-zero]\n      rename"), "devices"),
        (TIME_SLICING_RENAMED.replace("    - name: nvidia.com/gpu\n", "    - \n"), "name"),
        (RENAME_BY_DEFAULT.replace("renameByDefault: true", "renameByDefault: yes please"), "true or false"),
        ("version: v1\nsharing: time-slicing\n", "sharing"),
    ],
)
def test_a_file_not_the_plugin_s_schema_is_counted_not_fatal_and_the_flags_say(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, text: str, says: str
) -> None:
    (tmp_path / "bad.yaml").write_text(text)
    with pytest.raises(ConfigInvalid, match=says):
        read_plugin_config(tmp_path / "bad.yaml")
    with caplog.at_level(logging.WARNING, "gpucost.kubernetes"):
        got, counts = polled(
            tmp_path, [held("p", SHARED, f"{A}::0"), held("q", SHARED, f"{B}::0")], config(tmp_path, text), polls=3
        )
    assert got == {"p": (A, "time_slicing", 1, 8), "q": (B, "time_slicing", 1, 8)}
    assert counts["kube_sharing_config_invalid"] == 1  # once for the file as it is, not once a poll
    assert says in caplog.text and "--kube-replicas" in caplog.text


def test_a_missing_file_is_counted_and_once_written_it_is_used(tmp_path: Path) -> None:
    sharing = SharingSettings(replicas=8, config=tmp_path / "later.yaml")
    node = FakeNode(tmp_path, [held("early", SHARED, f"{A}::0")], node="gpu-a")
    with node.serving() as url:
        settings = KubernetesSettings(
            pods_url=url, token_file=node.token_file, pod_resources=node.socket, refresh_ns=10 * S
        )
        source = KubernetesAllocations(settings, sharing, AttributionSettings())
        first = source.poll("gpu-a", T0)
        (tmp_path / "later.yaml").write_text(TIME_SLICING_RENAMED)  # the ConfigMap's update reaches the mount
        node.pods.append(held("late", SHARED, f"{A}::1"))
        second = source.poll("gpu-a", T0 + 10 * S)
    assert [(a.app, a.fraction_den) for a in first + second] == [("early", 8), ("late", 4)]
    assert source.counts["kube_sharing_config_invalid"] == 1


def test_without_a_file_or_replicas_a_replica_is_unset_as_before(tmp_path: Path) -> None:
    got, counts = polled(tmp_path, [held("p", SHARED, f"{A}::0")], SharingSettings())
    assert got == {} and counts["kube_alloc_replicas_unset"] == 1
    sharing = config(tmp_path, RENAME_BY_DEFAULT)
    unset = SharingSettings(config=sharing.config)  # the file says where the flags do not
    got, _ = polled(tmp_path, [held("p", SHARED, f"{A}::0")], unset)
    assert got == {"p": (A, "time_slicing", 1, 4)}


def test_the_table_parsed_from_the_documented_examples() -> None:
    import yaml

    table = parse_plugin_config(yaml.safe_load(DEVICES_LISTED))
    assert table.lookup(GPU, A) == Replicated("time_slicing", 2)
    assert table.lookup(GPU, C) == Replicated("time_slicing", 5)
    assert table.lookup(SHARED, A) == "kube_sharing_config_unmatched"
    assert parse_plugin_config({"version": "v1"}).lookup(GPU, A) == "kube_sharing_config_unmatched"
    assert parse_plugin_config(yaml.safe_load(MPS_10)).lookup(GPU, B) == Replicated("mps", 10)


def test_the_flag_and_its_variable_name_the_file_and_run_s_wiring_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert build_parser().parse_args(["run"]).kube_sharing_config is None
    monkeypatch.setenv("GPUCOST_KUBE_SHARING_CONFIG", "/etc/nvidia-device-plugin/config.yaml")
    assert build_parser().parse_args(["run"]).kube_sharing_config == Path("/etc/nvidia-device-plugin/config.yaml")
    path = config(tmp_path, TWO_RESOURCES).config
    args = build_parser().parse_args(["run", "--kube-sharing-config", str(path)])
    assert args.kube_sharing_config == path  # the flag over its variable
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    kube = FakeNode(tmp_path, [held("gpu", GPU, f"{A}::0"), held("mig1", MIG1G, f"{MIGX}::0")], node="gpu-a")
    live = SimpleNamespace(events=lambda: samples("gpu-a", (A, MIGX), {}), counts=Counter())
    with kube.serving() as url:
        flags = kube.run_flags(url, "--kube-replicas", "8", "--kube-allocations", "on")
        out = list(attributed(build_parser().parse_args([*flags, "--kube-sharing-config", str(path)]), live))  # type: ignore[arg-type]
    assert sorted((a.app, a.fraction_den) for a in out if isinstance(a, Allocation)) == [("gpu", 4), ("mig1", 2)]
