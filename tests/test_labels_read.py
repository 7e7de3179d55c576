"""Labels read back from records leniently (``gpucost.schemas.labels.labels_read``): a record on a topic anyone may
write can hold any text in ``labels``; the Prometheus families and a reclaim action read it, and neither may fail
or invent a label from it (docs/definitions.md, "Labels")."""

from __future__ import annotations

import json

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from gpucost.cost_metrics import CostMetrics
from gpucost.schemas.labels import labels_read

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@given(st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=5))
def test_an_object_of_strings_is_read_back_as_it_was_written(labels: dict[str, str]) -> None:
    assert labels_read(json.dumps(labels)) == labels


@given(JSON)
def test_any_other_json_is_no_labels(value: object) -> None:
    is_labels = isinstance(value, dict) and all(isinstance(v, str) for v in value.values())
    assert labels_read(json.dumps(value)) == (value if is_labels else None)


@given(st.text(max_size=20))
def test_text_that_is_not_json_is_no_labels(text: str) -> None:
    try:
        json.loads(text)
    except ValueError:
        assert labels_read(text) is None


def test_hostile_labels_count_their_micro_dollars_and_make_no_label_series() -> None:
    texts = ['{"namespace":"ml"}', '{"namespace":1}', "[1]", "not json", None, '{"namespace":"ml","pod":"p"}']
    rows = [
        {"team": "t", "env": "", "app": "a", "sla": "Gold", "gpu_model": "H100", "node_id": "n", "labels": text}
        | {"cost_micro_usd": 10**k}
        for k, text in enumerate(texts)
    ]
    metrics = CostMetrics()
    metrics.observe("cost", pa.Table.from_pylist(rows))
    families = {f.name: f for f in metrics.metrics()}
    labels = {
        (s.labels["label"], s.labels["value"]): s.value
        for s in families["gpucost_label_cost_micro_usd"].samples
        if s.name.endswith("_total")
    }
    assert labels == {("namespace", "ml"): 1 + 10**5, ("pod", "p"): 10**5}  # only the two objects of strings
    charged = sum(s.value for s in families["gpucost_cost_micro_usd"].samples if s.name.endswith("_total"))
    assert charged == sum(10**k for k in range(len(texts)))  # every record's µ$, whatever its labels
