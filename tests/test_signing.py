"""Signatures: what a producer signs verifies; any change, unknown key or foreign node is refused."""

from __future__ import annotations

import os
import re
import secrets
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpucost.kafka.signing import KEY_ID_HEADER, SIGNATURE_HEADER, Keyring, Signer, SigningKey, parse_keys
from gpucost.schemas.topics import CONTROL_HEADER, END_OF_INPUT, SEQUENCE_HEADER

LINE = b'{"kind":"gpu_sample","node_id":"node-a","gpu_uuid":"GPU-1"}'


def key_line(key_id: str, nodes: str = "") -> str:
    return f"{key_id} {secrets.token_hex(32)} {nodes}".rstrip()


def write(path: Path, *lines: str) -> Path:
    path.write_text("\n".join(lines) + "\n")
    os.utime(path, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns + 1_000_000))  # a visible change
    return path


def signer_of(line: str, tmp: Path) -> Signer:
    return Signer.from_file(write(tmp / f"{line.split()[0]}.key", line))


RING_FILE = Path(tempfile.mkdtemp()) / "ring"
RING_LINE = key_line("k1")
RING_FILE.write_text(RING_LINE)


@given(st.binary(max_size=64), st.binary(max_size=300), st.integers(0, 10_000), st.integers(0, 7))
def test_any_changed_bit_is_refused(key: bytes, value: bytes, where: int, bit: int) -> None:
    headers = dict(Signer(parse_keys(RING_LINE, "mem")["k1"]).headers(key, value))
    ring = Keyring(RING_FILE)
    assert isinstance(ring.check(key, value, headers), SigningKey)
    blob = bytearray(key + value)
    if blob:
        blob[where % len(blob)] ^= 1 << bit
        k2, v2 = bytes(blob[: len(key)]), bytes(blob[len(key) :])
        assert ring.check(k2, v2, headers).reason == "bad_signature"
    # moving bytes between key and value changes the signature too
    if value:
        assert ring.check(key + value[:1], value[1:], headers).reason == "bad_signature"


def test_unsigned_unknown_and_foreign_node(tmp_path: Path) -> None:
    a, b = key_line("node-a-1", "node-a"), key_line("other")
    ring = Keyring(write(tmp_path / "ring", a))
    assert ring.check(b"GPU-1", LINE, {}).reason == "unsigned"
    assert ring.check(b"GPU-1", LINE, dict(signer_of(b, tmp_path).headers(b"GPU-1", LINE))).reason == "unknown_key"
    signer = signer_of(a, tmp_path)
    assert isinstance(ring.check(b"GPU-1", LINE, dict(signer.headers(b"GPU-1", LINE))), SigningKey)
    # a key limited to node-a signing node-b's events: the signature holds, the events are refused one by
    # one, on what the pipeline decoded (gpucost.streams.scope; tests/test_hostile_nodes.py)
    forged = LINE.replace(b"node-a", b"node-b")
    signed_by = ring.check(b"GPU-1", forged, dict(signer.headers(b"GPU-1", forged)))
    assert isinstance(signed_by, SigningKey) and signed_by.nodes == frozenset({"node-a"})
    bad_hex = {KEY_ID_HEADER: b"node-a-1", SIGNATURE_HEADER: b"zz"}
    assert ring.check(b"GPU-1", LINE, bad_hex).reason == "bad_signature"


def test_rotation_without_a_restart(tmp_path: Path) -> None:
    old, new = key_line("2026-11"), key_line("2026-12")
    ring = Keyring(write(tmp_path / "ring", old), reload_s=0)
    old_signer, new_signer = signer_of(old, tmp_path), signer_of(new, tmp_path)
    sign = lambda s: dict(s.headers(b"k", LINE))  # noqa: E731
    assert isinstance(ring.check(b"k", LINE, sign(old_signer)), SigningKey)
    assert ring.check(b"k", LINE, sign(new_signer)).reason == "unknown_key"
    write(tmp_path / "ring", old, new)  # 1. the workers learn the new key
    assert isinstance(ring.check(b"k", LINE, sign(old_signer)), SigningKey) and isinstance(
        ring.check(b"k", LINE, sign(new_signer)), SigningKey
    )
    (tmp_path / "ring").write_text("2026-12 not-hex-yet")  # a half-written file keeps the keys in force
    os.utime(tmp_path / "ring", ns=(1, os.stat(tmp_path / "ring").st_mtime_ns + 2_000_000))
    assert isinstance(ring.check(b"k", LINE, sign(new_signer)), SigningKey) and ring.reload_failures == 1
    write(tmp_path / "ring", new)  # 2. producers switched; 3. the old key is retired
    assert ring.check(b"k", LINE, sign(old_signer)).reason == "unknown_key"
    assert isinstance(ring.check(b"k", LINE, sign(new_signer)), SigningKey)


@pytest.mark.parametrize(
    "text, message",
    [
        ("k1", "expected '<key_id> <secret hex> [nodes|*]', got 1 fields"),
        ("k1 xyz", "is not hex"),
        ("k1 00ff", "has 2 bytes; use at least 16"),
        (f"k1 {'ab' * 16}\nk1 {'cd' * 16}", "appears twice"),
    ],
)
def test_bad_key_files_are_explained(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_keys(text, "keys.txt")


def test_control_and_sequence_headers_are_signed(tmp_path: Path) -> None:
    """Adding an end-of-input, or renumbering a message, breaks its signature."""
    line = key_line("k")
    ring = Keyring(write(tmp_path / "ring", line))
    signer = signer_of(line, tmp_path)
    sent = {SEQUENCE_HEADER: b"s1:7"}
    signed = {**sent, **dict(signer.headers(b"GPU-1", LINE, sent))}
    assert isinstance(ring.check(b"GPU-1", LINE, signed), SigningKey)
    assert ring.check(b"GPU-1", LINE, {**signed, CONTROL_HEADER: END_OF_INPUT}).reason == "bad_signature"
    assert ring.check(b"GPU-1", LINE, {**signed, SEQUENCE_HEADER: b"s1:999999"}).reason == "bad_signature"
