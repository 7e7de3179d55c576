"""Bad lines mixed into good input: valid results unchanged, each bad line dead-lettered with a reason."""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpucost.embedded import run_embedded
from gpucost.producers.replay import read_inputs
from gpucost.producers.simulate import FleetSpec, simulate
from gpucost.schemas.codec import REASONS, Rejected, decode_line, encode_event
from gpucost.schemas.events import EVENT_MODELS, GpuSample, Price, TenantBinding
from gpucost.schemas.records import CostRecord, DeadLetter
from gpucost.sinks.views import connect
from gpucost.streams.audit import Auditor
from gpucost.streams.settings import AuditSettings

NS = 1_000_000_000


@pytest.fixture(scope="module")
def good_lines() -> list[str]:
    return [encode_event(e) for e in simulate(FleetSpec(gpus=2, hours=4, interval_s=30, seed=5))]


def bad_lines(good: list[str]) -> list[tuple[bytes, str]]:
    """(line, expected reason): the catalogue of realistic ways an input line goes wrong."""
    gpu = json.loads(next(line for line in good if '"gpu_sample"' in line))
    # a pane before the data, sent after 4 h of them: its end lies past the 6 h revision horizon of the watermark
    late = {**gpu, "ts_ns": gpu["ts_ns"] - 3 * 3600 * NS}
    return [
        (b'{"kind": "gpu_sample", "node_id": ', "malformed_json"),  # torn write
        (b"\xff\xfe not utf-8 \x00", "malformed_json"),
        (b'"just a string"', "not_an_object"),
        (b'{"kind": "gpu_temperature", "value": 3}', "unknown_kind"),
        (b'{"node_id": "n1"}', "unknown_kind"),
        (json.dumps({**gpu, "interval_s": "ten"}).encode(), "wrong_type"),
        (json.dumps({**gpu, "mem_used_bytes": 1.5e9}).encode(), "wrong_type"),
        (json.dumps({**gpu, "ts_ns": True}).encode(), "wrong_type"),
        (json.dumps({k: v for k, v in gpu.items() if k != "gpu_uuid"}).encode(), "missing_field"),
        (json.dumps({**gpu, "sm_util_pct": 140.5}).encode(), "out_of_range"),
        (json.dumps({**gpu, "temp_c": 500}).encode(), "out_of_range"),
        (json.dumps({**gpu, "mem_used_bytes": -5}).encode(), "negative"),
        (json.dumps({**gpu, "interval_s": -10}).encode(), "negative"),
        (json.dumps(gpu).replace('"power_w":', '"power_w": NaN, "x":').encode(), "non_finite"),
        (json.dumps(gpu).replace('"sm_util_pct":', '"sm_util_pct": Infinity, "x":').encode(), "non_finite"),
        (json.dumps({**gpu, "ts_ns": gpu["ts_ns"] // 1_000_000}).encode(), "timestamp_out_of_range"),  # ms
        (json.dumps({**gpu, "ts_ns": 7_258_118_400 * NS}).encode(), "timestamp_out_of_range"),  # year 2200
        (json.dumps({**gpu, "ts_ns": time.time_ns() + 86_400 * NS}).encode(), "future_timestamp"),
        (json.dumps({**gpu, "mem_used_bytes": gpu["mem_total_bytes"] + 1}).encode(), "invalid"),
        (
            json.dumps(
                {
                    "kind": "tenant_binding",
                    "node_id": gpu["node_id"],
                    "pid": 9,
                    "ts_ns": gpu["ts_ns"],
                    "team": "idle",
                    "env": "",
                    "app": "",
                    "tier": "",
                    "sla": "Gold",
                }
            ).encode(),
            "invalid",
        ),
        (json.dumps(late).encode(), "late"),
    ]


def resent_lines(good: list[str]) -> list[tuple[int, bytes]]:
    """(index of the original, line): re-sends of good lines, arriving soon after the original."""
    first = {
        kind: next(i for i, line in enumerate(good) if f'"{kind}"' in line)
        for kind in ("gpu_sample", "process_sample", "tenant_binding", "price")
    }
    conflicting = {**json.loads(good[first["gpu_sample"]]), "sm_util_pct": 99.0}  # same key and ts_ns, new value
    return [(i, good[i].encode()) for i in first.values()] + [(first["gpu_sample"], json.dumps(conflicting).encode())]


def test_bad_lines_change_no_valid_result(good_lines: list[str], tmp_path: Path) -> None:
    bad = bad_lines(good_lines)
    resent = resent_lines(good_lines)
    mixed: list[bytes] = [line.encode() for line in good_lines]
    for index, line in sorted(resent, reverse=True):
        mixed.insert(index + 1, line)
    rnd = random.Random(3)
    for line, _reason in bad[:-1]:
        mixed.insert(rnd.randrange(len(mixed)), line)
    mixed.append(bad[-1][0])  # the late one must come after its GPU's watermark moved on
    (tmp_path / "good.jsonl").write_text("\n".join(good_lines) + "\n")
    (tmp_path / "mixed.jsonl").write_bytes(b"\n".join(mixed) + b"\n")

    clean = run_embedded(read_inputs([tmp_path / "good.jsonl"]), AuditSettings(), tmp_path / "clean")
    dirty = run_embedded(read_inputs([tmp_path / "mixed.jsonl"]), AuditSettings(), tmp_path / "dirty")

    assert not clean.dead_letters
    want = Counter(reason for _, reason in bad) + Counter({"duplicate": len(resent)})
    assert dict(dirty.dead_letters) == want
    assert set(want) <= set(REASONS)
    a, b = connect(tmp_path / "clean"), connect(tmp_path / "dirty")
    for view, order in [
        ("idle_index", "gpu_uuid, pane_start_ns"),
        ("cost", "record_id"),
        ("mae", "node_id, pid, first_ts_ns"),
    ]:
        rows = a.execute(f"SELECT * FROM {view} ORDER BY {order}").fetchall()
        assert rows and rows == b.execute(f"SELECT * FROM {view} ORDER BY {order}").fetchall(), view

    dlq = b.execute("SELECT reason, raw, source, detail FROM dlq").fetchall()
    assert len(dlq) == len(bad) + len(resent)
    lines_by_raw = {line.decode("utf-8", "backslashreplace"): reason for line, reason in bad}
    lines_by_raw.update({line.decode(): "duplicate" for _, line in resent})
    for reason, raw, source, detail in dlq:
        assert lines_by_raw[raw] == reason  # the raw text is kept, to fix and replay
        path, lineno = source.rsplit(":", 1)
        assert mixed[int(lineno) - 1].decode("utf-8", "backslashreplace") == raw and path.endswith("mixed.jsonl")
        assert detail
    details = {r: d for r, _, _, d in dlq}
    assert "watermark" in details["late"]
    assert "clock" in details["future_timestamp"]


def test_accepted_with_a_flag(good_lines: list[str]) -> None:
    """A model with no price (and no 'default') is billed 0 µ$ and flagged unpriced; a binding for a
    pid that never runs is kept (bindings precede their processes) and bills no one."""
    events = [
        e for e in (decode_line(line) for line in good_lines) if not isinstance(e, Price) or e.gpu_model != "default"
    ]
    gpu = next(e for e in events if isinstance(e, GpuSample))
    stranger = gpu.model_copy(update={"gpu_uuid": "GPU-new", "gpu_model": "B300"})
    binding = next(e for e in events if isinstance(e, TenantBinding)).model_copy(update={"pid": 4_000_000})
    auditor = Auditor(AuditSettings())
    out = [r for e in [binding, stranger, *events] for r in auditor.update(e)] + auditor.finish()
    assert not [r for r in out if isinstance(r, DeadLetter)]
    new = [r for r in out if isinstance(r, CostRecord) and r.gpu_uuid == "GPU-new"]
    assert new and all(r.unpriced and r.cost_micro_usd == 0 and r.usd_per_gpu_hour is None for r in new)
    assert auditor.counts["unpriced_panes"] == len(
        {(r.gpu_uuid, r.pane_start_ns) for r in out if isinstance(r, CostRecord) and r.unpriced}
    )
    priced = {e.gpu_model for e in events if isinstance(e, Price)}
    assert not [r for r in out if isinstance(r, CostRecord) and r.gpu_model in priced and r.unpriced]
    teams = {r.team for r in out if isinstance(r, CostRecord)}
    assert binding.team not in teams or any(
        isinstance(e, TenantBinding) and e.team == binding.team and e.pid != binding.pid for e in events
    )


@pytest.mark.slow
@given(st.one_of(st.binary(max_size=300), st.text(max_size=300)))
def test_decoder_never_raises_on_arbitrary_input(data: bytes | str) -> None:
    assert decode_line(data) is not None


@given(
    st.sampled_from(sorted(EVENT_MODELS)),
    st.dictionaries(
        st.sampled_from(
            [
                "node_id",
                "gpu_uuid",
                "gpu_model",
                "ts_ns",
                "interval_s",
                "sm_util_pct",
                "mem_bw_util_pct",
                "mem_used_bytes",
                "mem_total_bytes",
                "pid",
                "address",
                "hops",
                "latency_weight",
                "team",
                "sla",
                "trace_hex",
                "usd_per_gpu_hour",
            ]
        ),
        st.one_of(
            st.none(),
            st.booleans(),
            st.integers(),
            st.floats(),
            st.text(max_size=90),
            st.lists(st.integers(), max_size=2),
        ),
    ),
)
def test_decoder_never_raises_on_wrong_fields(kind: str, fields: dict) -> None:
    got = decode_line(json.dumps({"kind": kind, **fields}))
    assert isinstance(got, Rejected) or got.kind == kind


def test_no_simulated_fleet_is_refused_as_future() -> None:
    """The simulator's timeline is fixed (reproducible); even its longest fleet must lie in the past."""
    longest = FleetSpec(hours=24 * 366)
    assert longest.end_ns < time.time_ns() - AuditSettings().max_future_ns


@pytest.mark.parametrize("line", [b"\xff" * 1_000_000, b'{"kind":"gpu_sample","node_id":"' + b"n" * 300_000 + b'"}'])
def test_a_huge_bad_line_keeps_the_head_of_its_text(line: bytes) -> None:
    """A line of megabytes is dead-lettered once, with its first 65,536 characters and a note of the
    rest: whole (invalid bytes escaped 4-fold, then into JSON), it could be too big for a Kafka
    message, and the worker would stop at it forever."""
    full = line.decode("utf-8", "backslashreplace")
    for out in (
        Auditor(AuditSettings()).ingest(line, "f:1"),
        Auditor(AuditSettings()).ingest_lines([line], lambda i: "f:1"),
    ):
        (letter,) = out
        assert isinstance(letter, DeadLetter) and letter.source == "f:1"
        head, _, note = letter.raw.partition("… [cut: ")
        assert head == full[:65_536] and note.startswith(f"{len(full) - 65_536:,} more characters")
        assert len(letter.model_dump_json()) < 1 << 20  # fits a Kafka message at the broker's default limit
