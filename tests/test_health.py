"""The health audit against an independent recomputation from the raw events.

The reference never calls the operator: DuckDB sums the raw events per window (energy, busy
and idle time, the scheduling deviation per pane, the idle index at the window's last pane),
and a transition table written from docs/definitions.md's "Health audit" drives the breaker. Fleets are scripted
per GPU and window so that every grade and every breaker state is reached, including
``removed`` and back, skipped windows, a spare with no busy time and a model missing from
the peak table; a property test draws the scripts at random. Both paths are checked.
"""
from __future__ import annotations

import hashlib
import json
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from gpucost.cli import main
from gpucost.otlp import read_requests
from gpucost.schemas.arrow import events_table
from gpucost.schemas.blocks import expand
from gpucost.schemas.codec import encode_event
from gpucost.schemas.events import Event, GpuSample, ProcessSample, TenantBinding
from gpucost.schemas.records import HealthRecord, Output
from gpucost.sinks.views import connect
from gpucost.streams.audit import Auditor
from gpucost.streams.discovery import ServiceDiscovery
from gpucost.streams.settings import AuditSettings
from tests.support.health_oracle import judged, reference_breaker

NS = 1_000_000_000
T0 = 1_767_571_200 * NS  # 2026-01-05, a multiple of every window length used here
H_S = 3600
#: a small peak table, so that ordinary powers and utilisations span every grade
PEAKS = {"H100": 2, "T4": 1, "default": Decimal("1.5")}
#: a GPU's node is named by its id's last letter: GPU-h100b and GPU-xb share node-b
MODELS = {"GPU-h100": "NVIDIA H100 80GB HBM3", "GPU-t4": "Tesla T4", "GPU-x": "Acme X9", "GPU-h100b": "H100 PCIe",
          "GPU-xb": "Acme X9", "GPU-newc": "NVIDIA H200"}

#: what a GPU does in one window: (GPU samples' SM %, power W, share of the window sampled, tenant placed)
BEHAVIOURS: dict[str, tuple[float, float, float, bool]] = {
    "excellent": (80.0, 100.0, 1.0, True),  # 0.1 kW over 1.6 TOPS (H100 at 2): 0.0625
    "good": (50.0, 220.0, 1.0, True),  # 0.22 kW over 1 TOPS: 0.22
    "needs": (30.0, 300.0, 1.0, True),  # 0.3 kW over 0.6 TOPS: 0.5
    "spare": (0.0, 40.0, 1.0, False),  # no busy time at all: grade idle, passes
    "held_idle": (0.0, 60.0, 1.0, True),  # placed and left idle: grade idle, deviation 1, fails on it alone
    "busy_unplaced": (60.0, 50.0, 1.0, False),  # busy with nothing placed: deviation 1 (and so graded down)
    "thin": (80.0, 100.0, 0.5, True),  # half the window sampled: coverage fails
    "skip": (0.0, 0.0, 0.0, False),  # no GPU sample in the window at all
    # on the T4 (peak 1) exactly at a threshold: 0.18 kW/TOPS is good, not excellent; 0.25 is still good
    "at_excellent": (100.0, 180.0, 1.0, True),
    "at_good": (100.0, 250.0, 1.0, True),
}
#: behaviours whose power stays exactly as given (the others vary by an eighth of a watt, pane by pane)
STEADY = {"at_excellent", "at_good"}


