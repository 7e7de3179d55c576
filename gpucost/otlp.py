"""The health figures as OpenTelemetry metrics: OTLP/HTTP out, OTLP JSON coverage checks in.

Why the official ``opentelemetry-proto`` messages rather than an SDK: these are records of
the past, each at its own event time (a data point's ``time_unix_nano`` is its window's end,
``start_time_unix_nano`` its start), which an SDK's meters, stamping the time of reading, cannot
express. Each audit window becomes one gauge point per figure, with the GPU, node, model, grade
and breaker state as attributes.

The seed asks for 48 h of OTLP telemetry at a GPU's registration; ``admission_coverage`` reads
an OTLP JSON export (as a collector's file exporter writes it: one ``ExportMetricsServiceRequest``
per line, or one JSON document) and says, per GPU, the longest run of contiguous windows ending
at its latest, against ``admission_h``.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric

from gpucost.schemas.records import HealthRecord

__all__ = [
    "FIGURES",
    "COVERAGE_METRIC",
    "export_request",
    "post",
    "read_requests",
    "Coverage",
    "admission_coverage",
    "coverage_report",
    "to_json",
]

#: the figures exported, with their units (UCUM, as OpenTelemetry's semantic conventions write them)
FIGURES: dict[str, str] = {
    "mean_power_w": "W",
    "effective_tops": "TFLOP/s",
    "kw_per_tops": "kW/TFLOP/s",
    "sched_deviation": "1",
    "idle_index_72h": "1",
    "coverage": "1",
    "entitlement": "1",
    "passed": "1",
    "power_estimated_ms": "ms",  # the window's ms whose power is the platform table's TDP (none: no point)
}
#: the metric whose points say which windows a GPU was audited in
COVERAGE_METRIC = "gpucost.health.coverage"
_ATTRIBUTES = ("gpu_uuid", "node_id", "gpu_model", "grade", "breaker_state")


def _attribute(key: str, value: str) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(string_value=value))


def export_request(records: Iterable[HealthRecord]) -> ExportMetricsServiceRequest:
    """One request holding every record's figures (a null one, ``kw_per_tops`` or ``power_estimated_ms``, is left
    out: no point; a figure with no point is no metric, an empty gauge)."""
    request = ExportMetricsServiceRequest()
    resource = request.resource_metrics.add()
    resource.resource.attributes.append(_attribute("service.name", "gpucost"))
    scope = resource.scope_metrics.add()
    scope.scope.name = "gpucost.health"
    metrics: dict[str, Metric] = {}
    for name, unit in FIGURES.items():
        metric = metrics[name] = scope.metrics.add()
        metric.name, metric.unit = f"gpucost.health.{name}", unit
        metric.gauge.SetInParent()
    for record in records:
        attributes = [_attribute(a, getattr(record, a)) for a in _ATTRIBUTES]
        for name, metric in metrics.items():
            value = getattr(record, name)
            if value is None:
                continue
            point = metric.gauge.data_points.add(
                start_time_unix_nano=record.window_start_ns, time_unix_nano=record.window_end_ns, attributes=attributes
            )
            point.as_double = float(value)
    for i in reversed(range(len(scope.metrics))):  # a figure no record has (no estimate in the fleet): no metric
        if not scope.metrics[i].gauge.data_points:
            del scope.metrics[i]
    return request


def post(endpoint: str, request: ExportMetricsServiceRequest, attempts: int = 4, timeout_s: float = 10.0) -> None:
    """``request`` to an OTLP/HTTP receiver (``…/v1/metrics``), as protobuf; retried with backoff on
    the answers OTLP says to retry (429, 502, 503, 504) and on refused connections."""
    body = request.SerializeToString()
    for attempt in range(1, attempts + 1):
        req = urllib.request.Request(
            endpoint, data=body, method="POST", headers={"Content-Type": "application/x-protobuf"}
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as answer:
                answer.read()
                return
        except urllib.error.HTTPError as exc:
            if exc.code not in (429, 502, 503, 504) or attempt == attempts:
                raise RuntimeError(f"the OTLP receiver at {endpoint} answered {exc.code} {exc.reason}") from None
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            if attempt == attempts:
                raise RuntimeError(f"cannot reach the OTLP receiver at {endpoint}: {exc}") from None
        time.sleep(0.2 * 2**attempt)


def is_otlp_export(path: Path) -> bool:
    """Whether a file is an OTLP JSON export rather than a health snapshot (its first bytes say); False where
    it cannot be read, for the snapshot's reader to say why."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096)
    except OSError:
        return False
    return b'"resourceMetrics"' in head or b'"resource_metrics"' in head


