"""Hostile input against service discovery: forged health rows, and node names that are no scrape target.

Issue 35, items 6 and 9. Each attack runs on records of a real pipeline run (the embedded run of the scripted
health fleet, tests/support/health_fleet.py), in both configurations of the ``horizon`` fixture, and appends one
line to the hostile-input summary: what was sent, what was refused and why, and the outcome. Expected listings are
recomputed with SQL from the run's own rows.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import re
import urllib.parse
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gpucost.cli import main
from gpucost.schemas.events import Event
from gpucost.schemas.records import HealthRecord
from gpucost.sinks.views import connect
from gpucost.streams.settings import AuditSettings
from tests.conftest import horizon_label
from tests.fake_kafka import Message
from tests.support.file_sd import prometheus_file_sd_problems
from tests.support.health_fleet import SCRIPTS as HEALTH_SCRIPTS
from tests.support.health_fleet import audit_settings as health_settings
from tests.support.health_fleet import fleet as health_fleet
from tests.support.hostile import line
from tests.support.pipeline_runs import copy_of, pipeline_run

AUDIT_SECRET, OTHER_SECRET = b"k" * 32, b"o" * 32


# --- item 6: forged health rows --------------------------------------------------------------------


def canonical_sha256(fields: dict[str, Any]) -> str:
    """The hash of a health record (docs/definitions.md, "Health audit"), written here from its text: sorted
    keys, no spaces, UTF-8; the fault counts only when set."""
    rest = {k: v for k, v in fields.items() if k not in ("snapshot_sha256", "signature")}
    unhashed = ("faults_fatal", "faults_warning", "power_estimated_ms")
    rest = {k: v for k, v in rest.items() if not (v is None and k in unhashed)}
    return hashlib.sha256(
        json.dumps(rest, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    ).hexdigest()


def latest_states(out: Path) -> dict[str, str]:
    return dict(
        connect(out)
        .execute("SELECT gpu_uuid, arg_max(breaker_state, window_start_ns) FROM health GROUP BY ALL")
        .fetchall()
    )


def expected_targets(out: Path, port: int = 9400) -> set[str]:
    """The genuine rows' answer: nodes (named by their GPUs' last letter) none of whose GPUs is out."""
    states = latest_states(out)
    out_nodes = {f"node-{g[-1]}" for g, s in states.items() if s in ("removed", "probation")}
    return {f"node-{g[-1]}:{port}" for g in states} - {f"{n}:{port}" for n in out_nodes}


def forged_excellent(out: Path, gpu: str, how: str) -> dict[str, Any]:
    """``gpu``'s latest genuine row, one window later, graded excellent and in service, sealed as ``how`` says;
    written to a Parquet file of its own beside the run's."""
    files = sorted((out / "health").glob("**/*.parquet"))
    cur = connect(out).execute(
        f"SELECT * EXCLUDE (date) FROM health WHERE gpu_uuid = '{gpu}' ORDER BY window_start_ns DESC LIMIT 1"
    )
    row = dict(zip([d[0] for d in cur.description], cur.fetchone()))
    fields = HealthRecord.model_validate(row).model_dump(mode="json")
    span = fields["window_end_ns"] - fields["window_start_ns"]
    fields.update(
        window_start_ns=fields["window_start_ns"] + span,
        window_end_ns=fields["window_end_ns"] + span,
        grade="excellent",
        passed=True,
        fail_reasons=[],
        breaker_state="in_service",
    )
    if how != "altered":  # altered: the genuine row's hash and signature kept
        fields["snapshot_sha256"] = canonical_sha256(fields)
        fields["signature"] = (
            None
            if how == "unsigned"
            else hmac.new(OTHER_SECRET, fields["snapshot_sha256"].encode(), hashlib.sha256).hexdigest()
        )
    schema = pq.read_schema(files[-1])
    pq.write_table(
        pa.Table.from_pylist([{n: fields[n] for n in schema.names}], schema=schema),
        files[-1].parent / "zz-forged.parquet",
    )
    return fields


def listed(sd_file: Path) -> set[str]:
    return {t for group in json.loads(sd_file.read_text()) for t in group["targets"]}


