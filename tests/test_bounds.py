"""Every bound an event model declares, at its edges, on both paths.

The values come from the models' metadata, not from a list written here: for each bounded field
of each event model, the bound itself and the nearest value past it (and the shortest and longest
string allowed, and one past each). Each goes, alone in an otherwise valid event, through the row
path and the batch path; both must take or refuse it exactly as the model does. A bound changed
on a model, or a batch check that drifted from it, fails here.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from gpucost.producers.simulate import FleetSpec, simulate
from gpucost.schemas.blocks import expand
from gpucost.schemas.bounds import field_bounds
from gpucost.schemas.codec import encode_event
from gpucost.schemas.events import EVENT_MODELS
from gpucost.schemas.records import DeadLetter
from gpucost.streams.audit import Auditor
from gpucost.streams.settings import AuditSettings
from tests.support.batch_path import closing_at

#: one valid event of each kind the fleet simulator makes, as a JSON object
BASES: dict[str, dict[str, Any]] = {}
for _event in simulate(FleetSpec(gpus=2, hours=1, interval_s=10)):
    BASES.setdefault(_event.kind, json.loads(encode_event(_event)))


def _past(value: int | float, up: bool) -> int | float:
    """The nearest value above (``up``) or below ``value`` of its own type."""
    if isinstance(value, int):
        return value + (1 if up else -1)
    return math.nextafter(value, math.inf if up else -math.inf)


def edges() -> list[tuple[str, str, Any]]:
    """(kind, field, value) at and just past every bound every model declares, for the kinds with a base
    and the fields their wire form carries (an eBPF trace carries its numbers packed in ``trace_hex``)."""
    out = []
    for kind, model in EVENT_MODELS.items():
        if kind not in BASES:
            continue
        for name in model.model_fields:
            b = field_bounds(model, name)
            if name not in BASES[kind] and b.required:
                continue
            for op, bound in b.compare:
                number = float(bound) if isinstance(BASES[kind].get(name), float) else bound
                out += [(kind, name, number), (kind, name, _past(number, up=op in ("gt", "le")))]
            for length in (b.min_length, b.max_length):
                if length is not None:
                    out += [(kind, name, "x" * n) for n in (length - 1, length, length + 1) if n >= 0]
    return out


#: the edges of the models' cross-field validators, which the batch path restates beside the bounds:
#: memory used up to the total (``GpuSample``), an interval that rounds to 0 ms or to 1 (``_Sample``)
VALIDATOR_EDGES = [
    ("gpu_sample", "mem_used_bytes", BASES["gpu_sample"]["mem_total_bytes"]),
    ("gpu_sample", "mem_used_bytes", BASES["gpu_sample"]["mem_total_bytes"] + 1),
    *((kind, "interval_s", s) for kind in ("gpu_sample", "process_sample") for s in (0.0005, 0.0005000000000001)),
]
EDGES = edges()


def test_the_edges_cover_every_bounded_field_of_the_hot_kinds() -> None:
    """The kinds the batch path checks column by column are all here, each bounded field of them."""
    for kind in ("gpu_sample", "process_sample", "numa_event", "mem_access"):
        model = EVENT_MODELS[kind]
        bounded = {n for n in model.model_fields if field_bounds(model, n).compare or field_bounds(model, n).max_length}
        assert bounded and bounded == {name for k, name, _ in EDGES if k == kind}


def _refused(outputs: list[Any]) -> list[tuple[str | None, str]]:
    return [(o.kind, o.reason) for o in outputs if isinstance(o, DeadLetter)]


@pytest.mark.parametrize(
    "kind,field,value", EDGES + VALIDATOR_EDGES, ids=[f"{k}.{f}={str(v)[:24]}" for k, f, v in EDGES + VALIDATOR_EDGES]
)
def test_both_paths_take_or_refuse_each_edge_as_the_model_does(kind: str, field: str, value: Any) -> None:
    line = json.dumps({**BASES[kind], field: value}).encode()
    model_takes = True
    try:
        EVENT_MODELS[kind].model_validate_json(line)
    except ValueError:
        model_takes = False
    by_row = Auditor(AuditSettings())
    rows = by_row.ingest(line, "edge")
    by_batch = Auditor(AuditSettings())
    with closing_at(0, few_lines=0):  # a batch of one line, through the column checks
        batch = expand(by_batch.ingest_lines([line], lambda i: "edge"))
    assert (not _refused(rows)) == model_takes, (line, rows)
    assert _refused(batch) == _refused(rows) and batch == rows, (line, batch, rows)
    assert by_batch.counts == by_row.counts
