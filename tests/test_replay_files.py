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


def test_progress_counts_every_byte_of_a_file(tmp_path: Path) -> None:
    """The batches' byte counts (what the progress bar adds) sum to the file's size: a Parquet file read in
    several batches ended a byte or more short (each batch's share rounded down)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from gpucost.producers.replay import read_batches

    pq.write_table(pa.table({"ts_ns": list(range(150_001))}), tmp_path / "rows.parquet")
    (tmp_path / "lines.jsonl").write_text("".join(f'{{"n": {i}}}\n\n' for i in range(70_001)))
    for name in ("rows.parquet", "lines.jsonl"):
        batches = list(read_batches([tmp_path / name]))
        assert len(batches) > 1 and sum(b.nbytes for b in batches) == (tmp_path / name).stat().st_size, name