def fleet(scripts: dict[str, list[str]], pane_s: int = 60) -> list[Event]:
    """Per GPU, one behaviour per window: a GPU sample and, where placed, a process sample of a bound
    pid every pane (the sampled share of the window's panes). GPUs interleave in time order."""
    events: list[Event] = []
    for gpu in scripts:
        node = f"node-{gpu[-1]}"
        events.append(TenantBinding(node_id=node, pid=7, ts_ns=T0, team="search", env="prod", app="a", tier="t",
                                    sla="Gold"))
    per_window = H_S // pane_s
    for w in range(max(map(len, scripts.values()))):
        for p in range(per_window):
            ts = T0 + (w * H_S + p * pane_s) * NS + 5 * NS
            for gpu, script in scripts.items():
                if w >= len(script):
                    continue
                sm, power, share, placed = BEHAVIOURS[script[w]]
                if p >= per_window * share:
                    continue
                node = f"node-{gpu[-1]}"
                events.append(GpuSample(node_id=node, gpu_uuid=gpu, gpu_model=MODELS[gpu], ts_ns=ts,
                                        interval_s=float(pane_s), sm_util_pct=sm, mem_bw_util_pct=10.0,
                                        mem_used_bytes=1, mem_total_bytes=2,
                                        power_w=power + (0 if script[w] in STEADY else 0.125 * (p % 3)),
                                        temp_c=50.0))
                if placed:
                    events.append(ProcessSample(node_id=node, gpu_uuid=gpu, pid=7, ts_ns=ts + NS,
                                                interval_s=float(pane_s), sm_util_pct=sm, mem_bw_util_pct=10.0,
                                                mem_used_bytes=1))
                else:  # an unbound process: unattributed, so the pane is not allocated
                    events.append(ProcessSample(node_id=node, gpu_uuid=gpu, pid=99, ts_ns=ts + NS,
                                                interval_s=float(pane_s), sm_util_pct=sm, mem_bw_util_pct=10.0,
                                                mem_used_bytes=1))
    return events


def audit_settings(admission_h: int = 2, **kw: Any) -> AuditSettings:
    return AuditSettings(pane_s=60, lateness_s=0, window_h=2, health_window_h=1, admission_h=admission_h,
                         peak_tops=PEAKS, **kw)


def by_rows(events: list[Event], s: AuditSettings, key: bytes | None = None) -> list[Output]:
    auditor = Auditor(s, audit_key=key)
    out = [r for e in events for r in auditor.update(e)]
    return out + auditor.finish()


