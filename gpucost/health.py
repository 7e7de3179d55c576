"""Health snapshots for admission: a GPU's latest audit record as a file anyone can check.

``gpucost health snapshot`` writes a GPU's latest ``health`` record with the device it speaks
for (UUID, model, node, and a fingerprint of the three); ``gpucost health verify`` recomputes
the record's hash and, given the audit keys, its signature, and says what is wrong. The seal
is ``gpucost.schemas.snapshot``'s, the one the operator applied when it published the record;
``gpucost discovery --audit-keys`` checks every record it counts with it too (``seal_refusal``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gpucost.kafka.signing import parse_keys
from gpucost.schemas.codec import explain
from gpucost.schemas.records import HealthRecord
from gpucost.schemas.snapshot import seal_faults, seal_problems
from gpucost.sinks.views import sql_string, view_records

__all__ = [
    "SNAPSHOT_KIND",
    "audit_secrets",
    "fingerprint",
    "seal_refusal",
    "snapshot_of",
    "snapshot_problems",
    "read_json",
]

SNAPSHOT_KIND = "gpucost.health_snapshot/1"


def fingerprint(gpu_uuid: str, gpu_model: str, node_id: str) -> str:
    """The device a record speaks for, as one hash: UUID, model and node, unit-separated."""
    return hashlib.sha256("\x1f".join((gpu_uuid, gpu_model, node_id)).encode()).hexdigest()


def audit_secrets(path: Path) -> dict[str, bytes]:
    """The audit keys of a key file (``<key_id> <secret hex>`` lines) by id: what a seal's signature is checked
    against. Raises ``OSError`` or ``ValueError`` (naming the file and line)."""
    return {k.key_id: k.secret for k in parse_keys(path.read_text(), str(path)).values()}


def seal_refusal(fields: Mapping[str, Any], secrets: Mapping[str, bytes]) -> str | None:
    """Why a health record, its fields as written, may not count: the first of ``seal_faults``' reasons
    (``altered``, ``unsigned``, ``bad_signature``), or None when its hash and signature hold."""
    return next(iter(seal_faults(fields, secrets)[0]), None)


def snapshot_of(out_dir: Path, gpu_uuid: str) -> dict[str, Any] | None:
    """The snapshot of ``gpu_uuid``'s latest ``health`` record under ``out_dir`` (None: it has none)."""
    found = view_records(
        out_dir, "health", f"WHERE gpu_uuid = {sql_string(gpu_uuid)} ORDER BY window_start_ns DESC LIMIT 1"
    )
    if not found:
        return None
    record = found[0]
    return {
        "kind": SNAPSHOT_KIND,
        "timestamp_ns": record.window_end_ns,
        "device": {
            "gpu_uuid": record.gpu_uuid,
            "gpu_model": record.gpu_model,
            "node_id": record.node_id,
            "fingerprint": fingerprint(record.gpu_uuid, record.gpu_model, record.node_id),
        },
        "record": record.model_dump(mode="json"),
    }


def snapshot_problems(doc: Any, secrets: dict[str, bytes] | None) -> tuple[list[str], str | None]:
    """Why a snapshot does not hold (empty: it does), and the id of the audit key that signed it."""
    if not isinstance(doc, dict) or doc.get("kind") != SNAPSHOT_KIND:
        return [f'not a health snapshot: expected an object with "kind": "{SNAPSHOT_KIND}"'], None
    fields = doc.get("record")
    try:
        record = HealthRecord.model_validate(fields)
    except ValidationError as exc:
        return [f"the record is not a health record: {explain(exc)}"], None
    problems, signer = seal_problems(fields, secrets)  # the fields as written: a re-encoding could hide a change
    device = doc.get("device") if isinstance(doc.get("device"), dict) else {}
    for name in ("gpu_uuid", "gpu_model", "node_id"):
        if device.get(name) != getattr(record, name):
            problems.append(f"device.{name} is {device.get(name)!r} but the record's is {getattr(record, name)!r}")
    if device.get("fingerprint") != fingerprint(record.gpu_uuid, record.gpu_model, record.node_id):
        problems.append("device.fingerprint is not the hash of the record's UUID, model and node")
    if doc.get("timestamp_ns") != record.window_end_ns:
        problems.append(
            f"timestamp_ns is {doc.get('timestamp_ns')!r} but the record's window ends at {record.window_end_ns}"
        )
    return problems, signer


def read_json(path: Path) -> Any:
    """A JSON file, or a ``ValueError`` that says which, why, and what to give instead (a file nested too
    deeply for Python's parser, too)."""
    try:
        return json.loads(path.read_bytes())
    except OSError as exc:
        why = exc.strerror
    except RecursionError:
        why = "not valid JSON: nested too deeply"
    except ValueError as exc:  # includes UnicodeDecodeError
        why = f"not valid JSON: {exc}"
    raise ValueError(
        f"cannot read {path}: {why}; give a file written by gpucost health snapshot (or an OTLP JSON export)"
    )
