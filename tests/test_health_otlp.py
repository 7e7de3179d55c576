"""The health figures exported over OpenTelemetry (OTLP/HTTP and its JSON file), from the scripted fleet's replay
(tests/support/health_fleet.py): each figure at its window's event times, through a receiver's 503; ``health verify``
on an export tells whether it covers admission without a gap, and refuses a malformed file in one line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from gpucost.cli import main
from gpucost.otlp import read_requests
from gpucost.sinks.views import connect
from tests.support.health_fleet import H_S, NS, SCRIPTS, T0, replayed


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
        assert (
            main(
                [
                    "health",
                    "export-otlp",
                    "--out",
                    str(out),
                    "--endpoint",
                    receiver.url,
                    "--json",
                    str(tmp_path / "otlp.json"),
                ]
            )
            == 0
        )
    finally:
        receiver.server.shutdown()
    assert receiver.refused == 1 and len(receiver.requests) == 1, "the 503 was not retried"
    got = points(receiver.requests)
    rows = (
        connect(out)
        .execute(
            "SELECT gpu_uuid, window_start_ns, window_end_ns, mean_power_w, effective_tops, "
            "kw_per_tops, sched_deviation, idle_index_72h, coverage, entitlement, passed, power_estimated_ms "
            "FROM health"
        )
        .fetchall()
    )
    want = {}
    for gpu, start, end, *figures in rows:
        for name, value in zip(
            (
                "mean_power_w",
                "effective_tops",
                "kw_per_tops",
                "sched_deviation",
                "idle_index_72h",
                "coverage",
                "entitlement",
                "passed",
                "power_estimated_ms",
            ),
            figures,
        ):
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


@pytest.mark.parametrize(
    "text",
    [
        '{"resourceMetrics": [{"scopeMetrics": 5}]}',
        '{"resourceMetrics": [{"scopeMetrics": [{"metrics": [{"gauge": '
        '{"dataPoints": [{"timeUnixNano": "soon"}]}}]}]}]}',
        '{"resourceMetrics": []}\n{"resourceMetrics": ',
        "[1, 2]",
        '{"kind": "gpucost.health_snapshot/1", "record": {"gpu_uuid": 7}}',
        "\x00\xff not json",
    ],
)
def test_verify_refuses_a_malformed_file_in_one_line(
    tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Hostile or broken files to verify: a usage error or a failed verification, said in words, never a traceback."""
    path = tmp_path / "file.json"
    path.write_text(text, errors="surrogateescape")
    rc = main(["health", "verify", str(path)])
    out, err = capsys.readouterr()
    assert rc in (1, 2) and "Traceback" not in out + err
    assert ("error:" in err and err.count("\n") == 1) if rc == 2 else "FAILS verification" in out
