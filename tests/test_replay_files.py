"""Replayed files are read by their content: a gzip file is decompressed whatever its name (a compressed
``events.jsonl`` was read as text, every "line" a malformed-JSON dead letter), and gives the bill its plain
text gives, record for record."""

from __future__ import annotations

import gzip
from pathlib import Path

from gpucost.cli import main
from gpucost.producers.simulate import FleetSpec, simulate
from gpucost.schemas.codec import encode_event
from tests.support.outputs import rows


def test_gzip_is_read_whatever_its_name(tmp_path: Path) -> None:
    text = "".join(encode_event(e) + "\n" for e in simulate(FleetSpec(gpus=2, hours=1.0, seed=5)))
    named = {"plain.jsonl": text.encode(), "packed.jsonl": gzip.compress(text.encode())}
    named["packed.jsonl.gz"] = named["packed.jsonl"]
    got = {}
    for name, data in named.items():
        (tmp_path / "in" / name).parent.mkdir(exist_ok=True)
        (tmp_path / "in" / name).write_bytes(data)
        out = tmp_path / f"out-{name}"
        assert main(["replay", str(tmp_path / "in" / name), "--out", str(out)]) == 0
        got[name] = rows(out)
    assert got["plain.jsonl"]["cost"] and not got["plain.jsonl"]["dlq"]
    assert got["packed.jsonl"] == got["plain.jsonl"] == got["packed.jsonl.gz"]
