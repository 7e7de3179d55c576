"""Health records written before ``faults_fatal``/``faults_warning`` (commit 91680c0) still read and verify.

The expected seals are computed here from the text of docs/definitions.md ("Health audit"), with hashlib and hmac
over ``json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=False)``: never by the code under test. A
record of the previous version has no fault fields; read back today it carries them as null, and null they are out
of the hash, so its seal holds. Reported, they are sealed like any figure.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from gpucost.cli import main
from gpucost.discovery import from_output
from gpucost.kafka.sink import output_record
from gpucost.schemas.records import DeadLetter, HealthRecord
from gpucost.schemas.snapshot import seal_faults, sealed, snapshot_sha256
from tests.support.health_fleet import replayed

KEY, OTHER = b"a" * 32, b"b" * 32
KEYS = {"audit-1": KEY}

#: the health record's fields in the previous version (``git show 91680c0:gpucost/schemas/records.py``), seal last
OLD_FIELDS = [
    "gpu_uuid",
    "node_id",
    "gpu_model",
    "window_start_ns",
    "window_end_ns",
    "covered_ms",
    "idle_ms",
    "energy_uj",
    "mean_power_w",
    "effective_tops",
    "kw_per_tops",
    "sched_deviation",
    "idle_index_72h",
    "coverage",
    "grade",
    "entitlement",
    "passed",
    "fail_reasons",
    "windows_skipped",
    "breaker_state",
    "snapshot_sha256",
    "signature",
]


def old_seal(fields: dict[str, Any], key: bytes | None) -> dict[str, Any]:
    """``fields`` sealed as the previous version sealed them: the hash of every field but the seal's own."""
    rest = {k: v for k, v in fields.items() if k not in ("snapshot_sha256", "signature")}
    text = json.dumps(rest, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    digest = hashlib.sha256(text).hexdigest()
    signature = None if key is None else hmac.new(key, digest.encode(), hashlib.sha256).hexdigest()
    return {**rest, "snapshot_sha256": digest, "signature": signature}


def old_record(key: bytes | None = KEY, kw_per_tops: float | None = 0.062578125) -> dict[str, Any]:
    """A health record as the previous version wrote it: no fault fields."""
    figures = {
        "gpu_uuid": "GPU-ü-1",  # not ASCII: ensure_ascii=False is part of the canonical form
        "node_id": "node-a",
        "gpu_model": "NVIDIA H100 80GB HBM3",
        "window_start_ns": 1_767_571_200_000_000_000,
        "window_end_ns": 1_767_574_800_000_000_000,
        "covered_ms": 3_600_000,
        "idle_ms": 120_000,
        "energy_uj": 360_450_000_000,
        "mean_power_w": 100.125,
        "effective_tops": 1.6,
        "kw_per_tops": kw_per_tops,  # None (no busy time) is hashed: it was in the first version
        "sched_deviation": 0.1,
        "idle_index_72h": 1 / 3,
        "coverage": 1.0,
        "grade": "good",
        "entitlement": 1.0,
        "passed": True,
        "fail_reasons": [],
        "windows_skipped": 0,
        "breaker_state": "in_service",
    }
    fields = old_seal(figures, key)
    assert list(fields) == OLD_FIELDS
    return fields


@pytest.mark.parametrize("kw_per_tops", [0.062578125, None])
def test_a_record_of_the_previous_version_verifies_as_written_and_as_read_back(kw_per_tops: float | None) -> None:
    fields = old_record(KEY, kw_per_tops)
    assert seal_faults(fields, KEYS) == ({}, "audit-1")
    record = HealthRecord.model_validate(fields)  # no "Field required": the counts default to None
    assert record.faults_fatal is None and record.faults_warning is None
    back = record.model_dump(mode="json")  # what a view or a snapshot reads back: the counts as null
    assert back["faults_fatal"] is None and back["faults_warning"] is None
    assert snapshot_sha256(back) == fields["snapshot_sha256"]
    assert seal_faults(back, KEYS) == ({}, "audit-1")
    assert seal_faults({**back, "idle_ms": back["idle_ms"] + 1}, KEYS)[0].keys() == {"altered"}


def test_a_new_record_with_no_faults_reported_seals_as_before() -> None:
    fields = old_record(None)
    figures = {k: v for k, v in fields.items() if k not in ("snapshot_sha256", "signature")}
    new = sealed({**figures, "faults_fatal": None, "faults_warning": None}, KEY)
    assert new["snapshot_sha256"] == fields["snapshot_sha256"]
    assert new["signature"] == hmac.new(KEY, fields["snapshot_sha256"].encode(), hashlib.sha256).hexdigest()


@pytest.mark.parametrize("fatal, warning", [(1, 3), (0, 0), (0, None), (None, 2)])
def test_reported_faults_are_sealed_and_changing_one_fails(fatal: int | None, warning: int | None) -> None:
    figures = {k: v for k, v in old_record(None).items() if k not in ("snapshot_sha256", "signature")}
    counts = {"faults_fatal": fatal, "faults_warning": warning}
    got = sealed({**figures, **counts}, KEY)
    reported = {k: v for k, v in counts.items() if v is not None}
    assert got["snapshot_sha256"] == old_seal({**figures, **reported}, KEY)["snapshot_sha256"]
    assert seal_faults(got, KEYS) == ({}, "audit-1")
    assert seal_faults(HealthRecord.model_validate(got).model_dump(mode="json"), KEYS) == ({}, "audit-1")
    for name, value in counts.items():
        changes = [None, 7] if value is not None else [0, 7]  # a count changed, dropped, or made up
        for change in changes:
            forged = {**got, name: change}
            assert seal_faults(forged, KEYS)[0].keys() == {"altered"}, (name, value, change)
        if value is not None:
            assert seal_faults({k: v for k, v in got.items() if k != name}, KEYS)[0].keys() == {"altered"}


def test_the_previous_versions_health_message_is_a_record_not_a_dead_letter() -> None:
    fields = old_record()
    got = output_record("health", json.dumps(fields).encode(), "gpucost.health[0]@0")
    assert not isinstance(got, DeadLetter), got
    assert isinstance(got, HealthRecord) and got.faults_fatal is None and got.faults_warning is None
    assert seal_faults(got.model_dump(mode="json"), KEYS) == ({}, "audit-1")


def as_previous_version(out: Path) -> int:
    """Every health file under ``out`` rewritten as the previous version wrote it: no fault or power-estimate
    columns, sealed over the rest. The number of records rewritten."""
    n = 0
    for path in sorted((out / "health").glob("**/*.parquet")):
        table = pq.ParquetFile(path).read()
        table = table.drop_columns(
            [c for c in ("faults_fatal", "faults_warning", "power_estimated_ms") if c in table.column_names]
        )
        rows = [old_seal(r, KEY) for r in table.to_pylist()]
        assert all(set(r) == set(OLD_FIELDS) for r in rows)
        table = table.set_column(
            table.schema.get_field_index("snapshot_sha256"), "snapshot_sha256", [[r["snapshot_sha256"] for r in rows]]
        )
        table = table.set_column(
            table.schema.get_field_index("signature"), "signature", [[r["signature"] for r in rows]]
        )
        pq.write_table(table, path)
        n += len(rows)
    return n


def test_an_output_folder_of_the_previous_version_snapshots_verifies_and_counts_in_discovery(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = replayed(tmp_path, KEY)
    assert as_previous_version(out) > 0
    (tmp_path / "audit.key").write_text(f"audit-1 {KEY.hex()}\n")
    snap = tmp_path / "snap.json"
    assert main(["health", "snapshot", "--out", str(out), "--gpu", "GPU-h100", "--file", str(snap)]) == 0
    assert json.loads(snap.read_text())["record"]["faults_fatal"] is None
    capsys.readouterr()
    assert main(["health", "verify", str(snap), "--key-file", str(tmp_path / "audit.key")]) == 0, capsys.readouterr()
    refused: Counter[str] = Counter()
    from_output(out, KEYS, refused)
    assert not refused, refused
    from_output(out, {"audit-2": OTHER}, refused)  # the check is real: another key refuses them all
    assert set(refused) == {"bad_signature"}
