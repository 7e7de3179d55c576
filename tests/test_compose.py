"""The deployment files, checked for what can be checked without a Docker engine: the compose file
parses, every gpucost command in it is one the CLI accepts, and the image provides what the services
assume (their volumes' mount points writable by its user, a home for the spool, the package folders)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from gpucost.cli import build_parser, subcommand_parsers
from tests.conftest import ROOT

COMPOSE = yaml.safe_load((ROOT / "compose" / "docker-compose.yml").read_text())
DOCKERFILE = (ROOT / "compose" / "Dockerfile").read_text()


def _gpucost_args(service: dict) -> list[str]:
    entry = service.get("entrypoint") or ["gpucost"]
    assert entry[0] == "gpucost"
    return [*entry[1:], *service["command"]]


def test_compose_services_run_valid_gpucost_commands() -> None:
    services = COMPOSE["services"]
    assert {"kafka", "topics", "producer", "worker", "sink", "producer-nvml", "query"} <= set(services)
    parser = build_parser()
    for _name, service in services.items():
        if "build" not in service:  # Kafka, Prometheus, Grafana: images of their own
            continue
        assert service["build"]["dockerfile"] == "compose/Dockerfile"
        assert service["environment"]["GPUCOST_KAFKA_BOOTSTRAP"] == "kafka:9092"
        args = parser.parse_args(_gpucost_args(service))  # exits (fails the test) on an invalid command
        assert args.command == _gpucost_args(service)[0]


def test_the_image_copies_every_package_folder_it_installs() -> None:
    copied = set(re.findall(r"^COPY (\S+) \1$", DOCKERFILE, re.M))
    assert copied == {"gpucost"}  # every package lives in it (the top-level names are links into it)


def test_every_mount_point_exists_in_the_image_and_belongs_to_its_user() -> None:
    """Run as `nobody`, the image had neither /data (the sink's volume) nor a home for the producer's spool."""
    user = re.findall(r"^USER (\S+)$", DOCKERFILE, re.M)[-1]
    assert user not in {"root", "0", "nobody"}
    made = set(re.findall(r"mkdir -p ([^&\n]+)", DOCKERFILE)[0].split())
    owned = re.search(rf"chown -R {user} ([^&\n]+)", DOCKERFILE)
    assert owned, "the mount points are not given to the image's user"
    state = re.search(r"^ENV XDG_STATE_HOME=(\S+)$", DOCKERFILE, re.M)
    assert state and state[1] in made  # the producer's spool: $XDG_STATE_HOME/gpucost
    for service in COMPOSE["services"].values():
        if "build" not in service:
            continue
        for volume in service.get("volumes", []):
            target = volume.split(":")[1]
            assert any(m == target or m.startswith(target + "/") for m in made), target
            assert any(target == o or target.startswith(o + "/") for o in owned[1].split()), target
        if "--out" in (args := _gpucost_args(service)):
            out = args[args.index("--out") + 1]
            assert any(out.startswith(v.split(":")[1]) for v in service["volumes"]), f"{out} is in no volume"


def test_the_build_context_leaves_out_what_the_image_does_not_need() -> None:
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv", ".hypothesis"} <= set(ignored)


def test_the_nvml_producer_gets_the_gpus_and_the_analyst_reads_only() -> None:
    nvml, query = COMPOSE["services"]["producer-nvml"], COMPOSE["services"]["query"]
    (device,) = nvml["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "utility" in device["capabilities"]  # libnvidia-ml: NVML
    assert _gpucost_args(nvml)[:3] == ["produce", "--source", "nvml"]
    assert all(v.endswith(":ro") for v in query["volumes"])


def test_worker_and_sink_are_checked_through_their_health_endpoint() -> None:
    for name in ("worker", "sink"):
        service = COMPOSE["services"][name]
        port = service["environment"]["GPUCOST_METRICS_ADDRESS"].rpartition(":")[2]
        probe = " ".join(service["healthcheck"]["test"])
        assert f"127.0.0.1:{port}/healthz" in probe
        assert "--metrics-address" in " ".join(subcommand_parsers()[name].format_help().split())


def test_prometheus_scrapes_every_service_that_serves_metrics_and_grafana_gets_the_dashboards() -> None:
    prometheus = yaml.safe_load((ROOT / "compose" / "prometheus.yml").read_text())
    (job,) = prometheus["scrape_configs"]
    (dns,) = job["dns_sd_configs"]
    serving = {
        name
        for name, s in COMPOSE["services"].items()
        if "build" in s and "profiles" not in s and _gpucost_args(s)[0] in ("produce", "worker", "sink")
    }  # the long-running commands, up by default
    assert set(dns["names"]) == serving
    assert {str(dns["port"])} == {
        COMPOSE["services"][n]["environment"]["GPUCOST_METRICS_ADDRESS"].rpartition(":")[2] for n in serving
    }
    mounts = dict(v.rsplit(":", 2)[:2] for v in COMPOSE["services"]["grafana"]["volumes"])
    provider = yaml.safe_load(
        (ROOT / "compose" / "grafana" / "provisioning" / "dashboards" / "gpucost.yml").read_text()
    )
    (path,) = {p["options"]["path"] for p in provider["providers"]}
    source = next(host for host, target in mounts.items() if target == path)
    assert sorted((ROOT / "compose" / source).glob("*.json")), "the dashboards folder Grafana mounts is empty"
    (datasource,) = yaml.safe_load(
        (ROOT / "compose" / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text()
    )["datasources"]
    assert datasource["url"] == "http://prometheus:9090" and "prometheus" in COMPOSE["services"]


def test_the_kubernetes_producer_has_what_attribution_needs() -> None:
    """The DaemonSet of compose/kubernetes: a command the CLI accepts, with pods first; the node's pid namespace;
    the kubelet's pod-resources socket where the flag's default looks; the node's name from the Downward API;
    and a service account that may list pods, which the binding names."""
    manifest = (ROOT / "compose" / "kubernetes" / "producer.yaml").read_text()
    docs = {d["kind"]: d for d in yaml.safe_load_all(manifest)}
    pod = docs["DaemonSet"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = build_parser().parse_args(container["args"])
    assert args.command == "produce" and args.source == "nvml" and args.attribution == ("kubernetes", "environ")
    assert pod["hostPID"] is True and container["securityContext"]["runAsUser"] == 0
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    socket = Path(args.kube_pod_resources)  # the default: the manifest sets no flag for it
    (name,) = [n for n, m in mounts.items() if socket.parent == Path(m["mountPath"])]
    assert volumes[name]["hostPath"]["path"] == str(socket.parent) and mounts[name]["readOnly"]
    state = re.search(r"^ENV XDG_STATE_HOME=(\S+)$", DOCKERFILE, re.M)
    assert state and any(m["mountPath"] == state[1] for m in mounts.values())  # the spool outlives the pod
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    (rule,) = docs["ClusterRole"]["rules"]
    assert rule["resources"] == ["pods"] and {"get", "list"} <= set(rule["verbs"])
    (subject,) = docs["ClusterRoleBinding"]["subjects"]
    assert (subject["name"], subject["namespace"]) == (
        pod["serviceAccountName"],
        docs["DaemonSet"]["metadata"]["namespace"],
    )
    assert "[kubernetes]" in re.search(r"^RUN pip install (.+)$", DOCKERFILE, re.M)[1]  # grpcio for the socket