def by_batches(events: list[Event], s: AuditSettings, key: bytes | None = None) -> list[Output]:
    auditor = Auditor(s, audit_key=key)
    lines = [encode_event(e).encode() for e in events]
    out = expand(auditor.ingest_lines(lines[:len(lines) // 2], str))
    out += expand(auditor.ingest_batch(events_table(_decode(lines[len(lines) // 2:])).to_batches()[0], str))
    return out + auditor.finish()


def _decode(lines: list[bytes]) -> list[Event]:
    from gpucost.schemas.codec import decode_line
    return [decode_line(line) for line in lines]  # type: ignore[misc]


# --- the reference -------------------------------------------------------------------------------

REFERENCE_SQL = """
WITH g AS (
  SELECT gpu_uuid, node_id, gpu_model, ts_ns - ts_ns % {P} AS pane, ts_ns - ts_ns % {H} AS win,
         CAST(round(interval_s * 1000) AS BIGINT) AS iv, CAST(round(sm_util_pct * 100) AS BIGINT) AS sm,
         CAST(round(power_w * 1000) AS BIGINT) AS mw
  FROM ev WHERE kind = 'gpu_sample'),
placed AS (
  SELECT DISTINCT gpu_uuid, ts_ns - ts_ns % {P} AS pane FROM ev
  WHERE kind = 'process_sample' AND pid IN (SELECT pid FROM ev WHERE kind = 'tenant_binding')),
panes AS (
  SELECT g.gpu_uuid, g.pane, any_value(g.win) AS win, sum(iv) AS covered,
         sum(CASE WHEN sm < {THR} THEN iv ELSE 0 END) AS idle,
         bool_or(placed.pane IS NOT NULL) AS allocated
  FROM g LEFT JOIN placed ON placed.gpu_uuid = g.gpu_uuid AND placed.pane = g.pane
  GROUP BY ALL),
windows AS (
  SELECT gpu_uuid, win, min(node_id) AS node_id, min(gpu_model) AS gpu_model, sum(iv) AS covered,
         sum(CASE WHEN sm < {THR} THEN iv ELSE 0 END) AS idle, sum(mw * iv) AS energy, sum(sm * iv) AS busy,
         max(pane) AS last_pane
  FROM g GROUP BY ALL),
deviation AS (
  SELECT gpu_uuid, win, sum(CASE WHEN allocated THEN idle ELSE covered - idle END) AS dev FROM panes GROUP BY ALL)
SELECT w.gpu_uuid, w.win, w.node_id, w.gpu_model, w.covered, w.idle, w.energy, w.busy, d.dev,
       (SELECT sum(p.idle) FROM panes p WHERE p.gpu_uuid = w.gpu_uuid AND p.pane > w.last_pane - {W}
          AND p.pane <= w.last_pane) AS idle72,
       (SELECT sum(p.covered) FROM panes p WHERE p.gpu_uuid = w.gpu_uuid AND p.pane > w.last_pane - {W}
          AND p.pane <= w.last_pane) AS covered72
FROM windows w JOIN deviation d USING (gpu_uuid, win)
ORDER BY w.gpu_uuid, w.win
"""


def reference(events: list[Event], s: AuditSettings) -> list[dict[str, Any]]:
    """Every ``health`` record's fields, from the raw events alone."""
    con = duckdb.connect()
    con.register("ev", events_table(events))
    sql = REFERENCE_SQL.format(P=s.pane_s * NS, H=s.health_window_h * H_S * NS, THR=s.idle_threshold_cp,
                               W=s.window_h * H_S * NS)
    found = con.execute(sql).fetchall()
    h_ms = s.health_window_h * H_S * 1000
    peaks = {k.lower(): Fraction(v) for k, v in s.peak_tops.items()}
    out, per_gpu = [], {}
    for gpu, win, node, model, covered, idle, energy, busy, dev, idle72, covered72 in found:
        keys = sorted((k for k in peaks if k != "default" and k in model.lower()), key=lambda k: (-len(k), k))
        peak = peaks[keys[0] if keys else "default"]
        kw = None if busy == 0 else (Fraction(energy, covered * 1000) / 1000) / (peak * Fraction(busy, 10_000 * covered))
        sd, coverage = Fraction(dev, covered), Fraction(covered, h_ms)
        grade, reasons = judged(kw, sd, coverage)
        record = {"gpu_uuid": gpu, "node_id": node, "gpu_model": model, "window_start_ns": win,
                  "window_end_ns": win + h_ms * 1_000_000, "covered_ms": covered, "idle_ms": idle,
                  "energy_uj": energy, "mean_power_w": float(Fraction(energy, covered * 1000)),
                  "effective_tops": float(peak * Fraction(busy, 10_000 * covered)),
                  "kw_per_tops": None if kw is None else float(kw), "sched_deviation": float(sd),
                  "idle_index_72h": float(Fraction(idle72, covered72)), "coverage": float(coverage), "grade": grade,
                  "entitlement": {"excellent": 1.25, "good": 1.0, "needs_optimisation": 0.75, "idle": 1.0}[grade],
                  "passed": not reasons, "fail_reasons": reasons}
        per_gpu.setdefault(gpu, []).append((win // (h_ms * 1_000_000), record))
        out.append(record)
    admission = -(-s.admission_h // s.health_window_h)
    for windows in per_gpu.values():
        verdicts = [(k, r["passed"], "coverage" not in r["fail_reasons"]) for k, r in windows]
        for (_, r), (state, skipped) in zip(windows, reference_breaker(verdicts, admission, s.readmit_passes)):
            r["windows_skipped"], r["breaker_state"] = skipped, state
    return out


def checked(records: list[Output], key: bytes | None = None) -> list[dict[str, Any]]:
    """The health records' fields, each hash and signature checked from scratch here (hashlib, hmac)."""
    import hmac
    out = []
    for r in records:
        if not isinstance(r, HealthRecord):
            continue
        fields = r.model_dump()
        digest = fields.pop("snapshot_sha256")
        signature = fields.pop("signature")
        text = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
        assert digest == hashlib.sha256(text).hexdigest(), r
        assert signature == (None if key is None else hmac.new(key, digest.encode(), hashlib.sha256).hexdigest())
        out.append(fields)
    return sorted(out, key=lambda f: (f["gpu_uuid"], f["window_start_ns"]))


SCRIPTS = {
    # probation 2 windows, then in service; fails twice: removed; two passes: back in service
    "GPU-h100": ["excellent", "excellent", "good", "needs", "needs", "excellent", "needs", "excellent", "excellent",
                 "held_idle", "excellent"],
    # a spare (no busy time), a thin window in probation (restarts admission), a skipped window
    "GPU-t4": ["spare", "thin", "spare", "spare", "skip", "spare", "busy_unplaced", "spare", "skip", "skip", "good",
               "at_excellent", "at_good", "held_idle"],
    # a model the peak table lacks: the default peak
    "GPU-x": ["good", "excellent", "needs", "excellent", "thin", "thin", "thin", "excellent", "excellent"],
    "GPU-h100b": ["needs", "needs", "needs", "excellent", "needs", "needs", "good", "spare"],
    # admitted, then failing until removed: its node leaves service though GPU-h100b, beside it, is in
    "GPU-xb": ["needs", "needs", "needs", "needs", "needs"],
    # one window: still in probation at the end
    "GPU-newc": ["excellent"],
}


@pytest.mark.parametrize("path", [by_rows, by_batches], ids=["rows", "batches"])
def test_every_health_record_is_the_raw_events_recomputed(path: Any) -> None:
    s = audit_settings()
    events = fleet(SCRIPTS)
    key = b"k" * 32
    got = checked(path(events, s, key), key)
    want = reference(events, s)
    assert got == want
    # the scripts reach every grade and every breaker state, skip windows, and leave a GPU unjudged
    assert {r["grade"] for r in got} == {"excellent", "good", "needs_optimisation", "idle"}
    assert {r["breaker_state"] for r in got} == {"probation", "in_service", "observation", "removed"}
    states = [r["breaker_state"] for r in got if r["gpu_uuid"] == "GPU-h100"]
    assert states.index("removed") < len(states) - 1 - states[::-1].index("in_service"), "never back from removed"
    assert any(r["windows_skipped"] for r in got) and any(r["kw_per_tops"] is None for r in got)
    assert {r["fail_reasons"][0] for r in got if r["fail_reasons"]} == {"grade", "sched_deviation", "coverage"}
    t4 = {(r["window_start_ns"] - T0) // (H_S * NS): r for r in got if r["gpu_uuid"] == "GPU-t4"}
    at_thresholds = [(t4[w]["kw_per_tops"], t4[w]["grade"]) for w in (11, 12)]
    assert at_thresholds == [(0.18, "good"), (0.25, "good")]


@pytest.mark.slow
@settings(max_examples=25, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(MODELS)), st.lists(st.sampled_from(sorted(BEHAVIOURS)), min_size=1,
                                                                  max_size=8), min_size=1, max_size=3),
       st.sampled_from([0, 1, 3]), st.sampled_from([1, 2]))
def test_random_fleets_recomputed_on_both_paths(scripts: dict[str, list[str]], admission_h: int,
                                                readmit: int) -> None:
    s = audit_settings(admission_h=admission_h, readmit_passes=readmit)
    events = fleet(scripts)
    want = reference(events, s)
    assert checked(by_rows(events, s)) == want
    assert checked(by_batches(events, s)) == want


# --- snapshots, verification, service discovery ---------------------------------------------------

def replayed(tmp_path: Path, key: bytes | None) -> Path:
    """The scripted fleet replayed to Parquet, with its health records signed by ``key`` (if any)."""
    from gpucost.embedded import run_embedded
    from gpucost.producers.replay import read_inputs
    events = tmp_path / "events.jsonl"
    events.write_text("".join(encode_event(e) + "\n" for e in fleet(SCRIPTS)))
    out = tmp_path / "out"
    run_embedded(read_inputs([events]), audit_settings(), out, audit_key=key)
    return out


def test_a_snapshot_verifies_and_every_forgery_fails(tmp_path: Path) -> None:
    key, other = b"a" * 32, b"b" * 32
    (tmp_path / "audit.key").write_text(f"audit-1 {key.hex()}\n")
    (tmp_path / "other.key").write_text(f"audit-2 {other.hex()}\n")
    out = replayed(tmp_path, key)
    snap = tmp_path / "snap.json"
    assert main(["health", "snapshot", "--out", str(out), "--gpu", "GPU-h100", "--file", str(snap)]) == 0
    doc = json.loads(snap.read_text())
    latest = connect(out).execute("SELECT max(window_start_ns) FROM health WHERE gpu_uuid = 'GPU-h100'").fetchone()
    assert doc["record"]["window_start_ns"] == latest[0] and doc["device"]["gpu_model"] == MODELS["GPU-h100"]
    assert main(["health", "verify", str(snap), "--key-file", str(tmp_path / "audit.key")]) == 0
    assert main(["health", "verify", str(snap)]) == 0  # the hash alone

    def forged(change: Any) -> Path:
        bad = json.loads(snap.read_text())
        change(bad)
        path = tmp_path / "forged.json"
        path.write_text(json.dumps(bad))
        return path

    def resigned(doc: dict[str, Any]) -> None:  # figures changed, hash recomputed, signed with another key
        import hmac
        doc["record"]["grade"] = "excellent"
        fields = {k: v for k, v in doc["record"].items() if k not in ("snapshot_sha256", "signature")}
        digest = hashlib.sha256(json.dumps(fields, sort_keys=True, separators=(",", ":"),
                                           ensure_ascii=False).encode()).hexdigest()
        doc["record"]["snapshot_sha256"] = digest
        doc["record"]["signature"] = hmac.new(other, digest.encode(), hashlib.sha256).hexdigest()

    forgeries = {
        "a figure": lambda d: d["record"].__setitem__("energy_uj", d["record"]["energy_uj"] + 1),
        "a float's last bit": lambda d: d["record"].__setitem__("coverage", d["record"]["coverage"] - 1e-16),
        "the breaker": lambda d: d["record"].__setitem__("breaker_state", "removed"),
        "another key": resigned,
        "the device": lambda d: d["device"].__setitem__("node_id", "node-9"),
        "the signature removed": lambda d: d["record"].__setitem__("signature", None),
    }
    for what, change in forgeries.items():
        path = forged(change)
        assert main(["health", "verify", str(path), "--key-file", str(tmp_path / "audit.key")]) == 1, what
    # signed with the other key and re-hashed: the hash holds, so only the key can tell
    assert main(["health", "verify", str(forged(resigned))]) == 0
    assert main(["health", "verify", str(forged(resigned)), "--key-file", str(tmp_path / "other.key")]) == 0


def prometheus_file_sd_problems(text: str) -> list[str]:
    """What Prometheus would refuse in a file_sd JSON file (its documented format: a list of target groups, each
    ``targets`` (strings) and optional ``labels`` (label name → string), no other key, as its targetgroup decoder
    enforces with DisallowUnknownFields; label names of its data model)."""
    import re
    problems = []
    groups = json.loads(text)
    if not isinstance(groups, list):
        return ["not a JSON list"]
    for g in groups:
        if not isinstance(g, dict) or set(g) - {"targets", "labels"}:
            problems.append(f"not a target group: {g!r}")
            continue
        if not isinstance(g.get("targets"), list) or not all(isinstance(t, str) and t for t in g["targets"]):
            problems.append(f"targets must be a list of host[:port] strings: {g.get('targets')!r}")
        labels = g.get("labels", {})
        if not isinstance(labels, dict) or not all(
                isinstance(k, str) and re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", k) and isinstance(v, str)
                for k, v in labels.items()):
            problems.append(f"labels must map label names to strings: {labels!r}")
    return problems


def test_discovery_lists_a_node_while_none_of_its_gpus_is_removed_or_in_probation(tmp_path: Path) -> None:
    out = replayed(tmp_path, None)
    sd_file = tmp_path / "sd" / "gpus.json"
    sd_file.parent.mkdir()
    assert main(["discovery", "--out", str(out), "--file-sd", str(sd_file), "--target-port", "9400",
                 "--label", "job=gpu"]) == 0
    assert prometheus_file_sd_problems(sd_file.read_text()) == []
    assert [p.name for p in sd_file.parent.iterdir()] == ["gpus.json"], "a temporary file was left"
    latest = dict(connect(out).execute(
        "SELECT gpu_uuid, arg_max(breaker_state, window_start_ns) FROM health GROUP BY ALL").fetchall())
    nodes = {f"node-{g[-1]}" for g in latest}
    out_nodes = {f"node-{g[-1]}" for g, s in latest.items() if s in ("removed", "probation")}
    listed = {t for group in json.loads(sd_file.read_text()) for t in group["targets"]}
    assert listed == {f"{n}:9400" for n in nodes - out_nodes}
    assert out_nodes and nodes - out_nodes, "the scripts leave some nodes in and some out"


def test_a_node_leaves_the_list_the_moment_one_gpu_is_removed_and_returns_when_none_is() -> None:
    """Record by record, in window order, against each GPU's state as the records say it."""
    records = [r for r in by_rows(fleet(SCRIPTS), audit_settings()) if isinstance(r, HealthRecord)]
    records.sort(key=lambda r: (r.window_start_ns, r.gpu_uuid))
    sd, state = ServiceDiscovery(), {}
    for r in records:
        before = set(sd.in_service())
        changed = sd.update(r)
        state[r.gpu_uuid] = (r.node_id, r.breaker_state)
        want = {n for n, _ in state.values()} - {n for n, s in state.values() if s in ("removed", "probation")}
        assert set(sd.in_service()) == want
        assert (before ^ want) <= changed, "a node that came or went was not reported as changed"
        entry = sd.entry(r.node_id)
        assert entry["in_service"] == (r.node_id in want)
    assert sd.update(records[0]) == set(), "an older window changes nothing"


def test_labels_prometheus_refuses_are_refused() -> None:
    sd = ServiceDiscovery()
    for bad in ("__address__", "9lives", "a-b"):
        with pytest.raises(ValueError, match="label name"):
            sd.file_sd(9400, {bad: "x"})


# --- OpenTelemetry export ---------------------------------------------------------------------------

class Receiver:
    """An OTLP/HTTP metrics receiver on a free port: refuses its first ``refuse`` requests with 503 (OTLP's
    "retry"), then decodes each body with the official protobuf and keeps it."""

    def __init__(self, refuse: int = 1) -> None:
        import http.server
        import threading
        self.requests: list[Any] = []
        self.refused = 0
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (the http.server name)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if receiver.refused < refuse:
                    receiver.refused += 1
                    self.send_response(503)
                    self.end_headers()
                    return
                assert self.path == "/v1/metrics" and self.headers["Content-Type"] == "application/x-protobuf"
                receiver.requests.append(ExportMetricsServiceRequest.FromString(body))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()
                self.wfile.write(b"")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/metrics"


def points(requests: list[Any]) -> dict[tuple[str, str, int, int], float]:
    """(metric, GPU, start, end) → value of every data point received."""
    out = {}
    for request in requests:
        for rm in request.resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    for p in metric.gauge.data_points:
                        attrs = {a.key: a.value.string_value for a in p.attributes}
                        out[(metric.name, attrs["gpu_uuid"], p.start_time_unix_nano, p.time_unix_nano)] = p.as_double
    return out


def test_health_figures_reach_an_otlp_receiver_at_their_event_times(tmp_path: Path) -> None:
    out = replayed(tmp_path, None)
    receiver = Receiver(refuse=1)
    try:
        assert main(["health", "export-otlp", "--out", str(out), "--endpoint", receiver.url,
                     "--json", str(tmp_path / "otlp.json")]) == 0
    finally:
        receiver.server.shutdown()
    assert receiver.refused == 1 and len(receiver.requests) == 1, "the 503 was not retried"
    got = points(receiver.requests)
    rows = connect(out).execute("SELECT gpu_uuid, window_start_ns, window_end_ns, mean_power_w, effective_tops, "
                                "kw_per_tops, sched_deviation, idle_index_72h, coverage, entitlement, passed "
                                "FROM health").fetchall()
    want = {}
    for gpu, start, end, *figures in rows:
        for name, value in zip(("mean_power_w", "effective_tops", "kw_per_tops", "sched_deviation", "idle_index_72h",
                                "coverage", "entitlement", "passed"), figures):
            if value is not None:
                want[(f"gpucost.health.{name}", gpu, start, end)] = float(value)
    assert got == want
    # the JSON export is the same request, in OTLP's JSON encoding
    assert points(read_requests(tmp_path / "otlp.json")) == want


def test_verify_tells_whether_an_otlp_export_covers_admission_without_a_gap(tmp_path: Path) -> None:
    out = replayed(tmp_path, None)
    export = tmp_path / "otlp.json"
    assert main(["health", "export-otlp", "--out", str(out), "--json", str(export), "--gpu", "GPU-h100"]) == 0
    windows = connect(out).execute("SELECT count(*) FROM health WHERE gpu_uuid = 'GPU-h100'").fetchone()[0]
    assert windows == len(SCRIPTS["GPU-h100"])  # every window of the script, contiguous, one hour each
    assert main(["health", "verify", str(export), "--admission-h", str(windows)]) == 0
    assert main(["health", "verify", str(export), "--admission-h", str(windows + 1)]) == 1
    # one window's points taken out of the middle: only the hours after the gap count
    doc = json.loads(export.read_text())
    for metric in doc["resourceMetrics"][0]["scopeMetrics"][0]["metrics"]:
        points_ = metric["gauge"]["dataPoints"]
        metric["gauge"]["dataPoints"] = [p for p in points_ if int(p["startTimeUnixNano"]) != T0 + 3 * H_S * NS]
    gapped = tmp_path / "gapped.jsonl"
    gapped.write_text(json.dumps(doc) + "\n")  # and as JSON Lines, as a collector's file exporter writes
    assert main(["health", "verify", str(gapped), "--admission-h", str(windows - 4)]) == 0
    assert main(["health", "verify", str(gapped), "--admission-h", str(windows - 3)]) == 1


@pytest.mark.parametrize("text", [
    '{"resourceMetrics": [{"scopeMetrics": 5}]}', '{"resourceMetrics": [{"scopeMetrics": [{"metrics": [{"gauge": '
    '{"dataPoints": [{"timeUnixNano": "soon"}]}}]}]}]}', '{"resourceMetrics": []}\n{"resourceMetrics": ', '[1, 2]',
    '{"kind": "gpucost.health_snapshot/1", "record": {"gpu_uuid": 7}}', "\x00\xff not json"])
def test_verify_refuses_a_malformed_file_in_one_line(tmp_path: Path, text: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Hostile or broken files to verify: a usage error or a failed verification, said in words, never a traceback."""
    path = tmp_path / "file.json"
    path.write_text(text, errors="surrogateescape")
    rc = main(["health", "verify", str(path)])
    out, err = capsys.readouterr()
    assert rc in (1, 2) and "Traceback" not in out + err
    assert ("error:" in err and err.count("\n") == 1) if rc == 2 else "FAILS verification" in out
