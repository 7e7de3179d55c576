"""Labels as dimensions (docs/definitions.md, "Labels"): what a binding may carry, how it joins the tenant, and
every place cost is grouped by it (the ``cost_by_label`` view, the report, FOCUS ``Tags``, Prometheus).

The expected figures are recomputed here from the records' own rows or the events the test wrote (labels read
with ``json.loads``, summed in Python), never taken from the code under test. Row against batch and both against
the batch reference, with labels, are in the suites that draw ``tests.strategies.streams`` (which draws labels).
"""

from __future__ import annotations

import datetime as dt
import json
import re
import shutil
import unicodedata
from collections import Counter, defaultdict
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpucost.cli import build_parser
from gpucost.cost_metrics import CostMetrics
from gpucost.embedded import run_embedded
from gpucost.focus import export_focus
from gpucost.producers.attribution import AttributionSettings, ProcessEnvironment, labels_of
from gpucost.producers.kubernetes import pod_labels, pods_from
from gpucost.producers.replay import read_inputs
from gpucost.producers.simulate import FleetSpec, simulate
from gpucost.reclaim import action_of
from gpucost.report_bases import allocation_gap, by_label
from gpucost.schemas.codec import decode_line, encode_event
from gpucost.schemas.events import Allocation, Event, TenantBinding
from gpucost.schemas.records import ReclaimRecord
from gpucost.sinks.compact import compact
from gpucost.sinks.views import connect
from gpucost.streams.settings import AuditSettings
from gpucost.streams.tables import Tenant
from tests.fake_kubernetes import FakeContainer, FakePod

BINDING = {
    "kind": "tenant_binding",
    "node_id": "n",
    "pid": 1,
    "ts_ns": 1_736_121_600 * 10**9,
    "team": "search",
    "env": "prod",
    "app": "a",
    "tier": "t",
    "sla": "Gold",
}
_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_./-]{0,127}")


def _allowed(labels: dict[str, str]) -> bool:
    """The documented bounds, written out: at most 16; keys by the pattern; values ≤ 256 characters, no control
    character (Unicode's Cc: U+0000–U+001F, U+007F–U+009F) and no lone surrogate (U+D800–U+DFFF: no UTF-8 has it)."""
    return len(labels) <= 16 and all(
        _KEY.fullmatch(k)
        and len(v) <= 256
        and not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F or 0xD800 <= ord(c) <= 0xDFFF for c in v)
        for k, v in labels.items()
    )


_GOOD_KEY = st.from_regex(r"[a-z][a-z0-9_./-]{0,6}", fullmatch=True)
_GOOD_VALUE = st.text(st.characters(blacklist_categories=("Cc", "Cs")), max_size=8)


@given(
    st.one_of(
        st.dictionaries(_GOOD_KEY, _GOOD_VALUE, max_size=20),  # mostly taken: order, canonical text, the count
        st.dictionaries(
            st.one_of(_GOOD_KEY, st.from_regex(_KEY, fullmatch=True), st.text(max_size=3)),
            st.one_of(
                _GOOD_VALUE,
                st.text(max_size=8),
                st.text(min_size=250, max_size=260),
                st.sampled_from(["\ud800", "ok\udfff", "\udc00\ud800"]),  # lone surrogates (JSON's \u escapes)
            ),
            max_size=4,
        ),
    )
)
def test_labels_are_taken_exactly_when_the_rules_hold_as_one_text_whatever_their_order(
    labels: dict[str, str],
) -> None:
    got = decode_line(json.dumps({**BINDING, "labels": labels}).encode())
    if not _allowed(labels):
        assert got.reason == "invalid" and "label" in got.detail  # type: ignore[union-attr]
        return
    assert isinstance(got, TenantBinding)
    want = json.dumps(dict(sorted(labels.items())), separators=(",", ":"), ensure_ascii=False) if labels else None
    assert got.labels == want
    backwards = decode_line(json.dumps({**BINDING, "labels": dict(reversed(list(labels.items())))}).encode())
    assert isinstance(backwards, TenantBinding) and Tenant.of(backwards) == Tenant.of(got)
    assert json.loads(encode_event(got)).get("labels") == (labels or None)  # the wire has the object back


