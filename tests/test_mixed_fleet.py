"""A mixed fleet bills (issue 41): NVIDIA, AMD, AWS Neuron and Google TPU devices through one pipeline.

The NVIDIA part is the simulator's stream; the others are captures of ../shared/data/accelerators/
converted by ``gpucost devices FILE --events OUT`` and replayed together with it. Expected values are
recomputed independently: which devices are billed from the parser's neutral samples (``gpucost devices``
without ``--events``), the covered and busy sums and the pane costs with DuckDB SQL over the converted
events and the prices written here, the partitions' power and memory from the parent's reading or the
platform table read with ``tomllib``.
"""

from __future__ import annotations

import json
import tomllib
from collections import Counter, defaultdict
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path
from typing import Any

import duckdb
import pytest

from gpucost.embedded import run_embedded
from gpucost.focus import export_focus
from gpucost.producers.accelerators.events import Placement, to_events
from gpucost.producers.replay import input_files, read_inputs
from gpucost.producers.simulate import FleetSpec, simulate
from gpucost.producers.synthetic import unclaimed_pid
from gpucost.schemas.codec import decode_line, encode_event
from gpucost.schemas.devices import DeviceSample, Parsed
from gpucost.schemas.events import Event
from gpucost.sinks.views import connect
from gpucost.streams.settings import AuditSettings
from tests.conftest import ROOT, SHARED_DATA
from tests.support.batch_path import closing_at
from tests.support.bills import bills, run
from tests.support.cli import gpucost
from tests.support.deployment import (
    Deployment,
    assert_same_parquet,
    deployment,  # noqa: F401 (a fixture)
    run_to_completion,
)

ACC = SHARED_DATA / "accelerators"
AT, STEP = "2025-01-06T00:10:00Z", "10"  # the simulated fleet starts 2025-01-06T00:00:00Z
PRICES = {"MI300X": "3.600000", "Inferentia": "0.760000", "TPU v6e": "2.700000"}
#: the whole devices' model per node (the --model given, or the capture's)
NODE_MODEL = {"mi-a": "MI300X", "mi-b": "MI300X", "inf-a": "Inferentia", "tpu-a": "TPU v6e"}
#: (file under ACC, node, extra flags): AMD compute partitions without power, an AMD GPU with power and a
#: process, a Neuron device of four cores with per-process busy, four TPU v6e chips of a streaming capture
CAPTURES = (
    ("amd-instinct/amd-smi_metric-usage_xcp.txt", "mi-a", ("--at", AT, "--model", "MI300X")),
    ("amd-instinct/amd-smi_monitor-q_with-process.txt", "mi-b", ("--at", AT, "--model", "MI300X")),
    ("aws-neuron/aws_neuron_metrics.txt", "inf-a", ("--at", AT)),
    ("google-tpu/tpu-info_v6e_streaming_readme-0.14.2.txt", "tpu-a", ()),
)
BINDINGS = (("mi-b", 1564865, "train"), ("inf-a", 31961, "serve"), ("inf-a", 32786, "serve"))


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if not ACC.is_dir():
        pytest.skip(f"the shared outside data is not at {SHARED_DATA}")
    base = tmp_path_factory.mktemp("mixed")
    events = base / "events"
    events.mkdir()
    t0 = 1_736_121_600 * 10**9 - 86_400 * 10**9
    given = [{"kind": "price", "gpu_model": m, "ts_ns": t0, "usd_per_gpu_hour": p} for m, p in PRICES.items()]
    given += [
        {"kind": "tenant_binding", "node_id": n, "pid": pid, "ts_ns": t0, "team": team}
        | {"env": "prod", "app": team, "tier": "online", "sla": "Gold"}
        for n, pid, team in BINDINGS
    ]
    (events / "0-given.jsonl").write_text("".join(json.dumps(e) + "\n" for e in given))
    sim = FleetSpec(gpus=2, hours=0.5, interval_s=10.0, seed=5, gpus_per_node=2)
    (events / "1-nvidia.jsonl").write_text("".join(encode_event(e) + "\n" for e in simulate(sim)))
    samples: dict[str, list[dict[str, Any]]] = {}
    for i, (name, node, flags) in enumerate(CAPTURES, 2):
        parsed = gpucost("devices", str(ACC / name))
        samples[node] = [json.loads(line) for line in parsed.stdout.splitlines()]
        out = events / f"{i}-{node}.jsonl"
        gpucost("devices", str(ACC / name), "--events", str(out), "--node", node, "--interval-s", STEP, *flags)
    gpucost("replay", str(events), "--out", str(base / "out"))
    converted = [e for i in range(2, 2 + len(CAPTURES)) for e in _lines(next(events.glob(f"{i}-*.jsonl")))]
    return {"events": events, "out": base / "out", "samples": samples, "converted": converted}


