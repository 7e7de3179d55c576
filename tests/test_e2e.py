"""End to end through the CLI: simulate → replay → Parquet, checked against SQL over the raw input."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gpucost.produce_commands import replay_events
from gpucost.schemas.arrow import EVENT_SCHEMA
from gpucost.sinks.views import connect
from gpucost.streams.settings import AuditSettings
from tests.recompute import REVISED_COST, json_source, recompute_sql
from tests.support.cli import gpucost

pytestmark = pytest.mark.slow
NS = 1_000_000_000


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, duckdb.DuckDBPyConnection]:
    """Three GPUs for 74 h at 20 s sampling, replayed; plus the SQL recomputation from the input."""
    base = tmp_path_factory.mktemp("fleet")
    events, out = base / "events", base / "out"
    gpucost("simulate", "--gpus", "3", "--hours", "74", "--interval-s", "20", "--seed", "11", "--out", str(events))
    gpucost("replay", str(events), "--out", str(out))
    con = connect(out)
    con.execute(recompute_sql(json_source(sorted(events.glob("*.jsonl"))), AuditSettings()))
    return events, out, con


def test_nothing_dead_lettered(fleet) -> None:
    _, _, con = fleet
    assert con.execute("SELECT count(*) FROM dlq").fetchone() == (0,)


def test_idle_index_matches_sql(fleet) -> None:
    _, _, con = fleet
    n_want, n_got = con.execute("SELECT (SELECT count(*) FROM want_idle), (SELECT count(*) FROM idle_index)").fetchone()
    assert n_want == n_got > 3 * 70 * 60
    bad = con.execute("""
        SELECT count(*) FROM want_idle w FULL JOIN idle_index g USING (gpu_uuid, pane_start_ns)
        WHERE g.idle_ms IS DISTINCT FROM w.idle_ms OR g.covered_ms IS DISTINCT FROM w.covered_ms
           OR g.idle_ms_72h IS DISTINCT FROM w.idle_ms_72h OR g.covered_ms_72h IS DISTINCT FROM w.covered_ms_72h
           OR abs(g.idle_index_72h - w.idle_index_72h) > 1e-12 OR g.idle_index_72h IS NULL OR w.idle_index_72h IS NULL
           OR g.node_id <> w.node_id OR g.gpu_model <> w.gpu_model OR g.pane_end_ns <> w.pane_start_ns + 60e9
    """).fetchone()
    assert bad == (0,)
    # the window really filled and slid: some panes sum exactly 72 h of 60 s panes
    (full,) = con.execute("SELECT count(*) FROM idle_index WHERE covered_ms_72h > 71.9 * 3600 * 1000").fetchone()
    assert full > 0


def test_cost_matches_sql_to_the_micro_dollar(fleet) -> None:
    """The bill as revised against the recomputation in event time: the simulated fleet's late bindings revised
    it (their sum of differences is what SQL's as-of join gives at once)."""
    _, _, con = fleet
    con.execute(REVISED_COST)
    n_want, n_got, revised = con.execute(
        "SELECT (SELECT count(*) FROM want_cost), (SELECT count(*) FROM revised_cost), "
        "(SELECT count(*) FROM cost WHERE revision > 0)"
    ).fetchone()
    assert n_want == n_got and revised > 0
    bad = con.execute("""
        SELECT count(*) FROM want_cost w FULL JOIN revised_cost g USING (gpu_uuid, pane_start_ns, tenant_key)
        WHERE g.pane_cost_micro_usd IS DISTINCT FROM w.c OR g.unpriced IS DISTINCT FROM w.unpriced
           OR abs(g.cost_micro_usd - w.exact_cost) >= 1 + 1e-6 OR g.cost_micro_usd IS NULL OR w.c IS NULL
           OR abs(g.t_share - w.t_share) > 1e-12 OR abs(g.b_share - w.b_share) > 1e-12
           OR abs(g.l_share - w.l_share) > 1e-12 OR abs(g.weight - w.weight) > 1e-12
           OR abs(g.busy_fraction - w.busy) > 1e-12
    """).fetchone()
    assert bad == (0,)


def test_every_pane_bills_exactly_its_cost(fleet) -> None:
    _, _, con = fleet
    rows = con.execute("""
        SELECT count(*), count(*) FILTER (WHERE billed <> c), count(*) FILTER (WHERE idles <> 1), sum(c)
        FROM (SELECT gpu_uuid, pane_start_ns, sum(cost_micro_usd) AS billed,
                     arg_max(pane_cost_micro_usd, revision) AS c,
                     count(*) FILTER (WHERE tenant_key = 'idle' AND revision = 0) AS idles
              FROM cost GROUP BY ALL)""").fetchone()
    panes, wrong_sum, wrong_idle, total = rows
    assert panes > 0 and wrong_sum == 0 and wrong_idle == 0 and total > 0
    # the mid-run price change and the 'default' price of the unpriced model both took effect
    assert con.execute("SELECT count(DISTINCT usd_per_gpu_hour) FROM cost").fetchone()[0] >= 2


def test_record_ids_are_unique_and_deterministic(fleet, tmp_path: Path) -> None:
    events, out, con = fleet
    ids = con.execute("SELECT count(*), count(DISTINCT record_id) FROM cost").fetchone()
    assert ids[0] == ids[1]
    again = tmp_path / "again"
    gpucost("replay", str(events), "--out", str(again))
    assert (
        connect(again).execute("SELECT record_id, cost_micro_usd FROM cost ORDER BY 1").fetchall()
        == con.execute("SELECT record_id, cost_micro_usd FROM cost ORDER BY 1").fetchall()
    )


def test_mae_matches_sql(fleet) -> None:
    _, _, con = fleet
    n_want, n_got = con.execute("SELECT (SELECT count(*) FROM want_mae), (SELECT count(*) FROM mae)").fetchone()
    assert n_want == n_got > 0
    bad = con.execute("""
        SELECT count(*) FROM want_mae w FULL JOIN mae g USING (node_id, pid, first_ts_ns)
        WHERE g.n IS DISTINCT FROM w.n OR g.out_of_range IS DISTINCT FROM w.out_of_range
           OR g.last_ts_ns IS DISTINCT FROM w.last_ts_ns OR abs(g.mae_bits - w.mae_bits) > 1e-9
           OR g.mae_bits IS NULL OR w.mae_bits IS NULL""").fetchone()
    assert bad == (0,)
    # different access patterns give clearly different entropies
    lo, hi = con.execute("SELECT min(mae_bits), max(mae_bits) FROM mae WHERE n >= 512").fetchone()
    assert lo < 3 and hi > 7


def test_efficiency_matches_sql(fleet) -> None:
    """EFU, ΔBW and the diagnosis of every GPU pane and every process with BLAS traces, recomputed in SQL from
    the raw events (the traces' packed structs decoded in SQL): the same rows, floats to 1e-12 relative."""
    _, _, con = fleet
    n_want, n_got = con.execute(
        "SELECT (SELECT count(*) FROM want_efficiency), (SELECT count(*) FROM efficiency)"
    ).fetchone()
    assert n_want == n_got > 3 * 70 * 60
    bad = con.execute("""
        SELECT count(*) FROM want_efficiency w FULL JOIN efficiency g USING (gpu_uuid, pane_start_ns, pid)
        WHERE g.flops IS DISTINCT FROM w.flops::DOUBLE OR g.efu_source IS DISTINCT FROM w.efu_source
           OR g.bw_source IS DISTINCT FROM w.bw_source OR g.diagnosis IS DISTINCT FROM w.diagnosis
           OR (g.efu IS NULL) <> (w.efu IS NULL) OR abs(g.efu - w.efu) > 1e-12 * abs(w.efu)
           OR abs(g.bw_util - w.bw_util) > 1e-12 * abs(w.bw_util) OR abs(g.delta_bw - w.delta_bw) > 1e-12
           OR g.bw_util IS NULL OR w.bw_util IS NULL""").fetchone()
    assert bad == (0,)
    # panes with BLAS traces and panes without, and processes with rows of their own (this fleet has no Hopper GPU,
    # so no tensor or DRAM activity: tests/test_audit.py's random fleets cover those against the reference)
    sources = con.execute("SELECT DISTINCT coalesce(efu_source, '-') || '/' || bw_source FROM efficiency").fetchall()
    assert {s for (s,) in sources} == {"flops/mem_bw_util", "-/mem_bw_util"}
    assert con.execute("SELECT count(*) FROM efficiency WHERE pid > 0").fetchone()[0] > 0


def test_parquet_layout_and_schema(fleet) -> None:
    _, out, _ = fleet
    import pyarrow.parquet as pq

    from gpucost.schemas.arrow import ARROW_SCHEMAS

    for kind in ARROW_SCHEMAS.keys() - {"dlq"}:  # every kind a fleet's run writes, kernel lines included
        files = sorted((out / kind).glob("date=*/part-*.parquet"))
        assert files, kind
        for f in files:
            assert pq.read_schema(f).remove_metadata() == ARROW_SCHEMAS[kind]
    assert not list(out.rglob("*.tmp"))
    dates = sorted(p.name for p in (out / "cost").iterdir())
    assert dates == ["date=2025-01-06", "date=2025-01-07", "date=2025-01-08", "date=2025-01-09"]


def test_parquet_events_give_the_records_of_json_lines(fleet, tmp_path: Path) -> None:
    """The same fleet stored as Parquet (one column per wire field), replayed: identical output."""
    _, out, _ = fleet
    gpucost(
        "simulate",
        "--gpus",
        "3",
        "--hours",
        "74",
        "--interval-s",
        "20",
        "--seed",
        "11",
        "--format",
        "parquet",
        "--out",
        str(tmp_path / "events"),
    )
    assert list((tmp_path / "events").glob("*.parquet")) and not list((tmp_path / "events").glob("*.jsonl"))
    gpucost("replay", str(tmp_path / "events"), "--out", str(tmp_path / "out"))
    a, b = connect(out), connect(tmp_path / "out")
    for view, order in [
        ("idle_index", "gpu_uuid, pane_start_ns"),
        ("cost", "record_id"),
        ("mae", "node_id, pid, first_ts_ns"),
    ]:
        rows = a.execute(f"SELECT * FROM {view} ORDER BY {order}").fetchall()
        assert rows and rows == b.execute(f"SELECT * FROM {view} ORDER BY {order}").fetchall(), view


def test_a_bad_parquet_row_is_dead_lettered_as_json(tmp_path: Path) -> None:
    row = {
        "kind": "gpu_sample",
        "node_id": "n",
        "gpu_uuid": "G",
        "gpu_model": "H100",
        "ts_ns": 1_736_121_600 * NS,
        "interval_s": 1.0,
        "sm_util_pct": 140.0,
        "mem_bw_util_pct": 1.0,
        "mem_used_bytes": 1,
        "mem_total_bytes": 2,
        "power_w": 1.0,
        "temp_c": 30.0,
    }
    (tmp_path / "events").mkdir()
    pq.write_table(pa.Table.from_pylist([row], schema=EVENT_SCHEMA), tmp_path / "events" / "bad.parquet")
    gpucost("replay", str(tmp_path / "events"), "--out", str(tmp_path / "out"))
    ((reason, raw, source),) = connect(tmp_path / "out").execute("SELECT reason, raw, source FROM dlq").fetchall()
    assert reason == "out_of_range" and json.loads(raw) == row and source.endswith("bad.parquet#1")
    rejected: list = []  # the producer's path (`produce --source replay`) keeps it the same way
    assert list(replay_events([tmp_path / "events" / "bad.parquet"], rejected)) == []
    assert [(r.reason, json.loads(raw)) for r, _, raw in rejected] == [("out_of_range", row)]