def test_a_value_of_another_type_is_refused_with_the_label_it_is() -> None:
    for labels in ([], "ns=ml", {"ns": 3}, {"ns": None}):
        got = decode_line(json.dumps({**BINDING, "labels": labels}).encode())
        assert got.reason == "invalid"  # type: ignore[union-attr]
    assert "'ns'" in decode_line(json.dumps({**BINDING, "labels": {"ns": 3}}).encode()).detail  # type: ignore[union-attr]


@given(
    st.tuples(*[st.one_of(st.none(), st.text(alphabet="abc-", max_size=3)) for _ in range(7)]),
    st.dictionaries(st.from_regex(_KEY, fullmatch=True), st.text(alphabet="x:y", max_size=4), max_size=3),
)
def test_a_tenant_without_labels_keeps_the_key_it_had_and_labels_follow_one_more_colon(
    fields: tuple[str | None, ...], labels: dict[str, str]
) -> None:
    before = ":".join("" if v is None else v for v in fields)  # the key as it was before labels existed
    assert Tenant(*fields).key == before
    text = json.dumps(dict(sorted(labels.items())), separators=(",", ":")) if labels else None
    key = Tenant(*fields, text).key
    assert key == (before if text is None else f"{before}:{text}")
    assert key.split(":", 7)[:7] == before.split(":")  # the seven fields still come first, unambiguously


# --- a replayed fleet whose bindings and allocations carry labels -------------------------------------------------


def _labelled(ev: Event) -> Event:
    """The test's labels, by team: a namespace for most, a label named like a tenant field for nlp (which
    FOCUS's Tags give way on), none for ads; the same for a team's bindings and allocations, but for platform's
    holds, which lack the pod (its hold and its use under two keys of one team)."""
    if not isinstance(ev, TenantBinding | Allocation):
        return ev
    if isinstance(ev, Allocation) and ev.team == "platform":
        return type(ev).model_validate({**ev.to_wire(), "labels": {"namespace": "ns-platform"}})
    labels = {
        "ads": None,
        "nlp": {"namespace": "ns-nlp", "team": "not-the-team"},
    }.get(ev.team, {"namespace": f"ns-{ev.team}", "kubernetes.io/pod": f"p-{len(ev.team) % 2}"})
    return type(ev).model_validate({**ev.to_wire(), "labels": labels})


@pytest.fixture(scope="module")
def labelled_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("labels")
    events = [_labelled(e) for e in simulate(FleetSpec(gpus=4, hours=5, seed=11))]
    (base / "events.jsonl").write_text("".join(encode_event(e) + "\n" for e in events))
    run_embedded(read_inputs([base / "events.jsonl"]), AuditSettings(), base / "out")
    return base / "out"


def _rows(out: Path, kind: str) -> list[dict]:
    return pa.concat_tables(pq.read_table(p) for p in sorted((out / kind).glob("**/*.parquet"))).to_pylist()


def _by_label(out: Path) -> dict[tuple[str, str, str], int]:
    """µ$ per (basis, label key, value): every record's labels parsed and summed here."""
    sums: dict[tuple[str, str, str], int] = defaultdict(int)
    for basis, kind in (("usage", "cost"), ("allocation", "allocation")):
        for r in _rows(out, kind):
            for k, v in json.loads(r["labels"] or "{}").items():
                sums[(basis, k, v)] += r["cost_micro_usd"]
    return dict(sums)


def test_records_carry_their_tenant_s_labels_in_its_key_and_the_view_sums_them(labelled_run: Path) -> None:
    want = _by_label(labelled_run)
    assert {k[1] for k in want} == {"namespace", "kubernetes.io/pod", "team"} and any(
        b == "allocation" for b, *_ in want
    )
    for kind in ("cost", "allocation"):
        for r in _rows(labelled_run, kind):
            if r["labels"] is None:
                assert r["tenant_key"].count(":") <= 6 and r["team"] in ("ads", "idle", "unattributed", "unallocated")
            else:
                assert r["tenant_key"].endswith(":" + r["labels"])
    con = connect(labelled_run)
    got = con.execute(
        "SELECT cost_basis, label_key, label_value, sum(cost_micro_usd) FROM cost_by_label GROUP BY ALL"
    ).fetchall()
    assert {(b, k, v): int(m) for b, k, v, m in got} == want


