"""Labels in events Parquet files (docs/sources.md, "Parquet"): the ``labels`` column holds the object's JSON text,
``events_table`` writes it, and replay reads it back into the object, so the same events give the same records from
Parquet as from JSON Lines, by ``gpucost replay`` (the batch path) and by the row path; a text that is not a JSON
object of strings is a dead letter (``invalid``), never a crash or a lost label.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gpucost.cli import main
from gpucost.embedded import run_embedded
from gpucost.producers.replay import read_inputs
from gpucost.producers.simulate import FleetSpec, simulate
from gpucost.schemas.arrow import EVENT_SCHEMA, events_table
from gpucost.schemas.codec import encode_event
from gpucost.schemas.events import Allocation, Event, TenantBinding
from gpucost.streams.settings import AuditSettings


def _labelled(ev: Event) -> Event:
    """Labels by team, on bindings and allocations alike; none for ads; a value not ASCII for search."""
    if not isinstance(ev, TenantBinding | Allocation):
        return ev
    labels = {"ads": None, "search": {"namespace": "ns-sérch", "kubernetes.io/pod": "p-0"}}.get(
        ev.team, {"namespace": f"ns-{ev.team}"}
    )
    return type(ev).model_validate({**ev.to_wire(), "labels": labels})


@pytest.fixture(scope="module")
def events() -> list[Event]:
    return [_labelled(e) for e in simulate(FleetSpec(gpus=4, hours=2, seed=11))]


def _rows(out: Path, kind: str) -> list[dict[str, Any]]:
    files = sorted((out / kind).glob("**/*.parquet"))
    rows = pa.concat_tables(pq.read_table(p) for p in files).to_pylist() if files else []
    return sorted(rows, key=lambda r: json.dumps(r, sort_keys=True, default=str))


def test_events_table_writes_labels_as_the_object_s_json_text(events: list[Event]) -> None:
    table = events_table(events)
    assert table.schema == EVENT_SCHEMA and table.schema.field("labels").type == pa.string()
    written = [r["labels"] for r in table.to_pylist() if r["kind"] in ("tenant_binding", "allocation")]
    sent = [e.to_wire().get("labels") for e in events if isinstance(e, TenantBinding | Allocation)]
    assert [None if t is None else json.loads(t) for t in written] == sent
    assert any(t is not None for t in written) and any(t is None for t in written)


@pytest.mark.parametrize("path", ["replay", "rows"])
def test_parquet_events_with_labels_bill_as_the_same_json_lines(events: list[Event], tmp_path: Path, path: str) -> None:
    lines, parquet = tmp_path / "events.jsonl", tmp_path / "events.parquet"
    lines.write_text("".join(encode_event(e) + "\n" for e in events))
    pq.write_table(events_table(events), parquet)
    outs = {}
    for name, source in (("jsonl", lines), ("parquet", parquet)):
        out = tmp_path / f"out-{name}"
        if path == "replay":
            assert main(["replay", str(source), "--out", str(out)]) == 0
        else:
            run_embedded(read_inputs([source]), AuditSettings(), out)
        outs[name] = out
    assert _rows(outs["parquet"], "dlq") == [] == _rows(outs["jsonl"], "dlq")
    for kind in ("cost", "allocation"):
        want = _rows(outs["jsonl"], kind)
        labelled = [r for r in want if r["labels"] is not None]
        assert labelled and {json.loads(r["labels"])["namespace"] for r in labelled} >= {"ns-sérch"}, kind
        assert all(r["tenant_key"].endswith(":" + r["labels"]) for r in labelled), kind
        assert _rows(outs["parquet"], kind) == want, kind


def test_a_labels_text_that_is_not_a_json_object_of_strings_is_an_invalid_dead_letter(tmp_path: Path) -> None:
    binding = {"kind": "tenant_binding", "node_id": "n", "pid": 1, "ts_ns": 1_736_121_600 * 10**9, "team": "search",
               "env": "prod", "app": "a", "tier": "t", "sla": "Gold"}  # fmt: skip
    bad = ["not json", '["a"]', '"ns"', '{"namespace": 1}', '{"bad key": "x"}', "{" * 100_000]
    rows = [{**binding, "pid": i + 2, "labels": text} for i, text in enumerate(bad)]
    rows.append({**binding, "labels": '{"namespace":"ok"}'})
    pq.write_table(pa.Table.from_pylist(rows, schema=EVENT_SCHEMA), tmp_path / "bad.parquet")
    out = tmp_path / "out"
    assert main(["replay", str(tmp_path / "bad.parquet"), "--out", str(out)]) == 0
    letters = _rows(out, "dlq")
    assert len(letters) == len(bad), letters
    assert {r["reason"] for r in letters} == {"invalid"}
    for r in letters:
        assert "label" in r["detail"], r["detail"]
    pids = sorted(int(re.search(r'"pid":([0-9]+)', r["raw"]).group(1)) for r in letters)  # type: ignore[union-attr]
    assert pids == list(range(2, 2 + len(bad)))  # each bad row its own letter; the good binding taken
