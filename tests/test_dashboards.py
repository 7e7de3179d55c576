"""The Grafana dashboards under compose/ ask only for what the pipeline exports.

What is exported is read from the components themselves (an embedded run's, a worker's, a sink's and a
producer's metrics, in Prometheus' text format as a scrape gets it), not from a list kept beside the
dashboards: a metric renamed, or a label dropped, fails here rather than as an empty panel.
"""

from __future__ import annotations

import json
import re

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric

from gpucost.cost_metrics import CostMetrics
from gpucost.embedded import RunStats
from gpucost.kafka.publish import ProducerStats
from gpucost.kafka.settings import KafkaSettings
from gpucost.kafka.sink import SinkStats
from gpucost.kafka.worker import Worker
from gpucost.streams.settings import AuditSettings
from tests.conftest import ROOT

DASHBOARDS = sorted((ROOT / "compose" / "grafana" / "dashboards").glob("*.json"))
PROMQL_WORDS = {"sum", "by", "rate", "increase", "topk", "max", "or", "without", "on", "ignoring"}


class _Families:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def exported() -> dict[str, set[str]]:
    """Each metric name a scrape of any component shows (its ``# TYPE`` lines: a counter as ``…_total``), with
    the label names its family declares."""
    families = [
        *RunStats(cost=CostMetrics()).metrics(),
        *SinkStats(cost=CostMetrics()).metrics(),
        *Worker(KafkaSettings(), AuditSettings(), group="g").metrics(),
        *ProducerStats().metrics(),
    ]
    registry = CollectorRegistry()
    registry.register(_Families(families))  # type: ignore[arg-type]
    typed = dict(re.findall(r"^# TYPE (\S+) (\S+)$", generate_latest(registry).decode(), re.M))
    # the label names each family declares: prometheus_client has no public name for them (a family offers name,
    # documentation, type, unit, samples) and a component that has seen nothing has no labelled sample, so a
    # scrape shows none; read where the library keeps them (tests/test_imports.py's THIRD_PARTY allows this one)
    labels = {f.name + ("_total" if f.type == "counter" else ""): set(getattr(f, "_labelnames", ())) for f in families}
    return {name: labels[name] for name in typed}


def _exprs(dashboard: dict) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def test_there_are_dashboards_for_cost_and_for_the_pipeline() -> None:
    uids = {json.loads(p.read_text())["uid"] for p in DASHBOARDS}
    assert {"gpucost-cost", "gpucost-pipeline"} <= uids


def test_every_query_names_metrics_and_labels_the_pipeline_exports() -> None:
    metrics = exported()
    for path in DASHBOARDS:
        dashboard = json.loads(path.read_text())
        assert dashboard["panels"], path
        for expr in _exprs(dashboard):
            named = set(re.findall(r"\bgpucost_[a-z0-9_]+\b", expr))
            assert named, f"{path.name}: {expr} names no gpucost metric"
            for name in named:
                assert name in metrics, f"{path.name}: {name} is not exported (exported: {sorted(metrics)})"
            labels = {label for group in re.findall(r"\bby \(([^)]*)\)", expr) for label in re.split(r",\s*", group)}
            known = set().union(*(metrics[n] for n in named))
            assert labels <= known, f"{path.name}: {expr} groups by {labels - known}, which {named} do not carry"