def _costs(out: Path) -> list[tuple[Any, ...]]:
    return (
        connect(out)
        .execute(
            "SELECT gpu_uuid, pane_start_ns, tenant_key, cost_micro_usd, pane_cost_micro_usd, covered_ms, busy_num "
            "FROM cost WHERE revision = 0"
        )
        .fetchall()
    )


def test_every_device_or_partition_is_billed_and_no_parent(fleet: dict[str, Any]) -> None:
    """Billed: the neutral samples that are no other sample's parent; the NVIDIA GPUs of the stream."""
    want = set()
    for node, rows in fleet["samples"].items():
        parents = {r["parent_id"] for r in rows if r["parent_id"]}
        assert parents or node in ("mi-b", "tpu-a")
        want |= {f"{node}/{r['device_id']}" for r in rows if r["device_id"] not in parents}
    nvidia = {e["gpu_uuid"] for e in _lines(fleet["events"] / "1-nvidia.jsonl") if e["kind"] == "gpu_sample"}
    billed = {row[0] for row in _costs(fleet["out"])}
    assert billed == want | nvidia
    assert len(want) == 16 + 1 + 4 + 4  # 2 × 8 XCP, one GPU, 4 NeuronCores, 4 chips
    assert not {"mi-a/gpu0", "mi-a/gpu1", "inf-a/nd0"} & billed
    dlq = connect(fleet["out"]).execute("SELECT count(*) FROM dlq").fetchone()
    assert dlq == (0,)


def test_parties_add_up_to_the_pane_cost_recomputed_from_sql(fleet: dict[str, Any]) -> None:
    panes: dict[tuple[str, int], list[int]] = defaultdict(list)
    pane_cost: dict[tuple[str, int], int] = {}
    for gpu, start, _, cost, pane, *_ in _costs(fleet["out"]):
        panes[(gpu, start)].append(cost)
        assert pane_cost.setdefault((gpu, start), pane) == pane
    assert all(sum(v) == pane_cost[k] for k, v in panes.items())
    rows = _sql(fleet["converted"], "SELECT gpu_uuid, pane, gpu_model, covered, parts, partition_of FROM gpu")
    devices: dict[tuple[str, int], list[tuple[int, Decimal]]] = defaultdict(list)
    for gpu, start, model, covered, parts, parent in rows:
        whole = NODE_MODEL[gpu.split("/")[0]]
        assert model == (whole if parts == 1 else f"{whole} 1/{parts}"), (gpu, model)
        # each of n partitions pays 1/n of its device's price: rounded once, half to even
        exact = Decimal(PRICES[whole]) * 10**6 * covered / 3_600_000 / parts
        assert pane_cost[(gpu, start)] == int(exact.quantize(Decimal(1), rounding=ROUND_HALF_EVEN)), (gpu, start)
        devices[(parent or gpu, start)].append((pane_cost[(gpu, start)], exact * parts))
    for (device, _), costs in devices.items():  # a device costs its price once, never once per partition
        assert abs(sum(c for c, _ in costs) - costs[0][1]) <= Decimal(len(costs)) / 2, device
    assert sum(len(c) > 1 for c in devices.values()) >= 3 and any(c > 0 for c in pane_cost.values())