def test_the_report_s_rows_of_each_label_add_up_to_the_bill(labelled_run: Path) -> None:
    bill = sum(r["cost_micro_usd"] for r in _rows(labelled_run, "cost"))
    section = by_label(connect(labelled_run), top=1)  # one value shown per key: the rest folded into one row
    assert section is not None
    heading, columns, rows = section
    per_key: Counter[str] = Counter()
    for row in rows:
        per_key[row[0]] += int(row[columns.index("micro_usd")])
    assert set(per_key.values()) == {bill}
    usage = {(k, v): m for (b, k, v), m in _by_label(labelled_run).items() if b == "usage"}
    for row in rows:
        if row[1] not in ("(other values)", "(without this label)"):
            assert int(row[columns.index("micro_usd")]) == usage[(row[0], row[1])]


def test_prometheus_label_and_node_series_are_the_records_sums(labelled_run: Path) -> None:
    metrics = CostMetrics()
    for kind in ("cost", "allocation"):
        for path in sorted((labelled_run / kind).glob("**/*.parquet")):
            metrics.observe(kind, pq.read_table(path))
    families = {f.name: f for f in metrics.metrics()}

    def series(name: str, labels: tuple[str, ...]) -> dict[tuple[str, ...], float]:
        return {
            tuple(s.labels[n] for n in labels): s.value for s in families[name].samples if s.name.endswith("_total")
        }

    # a revision refunding some labelled records (as late data does): credits, which the net must take off
    cost = pa.concat_tables(pq.read_table(p) for p in sorted((labelled_run / "cost").glob("**/*.parquet")))
    refund = cost.filter(pc.invert(pc.is_null(cost.column("labels")))).slice(0, 40)
    refund = refund.set_column(
        refund.schema.get_field_index("cost_micro_usd"),
        "cost_micro_usd",
        pc.negate(refund.column("cost_micro_usd")),
    )
    metrics.observe("cost", refund)
    families = {f.name: f for f in metrics.metrics()}
    want_labels = defaultdict(int, _by_label(labelled_run))
    for r in refund.to_pylist():
        for k, v in json.loads(r["labels"]).items():
            want_labels[("usage", k, v)] += r["cost_micro_usd"]
    assert any(r["cost_micro_usd"] < 0 for r in refund.to_pylist())

    charged = series("gpucost_label_cost_micro_usd", ("basis", "label", "value"))
    credited = series("gpucost_label_cost_credit_micro_usd", ("basis", "label", "value"))
    net = {k: charged.get(k, 0) - credited.get(k, 0) for k in charged.keys() | credited.keys()}
    assert net == {k: float(v) for k, v in want_labels.items()}
    nodes = series("gpucost_node_cost_micro_usd", ("basis", "node", "gpu_model"))
    nodes_credit = series("gpucost_node_cost_credit_micro_usd", ("basis", "node", "gpu_model"))
    want: dict[tuple[str, ...], int] = defaultdict(int)
    for basis, kind in (("usage", "cost"), ("allocation", "allocation")):
        for r in _rows(labelled_run, kind) + (refund.to_pylist() if kind == "cost" else []):
            want[(basis, r["node_id"], r["gpu_model"])] += r["cost_micro_usd"]
    assert {k: v - nodes_credit.get(k, 0) for k, v in nodes.items()} == {k: float(v) for k, v in want.items()}


