"""Cost where platform teams already look: Prometheus figures of the records a sink has written.

Why here, at the sink: a record counted when its Parquet file is in place is counted once, as the bill
counts it (the Kafka sink drops what it reads twice before writing). ``gpucost run`` and ``gpucost sink``
serve these beside their own metrics at ``--metrics-address`` (docs/operations.md, "Cost in Prometheus").

- ``gpucost_cost_micro_usd_total{team, env, app, sla, gpu_model}``: µ$ charged, idle (team ``idle``) and
  ``unattributed`` included, so the series sum to what the GPUs cost.
- ``gpucost_cost_credit_micro_usd_total{…}``: µ$ credited back by revisions (a revision's negative
  differences, as positive amounts). A counter only rises, so the bill in Prometheus is charged − credited.
- ``gpucost_allocated_micro_usd_total{…}`` and ``gpucost_allocated_credit_micro_usd_total{…}``: the same on the
  allocation basis (docs/definitions.md, "Allocation basis"; team ``unallocated`` the capacity no one held), for
  the GPUs with allocations: a team's allocated − charged there is what it held and did not use.
- ``gpucost_idle_cost_micro_usd_total{gpu_model, node}``: the idle party's µ$: idle = cost of unused capacity.
- ``gpucost_node_cost_micro_usd_total{basis, node, gpu_model}`` and ``gpucost_label_cost_micro_usd_total{basis, label,
  value}`` (each with its ``…_credit_…`` twin): the same µ$ by node, and by each label the tenants carry (a
  Kubernetes namespace or pod, an environment variable named in the sources' settings; docs/definitions.md,
  "Labels"): a label's series sum to the bill of the tenants carrying it, on each basis.
- ``gpucost_reclaim_triggers_total{sla, team}``; ``gpucost_gpus{grade, breaker_state}``: GPUs by the grade
  and breaker state of their latest health record.
- ``gpucost_device_faults_total{node, severity}``: device faults new in the audit windows' GPU samples
  (``fatal``: each failed its window; ``warning``), from the health records' ``faults_fatal`` and
  ``faults_warning``; by node, not GPU (the rule below): the report names the GPU.

Label cardinality is bounded: no commit, pipeline, pid or GPU label, and every family here (its labels come
from input: names in bindings, models and nodes in samples, grades in records read back) keeps at most
``max_series`` label sets (``gpucost.metrics.BoundedSeries``); further ones are counted in the family's one
series whose every label is ``_other``, and in ``gpucost_cost_series_folded_total{family}``.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpucost.metrics import OTHER, BoundedSeries, labelled
from gpucost.schemas.labels import labels_read

__all__ = ["CostMetrics", "COST_LABELS", "OTHER_TEAM"]

COST_LABELS = ("team", "env", "app", "sla", "gpu_model")
OTHER_TEAM = OTHER  # the team (as every other label) of a family's series past the cap
IDLE_TEAM = "idle"


class CostMetrics:
    """Sums of the records written, by bounded labels; ``observe`` each table as its file is published."""

    def __init__(self, max_series: int = 2000) -> None:
        self.charged = BoundedSeries(max_series, len(COST_LABELS))
        self.credited = BoundedSeries(max_series, len(COST_LABELS))
        self.allocated = BoundedSeries(max_series, len(COST_LABELS))
        self.allocated_credit = BoundedSeries(max_series, len(COST_LABELS))
        self.nodes = {sign: BoundedSeries(max_series, 3) for sign in (1, -1)}  # charged, credited
        self.labels = {sign: BoundedSeries(max_series, 3) for sign in (1, -1)}
        self.idle = BoundedSeries(max_series, 2)
        self.triggers = BoundedSeries(max_series, 2)
        self.gpus = BoundedSeries(max_series, 2)  # GPUs by the series their latest health record is counted in
        self.faults = BoundedSeries(max_series, 2)  # by (node, severity)
        self._latest: dict[str, tuple[int, tuple[str, ...]]] = {}  # per GPU: its latest window's end, its series

    def observe(self, kind: str, table: pa.Table) -> None:
        """A table of ``kind``'s records just written."""
        if kind == "cost":
            self._basis(table, "usage", self.charged, self.credited)
            self._idle(table)
        elif kind == "allocation":
            self._basis(table, "allocation", self.allocated, self.allocated_credit)
        elif kind == "reclaim":
            for sla, team in zip(table.column("sla").to_pylist(), table.column("team").to_pylist()):
                self.triggers.add((sla or "", team), 1)
        elif kind == "health":
            for gpu, end, grade, state in zip(
                *(table.column(c).to_pylist() for c in ("gpu_uuid", "window_end_ns", "grade", "breaker_state"))
            ):
                if gpu not in self._latest or end >= self._latest[gpu][0]:
                    if gpu in self._latest:
                        self.gpus.add(self._latest[gpu][1], -1)
                    self._latest[gpu] = (end, self.gpus.add((grade, state), 1))
            if "faults_fatal" in table.column_names:  # a table written before device faults has none
                for node, *found in zip(
                    *(table.column(c).to_pylist() for c in ("node_id", "faults_fatal", "faults_warning"))
                ):
                    for severity, n in zip(("fatal", "warning"), found):
                        if n:  # None: not reported; 0: none, no series of its own
                            self.faults.add((node, severity), n)

    def _basis(self, table: pa.Table, basis: str, charged: BoundedSeries, credited: BoundedSeries) -> None:
        """A basis's records, charged and credited apart (each filtered once): by the cost labels, by node and by
        label."""
        if "labels" not in table.column_names:  # a table of records written before labels existed
            table = table.append_column("labels", pa.nulls(table.num_rows, pa.string()))
        cost = table.column("cost_micro_usd")
        for sign, counter, rows in (
            (1, charged, table.filter(pc.greater(cost, 0))),
            (-1, credited, table.filter(pc.less(cost, 0))),
        ):
            if rows.num_rows:
                self._by_cost_labels(rows, counter)
                self._dimensions(rows, basis, sign)

    @staticmethod
    def _by_cost_labels(rows: pa.Table, counter: BoundedSeries) -> None:
        sums = (
            rows.select([*COST_LABELS, "cost_micro_usd"])
            .group_by(list(COST_LABELS), use_threads=False)
            .aggregate([("cost_micro_usd", "sum")])
        )
        for *key, total in zip(*(sums.column(c).to_pylist() for c in (*COST_LABELS, "cost_micro_usd_sum"))):
            counter.add(tuple(k or "" for k in key), abs(total))

    def _dimensions(self, rows: pa.Table, basis: str, sign: int) -> None:
        """Records of one sign by node and by label: each distinct label set's sum read once (a label set is the
        same text in every record of its tenant), each series added to once per table."""
        nodes = rows.group_by(["node_id", "gpu_model"], use_threads=False).aggregate([("cost_micro_usd", "sum")])
        for node, model, total in zip(
            *(nodes.column(c).to_pylist() for c in ("node_id", "gpu_model", "cost_micro_usd_sum"))
        ):
            self.nodes[sign].add((basis, node, model), abs(total))
        sets = rows.group_by(["labels"], use_threads=False).aggregate([("cost_micro_usd", "sum")])
        labelled: dict[tuple[str, str, str], int] = {}
        for labels, total in zip(*(sets.column(c).to_pylist() for c in ("labels", "cost_micro_usd_sum"))):
            for key, value in (labels_read(labels) or {}).items():
                labelled[(basis, key, value)] = labelled.get((basis, key, value), 0) + abs(total)
        for series, total in labelled.items():  # one add per series: what folds past the cap is counted once
            self.labels[sign].add(series, total)

    def _idle(self, table: pa.Table) -> None:
        idle = table.filter(pc.equal(table.column("team"), IDLE_TEAM))
        if idle.num_rows:
            sums = idle.group_by(["gpu_model", "node_id"], use_threads=False).aggregate([("cost_micro_usd", "sum")])
            for model, node, total in zip(
                *(sums.column(c).to_pylist() for c in ("gpu_model", "node_id", "cost_micro_usd_sum"))
            ):
                self.idle.add((model, node), total)

    def metrics(self) -> list[Metric]:
        shown = [  # each family's series, and what it shows of them
            (
                self.charged,
                labelled(
                    CounterMetricFamily,
                    "gpucost_cost_micro_usd",
                    "µ$ charged by the cost records written",
                    COST_LABELS,
                    dict(self.charged),
                ),
            ),
            (
                self.credited,
                labelled(
                    CounterMetricFamily,
                    "gpucost_cost_credit_micro_usd",
                    "µ$ credited back by "
                    "revisions (negative differences, as positive amounts): the bill is charged − "
                    "credited",
                    COST_LABELS,
                    dict(self.credited),
                ),
            ),
            (
                self.allocated,
                labelled(
                    CounterMetricFamily,
                    "gpucost_allocated_micro_usd",
                    "µ$ charged by the allocation records written (what was held)",
                    COST_LABELS,
                    dict(self.allocated),
                ),
            ),
            (
                self.allocated_credit,
                labelled(
                    CounterMetricFamily,
                    "gpucost_allocated_credit_micro_usd",
                    "µ$ credited back by revisions of the allocation records (as positive amounts)",
                    COST_LABELS,
                    dict(self.allocated_credit),
                ),
            ),
            (
                self.idle,
                labelled(
                    CounterMetricFamily,
                    "gpucost_idle_cost_micro_usd",
                    "µ$ of unused capacity (the idle party)",
                    ("gpu_model", "node"),
                    dict(self.idle),
                ),
            ),
            *(
                (
                    series[sign],
                    labelled(
                        CounterMetricFamily,
                        f"gpucost_{what}{'' if sign > 0 else '_credit'}_micro_usd",
                        f"µ$ {'charged' if sign > 0 else 'credited back (as positive amounts)'} by the records "
                        f"written, on each basis, by {doc}",
                        names,
                        dict(series[sign]),
                    ),
                )
                for what, series, names, doc in (
                    ("node_cost", self.nodes, ("basis", "node", "gpu_model"), "node"),
                    ("label_cost", self.labels, ("basis", "label", "value"), "each label of the tenants"),
                )
                for sign in (1, -1)
            ),
            (
                self.triggers,
                labelled(
                    CounterMetricFamily,
                    "gpucost_reclaim_triggers",
                    "reclaim triggers written",
                    ("sla", "team"),
                    dict(self.triggers),
                ),
            ),
            (
                self.gpus,
                labelled(
                    GaugeMetricFamily,
                    "gpucost_gpus",
                    "GPUs by the grade and breaker state of their latest health record",
                    ("grade", "breaker_state"),
                    {k: v for k, v in dict(self.gpus).items() if v},
                ),
            ),  # a state no GPU holds any more
            *(
                [
                    (
                        self.faults,
                        labelled(
                            CounterMetricFamily,
                            "gpucost_device_faults",
                            "device faults new in the audit windows' GPU samples, by node and severity (a fatal one "
                            "fails its window)",
                            ("node", "severity"),
                            dict(self.faults),
                        ),
                    )
                ]
                if self.faults
                else []  # no family until a fault is seen: most tools report none, and an empty family says nothing
            ),
        ]
        folded = {(f.name + ("_total" if f.type == "counter" else ""),): s.folded for s, f in shown}
        return [
            *(f for _, f in shown),
            labelled(
                CounterMetricFamily,
                "gpucost_cost_series_folded",
                f"label sets counted in their family's {OTHER!r} "
                "series, past the cap on label sets (--cost-series), by family",
                ("family",),
                folded,
            ),
        ]