def _sql(events: list[dict[str, Any]], query: str) -> list[tuple[Any, ...]]:
    """``query`` over views ``gpu`` (covered ms per GPU pane) and ``proc`` (busy per GPU pane) of the
    converted events, written to DuckDB as they stand in the files."""
    con = duckdb.connect()
    con.execute(
        "CREATE TABLE e (kind VARCHAR, gpu_uuid VARCHAR, ts_ns BIGINT, interval_s DOUBLE, sm_util_pct DOUBLE, "
        "gpu_model VARCHAR, partition_of VARCHAR)"
    )
    con.executemany(
        "INSERT INTO e VALUES (?, ?, ?, ?, ?, ?, ?)",
        [
            (e["kind"], e["gpu_uuid"], e["ts_ns"], e["interval_s"], e["sm_util_pct"])
            + (e.get("gpu_model"), e.get("partition_of"))
            for e in events
        ],
    )
    con.execute(  # parts: how many partitions of its device the capture shows beside it (1: a whole device)
        "CREATE VIEW gpu AS SELECT gpu_uuid, ts_ns // 60000000000 * 60000000000 AS pane, any_value(gpu_model) "
        "AS gpu_model, sum(CAST(round(interval_s * 1000) AS BIGINT)) AS covered, any_value(parts) AS parts, "
        "any_value(partition_of) AS partition_of FROM (SELECT *, CASE WHEN partition_of IS NULL THEN 1 ELSE "
        "count(*) OVER (PARTITION BY partition_of, ts_ns) END AS parts FROM e WHERE kind = 'gpu_sample') GROUP BY ALL"
    )
    con.execute(
        "CREATE VIEW proc AS SELECT gpu_uuid, ts_ns // 60000000000 * 60000000000 AS pane, "
        "sum(CAST(round(sm_util_pct * 100) AS BIGINT) * CAST(round(interval_s * 1000) AS BIGINT)) AS busy "
        "FROM e WHERE kind = 'process_sample' GROUP BY ALL"
    )
    return con.execute(query).fetchall()


def test_covered_and_busy_per_device_equal_sql_over_the_converted_events(fleet: dict[str, Any]) -> None:
    want = {
        (g, p): (c, b)
        for g, p, c, b in _sql(
            fleet["converted"],
            "SELECT gpu.gpu_uuid, gpu.pane, covered, coalesce(busy, 0) FROM gpu LEFT JOIN proc USING (gpu_uuid, pane)",
        )
    }
    got = {(g, p): (c, int(b)) for g, p, _, _, _, c, b in _costs(fleet["out"]) if (g, p) in want}
    assert got == want
    assert len(want) == 25 and any(b > 0 for _, b in want.values())


def test_partitions_share_the_parents_power_and_memory_exactly(fleet: dict[str, Any]) -> None:
    tdp = tomllib.loads((ROOT / "gpucost" / "schemas" / "platforms.toml").read_text())["MI300X"]["tdp_w"]
    sums: dict[str, Counter[str]] = defaultdict(Counter)
    for e in fleet["converted"]:
        if e["kind"] == "gpu_sample" and "partition_of" in e:
            sums[e["partition_of"]].update(
                mw=round(Decimal(repr(e["power_w"])) * 1000), total=e["mem_total_bytes"], used=e["mem_used_bytes"]
            )
            assert (e.get("power_estimated") is True) is e["partition_of"].startswith("mi-a/")
    assert sums["mi-a/gpu0"]["mw"] == sums["mi-a/gpu1"]["mw"] == tdp * 1000
    (nd0,) = [r for r in fleet["samples"]["inf-a"] if r["device_id"] == "nd0"]
    assert (sums["inf-a/nd0"]["total"], sums["inf-a/nd0"]["used"]) == (nd0["mem_total_bytes"], nd0["mem_used_bytes"])
    assert sums["inf-a/nd0"]["mw"] == 0


def test_a_parents_odd_power_and_memory_split_by_largest_remainder() -> None:
    """Brute force over small odd figures: partition shares add up to the parent's and differ by at most one
    unit, the first partitions by id taking the odd units; the parent itself gets no event."""
    for n in range(1, 6):
        for mw in range(0, 3 * n + 2):
            parent = DeviceSample("V", "MI300X", "g", power_w=Decimal(mw) / 1000, mem_total_bytes=7 * n + mw)
            parts = [DeviceSample("V", "MI300X", f"g.p{i}", parent_id="g", busy_pct=Decimal(1)) for i in range(n)]
            out = to_events([parent, *parts[::-1]], Placement("n", Decimal(1), 1_736_121_600 * 10**9), Parsed())
            out = sorted((e for e in out if e["kind"] == "gpu_sample"), key=lambda e: str(e["gpu_uuid"]))
            power = [round(Decimal(repr(e["power_w"])) * 1000) for e in out]
            total = [e["mem_total_bytes"] for e in out]
            assert [e["gpu_uuid"] for e in out] == [f"n/g.p{i}" for i in range(n)]
            for values, whole in ((power, mw), (total, 7 * n + mw)):
                assert sum(values) == whole and values == sorted(values, reverse=True)
                assert values[0] - values[-1] <= 1


