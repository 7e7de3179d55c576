"""Bad lines mixed into good input: valid results unchanged, each bad line dead-lettered with a reason."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpucost.embedded import run_embedded
from producers.replay import read_lines
from producers.simulate import FleetSpec, simulate
from schemas.codec import Rejected, decode_line, encode_event
from schemas.events import EVENT_MODELS
from sinks.views import connect
from streams.settings import AuditSettings

NS = 1_000_000_000


@pytest.fixture(scope="module")
def good_lines() -> list[str]:
    return [encode_event(e) for e in simulate(FleetSpec(gpus=2, hours=4, interval_s=30, seed=5))]


def bad_lines(good: list[str]) -> list[tuple[bytes, str]]:
    """(line, expected reason): one of each realistic way a line goes wrong."""
    gpu = json.loads(next(line for line in good if '"gpu_sample"' in line))
    late = {**gpu, "ts_ns": gpu["ts_ns"] + 60 * NS}  # an early pane, sent after hours of later data
    return [
        (b'{"kind": "gpu_sample", "node_id": ', "malformed_json"),
        (b"\xff\xfe not utf-8 \x00", "malformed_json"),
        (b'"just a string"', "not_an_object"),
        (b'{"kind": "gpu_temperature", "value": 3}', "unknown_kind"),
        (json.dumps({**gpu, "sm_util_pct": 140.5}).encode(), "invalid"),
        (json.dumps({**gpu, "mem_used_bytes": -5}).encode(), "invalid"),
        (json.dumps({**gpu, "interval_s": "ten"}).encode(), "invalid"),
        (json.dumps({**gpu, "ts_ns": 1_000}).encode(), "invalid"),
        (json.dumps({k: v for k, v in gpu.items() if k != "gpu_uuid"}).encode(), "invalid"),
        (json.dumps(gpu).replace('"power_w":', '"power_w": NaN, "x":').encode(), "invalid"),
        (json.dumps(late).encode(), "late"),
    ]


def test_bad_lines_change_no_valid_result(good_lines: list[str], tmp_path: Path) -> None:
    bad = bad_lines(good_lines)
    mixed: list[bytes] = [line.encode() for line in good_lines]
    rnd = random.Random(3)
    for line, reason in bad[:-1]:
        mixed.insert(rnd.randrange(len(mixed)), line)
    mixed.append(bad[-1][0])  # the late one must come after its GPU's watermark moved on
    (tmp_path / "good.jsonl").write_text("\n".join(good_lines) + "\n")
    (tmp_path / "mixed.jsonl").write_bytes(b"\n".join(mixed) + b"\n")

    clean = run_embedded(read_lines([tmp_path / "good.jsonl"]), AuditSettings(), tmp_path / "clean")
    dirty = run_embedded(read_lines([tmp_path / "mixed.jsonl"]), AuditSettings(), tmp_path / "dirty")

    assert not clean.dead_letters
    want = {}
    for _, reason in bad:
        want[reason] = want.get(reason, 0) + 1
    assert dict(dirty.dead_letters) == want
    a, b = connect(tmp_path / "clean"), connect(tmp_path / "dirty")
    for view, order in [("idle_index", "gpu_uuid, pane_start_ns"), ("cost", "record_id"), ("mae", "node_id, pid, first_ts_ns")]:
        rows = a.execute(f"SELECT * FROM {view} ORDER BY {order}").fetchall()
        assert rows and rows == b.execute(f"SELECT * FROM {view} ORDER BY {order}").fetchall(), view

    dlq = b.execute("SELECT reason, raw, source, detail FROM dlq").fetchall()
    assert len(dlq) == len(bad)
    lines_by_raw = {line.decode("utf-8", "backslashreplace"): reason for line, reason in bad}
    for reason, raw, source, detail in dlq:
        assert lines_by_raw[raw] == reason  # the raw text is kept, to fix and replay
        path, lineno = source.rsplit(":", 1)
        assert mixed[int(lineno) - 1].decode("utf-8", "backslashreplace") == raw and path.endswith("mixed.jsonl")
        assert detail
    details = {r: d for r, _, _, d in dlq}
    assert "watermark" in details["late"]


@given(st.one_of(st.binary(max_size=300), st.text(max_size=300)))
def test_decoder_never_raises_on_arbitrary_input(data: bytes | str) -> None:
    assert decode_line(data) is not None


@given(st.sampled_from(sorted(EVENT_MODELS)),
       st.dictionaries(st.sampled_from(["node_id", "gpu_uuid", "gpu_model", "ts_ns", "interval_s", "sm_util_pct",
                                        "mem_bw_util_pct", "mem_used_bytes", "mem_total_bytes", "pid", "address",
                                        "hops", "latency_weight", "team", "sla", "trace_hex", "usd_per_gpu_hour"]),
                       st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=90),
                                 st.lists(st.integers(), max_size=2))))
def test_decoder_never_raises_on_wrong_fields(kind: str, fields: dict) -> None:
    got = decode_line(json.dumps({"kind": kind, **fields}))
    assert isinstance(got, Rejected) or got.kind == kind