def test_focus_tags_hold_the_tenant_s_fields_and_its_labels_a_field_winning_a_clash(
    labelled_run: Path, tmp_path: Path
) -> None:
    month = _rows(labelled_run, "cost")[0]["pane_start_ns"]
    ym = dt.datetime.fromtimestamp(month // 10**9, dt.UTC).strftime("%Y-%m")
    by_id = {r["record_id"]: r for r in _rows(labelled_run, "cost")}
    for version in ("1.2", "1.3"):
        dest = tmp_path / f"focus-{version}.parquet"
        weights = (s.alpha, s.beta, s.gamma) if (s := AuditSettings()) and version == "1.3" else None
        export_focus(labelled_run, ym, dest, fmt="parquet", version=version, weights=weights)
        rows = pq.read_table(dest).to_pylist()
        column = "Tags" if version == "1.2" else "AllocatedTags"
        seen = 0
        for row in rows:
            r = by_id.get(row["x_RecordId"])
            if r is None or row[column] is None:
                continue
            tags = json.loads(row[column])
            fields = {f: r[f] for f in ("team", "env", "app", "tier", "sla", "git_commit", "ci_pipeline_id")}
            labels = json.loads(r["labels"] or "{}")
            assert tags == {**{k: v for k, v in labels.items() if k not in fields}, **fields}
            assert tags["team"] == r["team"]
            seen += bool(labels)
        assert seen, version


# --- sources --------------------------------------------------------------------------------------------------------


def test_a_pod_s_labels_are_its_own_metadata_then_a_label_then_an_annotation_a_bad_value_left_out() -> None:
    pod = FakePod(
        "ml",
        "trainer-0",
        [FakeContainer("main")],
        labels={"pod": "a label named pod", "owner": "from-the-label", "x": "y" * 300},
        annotations={"owner": "from-the-annotation", "cost-center": "cc-17"},
    )
    (got,) = pods_from({"items": [pod.item("node-0")]}, Counter()).values()
    settings = AttributionSettings(label_keys=("namespace", "pod", "controller", "owner", "cost-center", "x", "absent"))
    counts: Counter[str] = Counter()
    assert pod_labels(got, "main", settings, counts) == {
        "namespace": "ml",
        "pod": "trainer-0",
        "controller": "Job/trainer-0",  # the fake's owner: a Job named after the pod (its first 20 characters)
        "owner": "from-the-label",
        "cost-center": "cc-17",
    }
    assert counts == {"label_refused": 1}
    assert pod_labels(got, "main", AttributionSettings(), counts) is None  # no keys named: no labels


def test_a_process_s_labels_are_the_environment_variables_named(tmp_path: Path) -> None:
    proc = tmp_path / "proc" / "42"
    proc.mkdir(parents=True)
    env = {"GPUCOST_TEAM": "search", "SLURM_JOB_PARTITION": "gpu-a100", "SLURM_JOB_QOS": "high"}
    (proc / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items()))
    (proc / "stat").write_text("42 (python3) S " + " ".join(["0"] * 18) + " 1042 0 0\n")
    settings = AttributionSettings(proc=tmp_path / "proc", label_keys=("SLURM_JOB_PARTITION", "UNSET"))
    b = ProcessEnvironment(settings).binding("n", 42, BINDING["ts_ns"], None)  # type: ignore[arg-type]
    assert b is not None and json.loads(b.labels or "{}") == {"SLURM_JOB_PARTITION": "gpu-a100"}
    assert labels_of(settings, {}, counts=Counter()) is None


def test_label_keys_come_from_the_flag_or_its_variable_and_a_key_no_label_can_have_is_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert build_parser().parse_args(["run", "--label-keys", "namespace, pod,namespace"]).label_keys == (
        "namespace",
        "pod",
    )
    monkeypatch.setenv("GPUCOST_LABEL_KEYS", "SLURM_JOB_PARTITION")
    assert build_parser().parse_args(["run"]).label_keys == ("SLURM_JOB_PARTITION",)
    for bad in ("a b", ",".join(f"k{i}" for i in range(17))):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["run", "--label-keys", bad])
        assert "label key" in capsys.readouterr().err


# --- files written before labels existed ------------------------------------------------------------------------


