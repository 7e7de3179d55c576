"""Device faults in the health audit (docs/definitions.md, "Health audit"): a fatal fault new in a GPU sample fails
its GPU's audit window (``device_fault``) and the breaker acts as for any failed window; warnings are counted on
the record; a window none of whose samples reported fault fields says None, not 0. Both paths, against the
reference of tests/test_health.py (written from the definition), a snapshot taken mid-window, the default settings
(revisions on), and a real capture through ``gpucost devices --events``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpucost.cli import main
from gpucost.schemas.codec import decode_line
from gpucost.schemas.devices import DeviceSample
from gpucost.schemas.events import Event, GpuSample
from gpucost.schemas.faults import counts
from gpucost.schemas.records import CostRecord, HealthRecord, Output
from gpucost.streams.audit import Auditor
from gpucost.streams.settings import AuditSettings
from tests.support.health_fleet import H_S, NS, T0, audit_settings, by_batches, by_rows, fleet
from tests.support.health_oracle import checked, reference

GAUDI = Path("/work/shared/data/accelerators/intel-gaudi/hl-smi_log_gaudi2_hl-225_1.18.0.txt")
#: the second snapshot's device line of that capture, whose last column is the volatile uncorrectable ECC count
GAUDI_ECC = "| 0000:4d:00.0     N/A |                   0  |"


def window_of(ts_ns: int) -> int:
    return (ts_ns - T0) // (H_S * NS)


def with_faults(events: list[Event], faults: dict[tuple[str, int, int], tuple[int | None, int | None]]) -> list[Event]:
    """The events with ``(fault_fatal, fault_warning)`` on the GPU sample of (GPU, window, k-th sample in it)."""
    seen: dict[tuple[str, int], int] = {}
    out: list[Event] = []
    for e in events:
        if isinstance(e, GpuSample):
            at = (e.gpu_uuid, window_of(e.ts_ns))
            k = seen[at] = seen.get(at, -1) + 1
            if (*at, k) in faults:
                fatal, warning = faults[(*at, k)]
                e = GpuSample.model_validate({**e.model_dump(), "fault_fatal": fatal, "fault_warning": warning})
        out.append(e)
    return out


def health(records: list[Output], gpu: str = "GPU-h100") -> dict[int, HealthRecord]:
    return {window_of(r.window_start_ns): r for r in records if isinstance(r, HealthRecord) and r.gpu_uuid == gpu}


# six windows, in service from the third (admission 2 h)
SCRIPT = {"GPU-h100": ["excellent"] * 6, "GPU-t4": ["good"] * 6}


@pytest.mark.parametrize("path", [by_rows, by_batches], ids=["rows", "batches"])
def test_a_fatal_fault_fails_its_window_and_the_breaker_acts_as_for_another_failure(path: Any) -> None:
    s = audit_settings()
    got = health(path(with_faults(fleet(SCRIPT), {("GPU-h100", 3, 17): (1, 0)}), s))
    assert got[3].fail_reasons == ["device_fault"] and not got[3].passed
    assert (got[3].faults_fatal, got[3].faults_warning) == (1, 0)
    assert all(got[w].passed for w in got if w != 3)
    # the breaker as for a window that fails on its scheduling deviation alone
    other = health(path(fleet({"GPU-h100": ["excellent"] * 3 + ["held_idle"] + ["excellent"] * 2}), s))
    assert other[3].fail_reasons == ["sched_deviation"]
    assert [got[w].breaker_state for w in sorted(got)] == [other[w].breaker_state for w in sorted(other)]
    assert got[3].breaker_state == "observation"
    # two fatal windows in a row: removed, as two failures are
    twice = health(path(with_faults(fleet(SCRIPT), {("GPU-h100", 3, 0): (2, 1), ("GPU-h100", 4, 59): (1, 0)}), s))
    assert [twice[w].breaker_state for w in (3, 4)] == ["observation", "removed"]


@pytest.mark.parametrize("path", [by_rows, by_batches], ids=["rows", "batches"])
def test_warnings_are_counted_and_fail_nothing(path: Any) -> None:
    got = health(path(with_faults(fleet(SCRIPT), {("GPU-h100", 2, k): (0, 2) for k in (0, 30, 59)}), audit_settings()))
    assert got[2].passed and got[2].fail_reasons == []
    assert (got[2].faults_fatal, got[2].faults_warning) == (0, 6)


@pytest.mark.parametrize("path", [by_rows, by_batches], ids=["rows", "batches"])
def test_absent_is_not_reported_and_zero_is_reported_clean(path: Any) -> None:
    got = health(path(with_faults(fleet(SCRIPT), {("GPU-h100", 1, 5): (0, 0)}), audit_settings()))
    assert (got[1].faults_fatal, got[1].faults_warning) == (0, 0)
    assert all((got[w].faults_fatal, got[w].faults_warning) == (None, None) for w in got if w != 1)


@pytest.mark.parametrize("path", [by_rows, by_batches], ids=["rows", "batches"])
def test_a_fault_counts_in_the_window_of_its_sample(path: Any) -> None:
    # the last sample of window 2 and the first of window 4: windows 2 and 4 fail, 3 does not
    got = health(
        path(with_faults(fleet(SCRIPT), {("GPU-h100", 2, 59): (1, 0), ("GPU-h100", 4, 0): (0, 1)}), audit_settings())
    )
    assert [got[w].faults_fatal for w in (1, 2, 3, 4)] == [None, 1, None, 0]
    assert [got[w].faults_warning for w in (2, 4)] == [0, 1]
    assert [w for w in got if "device_fault" in got[w].fail_reasons] == [2]


FAULTS = {
    ("GPU-h100", 0, 3): (1, 0),
    ("GPU-h100", 2, 59): (0, 3),
    ("GPU-h100", 3, 0): (1, 1),
    ("GPU-t4", 1, 10): (0, 0),
    ("GPU-t4", 2, 10): (0, 1),
    ("GPU-t4", 4, 40): (2, 0),
}


def test_both_paths_are_the_definition_recomputed() -> None:
    s = audit_settings()
    events = with_faults(fleet(SCRIPT), FAULTS)
    want = reference(events, s)
    assert any(r["faults_fatal"] for r in want) and any(r["faults_fatal"] is None for r in want)
    key = b"k" * 32
    assert checked(by_rows(events, s, key), key) == want
    assert checked(by_batches(events, s, key), key) == want


def test_the_bill_is_what_it_was_without_faults() -> None:
    s = audit_settings()

    def costs(events: list[Event]) -> list[CostRecord]:
        return [r for r in by_batches(events, s) if isinstance(r, CostRecord)]

    assert costs(with_faults(fleet(SCRIPT), FAULTS)) == costs(fleet(SCRIPT))


@pytest.mark.parametrize("offset_s", [7, 1800], ids=["pane_open", "pane_closed"])
def test_a_snapshot_mid_window_keeps_the_faults_seen(offset_s: int) -> None:
    s = audit_settings()
    events = with_faults(fleet(SCRIPT), FAULTS)
    whole = by_rows(events, s)
    # cut inside window 3 after its first sample, the fatal one: while its pane is open (the pane's state holds
    # the fault), or half an hour on (the health window's does)
    cut = next(i for i, e in enumerate(events) if e.ts_ns >= T0 + (3 * H_S + offset_s) * NS)
    first = Auditor(s)
    out = [r for e in events[:cut] for r in first.update(e)]
    state = json.loads(json.dumps(first.to_state()))
    if offset_s == 7:
        (pane,) = [p for p in state["panes"]["open"] if p[0] == "GPU-h100"]
        assert pane[19] == [1, 1, 1, 0]  # samples reporting, fatal, warning; no power estimated
    else:
        assert state["health"]["open"]["GPU-h100"][-4:-1] == [1, 1, 1]
    second = Auditor.from_state(state, s)
    out += [r for e in events[cut:] for r in second.update(e)] + second.finish()
    assert checked(out) == checked(whole)
    assert health(out)[3].fail_reasons == ["device_fault"]


def test_default_settings_with_revisions() -> None:
    s = AuditSettings(peak_tops=audit_settings().peak_tops)  # the defaults: revisions on, 1 h windows
    assert s.revision_horizon_ns > 0
    events = with_faults(fleet(SCRIPT), FAULTS)
    rows, batches = checked(by_rows(events, s)), checked(by_batches(events, s))
    assert rows == batches
    failed = {(r["gpu_uuid"], window_of(r["window_start_ns"])) for r in rows if "device_fault" in r["fail_reasons"]}
    assert failed == {("GPU-h100", 0), ("GPU-h100", 3), ("GPU-t4", 4)}


def test_counts_classify_with_the_rules_of_schemas_faults() -> None:
    def sample(**kw: Any) -> DeviceSample:
        return DeviceSample("NVIDIA", "L4", "0", **kw)

    assert counts(sample()) is None  # not reported
    assert counts(sample(ecc_uncorrected=0, xid=0)) == (0, 0)  # reported clean
    assert counts(sample(xid=79)) == (1, 0)  # a fatal XID
    assert counts(sample(xid=13)) == (0, 1)  # any other XID warns
    assert counts(sample(xid=79), sample(xid=79)) == (0, 0)  # the same XID again is not new
    assert counts(sample(ecc_uncorrected=3, ecc_corrected=5), sample(ecc_uncorrected=3, ecc_corrected=4)) == (0, 1)


def _events_of(capture: Path, tmp_path: Path) -> list[Event]:
    out = tmp_path / "events.jsonl"
    assert main(["devices", "--events", str(out), "--node", "n1", str(capture)]) == 0
    return [decode_line(line.encode()) for line in out.read_text().splitlines()]  # type: ignore[misc]


@pytest.mark.skipif(not GAUDI.exists(), reason="the shared captures are not here")
def test_a_real_capture_through_devices_events_into_the_audit(tmp_path: Path) -> None:
    s = AuditSettings()
    # as captured: hl-smi reports the uncorrectable ECC count, 0 in both snapshots: reported, and clean
    clean = _events_of(GAUDI, tmp_path)
    assert [(e.fault_fatal, e.fault_warning) for e in clean if isinstance(e, GpuSample)] == [(0, 0), (0, 0)]
    for path in (by_rows, by_batches):
        (record,) = [r for r in path(clean, s) if isinstance(r, HealthRecord)]
        assert (record.faults_fatal, record.faults_warning) == (0, 0) and "device_fault" not in record.fail_reasons
    # the same capture with two uncorrectable ECC errors in its second snapshot (a copy, here)
    text = GAUDI.read_text()
    assert text.count(GAUDI_ECC) == 2
    at = text.rindex(GAUDI_ECC)
    faulty = tmp_path / "ecc.txt"
    faulty.write_text(text[:at] + GAUDI_ECC.replace("   0  |", "   2  |") + text[at + len(GAUDI_ECC) :])
    events = _events_of(faulty, tmp_path)
    assert [(e.fault_fatal, e.fault_warning) for e in events if isinstance(e, GpuSample)] == [(0, 0), (1, 0)]
    for path in (by_rows, by_batches):
        (record,) = [r for r in path(events, s) if isinstance(r, HealthRecord)]
        assert (record.faults_fatal, record.faults_warning) == (1, 0) and "device_fault" in record.fail_reasons
        assert not record.passed
    # two errors already in the first snapshot and no more after: new in the first sample only (the capture's
    # first sample has nothing before it), not again in the second, whose counter did not rise
    faulty.write_text(text.replace(GAUDI_ECC, GAUDI_ECC.replace("   0  |", "   2  |")))
    events = _events_of(faulty, tmp_path)
    assert [(e.fault_fatal, e.fault_warning) for e in events if isinstance(e, GpuSample)] == [(1, 0), (0, 0)]


def test_a_partition_carries_its_whole_device_faults() -> None:
    from decimal import Decimal

    from gpucost.producers.accelerators.events import Placement, to_events
    from gpucost.producers.accelerators.events import with_faults as written
    from gpucost.schemas.devices import Parsed

    at = T0
    parent = DeviceSample("AMD", "MI300X", "0", ts_ns=at, ecc_uncorrected=1, ecc_corrected=0)
    parts = [DeviceSample("AMD", "MI300X", f"0.{k}", parent_id="0", ts_ns=at, busy_pct=Decimal(5)) for k in (0, 1)]
    alone = DeviceSample("AMD", "MI300X", "1", ts_ns=at, busy_pct=Decimal(5))  # reports no fault field
    place = Placement("n1", Decimal(10))
    samples = [parent, *parts, alone]
    wire = written(to_events(samples, place, Parsed()), samples, place)
    got = {e["gpu_uuid"]: (e.get("fault_fatal"), e.get("fault_warning")) for e in wire if e["kind"] == "gpu_sample"}
    assert got == {"n1/0.0": (1, 0), "n1/0.1": (1, 0), "n1/1": (None, None)}


def test_the_report_and_the_metrics_show_them(tmp_path: Path) -> None:
    import pyarrow.parquet as pq
    from prometheus_client.core import Metric

    from gpucost.cost_metrics import CostMetrics
    from gpucost.embedded import run_embedded
    from gpucost.producers.replay import read_inputs
    from gpucost.report import device_faults
    from gpucost.schemas.codec import encode_event
    from gpucost.sinks.views import connect

    lines = tmp_path / "events.jsonl"
    lines.write_text("".join(encode_event(e) + "\n" for e in with_faults(fleet(SCRIPT), FAULTS)))
    out = tmp_path / "out"
    run_embedded(read_inputs([lines]), audit_settings(), out)
    text = device_faults(connect(out))
    assert text is not None and "2 of the 2 GPUs" in text
    rows = [line.split() for line in text.splitlines()[4:]]
    # gpu_uuid, node_id, failed_windows, fatal, warning, then the last window's end (date and time)
    assert [r[:5] for r in rows] == [["GPU-h100", "node-0", "2", "2", "4"], ["GPU-t4", "node-4", "1", "2", "1"]]
    metrics = CostMetrics()
    metrics.observe("health", pq.read_table(out / "health"))
    (family,) = [m for m in metrics.metrics() if isinstance(m, Metric) and m.name == "gpucost_device_faults"]
    got = {(s.labels["node"], s.labels["severity"]): s.value for s in family.samples if s.name.endswith("_total")}
    assert got == {("node-0", "fatal"): 2, ("node-0", "warning"): 4, ("node-4", "fatal"): 2, ("node-4", "warning"): 1}
    # without faults reported, the report says nothing of them
    lines.write_text("".join(encode_event(e) + "\n" for e in fleet(SCRIPT)))
    run_embedded(read_inputs([lines]), audit_settings(), tmp_path / "clean")
    assert device_faults(connect(tmp_path / "clean")) is None
