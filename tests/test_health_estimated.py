"""A TDP estimate on the health record (docs/definitions.md, "Health audit"): a GPU sample whose ``power_w`` is the
platform table's TDP (``power_estimated``: a tool that gives no power for a part whose row has a TDP, as an amd-smi
capture without power) adds its ms to its window's
``power_estimated_ms``; a window none of whose samples is estimated says None. Both paths against the reference of
tests/support/health_oracle.py (written from the definition), in the default settings (revisions on), across a
snapshot, from a state written before the field, hostile values of the flag, and a real capture through
``gpucost devices --events``.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from gpucost.cli import main
from gpucost.schemas.blocks import expand
from gpucost.schemas.codec import decode_line, encode_event
from gpucost.schemas.events import Event, GpuSample
from gpucost.schemas.records import CostRecord, DeadLetter, HealthRecord, Output
from gpucost.streams.audit import Auditor
from gpucost.streams.settings import AuditSettings
from tests.support.health_fleet import H_S, NS, T0, audit_settings, by_batches, by_rows, fleet
from tests.support.health_oracle import checked, reference

XCP = Path("/work/shared/data/accelerators/amd-instinct/amd-smi_metric-usage_xcp.txt")
SCRIPT = {"GPU-h100": ["excellent"] * 6, "GPU-t4": ["good"] * 6}


def estimated(events: list[Event], seed: int, share: float = 0.3) -> list[Event]:
    """The events with ``power_estimated`` true on a random share of the GPU samples (and false on some others:
    false is a reading, as absent is)."""
    rng = random.Random(seed)
    out: list[Event] = []
    for e in events:
        if isinstance(e, GpuSample) and rng.random() < share:
            e = GpuSample.model_validate({**e.model_dump(), "power_estimated": True})
        elif isinstance(e, GpuSample) and rng.random() < 0.1:
            e = GpuSample.model_validate({**e.model_dump(), "power_estimated": False})
        out.append(e)
    return out


def window_of(ts_ns: int) -> int:
    return (ts_ns - T0) // (H_S * NS)


def health(records: list[Output]) -> dict[tuple[str, int], HealthRecord]:
    return {(r.gpu_uuid, window_of(r.window_start_ns)): r for r in records if isinstance(r, HealthRecord)}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_both_paths_are_the_definition_recomputed(seed: int) -> None:
    s = audit_settings()
    events = estimated(fleet(SCRIPT), seed)
    want = reference(events, s)
    assert any(r["power_estimated_ms"] for r in want)
    key = b"k" * 32
    assert checked(by_rows(events, s, key), key) == want
    assert checked(by_batches(events, s, key), key) == want


@pytest.mark.parametrize("path", [by_rows, by_batches], ids=["rows", "batches"])
def test_a_window_wholly_estimated_says_so_and_one_read_says_none(path: Any) -> None:
    # GPU-h100's window 2 estimated throughout, window 4 in its first sample alone; the rest read
    events = []
    for e in fleet(SCRIPT):
        at = (e.gpu_uuid, window_of(e.ts_ns)) if isinstance(e, GpuSample) else None
        first = at == ("GPU-h100", 4) and (e.ts_ns - T0) % (H_S * NS) < 60 * NS
        if at == ("GPU-h100", 2) or first:
            e = GpuSample.model_validate({**e.model_dump(), "power_estimated": True})
        events.append(e)
    got = health(path(events, audit_settings()))
    assert got[("GPU-h100", 2)].power_estimated_ms == got[("GPU-h100", 2)].covered_ms
    first_ms = sum(
        round(e.interval_s * 1000)
        for e in events
        if isinstance(e, GpuSample) and e.power_estimated and window_of(e.ts_ns) == 4 and e.gpu_uuid == "GPU-h100"
    )
    assert 0 < got[("GPU-h100", 4)].power_estimated_ms == first_ms < got[("GPU-h100", 4)].covered_ms  # type: ignore[operator]
    assert all(r.power_estimated_ms is None for k, r in got.items() if k not in (("GPU-h100", 2), ("GPU-h100", 4)))


def test_the_bill_is_what_it_was_without_the_flag() -> None:
    s = audit_settings()

    def costs(events: list[Event]) -> list[CostRecord]:
        return [r for r in by_batches(events, s) if isinstance(r, CostRecord)]

    assert costs(estimated(fleet(SCRIPT), 5)) == costs(fleet(SCRIPT))


def test_default_settings_with_revisions() -> None:
    s = AuditSettings(peak_tops=audit_settings().peak_tops)  # the defaults: revisions on, 1 h windows
    assert s.revision_horizon_ns > 0
    events = estimated(fleet(SCRIPT), 7)
    rows, batches = checked(by_rows(events, s)), checked(by_batches(events, s))
    assert rows == batches
    want = {(r["gpu_uuid"], r["window_start_ns"]): r["power_estimated_ms"] for r in reference(events, s)}
    assert {(r["gpu_uuid"], r["window_start_ns"]): r["power_estimated_ms"] for r in rows} == want
    assert any(want.values())


@pytest.mark.parametrize("offset_s", [7, 1800], ids=["pane_open", "pane_closed"])
def test_a_snapshot_mid_window_keeps_the_estimated_ms(offset_s: int) -> None:
    s = audit_settings()
    events = estimated(fleet(SCRIPT), 11, share=1.0)  # every GPU sample: a pane's state holds only this
    whole = by_rows(events, s)
    cut = next(i for i, e in enumerate(events) if e.ts_ns >= T0 + (3 * H_S + offset_s) * NS)
    first = Auditor(s)
    out = [r for e in events[:cut] for r in first.update(e)]
    state = json.loads(json.dumps(first.to_state()))
    second = Auditor.from_state(state, s)
    out += [r for e in events[cut:] for r in second.update(e)] + second.finish()
    assert checked(out) == checked(whole)
    assert all(r.power_estimated_ms == r.covered_ms for r in health(out).values())


def test_a_state_written_before_the_field_reads_as_none_estimated() -> None:
    """A pane's state from before ``power_estimated_ms`` has three health sums (the faults'): it reads, and its
    pane counts nothing estimated."""
    s = audit_settings()
    events = [e for e in fleet(SCRIPT) if e.ts_ns < T0 + 30 * NS]
    faulty = [
        GpuSample.model_validate({**e.model_dump(), "fault_fatal": 0, "fault_warning": 1})
        if isinstance(e, GpuSample)
        else e
        for e in events
    ]
    auditor = Auditor(s)
    for e in faulty:
        auditor.update(e)
    state = json.loads(json.dumps(auditor.to_state()))
    for pane in state["panes"]["open"]:
        assert pane[19][3] == 0
        pane[19] = pane[19][:3]  # as written before the field
    again = Auditor.from_state(state, s)
    assert json.loads(json.dumps(again.to_state())) == json.loads(json.dumps(auditor.to_state()))


@pytest.mark.parametrize("path", [by_rows, by_batches], ids=["rows", "batches"])
@pytest.mark.parametrize("value", [1, 0, "true", None, [True], {"x": 1}])
def test_a_flag_that_is_not_a_boolean_is_dead_lettered_on_both_paths(path: Any, value: Any) -> None:
    (sample,) = [e for e in fleet(SCRIPT)[:10] if isinstance(e, GpuSample)][:1]
    wire = json.loads(encode_event(sample))
    wire["power_estimated"] = value
    line = json.dumps(wire).encode()
    decoded = decode_line(line)
    if value is None:  # null is absent: read
        assert isinstance(decoded, GpuSample) and decoded.power_estimated is None
        return
    out = path_lines(path, [line])
    letters = [r for r in out if isinstance(r, DeadLetter)]
    assert len(letters) == 1 and letters[0].reason in ("wrong_type", "invalid"), out
    assert "power_estimated" in letters[0].detail


def path_lines(path: Any, lines: list[bytes]) -> list[Output]:
    """``lines`` through the row path (one by one) or the batch path (as one batch of lines)."""
    auditor = Auditor(audit_settings())
    if path is by_rows:
        return [r for line in lines for r in auditor.ingest(line, "t")] + auditor.finish()
    return [*expand(auditor.ingest_lines(lines, lambda i: "t")), *auditor.finish()]


@pytest.mark.skipif(not XCP.exists(), reason="the shared captures are not here")
def test_a_real_capture_without_power_is_estimated_through_devices_events(tmp_path: Path) -> None:
    out = tmp_path / "events.jsonl"
    flags = ["--node", "mi-a", "--at", "2026-01-05T00:00:00Z", "--model", "MI300X", "--interval-s", "10"]
    assert main(["devices", "--events", str(out), *flags, str(XCP)]) == 0
    events = [decode_line(line.encode()) for line in out.read_text().splitlines()]
    gpus = [e for e in events if isinstance(e, GpuSample)]
    assert gpus and all(e.power_estimated for e in gpus)  # amd-smi metric --usage gives no power: the TDP's share
    for path in (by_rows, by_batches):
        records = [r for r in path(events, AuditSettings()) if isinstance(r, HealthRecord)]  # type: ignore[arg-type]
        assert {r.gpu_uuid for r in records} == {e.gpu_uuid for e in gpus}
        assert all(r.power_estimated_ms == r.covered_ms == 10_000 for r in records)


def test_the_otlp_export_carries_the_estimated_ms_and_no_empty_metric() -> None:
    from gpucost.otlp import export_request

    def points(records: list[HealthRecord]) -> dict[tuple[str, int], float]:
        (metrics,) = [scope.metrics for r in export_request(records).resource_metrics for scope in r.scope_metrics]
        got = {}
        for m in metrics:
            assert len(m.gauge.data_points) > 0, m.name
            if m.name == "gpucost.health.power_estimated_ms":
                for p in m.gauge.data_points:
                    gpu = next(a.value.string_value for a in p.attributes if a.key == "gpu_uuid")
                    got[(gpu, p.start_time_unix_nano)] = p.as_double
        return got

    s = audit_settings()
    records = [r for r in by_rows(estimated(fleet(SCRIPT), 3), s) if isinstance(r, HealthRecord)]
    want = {(r.gpu_uuid, r.window_start_ns): float(r.power_estimated_ms) for r in records if r.power_estimated_ms}
    assert want and points(records) == want
    assert points([r for r in by_rows(fleet(SCRIPT), s) if isinstance(r, HealthRecord)]) == {}


def test_the_summary_says_how_many_windows_were_judged_on_an_estimate(tmp_path: Path) -> None:
    import re

    import duckdb

    from gpucost.embedded import RunStats, run_embedded
    from gpucost.producers.replay import read_inputs
    from gpucost.report import summary

    def said(events: list[Event], out: Path) -> str:
        lines = out.with_suffix(".jsonl")
        lines.write_text("".join(encode_event(e) + "\n" for e in events))
        run_embedded(read_inputs([lines]), audit_settings(), out)
        return summary(out, RunStats())

    events = estimated(fleet(SCRIPT), 13, share=0.02)
    text = said(events, tmp_path / "estimated")
    found = re.search(r"\((\d+) of these windows, on (\d+) GPU\(s\), were judged on power estimated", text)
    assert found is not None, text
    with duckdb.connect() as con:  # the records' own figures, read apart from the views
        want = con.execute(
            f"SELECT count(*), count(DISTINCT gpu_uuid) FROM '{tmp_path / 'estimated' / 'health'}/**/*.parquet' "
            "WHERE power_estimated_ms > 0"
        ).fetchone()
    assert (int(found[1]), int(found[2])) == want and want[0] > 0
    assert "judged on power estimated" not in said(fleet(SCRIPT), tmp_path / "read")


@pytest.mark.parametrize("form", ["field", "old_label", "parquet"])
def test_fit_weights_leaves_out_the_panes_of_an_estimated_power(form: str, tmp_path: Path) -> None:
    """The fit never learns a TDP stand-in: from JSON Lines with the field, from files written before it (which
    labelled the TDP ``estimated``), and from Parquet, which keeps the field. A pane is left out where any of its
    GPU samples is estimated; the others are fitted."""
    import pyarrow.parquet as pq

    from gpucost.fit import pane_features
    from gpucost.schemas.arrow import events_table

    events = estimated(fleet({"GPU-x": ["excellent"] * 2}), 17, share=0.05)
    flagged = {
        (e.gpu_uuid, e.ts_ns - e.ts_ns % (60 * NS)) for e in events if isinstance(e, GpuSample) and e.power_estimated
    }
    path = tmp_path / "events.jsonl"
    if form == "parquet":
        path = tmp_path / "events.parquet"
        pq.write_table(events_table(events), path)
    else:
        lines = []
        for e in events:
            wire = json.loads(encode_event(e))
            if form == "old_label" and wire.pop("power_estimated", None):
                wire["estimated"] = ["power_w"]  # as gpucost devices --events wrote a TDP before the field
            lines.append(json.dumps(wire))
        path.write_text("\n".join(lines) + "\n")
    f = pane_features([path], audit_settings())
    left_out = {("GPU-x", int(start)) for start, read in zip(f.start_ns, f.read) if not read}
    assert flagged and left_out == flagged and len(f.read) > len(flagged)