def test_what_the_platform_does_not_report_is_labelled(fleet: dict[str, Any]) -> None:
    gpus = {e["gpu_uuid"]: e for e in fleet["converted"] if e["kind"] == "gpu_sample"}
    for gpu, e in gpus.items():
        labelled = set(e.get("estimated", [])) | set(e.get("not_reported", []))
        assert e["power_w"] > 0 or "power_w" in labelled, gpu
        assert "power_w" not in e.get("estimated", [])  # a TDP is the event's power_estimated, not a label
        assert "mem_bw_util_pct" in labelled
    assert "power_w" not in gpus["mi-b/gpu0"].get("not_reported", []) and gpus["mi-b/gpu0"]["power_w"] == 199
    assert all("power_w" in gpus[f"tpu-a/tpu{c}"]["not_reported"] for c in (8, 9, 12, 13))
    (proc,) = [e for e in fleet["converted"] if e["kind"] == "process_sample" and e["gpu_uuid"] == "mi-b/gpu0"]
    assert proc["sm_util_pct"] == 99 and proc["estimated"] == ["sm_util_pct"]  # the GPU's 99 %, its one process


def test_row_path_equals_batch_path(fleet: dict[str, Any], tmp_path: Path) -> None:
    files = input_files([fleet["events"]])
    events = [e for raw, _ in read_inputs(files) if isinstance(e := decode_line(raw), Event)]
    row = bills(run(AuditSettings(), events))
    with closing_at(1):
        run_embedded(read_inputs(files), AuditSettings(), tmp_path / "out")
    batch: dict[tuple[str, int, str], int] = defaultdict(int)
    for gpu, start, tenant, cost, *_ in (
        connect(tmp_path / "out")
        .execute("SELECT gpu_uuid, pane_start_ns, tenant_key, cost_micro_usd FROM cost")
        .fetchall()
    ):
        batch[(gpu, start, tenant)] += cost
    assert row == dict(batch) and any(k[0].startswith("inf-a/") for k in row)


def test_a_capture_that_cannot_be_billed_says_why(tmp_path: Path) -> None:
    name = str(ACC / "aws-neuron/aws_neuron_metrics.txt")
    if not ACC.is_dir():
        pytest.skip(f"the shared outside data is not at {SHARED_DATA}")
    out = tmp_path / "e.jsonl"
    no_time = gpucost("devices", name, "--events", str(out), "--node", "n", check=False)
    assert no_time.returncode == 2 and not out.exists() and not list(tmp_path.iterdir())  # nothing left behind
    out.write_text("earlier events\n")  # a failed run leaves the file it would have replaced
    assert gpucost("devices", name, "--events", str(out), "--node", "n", check=False).returncode == 2
    assert out.read_text() == "earlier events\n"
    assert "5 × no sample time in the capture: give --at ISO-TIME" in no_time.stderr
    no_step = gpucost("devices", name, "--events", str(out), "--node", "n", "--at", AT, check=False)
    assert no_step.returncode == 2 and "4 × one time per device and no sampling step" in no_step.stderr
    for flags, says in (
        ((), "--events needs --node NODE"),
        (("--node", "n", "--at", "noon"), "is not an ISO-8601 time"),
        (("--node", "n", "--at", "2025-01-06T00:10:00"), "has no zone"),
        (("--node", "n", "--interval-s", "0"), "--interval-s '0'"),
    ):
        bad = gpucost("devices", name, "--events", str(out), *flags, check=False)
        assert bad.returncode == 2 and bad.stderr.splitlines() == [bad.stderr.splitlines()[0]], bad.stderr
        assert bad.stderr.startswith("gpucost: error: ") and says in bad.stderr


@pytest.mark.slow
@pytest.mark.kafka
@pytest.mark.parametrize("encoding", ["arrow", "json"])
def test_kafka_path_gives_the_embedded_records(
    fleet: dict[str, Any],
    deployment: Deployment,  # noqa: F811
    encoding: str,
) -> None:
    """The same events produced to the broker (``produce --source replay``) in either input encoding, billed by a
    worker and written by a sink: every view equals the embedded run's, row for row."""
    deployment.gpucost("produce", "--source", "replay", str(fleet["events"]), "--event-encoding", encoding)
    deployment.worker("worker")
    deployment.sink()
    run_to_completion(deployment, fleet["out"])
    assert_same_parquet(deployment.out, fleet["out"])


