"""HMAC-SHA256 signatures on input messages: producers sign, workers verify.

A message's signature covers its Kafka key, its value and the headers that change what a
worker does with it (control, sequence), so a signed batch can be neither altered, nor moved
to another GPU's stream, nor turned into an end of input, nor made to shadow later messages. Keys live
in files (or one environment variable), one per line: ``<key_id> <secret as hex> [node,node,…|*]``. The optional third
column limits the nodes a key may speak for (default ``*``: any node); a producer's file
holds its one key, a worker's keyring every key it accepts. Rotation: add the new key to
the workers' keyrings (they reload a changed file within ``reload_s``), switch the
producers to it, then remove the old one. Nothing stops meanwhile.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time
from dataclasses import dataclass
from pathlib import Path

from gpucost.schemas.topics import CONTROL_HEADER, ENCODING_HEADER, SEQUENCE_HEADER
from gpucost.streams.scope import PRICE_SCOPE

__all__ = ["KEY_ID_HEADER", "SIGNATURE_HEADER", "SigningKey", "Signer", "Keyring", "Verdict", "parse_keys"]

KEY_ID_HEADER = "gpucost-key-id"
SIGNATURE_HEADER = "gpucost-signature"
COVERED_HEADERS = (CONTROL_HEADER, SEQUENCE_HEADER)  # the headers that change what a worker does
#: covered too, where a message has it: a JSON Lines message, which has none, signs as it did before it existed
COVERED_IF_SET = (ENCODING_HEADER,)
MIN_SECRET_BYTES = 16


@dataclass(frozen=True)
class SigningKey:
    key_id: str
    secret: bytes
    nodes: frozenset[str] | None  # None: any node

    def mac(self, key: bytes, value: bytes, headers: dict[str, bytes]) -> bytes:
        # every part length-prefixed, so no two messages can sign alike by shifting bytes between parts
        parts = [key, value, *(headers.get(h, b"") for h in COVERED_HEADERS)]
        parts += [headers[h] for h in COVERED_IF_SET if h in headers]
        return hmac.new(self.secret, b"".join(len(p).to_bytes(4, "big") + p for p in parts), hashlib.sha256).digest()


def parse_keys(text: str, where: str) -> dict[str, SigningKey]:
    """The keys of a key file; a malformed line is an error naming the file and line."""
    keys: dict[str, SigningKey] = {}
    for n, line in enumerate(text.splitlines(), 1):
        parts = line.split("#", 1)[0].split()
        if not parts:
            continue
        if len(parts) not in (2, 3):
            raise ValueError(f"{where}:{n}: expected '<key_id> <secret hex> [nodes|*]', got {len(parts)} fields")
        try:
            secret = bytes.fromhex(parts[1])
        except ValueError:
            raise ValueError(f"{where}:{n}: the secret of key {parts[0]!r} is not hex") from None
        if len(secret) < MIN_SECRET_BYTES:
            raise ValueError(
                f"{where}:{n}: the secret of key {parts[0]!r} has {len(secret)} bytes; use at least "
                f"{MIN_SECRET_BYTES} (e.g. `openssl rand -hex 32`)"
            )
        if parts[0] in keys:
            raise ValueError(f"{where}:{n}: key id {parts[0]!r} appears twice")
        nodes = None if len(parts) == 2 or parts[2] == "*" else frozenset(parts[2].split(","))
        keys[parts[0]] = SigningKey(parts[0], secret, nodes)
    return keys


class Signer:
    """A producer's one key: the headers to put on each message."""

    def __init__(self, key: SigningKey) -> None:
        self.key = key

    @classmethod
    def from_file(cls, path: Path) -> Signer:
        keys = parse_keys(path.read_text(), str(path))
        if len(keys) != 1:
            raise ValueError(
                f"{path}: a key file that signs (a producer's, or the audit key of health records) holds exactly one "
                f"'<key_id> <secret hex>' line, found {len(keys)}"
            )
        return cls(next(iter(keys.values())))

    def headers(self, key: bytes, value: bytes, headers: dict[str, bytes] | None = None) -> list[tuple[str, bytes]]:
        """The signature headers for a message with these key, value and (control, sequence, encoding) headers."""
        mac = self.key.mac(key, value, headers or {})
        return [(KEY_ID_HEADER, self.key.key_id.encode()), (SIGNATURE_HEADER, mac.hex().encode())]


@dataclass(frozen=True)
class Verdict:
    reason: str  # a dead-letter reason of gpucost.schemas.codec.REASONS
    detail: str


class Keyring:
    """A worker's accepted keys, re-read when the file changes (checked at most every ``reload_s``)."""

    def __init__(self, path: Path, reload_s: float = 5.0) -> None:
        self.path, self.reload_s = path, reload_s
        self._mtime_ns = -1
        self._checked = float("-inf")
        self.keys: dict[str, SigningKey] = {}
        #: key id → secret of every key that may sign prices (node list ``*`` or holding ``@prices``);
        #: kept with ``keys``, so that it is one object between reloads
        self.price_keys: dict[str, bytes] = {}
        self.reload_failures = 0
        self._maybe_reload(force=True)

    def _maybe_reload(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._checked < self.reload_s:
            return
        self._checked = now
        mtime = os.stat(self.path).st_mtime_ns
        if mtime == self._mtime_ns:
            return
        try:
            keys = parse_keys(self.path.read_text(), str(self.path))
        except (OSError, ValueError):
            if force:
                raise
            self.reload_failures += 1  # a half-written or broken file: keep the keys we have
            return
        self.keys = keys
        self.price_keys = {k.key_id: k.secret for k in keys.values() if k.nodes is None or PRICE_SCOPE in k.nodes}
        self._mtime_ns = mtime

    def check(self, key: bytes, value: bytes, headers: dict[str, bytes]) -> Verdict | SigningKey:
        """The key that signed the message, or why it is refused. Which nodes the key may speak for is
        checked on the decoded events (``gpucost.streams.scope``), not here: one parser decides."""
        self._maybe_reload()
        key_id, signature = headers.get(KEY_ID_HEADER), headers.get(SIGNATURE_HEADER)
        if key_id is None or signature is None:
            return Verdict(
                "unsigned", "the message has no signature headers; configure the producer's --signing-key-file"
            )
        signing_key = self.keys.get(key_id.decode("utf-8", "replace"))
        if signing_key is None:
            return Verdict(
                "unknown_key",
                f"key id {key_id.decode('utf-8', 'replace')[:64]!r} is not in "
                f"{self.path}; add it to the keyring (rotation) or check the producer's "
                "key file",
            )
        try:
            given = bytes.fromhex(signature.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            given = b""
        if not hmac.compare_digest(given, signing_key.mac(key, value, headers)):
            return Verdict(
                "bad_signature",
                f"the signature does not match the message for key "
                f"{signing_key.key_id!r}: altered in transit, or a forged key",
            )
        return signing_key
