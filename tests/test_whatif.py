"""``gpucost whatif``: the published records billed again under other prices, weights or idle policy, from
the Parquet alone, against a full replay of the raw events under the same settings (exact, per record),
and the ``share`` idle policy against a brute force in exact fractions."""

from __future__ import annotations

import json
from collections import defaultdict
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from gpucost.producers.simulate import GPU_MODELS, FleetSpec, simulate
from gpucost.schemas.codec import encode_event
from gpucost.schemas.events import Price
from gpucost.sinks.views import connect
from gpucost.whatif import Scenario, bills, cost_panes, whatif
from tests.support.cli import gpucost

pytestmark = pytest.mark.slow
SPEC = FleetSpec(gpus=4, hours=8, seed=21, interval_s=15)
#: the scenario's prices: every model repriced, one of them twice, and a default
NEW_PRICES = [
    Price(gpu_model=m, ts_ns=SPEC.start_ns - 3600 * 10**9, usd_per_gpu_hour=Decimal("1.234567") * (k + 1))
    for k, (m, _, _) in enumerate(GPU_MODELS[:3])
] + [
    Price(gpu_model=GPU_MODELS[0][0], ts_ns=SPEC.start_ns + 3 * 3600 * 10**9, usd_per_gpu_hour=Decimal("9.999999")),
    Price(gpu_model="default", ts_ns=SPEC.start_ns - 3600 * 10**9, usd_per_gpu_hour=Decimal("0.5")),
]


@pytest.fixture(scope="module")
def billed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """The fleet replayed as billed, and replayed again from its raw events with the scenario's prices in place
    of its own and weights 0.2 / 0.5 / 0.3."""
    base = tmp_path_factory.mktemp("whatif")
    events = list(simulate(SPEC))
    (base / "events").mkdir()
    (base / "events" / "events.jsonl").write_text("".join(encode_event(e) + "\n" for e in events))
    (base / "repriced").mkdir()
    (base / "repriced" / "events.jsonl").write_text(
        "".join(encode_event(e) + "\n" for e in [*NEW_PRICES, *(e for e in events if e.kind != "price")])
    )
    (base / "prices.jsonl").write_text("".join(encode_event(p) + "\n" for p in NEW_PRICES))
    gpucost("replay", str(base / "events"), "--out", str(base / "out"))
    gpucost(
        "replay",
        str(base / "repriced"),
        "--out",
        str(base / "again"),
        "--alpha",
        "0.2",
        "--beta",
        "0.5",
        "--gamma",
        "0.3",
    )
    return base, base / "out", base / "again"


def cost_by_record(out: Path) -> dict[tuple[str, int, str], int]:
    rows = connect(out).execute("SELECT gpu_uuid, pane_start_ns, tenant_key, cost_micro_usd FROM cost").fetchall()
    return {(g, p, k): c for g, p, k, c in rows}


def test_a_whatif_equals_a_full_replay_under_the_same_settings(billed: tuple[Path, Path, Path]) -> None:
    _, out, again = billed
    scenario = Scenario.of(Decimal("0.2"), Decimal("0.5"), Decimal("0.3"), NEW_PRICES)
    got = {
        (r.gpu_uuid, r.pane_start_ns, r.tenant_key): r.cost_micro_usd
        for pane in cost_panes(out)
        for r in whatif(pane, scenario)
    }
    want = cost_by_record(again)
    assert got == want and len(want) > 1000
    assert got != cost_by_record(out)  # the scenario does change the bill
    # and the per-team table is that replay's, summed
    by_team: dict[str, int] = defaultdict(int)
    for team, cost in connect(again).execute("SELECT team, cost_micro_usd FROM cost").fetchall():
        by_team[team] += cost
    assert {b.team: b.scenario_micro_usd for b in bills(out, scenario)} == by_team


def test_the_settings_billed_give_the_bill_back(billed: tuple[Path, Path, Path]) -> None:
    _, out, _ = billed
    rows = bills(out, Scenario.of(Decimal("0.6"), Decimal("0.3"), Decimal("0.1")))
    assert rows and all(b.difference_micro_usd == 0 for b in rows)