@pytest.mark.parametrize(
    "how, reason", [("unsigned", "unsigned"), ("another-key", "bad_signature"), ("altered", "altered")]
)
def test_a_forged_excellent_row_does_not_put_a_removed_node_back(
    how: str,
    reason: str,
    horizon: AuditSettings,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings_ = health_settings(revision_horizon_s=horizon.revision_horizon_s)
    out = copy_of(
        pipeline_run(tmp_path_factory, "health", settings_, lambda: health_fleet(HEALTH_SCRIPTS), AUDIT_SECRET),
        tmp_path,
    )
    (tmp_path / "audit.key").write_text(f"audit-1 {AUDIT_SECRET.hex()}\n")
    want = expected_targets(out)
    assert latest_states(out)["GPU-xb"] == "removed" and "node-b:9400" not in want
    forged_excellent(out, "GPU-xb", how)
    sd_file = tmp_path / "gpus.json"
    argv = ["discovery", "--out", str(out), "--file-sd", str(sd_file), "--target-port", "9400"]
    assert main(argv) == 0
    assert "node-b:9400" in listed(sd_file), "without verification the forgery works: the attack is real"
    capsys.readouterr()
    assert main([*argv, "--audit-keys", str(tmp_path / "audit.key")]) == 0
    err = capsys.readouterr().err
    assert listed(sd_file) == want, "the node's state must come from its verified rows only"
    assert f"refused 1 health record(s) that do not verify ({reason} 1)" in err, err
    line(
        f"discovery: forged row ({how})",
        settings_,
        "1 excellent row for removed GPU-xb",
        f"1 ({reason})",
        f"node-b listed: {'node-b:9400' in listed(sd_file)} (want False)",
    )


def test_verify_keys_on_an_output_directory_is_an_error_not_ignored(
    horizon: AuditSettings, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's command: ``--verify-keys`` checks Kafka messages, and rows of an output directory are none."""
    settings_ = health_settings(revision_horizon_s=horizon.revision_horizon_s)
    out = copy_of(
        pipeline_run(tmp_path_factory, "health", settings_, lambda: health_fleet(HEALTH_SCRIPTS), AUDIT_SECRET),
        tmp_path,
    )
    forged_excellent(out, "GPU-xb", "unsigned")
    (tmp_path / "output.keys").write_text(f"worker-1 {OTHER_SECRET.hex()}\n")
    sd_file = tmp_path / "gpus.json"
    code = main(
        ["discovery", "--out", str(out), "--file-sd", str(sd_file), "--verify-keys", str(tmp_path / "output.keys")]
    )
    err = capsys.readouterr().err
    assert code == 2 and not sd_file.exists()
    assert err.startswith("gpucost: error: --verify-keys") and "--audit-keys" in err and err.count("\n") == 1
    line(
        "discovery: --out with --verify-keys",
        settings_,
        "1 unsigned excellent row",
        "the command (exit 2)",
        "no file written; the error names --audit-keys",
    )


class FakeConsumer:
    """The health topic as one partition holding ``messages``; the second poll sets ``done``."""

    def __init__(self, messages: list[Message], done: asyncio.Event) -> None:
        self.messages, self.done, self.polls, self.parts = messages, done, 0, []

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def topics(self) -> set[str]:
        return {"gpucost.health"}

    def assign(self, parts: list[Any]) -> None:
        self.parts = parts

    async def seek_to_beginning(self, *parts: Any) -> None: ...

    async def end_offsets(self, parts: list[Any]) -> dict[Any, int]:
        return {tp: len(self.messages) for tp in parts}

    async def position(self, tp: Any) -> int:
        return len(self.messages) if self.polls else 0

    async def getmany(self, timeout_ms: int) -> dict[Any, list[Message]]:
        self.polls += 1
        if self.polls > 1:
            self.done.set()
            return {}
        return {self.parts[0]: self.messages}


class FakeProducer:
    def __init__(self, **_: Any) -> None: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def partitions_for(self, topic: str) -> set[int]:
        return {0}

    async def send_and_wait(self, *_: Any, **__: Any) -> None: ...


def test_the_kafka_follower_applies_only_health_records_whose_seal_verifies(
    horizon: AuditSettings, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gpucost.discovery as discovery
    from gpucost.kafka.settings import KafkaSettings
    from gpucost.sinks.views import view_records

    settings_ = health_settings(revision_horizon_s=horizon.revision_horizon_s)
    out = copy_of(
        pipeline_run(tmp_path_factory, "health", settings_, lambda: health_fleet(HEALTH_SCRIPTS), AUDIT_SECRET),
        tmp_path,
    )
    want = expected_targets(out)
    values = [r.model_dump_json().encode() for r in view_records(out, "health", "ORDER BY window_start_ns")]
    values.append(json.dumps(forged_excellent(out, "GPU-xb", "another-key")).encode())
    stop = asyncio.Event()
    consumer = FakeConsumer([Message(b"k", v, i, [], "gpucost.health", 0) for i, v in enumerate(values)], stop)
    monkeypatch.setattr(discovery, "AIOKafkaConsumer", lambda **_: consumer)
    monkeypatch.setattr(discovery, "AIOKafkaProducer", FakeProducer)
    refused: Counter[str] = Counter()
    sd_file = tmp_path / "gpus.json"
    asyncio.run(
        discovery.run_kafka_discovery(
            KafkaSettings(), sd_file, 9400, {}, stop, None, None, {"audit-1": AUDIT_SECRET}, refused
        )
    )
    assert listed(sd_file) == want and refused == Counter(bad_signature=1)
    line(
        "discovery (Kafka): forged row, other key",
        settings_,
        f"{len(values)} health messages",
        f"{sum(refused.values())} {dict(refused)}",
        f"node-b listed: {'node-b:9400' in listed(sd_file)}",
    )


# --- item 9: file_sd targets -----------------------------------------------------------------------

#: node names a health record may carry, and why none may be scraped (written from the rule, not the code)
HOSTILE_NODES = {
    "169.254.169.254": "link_local",
    "fe80::1": "link_local",
    "::ffff:169.254.169.254": "link_local",
    "fd00:ec2::254": "metadata",
    "0.0.0.0": "unspecified",
    "::": "unspecified",
    "2852039166": "numeric",
    "169.254.43518": "numeric",
    "node a": "not_a_host",
    "node-a\nnode-b": "not_a_host",
    "evil.example/metrics": "not_a_host",
    "user@evil.example": "not_a_host",
    "node-x:22": "not_a_host",
    "-node-": "not_a_host",
    "n" * 254: "too_long",
}
#: and names that are hosts, with the target Prometheus should be given
GOOD_NODES = {
    "gpu-7.example.com": "gpu-7.example.com:9400",
    "10.0.0.7": "10.0.0.7:9400",
    "2001:db8::7": "[2001:db8::7]:9400",
    "node-000": "node-000:9400",
}


def hostile_fleet() -> list[Event]:
    """One GPU per node name, each excellent for three windows (in service after two): the names alone differ."""
    template = health_fleet({"GPU-h100": ["excellent"] * 3})
    return [
        e.model_copy(update={"node_id": node, **({"gpu_uuid": f"GPU-{i}"} if hasattr(e, "gpu_uuid") else {})})
        for i, node in enumerate([*HOSTILE_NODES, *GOOD_NODES])
        for e in template
    ]


def prometheus_target_ok(target: str) -> bool:
    """Whether Prometheus would scrape ``target`` as given: ``http://<target>/metrics`` parses to that host and
    port, with nothing else in it (no user, no path, no space)."""
    try:
        url = urllib.parse.urlsplit(f"http://{target}/metrics")
        return (
            url.port is not None
            and url.hostname is not None
            and url.path == "/metrics"
            and not url.username
            and url.netloc == target
            and not re.search(r"\s", target)
        )
    except ValueError:
        return False


_SD_RESULTS: dict[str, tuple[str, str]] = {}


def hostile_discovery(
    tmp_path_factory: pytest.TempPathFactory, settings_: AuditSettings, capsys: pytest.CaptureFixture[str]
) -> tuple[str, str]:
    """The file_sd text and stderr of ``gpucost discovery --out`` (no --target-port) over the hostile fleet."""
    if horizon_label(settings_) not in _SD_RESULTS:
        out = pipeline_run(tmp_path_factory, "nodes", settings_, hostile_fleet)
        assert set(latest_states(out).values()) == {"in_service"}, "every node in service: the names alone decide"
        sd_file = out.parent / "gpus.json"
        capsys.readouterr()
        assert main(["discovery", "--out", str(out), "--file-sd", str(sd_file)]) == 0
        _SD_RESULTS[horizon_label(settings_)] = (sd_file.read_text(), capsys.readouterr().err)
    return _SD_RESULTS[horizon_label(settings_)]


@pytest.mark.parametrize("node", list(HOSTILE_NODES), ids=[repr(n[:24]) for n in HOSTILE_NODES])
def test_a_node_name_that_is_no_host_is_never_a_target(
    node: str, horizon: AuditSettings, tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    settings_ = health_settings(revision_horizon_s=horizon.revision_horizon_s)
    text, err = hostile_discovery(tmp_path_factory, settings_, capsys)
    groups = json.loads(text)
    assert prometheus_file_sd_problems(text) == []
    assert all(prometheus_target_ok(t) for g in groups for t in g["targets"])
    assert json.dumps(node) not in text and node not in {g["labels"]["gpucost_node"] for g in groups}, (
        "a refused name was written"
    )
    assert {t for g in groups for t in g["targets"]} == set(GOOD_NODES.values())
    reasons = Counter(HOSTILE_NODES.values())
    want = ", ".join(f"{k} {v}" for k, v in sorted(reasons.items()))
    assert f"refused {len(HOSTILE_NODES)} node(s) whose name is no scrape target ({want})" in err, err
    line(
        f"file_sd: node {node[:24]!r}",
        settings_,
        "an in-service GPU on it",
        f"1 ({HOSTILE_NODES[node]})",
        f"targets written {len(groups)} = the {len(GOOD_NODES)} host names",
    )


def test_targets_carry_the_documented_default_port(
    horizon: AuditSettings, tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    """No --target-port: every target is host:9400 (the DCGM exporter's), as --help says, never a bare name that
    Prometheus would scrape on port 80."""
    settings_ = health_settings(revision_horizon_s=horizon.revision_horizon_s)
    text, _ = hostile_discovery(tmp_path_factory, settings_, capsys)
    targets = {t for g in json.loads(text) for t in g["targets"]}
    assert targets and all(urllib.parse.urlsplit(f"http://{t}").port == 9400 for t in targets)
    with pytest.raises(SystemExit):
        main(["discovery", "--help"])
    assert "9400" in re.sub(r"\s+", " ", capsys.readouterr().out.rsplit("--target-port", 1)[1].split("--label")[0])
    line(
        "file_sd: no --target-port",
        settings_,
        "discovery without a port",
        "nothing",
        f"{len(targets)} target(s), each :9400 (help says so)",
    )
