"""A message signature verified by the steps docs/security.md specifies, with ``hmac`` and ``hashlib`` alone: what a
consumer in another language would write, never gpucost's own code. tests/test_signature_spec.py holds it to the
document's test vectors, tests/test_billing.py to records a real worker signed."""

from __future__ import annotations

import hashlib
import hmac


def verify(secret: bytes, key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]]) -> bool:
    """The specification's steps: four length-prefixed parts, HMAC-SHA256, lowercase hex in a header."""
    named: dict[str, bytes] = {}
    for name, header_value in headers:
        named[name] = header_value  # the last value of a repeated header counts
    if "gpucost-signature" not in named or "gpucost-key-id" not in named:
        return False
    parts = [key or b"", value or b"", named.get("gpucost-control", b""), named.get("gpucost-seq", b"")]
    message = b"".join(len(p).to_bytes(4, "big") + p for p in parts)
    expected = hmac.new(secret, message, hashlib.sha256).hexdigest().encode("ascii")
    return hmac.compare_digest(expected, named["gpucost-signature"])