def test_idle_shared_by_weight_against_exact_fractions(billed: tuple[Path, Path, Path]) -> None:
    """Each pane's idle µ$ go to its tenants in proportion to w_i (largest remainder, ties by key); a pane
    without a weighted tenant keeps them; every pane still sums to its cost."""
    _, out, _ = billed
    alpha, beta, gamma = Fraction("0.6"), Fraction("0.3"), Fraction("0.1")
    separate = Scenario.of(Decimal("0.6"), Decimal("0.3"), Decimal("0.1"))
    share = Scenario.of(Decimal("0.6"), Decimal("0.3"), Decimal("0.1"), idle_policy="share")
    kept = moved = 0
    for pane in cost_panes(out):
        base = {r.tenant_key: r.cost_micro_usd for r in whatif(pane, separate)}
        got = {r.tenant_key: r.cost_micro_usd for r in whatif(pane, share)}
        cost = whatif(pane, separate)[0].pane_cost_micro_usd
        assert sum(got.values()) == cost
        tenants = sorted((r for r in pane if r["tenant_key"] != "idle"), key=lambda r: r["tenant_key"])
        totals = [sum(int(r[f]) for r in tenants) for f in ("t_num", "b_num", "l_num")]
        w = [
            alpha * Fraction(int(r["t_num"]), totals[0] or 1)
            + beta * Fraction(int(r["b_num"]), totals[1] or 1)
            + gamma * Fraction(int(r["l_num"]), totals[2] or 1)
            for r in tenants
        ]
        idle = base["idle"]
        if not sum(w):
            assert got == base
            kept += idle > 0
            continue
        exact = [idle * x / sum(w) for x in w]
        floors = [int(x) for x in exact]
        order = sorted(range(len(w)), key=lambda i: (-(exact[i] - floors[i]), tenants[i]["tenant_key"]))
        for i in order[: idle - sum(floors)]:
            floors[i] += 1
        assert got["idle"] == 0
        assert [got[r["tenant_key"]] - base[r["tenant_key"]] for r in tenants] == floors
        moved += idle > 0
    assert kept > 0 and moved > 0  # both kinds of pane occur


def test_the_command(billed: tuple[Path, Path, Path]) -> None:
    base, out, again = billed
    proc = gpucost(
        "whatif",
        "--out",
        str(out),
        "--prices",
        str(base / "prices.jsonl"),
        "--alpha",
        "0.2",
        "--beta",
        "0.5",
        "--gamma",
        "0.3",
        "--format",
        "json",
    )
    rows = {r["team"]: r for r in json.loads(proc.stdout)}
    total = connect(again).execute("SELECT sum(cost_micro_usd) FROM cost").fetchall()[0][0]
    billed_total = connect(out).execute("SELECT sum(cost_micro_usd) FROM cost").fetchall()[0][0]
    assert rows["(total)"]["scenario_micro_usd"] == total and rows["(total)"]["base_micro_usd"] == billed_total
    assert all(r["difference_micro_usd"] == r["scenario_micro_usd"] - r["base_micro_usd"] for r in rows.values())
    table = gpucost("whatif", "--out", str(out), "--idle-policy", "share").stdout
    assert table.splitlines()[0].split() == ["team", "base_micro_usd", "scenario_micro_usd", "difference_micro_usd"]
    assert "idle" in table


def test_bad_inputs_are_usage_errors(billed: tuple[Path, Path, Path], tmp_path: Path) -> None:
    base, out, _ = billed
    sample = next(line for line in (base / "events" / "events.jsonl").read_text().splitlines() if "gpu_sample" in line)
    (tmp_path / "notprices.jsonl").write_text(sample + "\n")
    proc = gpucost("whatif", "--out", str(out), "--prices", str(tmp_path / "notprices.jsonl"), check=False)
    assert proc.returncode == 2 and "not a price" in proc.stderr and "notprices.jsonl:1" in proc.stderr
    proc = gpucost("whatif", "--out", str(tmp_path / "nothing"), check=False)
    assert proc.returncode == 2 and "does not exist" in proc.stderr
    # cost records of a gpucost from before the numerators: said so, not a traceback
    older = tmp_path / "older" / "cost" / "date=2025-01-06"
    older.mkdir(parents=True)
    table = pq.read_table(next((out / "cost").glob("date=*/*.parquet")))
    pq.write_table(table.drop_columns(["t_num", "b_num", "l_num", "busy_num", "covered_ms"]), older / "part-0.parquet")
    proc = gpucost("whatif", "--out", str(tmp_path / "older"), check=False)
    assert proc.returncode == 2 and "lack the numerators" in proc.stderr and "Traceback" not in proc.stderr


def test_a_tie_in_sharing_idle_goes_to_the_smaller_tenant_key() -> None:
    """Two tenants of equal weight and an odd number of idle µ$: the µ$ left over goes to the smaller key."""
    head = {
        "gpu_uuid": "g",
        "node_id": "n",
        "gpu_model": "m",
        "pane_start_ns": 0,
        "pane_end_ns": 60 * 10**9,
        "usd_per_gpu_hour": Decimal("3.6"),
        "busy_num": 2 * 10**8,
        "covered_ms": 60_001,
    }
    tenant = {"env": None, "app": None, "tier": None, "sla": "Gold", "git_commit": None, "ci_pipeline_id": None}
    pane = [
        {
            **head,
            **tenant,
            "tenant_key": "idle",
            "team": "idle",
            "sla": None,
            "cost_micro_usd": 0,
            "t_num": 0,
            "b_num": 0,
            "l_num": 0,
        }
    ]
    for team in ("zeta", "alpha"):
        pane.append(
            {
                **head,
                **tenant,
                "tenant_key": f"{team}::::Gold::",
                "team": team,
                "cost_micro_usd": 0,
                "t_num": 10**8,
                "b_num": 10**8,
                "l_num": 0,
            }
        )
    weights = (Decimal("0.6"), Decimal("0.3"), Decimal("0.1"))
    base = {r.team: r.cost_micro_usd for r in whatif(pane, Scenario.of(*weights))}
    got = {r.team: r.cost_micro_usd for r in whatif(pane, Scenario.of(*weights, idle_policy="share"))}
    assert base["idle"] % 2 == 1 and got["idle"] == 0
    assert got["alpha"] - base["alpha"] == base["idle"] // 2 + 1
    assert got["zeta"] - base["zeta"] == base["idle"] // 2


