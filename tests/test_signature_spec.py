"""The bytes ``gpucost-signature`` covers, as docs/security.md specifies them for consumers in other languages.

``verify`` (tests/support/signatures.py) follows the document's steps with ``hmac`` and ``hashlib`` alone, never
gpucost's code, and is checked against the document's test vectors here and against records a real worker signed
in tests/test_billing.py: if the code and the specification part ways, one of them fails.
"""

from __future__ import annotations

import re

from gpucost.kafka.signing import Signer, parse_keys
from tests.conftest import ROOT
from tests.support.signatures import verify

SPEC = ROOT / "docs" / "security.md"
SECRET_HEX = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"


def vectors() -> list[tuple[bytes, bytes, bytes, bytes, str]]:
    """The document's test vectors: key, value, control, sequence, signature."""
    text = SPEC.read_text()
    assert "<!-- signature-vectors:" in text, "docs/security.md lost its signature test vectors"
    table = text.split("<!-- signature-vectors:", 1)[1].split("\n\n", 1)[0]
    rows = []
    for line in table.splitlines()[3:]:
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        rows.append((cells[0].encode(), cells[1].encode(), cells[2].encode(), cells[3].encode(), cells[4]))
    return rows


def test_the_documented_vectors_verify_by_the_documented_steps_and_gpucost_signs_them_alike() -> None:
    rows = vectors()
    assert len(rows) == 2 and f"`{SECRET_HEX}`" in SPEC.read_text()
    signer = Signer(parse_keys(f"worker-out {SECRET_HEX}", "spec")["worker-out"])
    for key, value, control, seq, signature in rows:
        headers = [(n, v) for n, v in (("gpucost-control", control), ("gpucost-seq", seq)) if v]
        signed = headers + [("gpucost-key-id", b"worker-out"), ("gpucost-signature", signature.encode())]
        assert verify(bytes.fromhex(SECRET_HEX), key, value, signed)
        assert dict(signer.headers(key, value, dict(headers)))["gpucost-signature"].decode() == signature


def test_the_independent_verifier_refuses_what_it_must() -> None:
    """A verifier that accepts everything would pass the test above with any vector: it must refuse a changed
    value, a key moved, a header added, a wrong secret, a missing signature."""
    secret = bytes.fromhex(SECRET_HEX)
    key, value, _, _, signature = vectors()[0]
    good = [("gpucost-key-id", b"worker-out"), ("gpucost-signature", signature.encode())]
    assert verify(secret, key, value, good)
    assert not verify(secret, key, value + b" ", good)
    assert not verify(secret, b"GPU-2", value, good)
    assert not verify(secret, key, value, [("gpucost-control", b"closed"), *good])
    assert not verify(bytes(32), key, value, good)
    assert not verify(secret, key, value, good[:1])
    # the bytes cannot move between parts: the key's last byte made the value's first
    assert not verify(secret, key[:-1], key[-1:] + value, good)
    assert re.fullmatch(r"[0-9a-f]{64}", signature)