def test_a_device_that_reports_no_power_is_not_graded_on_it(fleet: dict[str, Any]) -> None:
    """0 W from a platform that reports no power (Neuron, TPU) once graded the device excellent (kW per TOPS 0),
    raising its tenants' quota entitlement: its windows are not judged on efficiency (kW per TOPS null)."""
    unpowered = {
        e["gpu_uuid"]
        for e in fleet["converted"]
        if e["kind"] == "gpu_sample" and "power_w" in e.get("not_reported", [])
    }
    graded = connect(fleet["out"]).execute("SELECT gpu_uuid, kw_per_tops, grade, energy_uj FROM health").fetchall()
    mine = [(gpu, kw, grade) for gpu, kw, grade, energy in graded if gpu in unpowered and energy == 0]
    assert mine, "the Neuron and TPU devices have health windows"
    assert all(kw is None and grade != "excellent" for _, kw, grade in mine), mine
    assert any(kw is not None for gpu, kw, _, _ in graded if gpu not in unpowered)  # the others still are


def test_busy_time_no_process_claims_is_unattributed_never_idle(fleet: dict[str, Any]) -> None:
    """Per device and time, the process sample of the device's own synthetic pid carries what the device's busy
    leaves after its processes' (all of it where the tool names none), in 0.01 %; in the bill that time is
    ``unattributed``'s, not ``idle``'s. Worked out from the converted events' own numbers."""
    seen: dict[tuple[str, int], tuple[int, dict[int, int]]] = {}
    for e in fleet["converted"]:
        busy, procs = seen.setdefault((e["gpu_uuid"], e["ts_ns"]), (0, {}))
        cp = round(Decimal(repr(e["sm_util_pct"])) * 100)
        if e["kind"] == "gpu_sample":
            seen[(e["gpu_uuid"], e["ts_ns"])] = (cp, procs)
        else:
            procs[e["pid"]] = cp
    left = 0
    for (gpu, _), (busy, procs) in seen.items():
        nobody = procs.pop(unclaimed_pid(gpu), 0)
        assert nobody == max(0, busy - sum(procs.values())), gpu
        left += nobody
    assert left > 0  # TPU chips and partitions whose tools name no process were busy
    con = connect(fleet["out"])
    (unattributed,) = con.execute(
        "SELECT sum(cost_micro_usd) FROM cost WHERE team = 'unattributed' AND gpu_uuid NOT LIKE 'GPU-%'"
    ).fetchone()
    assert unattributed > 0


def test_a_partitions_gpu_hours_are_its_share_in_unit_cost_and_focus(fleet: dict[str, Any], tmp_path: Path) -> None:
    """GPU-hours counted in SQL take each partition's share: ``unit_cost`` per model equals the converted events'
    covered hours over the partitions shown beside each; in FOCUS, ListUnitPrice (the device's price) ×
    PricingQuantity is each priced row's cost, partitions included."""
    rows = _sql(fleet["converted"], "SELECT gpu_model, covered, parts FROM gpu")
    want: dict[str, Decimal] = defaultdict(Decimal)
    for model, covered, parts in rows:
        want[model] += Decimal(covered) / 3_600_000 / parts
    got = dict(connect(fleet["out"]).execute("SELECT gpu_model, sum(gpu_hours) FROM unit_cost GROUP BY ALL").fetchall())
    assert {m: round(Decimal(got[m]), 9) for m in want} == {m: round(h, 9) for m, h in want.items()}
    assert any(" 1/" in m for m in want)
    export_focus(fleet["out"], "2025-01", tmp_path / "f.parquet", fmt="parquet")
    focus = (
        duckdb.connect()
        .execute(
            f"SELECT SkuId, ListUnitPrice, PricingQuantity, BilledCost FROM '{tmp_path / 'f.parquet'}' "
            "WHERE ListUnitPrice IS NOT NULL"
        )
        .fetchall()
    )
    parts = [r for r in focus if " 1/" in r[0]]
    assert parts and len(parts) < len(focus)
    for sku, price, quantity, cost in focus:
        assert abs(Decimal(price) * Decimal(quantity) - Decimal(cost)) < Decimal("0.000001"), (sku, price, quantity)