def test_a_pane_revised_by_a_late_binding_bills_again_as_revised(tmp_path: Path) -> None:
    """A process billed ``unattributed``, then bound late within the horizon: the pane's revision empties
    ``unattributed``. With the settings billed, the scenario is the revised bill, party by party."""
    from gpucost.schemas.events import GpuSample, ProcessSample, TenantBinding  # noqa: PLC0415
    from gpucost.streams.settings import AuditSettings  # noqa: PLC0415

    t0, ns = 1_767_571_200 * 10**9, 10**9
    gpu = [
        GpuSample(
            node_id="n1",
            gpu_uuid="g",
            gpu_model="H100",
            ts_ns=t0 + t * ns,
            interval_s=5.0,
            sm_util_pct=60.0,
            mem_bw_util_pct=5.0,
            mem_used_bytes=0,
            mem_total_bytes=1,
            power_w=300.0,
            temp_c=50.0,
        )
        for t in (*range(0, 60, 5), 200)
    ]
    events = [
        Price(gpu_model="H100", ts_ns=t0, usd_per_gpu_hour=Decimal("3.5")),
        *gpu[:-1],
        ProcessSample(
            node_id="n1",
            gpu_uuid="g",
            pid=7,
            ts_ns=t0 + 10 * ns,
            interval_s=5.0,
            sm_util_pct=40.0,
            mem_bw_util_pct=10.0,
            mem_used_bytes=1,
        ),
        gpu[-1],
        TenantBinding(node_id="n1", pid=7, ts_ns=t0, team="ads", env="prod", app="a", tier="t", sla="Gold"),
    ]
    (tmp_path / "events").mkdir()
    (tmp_path / "events" / "e.jsonl").write_text("".join(encode_event(e) + "\n" for e in events))
    gpucost("replay", str(tmp_path / "events"), "--out", str(tmp_path / "out"))
    revised = (
        connect(tmp_path / "out")
        .execute("SELECT team, sum(cost_micro_usd), max(revision) FROM cost GROUP BY team")
        .fetchall()
    )
    assert {team: (total, latest) for team, total, latest in revised}["unattributed"] == (0, 1)  # the case
    totals: dict[int, dict[str, int]] = defaultdict(dict)
    for start, key, total in (
        connect(tmp_path / "out")
        .execute("SELECT pane_start_ns, tenant_key, sum(cost_micro_usd) FROM cost GROUP BY ALL")
        .fetchall()
    ):
        totals[start][key] = total
    emptied = []
    for pane in cost_panes(tmp_path / "out"):  # each party once, at its revised total and latest integers
        assert len({r["tenant_key"] for r in pane}) == len(pane)
        assert {r["tenant_key"]: r["cost_micro_usd"] for r in pane} == totals[pane[0]["pane_start_ns"]]
        emptied += [r["t_num"] for r in pane if r["tenant_key"].startswith("unattributed")]
    assert emptied == [0]  # its closing record's integers, not its first
    s = AuditSettings()
    for bill in bills(tmp_path / "out", Scenario.of(s.alpha, s.beta, s.gamma)):
        assert bill.difference_micro_usd == 0, bill


def test_settings_a_whatif_cannot_change_are_refused(billed: tuple[Path, Path, Path]) -> None:
    """A what-if bills the published panes again: a pane length or an idle threshold cannot change there, so a
    flag for one is refused, never silently ignored (it once printed the bill unchanged)."""
    _, out, _ = billed
    for flag, value in (("--pane-s", "30"), ("--idle-threshold-pct", "50"), ("--audit-key-file", "k")):
        proc = gpucost("whatif", "--out", str(out), flag, value, check=False)
        assert proc.returncode == 2 and flag in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_a_model_missing_from_the_prices_is_said(billed: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """--prices with one model's price alone bills every other model's panes 0 µ$: said on stderr with their
    number, counted here with SQL over the published cost records."""
    _, out, _ = billed
    model = GPU_MODELS[0][0]
    (tmp_path / "one.jsonl").write_text(
        encode_event(Price(gpu_model=model, ts_ns=SPEC.start_ns - 10**9, usd_per_gpu_hour=Decimal("10"))) + "\n"
    )
    proc = gpucost("whatif", "--out", str(out), "--prices", str(tmp_path / "one.jsonl"))
    (others,) = (
        connect(out)
        .execute(
            "SELECT count(DISTINCT (gpu_uuid, pane_start_ns)) FROM cost WHERE gpu_model <> ? AND NOT unpriced", [model]
        )
        .fetchone()
    )
    assert others > 0 and f"{others:,} GPU-pane(s)" in proc.stderr, proc.stderr
    everything = gpucost("whatif", "--out", str(out), "--prices", str(billed[0] / "prices.jsonl"))
    assert "no price" not in everything.stderr  # a 'default' price covers every model
