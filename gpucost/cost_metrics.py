"""Cost where platform teams already look: Prometheus figures of the records a sink has written.

Why here, at the sink: a record counted when its Parquet file is in place is counted once, as the bill
counts it (the Kafka sink drops what it reads twice before writing). ``gpucost run`` and ``gpucost sink``
serve these beside their own metrics at ``--metrics-address`` (docs/operations.md, "Cost in Prometheus").

- ``gpucost_cost_micro_usd_total{team, env, app, sla, gpu_model}``: µ$ charged, idle (team ``idle``) and
  ``unattributed`` included, so the series sum to what the GPUs cost.
- ``gpucost_cost_credit_micro_usd_total{…}``: µ$ credited back by revisions (a revision's negative
  differences, as positive amounts). A counter only rises, so the bill in Prometheus is charged − credited.
- ``gpucost_idle_cost_micro_usd_total{gpu_model, node}``: the idle party's µ$.
- ``gpucost_reclaim_triggers_total{sla, team}``; ``gpucost_gpus{grade, breaker_state}``: GPUs by the grade
  and breaker state of their latest health record.

Label cardinality is bounded: no commit, pipeline, pid or GPU label, and at most ``max_series`` label sets
per cost counter; further ones are counted under team ``_other`` (their model kept) and in
``gpucost_cost_series_folded_total``.
"""
from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pyarrow.compute as pc
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpucost.metrics import labelled

__all__ = ["CostMetrics", "COST_LABELS", "OTHER_TEAM"]

COST_LABELS = ("team", "env", "app", "sla", "gpu_model")
OTHER_TEAM = "_other"
IDLE_TEAM = "idle"


class CostMetrics:
    """Sums of the records written, by bounded labels; ``observe`` each table as its file is published."""

    def __init__(self, max_series: int = 2000) -> None:
        self.max_series = max_series
        self.charged: Counter[tuple[str, ...]] = Counter()
        self.credited: Counter[tuple[str, ...]] = Counter()
        self.idle: Counter[tuple[str, ...]] = Counter()
        self.triggers: Counter[tuple[str, ...]] = Counter()
        self.folded = 0
        self._latest: dict[str, tuple[int, str, str]] = {}  # per GPU: its latest health window's end, grade, state

    def observe(self, kind: str, table: pa.Table) -> None:
        """A table of ``kind``'s records just written."""
        if kind == "cost":
            self._cost(table)
        elif kind == "reclaim":
            for sla, team in zip(table.column("sla").to_pylist(), table.column("team").to_pylist()):
                self.triggers[(sla or "", team)] += 1
        elif kind == "health":
            for gpu, end, grade, state in zip(*(table.column(c).to_pylist() for c in (
                    "gpu_uuid", "window_end_ns", "grade", "breaker_state"))):
                if gpu not in self._latest or end >= self._latest[gpu][0]:
                    self._latest[gpu] = (end, grade, state)

    def _cost(self, table: pa.Table) -> None:
        cost = table.column("cost_micro_usd")
        for counter, rows in ((self.charged, table.filter(pc.greater(cost, 0))),
                              (self.credited, table.filter(pc.less(cost, 0)))):
            if not rows.num_rows:
                continue
            sums = rows.select([*COST_LABELS, "cost_micro_usd"]).group_by(list(COST_LABELS), use_threads=False) \
                .aggregate([("cost_micro_usd", "sum")])
            for *key, total in zip(*(sums.column(c).to_pylist() for c in (*COST_LABELS, "cost_micro_usd_sum"))):
                counter[self._series(counter, tuple(k or "" for k in key))] += abs(total)
        idle = table.filter(pc.equal(table.column("team"), IDLE_TEAM))
        if idle.num_rows:
            sums = idle.group_by(["gpu_model", "node_id"], use_threads=False).aggregate([("cost_micro_usd", "sum")])
            for model, node, total in zip(*(sums.column(c).to_pylist() for c in (
                    "gpu_model", "node_id", "cost_micro_usd_sum"))):
                self.idle[(model, node)] += total

    def _series(self, counter: Counter[tuple[str, ...]], key: tuple[str, ...]) -> tuple[str, ...]:
        """``key``, or its model's ``_other`` series once the counter holds ``max_series`` label sets."""
        if key in counter or len(counter) < self.max_series:
            return key
        self.folded += 1
        return (OTHER_TEAM, "", "", "", key[-1])

    def metrics(self) -> list[Metric]:
        grades = Counter((grade, state) for _, grade, state in list(self._latest.values()))
        return [
            labelled(CounterMetricFamily, "gpucost_cost_micro_usd", "µ$ charged by the cost records written",
                    COST_LABELS, dict(self.charged)),
            labelled(CounterMetricFamily, "gpucost_cost_credit_micro_usd", "µ$ credited back by revisions (negative "
                    "differences, as positive amounts): the bill is charged − credited", COST_LABELS,
                    dict(self.credited)),
            labelled(CounterMetricFamily, "gpucost_idle_cost_micro_usd", "µ$ of idle GPU time (the idle party)",
                    ("gpu_model", "node"), dict(self.idle)),
            labelled(CounterMetricFamily, "gpucost_reclaim_triggers", "reclaim triggers written", ("sla", "team"),
                    dict(self.triggers)),
            labelled(GaugeMetricFamily, "gpucost_gpus", "GPUs by the grade and breaker state of their latest health "
                    "record", ("grade", "breaker_state"), dict(grades)),
            labelled(CounterMetricFamily, "gpucost_cost_series_folded", "cost record groups counted under team "
                    f"{OTHER_TEAM!r}: past the cap on label sets", (), {(): self.folded}),
        ]
