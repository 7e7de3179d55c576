"""Health snapshots and service discovery over the scripted fleet's replay (tests/support/health_fleet.py): a
snapshot verifies by its hash and key and every forgery of it fails; the file_sd file lists a node while none of its
GPUs is removed or in probation, record by record.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from gpucost.cli import main
from gpucost.schemas.records import HealthRecord
from gpucost.sinks.views import connect
from gpucost.streams.discovery import ServiceDiscovery
from tests.support.file_sd import prometheus_file_sd_problems
from tests.support.health_fleet import MODELS, SCRIPTS, audit_settings, by_rows, fleet, replayed


def test_a_snapshot_verifies_and_every_forgery_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key, other = b"a" * 32, b"b" * 32
    (tmp_path / "audit.key").write_text(f"audit-1 {key.hex()}\n")
    (tmp_path / "other.key").write_text(f"audit-2 {other.hex()}\n")
    out = replayed(tmp_path, key)
    snap = tmp_path / "snap.json"
    assert main(["health", "snapshot", "--out", str(out), "--gpu", "GPU-h100", "--file", str(snap)]) == 0
    doc = json.loads(snap.read_text())
    said = capsys.readouterr().out
    end_s = doc["record"]["window_end_ns"] // 10**9  # said as a time a person reads, not nanoseconds
    assert f"window ending {dt.datetime.fromtimestamp(end_s, dt.UTC).strftime('%Y-%m-%dT%H:%M:%S')}" in said, said
    latest = connect(out).execute("SELECT max(window_start_ns) FROM health WHERE gpu_uuid = 'GPU-h100'").fetchone()
    assert doc["record"]["window_start_ns"] == latest[0] and doc["device"]["gpu_model"] == MODELS["GPU-h100"]
    assert main(["health", "verify", str(snap), "--key-file", str(tmp_path / "audit.key")]) == 0
    assert main(["health", "verify", str(snap)]) == 0  # the hash alone
    (tmp_path / "empty.key").write_text("")  # not "matches none of the keys": there were none to match
    capsys.readouterr()
    assert main(["health", "verify", str(snap), "--key-file", str(tmp_path / "empty.key")]) == 2
    assert "holds no key" in capsys.readouterr().err

    def forged(change: Any) -> Path:
        bad = json.loads(snap.read_text())
        change(bad)
        path = tmp_path / "forged.json"
        path.write_text(json.dumps(bad))
        return path

    def resigned(doc: dict[str, Any]) -> None:  # figures changed, hash recomputed, signed with another key
        import hmac

        doc["record"]["grade"] = "excellent"
        fields = {k: v for k, v in doc["record"].items() if k not in ("snapshot_sha256", "signature")}
        unhashed = ("faults_fatal", "faults_warning", "power_estimated_ms")
        fields = {k: v for k, v in fields.items() if not (v is None and k in unhashed)}
        digest = hashlib.sha256(
            json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
        ).hexdigest()
        doc["record"]["snapshot_sha256"] = digest
        doc["record"]["signature"] = hmac.new(other, digest.encode(), hashlib.sha256).hexdigest()

    forgeries = {
        "a figure": lambda d: d["record"].__setitem__("energy_uj", d["record"]["energy_uj"] + 1),
        "a float's last bit": lambda d: d["record"].__setitem__("coverage", d["record"]["coverage"] - 1e-16),
        "the breaker": lambda d: d["record"].__setitem__("breaker_state", "removed"),
        "another key": resigned,
        "the device": lambda d: d["device"].__setitem__("node_id", "node-9"),
        "the signature removed": lambda d: d["record"].__setitem__("signature", None),
    }
    for what, change in forgeries.items():
        path = forged(change)
        assert main(["health", "verify", str(path), "--key-file", str(tmp_path / "audit.key")]) == 1, what
    # signed with the other key and re-hashed: the hash holds, so only the key can tell
    assert main(["health", "verify", str(forged(resigned))]) == 0
    assert main(["health", "verify", str(forged(resigned)), "--key-file", str(tmp_path / "other.key")]) == 0


def test_discovery_lists_a_node_while_none_of_its_gpus_is_removed_or_in_probation(tmp_path: Path) -> None:
    out = replayed(tmp_path, None)
    sd_file = tmp_path / "sd" / "gpus.json"
    sd_file.parent.mkdir()
    assert (
        main(["discovery", "--out", str(out), "--file-sd", str(sd_file), "--target-port", "9400", "--label", "job=gpu"])
        == 0
    )
    assert prometheus_file_sd_problems(sd_file.read_text()) == []
    assert [p.name for p in sd_file.parent.iterdir()] == ["gpus.json"], "a temporary file was left"
    latest = dict(
        connect(out)
        .execute("SELECT gpu_uuid, arg_max(breaker_state, window_start_ns) FROM health GROUP BY ALL")
        .fetchall()
    )
    nodes = {f"node-{g[-1]}" for g in latest}
    out_nodes = {f"node-{g[-1]}" for g, s in latest.items() if s in ("removed", "probation")}
    listed = {t for group in json.loads(sd_file.read_text()) for t in group["targets"]}
    assert listed == {f"{n}:9400" for n in nodes - out_nodes}
    assert out_nodes and nodes - out_nodes, "the scripts leave some nodes in and some out"


def test_a_node_leaves_the_list_the_moment_one_gpu_is_removed_and_returns_when_none_is() -> None:
    """Record by record, in window order, against each GPU's state as the records say it."""
    records = [r for r in by_rows(fleet(SCRIPTS), audit_settings()) if isinstance(r, HealthRecord)]
    records.sort(key=lambda r: (r.window_start_ns, r.gpu_uuid))
    sd, state = ServiceDiscovery(), {}
    for r in records:
        before = set(sd.in_service())
        changed = sd.update(r)
        state[r.gpu_uuid] = (r.node_id, r.breaker_state)
        want = {n for n, _ in state.values()} - {n for n, s in state.values() if s in ("removed", "probation")}
        assert set(sd.in_service()) == want
        assert (before ^ want) <= changed, "a node that came or went was not reported as changed"
        entry = sd.entry(r.node_id)
        assert entry["in_service"] == (r.node_id in want)
    assert sd.update(records[0]) == set(), "an older window changes nothing"


def test_labels_prometheus_refuses_are_refused() -> None:
    sd = ServiceDiscovery()
    for bad in ("__address__", "9lives", "a-b"):
        with pytest.raises(ValueError, match="label name"):
            sd.file_sd(9400, {bad: "x"})