def read_requests(path: Path) -> list[ExportMetricsServiceRequest]:
    """An OTLP JSON export: one JSON document, or one request per line. ``ValueError`` says what is wrong."""
    try:
        text = path.read_text()
        try:
            docs = [json.loads(text)]
        except ValueError:
            docs = [json.loads(line) for line in text.splitlines() if line.strip()]
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from None
    except RecursionError:
        raise ValueError(f"{path} is not an OTLP JSON metrics export: nested too deeply") from None
    except ValueError as exc:  # includes UnicodeDecodeError
        raise ValueError(f"{path} is not an OTLP JSON metrics export: {exc}") from None
    out = []
    for doc in docs:
        if not isinstance(doc, dict) or "resourceMetrics" not in doc and "resource_metrics" not in doc:
            raise ValueError(f"{path} is not an OTLP JSON metrics export (no resourceMetrics)")
        try:
            out.append(json_format.ParseDict(doc, ExportMetricsServiceRequest(), ignore_unknown_fields=True))
        except json_format.ParseError as exc:  # a field of the wrong type, say
            raise ValueError(f"{path} is not a valid OTLP JSON metrics export: {exc}") from None
    return out


@dataclass(frozen=True)
class Coverage:
    """One GPU's audited windows in an export: the contiguous run ending at its latest window."""

    gpu_uuid: str
    windows: int  # windows seen in all
    run_start_ns: int
    run_end_ns: int

    @property
    def run_hours(self) -> float:
        return (self.run_end_ns - self.run_start_ns) / 3.6e12

    def covers(self, admission_h: int) -> bool:
        return self.run_end_ns - self.run_start_ns >= admission_h * 3_600_000_000_000


def admission_coverage(requests: Iterable[ExportMetricsServiceRequest]) -> list[Coverage]:
    """Per GPU, from the ``gpucost.health.coverage`` points: the windows audited, and the longest run of
    windows each starting where the one before it ended, that ends at the GPU's latest window."""
    spans: dict[str, set[tuple[int, int]]] = {}
    for request in requests:
        for resource in request.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name != COVERAGE_METRIC:
                        continue
                    for point in metric.gauge.data_points:
                        gpu = next((a.value.string_value for a in point.attributes if a.key == "gpu_uuid"), "")
                        spans.setdefault(gpu, set()).add((point.start_time_unix_nano, point.time_unix_nano))
    out = []
    for gpu, windows in sorted(spans.items()):
        ordered = sorted(windows)
        start, end = ordered[-1]
        for s, e in reversed(ordered[:-1]):
            if e != start:
                break
            start = s
        out.append(Coverage(gpu, len(ordered), start, end))
    return out


def coverage_report(coverages: list[Coverage], admission_h: int) -> tuple[bool, list[str]]:
    """Whether every GPU's export covers ``admission_h`` hours without a gap, and a line per GPU."""
    lines = []
    for c in coverages:
        verdict = "covers" if c.covers(admission_h) else "does NOT cover"
        lines.append(
            f"{c.gpu_uuid}: {c.run_hours:g} h contiguous up to its latest window ({c.windows} window(s) in "
            f"all): {verdict} {admission_h} h"
        )
    return bool(coverages) and all(c.covers(admission_h) for c in coverages), lines


def to_json(request: ExportMetricsServiceRequest) -> dict[str, Any]:
    """The request in OTLP's JSON encoding (camelCase fields, 64-bit integers as strings)."""
    return json_format.MessageToDict(request)  # type: ignore[no-any-return]
