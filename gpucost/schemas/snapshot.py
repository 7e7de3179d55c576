"""The health record's seal: a SHA-256 of its figures as canonical JSON, and an HMAC of that hash.

Why here, apart from the operator: the operator seals each record as it publishes it, and
``gpucost health verify`` checks a snapshot file with the very same functions, so the two can
never hash differently. The canonical form is docs/definitions.md's ("Health audit"): Python's
``json.dumps`` with sorted keys, no spaces and ``ensure_ascii=False``, floats as Python writes them, UTF-8,
of every field but the seal's own and, while None, the fields added after the record's first version
(``UNHASHED_IF_NONE``): a record written before those verifies as it did, with any version's code.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import Any

from gpucost.schemas.records import UNHASHED, UNHASHED_IF_NONE

__all__ = [
    "canonical_json",
    "hashed_fields",
    "snapshot_sha256",
    "signature_of",
    "sealed",
    "seal_faults",
    "seal_problems",
]


def canonical_json(fields: Mapping[str, Any]) -> bytes:
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def hashed_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
    """What the seal covers: every field but the seal's own (``UNHASHED``) and the later fields that are None
    (``UNHASHED_IF_NONE``), so that a record written before those fields verifies as it did."""
    return {k: v for k, v in fields.items() if k not in UNHASHED and not (v is None and k in UNHASHED_IF_NONE)}


def snapshot_sha256(fields: Mapping[str, Any]) -> str:
    """The hash of ``hashed_fields`` as canonical JSON: the one rule that sealing and every check use."""
    return hashlib.sha256(canonical_json(hashed_fields(fields))).hexdigest()


def signature_of(digest: str, secret: bytes) -> str:
    """HMAC-SHA256 of the hash's ASCII text with the audit key."""
    return hmac.new(secret, digest.encode("ascii"), hashlib.sha256).hexdigest()


def sealed(fields: dict[str, Any], secret: bytes | None) -> dict[str, Any]:
    """``fields`` with ``snapshot_sha256`` and ``signature`` (None without a key) added, last."""
    digest = snapshot_sha256(fields)
    fields["snapshot_sha256"] = digest
    fields["signature"] = None if secret is None else signature_of(digest, secret)
    return fields


def seal_faults(fields: Mapping[str, Any], secrets: Mapping[str, bytes] | None) -> tuple[dict[str, str], str | None]:
    """What is wrong with a record's seal, by reason (none: it holds), and the id of the key that signed it.

    The reasons, each with what to do about it: ``altered`` (the figures do not hash to
    ``snapshot_sha256``), ``unsigned`` and ``bad_signature`` (by none of ``secrets``, or changed).
    ``secrets`` (key id → secret) None checks the hash only; given, the signature must be one of theirs."""
    faults: dict[str, str] = {}
    digest = snapshot_sha256(fields)
    if fields.get("snapshot_sha256") != digest:
        faults["altered"] = (
            f"snapshot_sha256 is {fields.get('snapshot_sha256')!r} but the figures hash to "
            f"{digest!r}: a figure was changed after the record was published"
        )
    if secrets is None:
        return faults, None
    signature = fields.get("signature")
    if not isinstance(signature, str):
        faults["unsigned"] = "the record is unsigned: the worker that published it had no audit key"
        return faults, None
    claimed = fields.get("snapshot_sha256")
    if isinstance(claimed, str) and claimed.isascii() and signature.isascii():  # compare_digest takes ASCII only
        for key_id, secret in secrets.items():
            if hmac.compare_digest(signature, signature_of(claimed, secret)):
                return faults, key_id
    faults["bad_signature"] = "the signature matches none of the keys given: it was signed with another key, or altered"
    return faults, None


def seal_problems(fields: Mapping[str, Any], secrets: Mapping[str, bytes] | None) -> tuple[list[str], str | None]:
    """``seal_faults``' explanations, for a person to read."""
    faults, signer = seal_faults(fields, secrets)
    return list(faults.values()), signer