def test_files_written_before_labels_are_read_and_compacted_beside_new_ones(labelled_run: Path, tmp_path: Path) -> None:
    out = Path(shutil.copytree(labelled_run, tmp_path / "out"))
    (folder,) = (out / "cost").glob("date=*")
    (path,) = folder.glob("*.parquet")
    whole = pq.read_table(path)
    pq.write_table(whole.drop_columns(["labels"]), path)  # every file as an earlier version wrote it
    con = connect(out)
    assert con.execute("SELECT count(*), count(labels) FROM cost").fetchone() == (whole.num_rows, 0)
    assert con.execute("SELECT count(*) FROM cost_by_label WHERE cost_basis = 'usage'").fetchone() == (0,)
    table = whole.slice(0, whole.num_rows // 2)
    pq.write_table(table.drop_columns(["labels"]), path)  # its first half as an earlier version wrote it
    pq.write_table(whole.slice(whole.num_rows // 2), folder / "part-00001.parquet")  # then this version's
    total = sum(r["cost_micro_usd"] for r in _rows(labelled_run, "cost"))
    assert connect(out).execute("SELECT sum(cost_micro_usd) FROM cost").fetchone()[0] == total
    before = Counter((r["record_id"], r["cost_micro_usd"]) for r in _rows(labelled_run, "cost"))
    compact(out)
    after = _rows(out, "cost")
    assert Counter((r["record_id"], r["cost_micro_usd"]) for r in after) == before
    dropped = {r["record_id"] for r in table.to_pylist()}
    assert all(r["labels"] is None for r in after if r["record_id"] in dropped)  # what it lacked is null, no more
    assert any(r["labels"] is not None for r in after)


def test_no_label_key_names_a_control_character_category_the_bounds_do_not() -> None:
    """The test's own reading of "control characters" against Unicode's: every Cc code point below U+00A0."""
    assert [c for c in map(chr, range(0x110000)) if unicodedata.category(c) == "Cc"] == [
        chr(i) for i in (*range(0x20), *range(0x7F, 0xA0))
    ]


def test_the_held_against_used_table_nets_a_team_per_pane_and_its_totals_are_the_panes_cost(
    labelled_run: Path,
) -> None:
    """Recomputed from the records: per (GPU, pane, team), held Σ µ$ against used Σ µ$ on the panes with
    allocations; reserved idle the excess held, borrowed the excess used, each summed over panes; totals equal."""
    own = ("idle", "unattributed", "unallocated")
    held: dict[tuple, int] = defaultdict(int)
    used: dict[tuple, int] = defaultdict(int)
    panes = {(r["gpu_uuid"], r["pane_start_ns"]) for r in _rows(labelled_run, "allocation")}
    for r in _rows(labelled_run, "allocation"):
        held[(r["gpu_uuid"], r["pane_start_ns"], r["team"])] += r["cost_micro_usd"]
    for r in _rows(labelled_run, "cost"):
        if (r["gpu_uuid"], r["pane_start_ns"]) in panes:
            used[(r["gpu_uuid"], r["pane_start_ns"], r["team"])] += r["cost_micro_usd"]
    want: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for k in held.keys() | used.keys():
        if k[2] not in own:
            a, u = held.get(k, 0), used.get(k, 0)
            w = want[k[2]]
            w[0], w[1], w[2], w[3] = w[0] + a, w[1] + u, w[2] + max(a - u, 0), w[3] + max(u - a, 0)
    section = allocation_gap(connect(labelled_run))
    assert section is not None
    rows = {row[0]: row[1:] for row in section[2]}
    for team, (a, u, r, b) in want.items():
        assert rows[team] == tuple(f"{m / 1e6:.2f}" for m in (a, u, r, b)), team
    total = sum(v for v in held.values())
    assert rows["total"][:2] == (f"{total / 1e6:.2f}", f"{sum(used.values()) / 1e6:.2f}") and total == sum(
        used.values()
    )


def test_a_reclaim_carries_its_tenant_s_labels_and_the_webhook_action_the_object(labelled_run: Path) -> None:
    rows = _rows(labelled_run, "reclaim")
    assert any(r["labels"] is not None for r in rows)
    for r in rows:
        fields = r["tenant_key"].split(":", 7)
        assert r["labels"] == (fields[7] if len(fields) == 8 else None)  # the key's labels, nothing else
        action = action_of(ReclaimRecord.model_validate(r))
        assert action["labels"] == (None if r["labels"] is None else json.loads(r["labels"]))
    hostile = ReclaimRecord.model_validate({**rows[0], "labels": "not json"})  # a record anyone may write
    assert action_of(hostile)["labels"] == "not json"
