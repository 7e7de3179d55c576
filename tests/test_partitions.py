"""A partition pays its share of its whole device (docs/definitions.md, "Partitions"; issue 41).

Each expectation is recomputed here with ``fractions.Fraction`` or DuckDB, not read from the code under test:
the share of ``<model> 1/<n>``, its price (the whole device's), its pane cost (rounded half to even once), the
peak a partition is judged against, and the SQL reading of the share against the Python one.
"""

from __future__ import annotations

import json
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import duckdb
import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gpucost.embedded import run_embedded
from gpucost.producers.accelerators.events import Placement, to_events
from gpucost.producers.accelerators.neuron import parse_scrape
from gpucost.producers.replay import input_files, read_inputs
from gpucost.report import RECLAIMS
from gpucost.schemas.codec import Rejected, decode_line, encode_event
from gpucost.schemas.devices import DeviceSample, Parsed
from gpucost.schemas.events import Event, GpuSample, Price
from gpucost.schemas.partitions import device_share, partition_model, share_sql
from gpucost.schemas.records import HealthRecord
from gpucost.sinks.views import connect
from gpucost.streams.apportion import pane_cost_micro_usd
from gpucost.streams.health import peak_tops
from gpucost.streams.settings import DEFAULT_PEAK_TOPS, AuditSettings
from gpucost.streams.tables import PriceTable
from tests.support.batch_path import closing_at
from tests.support.bills import bills, run

MS_PER_HOUR = 3_600_000
T0 = 1_780_000_000 * 10**9 // (3600 * 10**9) * (3600 * 10**9)  # an hour's start: a pane's


def half_even(q: Fraction) -> int:
    """``q`` rounded to the nearest integer, a half to the even one: brute force over floor and ceiling."""
    lo = q.numerator // q.denominator
    gap = q - lo
    return lo + (gap > Fraction(1, 2) or (gap == Fraction(1, 2) and lo % 2 == 1))


@settings(max_examples=300, deadline=None)
@given(
    micro_usd=st.integers(0, 10**15 - 1),
    covered_ms=st.integers(0, 3_600_000),
    n=st.integers(1, 64),
)
def test_n_partitions_pay_their_device_once(micro_usd: int, covered_ms: int, n: int) -> None:
    """Each of n partitions pays price × covered / n, rounded once; together what the whole device pays, give or
    take the rounding of each (at most n halves of a µ$), never n times it."""
    price = Decimal(micro_usd) / 10**6
    whole = pane_cost_micro_usd(price, covered_ms, "MI300X")
    part = pane_cost_micro_usd(price, covered_ms, partition_model("MI300X", n))
    assert whole == half_even(Fraction(micro_usd * covered_ms, MS_PER_HOUR))
    assert part == half_even(Fraction(micro_usd * covered_ms, MS_PER_HOUR * n))
    assert abs(n * part - Fraction(micro_usd * covered_ms, MS_PER_HOUR)) <= Fraction(n, 2)


def test_a_partition_takes_its_whole_devices_price_and_default() -> None:
    table = PriceTable()
    for model, usd, ts in (("MI300X", "8", T0 + 10), ("MI300X", "16", T0 + 20), ("default", "1", T0)):
        table.take(Price(gpu_model=model, ts_ns=ts, usd_per_gpu_hour=usd))
    models = np.array(["MI300X 1/8", "MI300X 1/8", "MI300X", "Trn1 1/2", "MI300X 9/8"], object)
    got = table.lookup_many(models, T0 + np.array([15, 25, 25, 25, 25], np.int64)).tolist()
    # 9/8 is no share: the text is a model of its own, unpriced, so the default's
    assert got == [Decimal(8), Decimal(16), Decimal(16), Decimal(1), Decimal(1)]


def test_a_price_for_a_partition_is_dead_lettered_saying_to_price_the_device() -> None:
    line = json.dumps({"kind": "price", "gpu_model": "MI300X 1/8", "ts_ns": T0, "usd_per_gpu_hour": "1"})
    got = decode_line(line)
    assert isinstance(got, Rejected) and "price the whole device, 'MI300X'" in got.detail, got
    ok = decode_line(line.replace("1/8", "MIG 1g.10gb"))  # a partition with a model of its own is priced as that
    assert isinstance(ok, Price)
    whole = decode_line(line.replace("1/8", "1/1"))  # a pane of "MI300X 1/1" is priced as "MI300X": so is its price
    assert isinstance(whole, Rejected) and "price the whole device, 'MI300X'" in whole.detail, whole


def test_a_partition_is_judged_against_its_share_of_the_peak() -> None:
    for model, peak in DEFAULT_PEAK_TOPS.items():
        if model != "default":
            for n in (2, 3, 8):
                assert peak_tops(DEFAULT_PEAK_TOPS, f"{model} 1/{n}") == Fraction(peak) / n, model
    assert peak_tops(DEFAULT_PEAK_TOPS, "MI300X 3/2") == Fraction(DEFAULT_PEAK_TOPS["MI300X"])  # no share: whole


_TEXT = st.text(st.sampled_from("ab X/ 0123456789\n'"), max_size=14)


@settings(max_examples=400, deadline=None)
@example("MI300X 1/2\n")  # Python's $ matches before a last newline, RE2's does not: fullmatch here
@example("MI300X 1/2\r")
@example("X 1/2 1/4")
@given(
    st.one_of(
        _TEXT,
        st.builds(lambda m, a, b: f"{m} {a}/{b}", _TEXT, st.integers(0, 20_000), st.integers(0, 20_000)),
    )
)
def test_sql_reads_the_share_as_python_does(model: str) -> None:
    """The SQL that counts GPU-hours and Python's pricing agree on every text, shares or not."""
    num, den = share_sql("m")
    with duckdb.connect() as con:  # its own: a result left unfetched on the default one blocks the next test's
        (got,) = con.execute(f"SELECT {num}, {den} FROM (SELECT ? AS m)", [model]).fetchall()
    assert got is not None and Fraction(*got) == device_share(model)[1], model


def test_partition_model_names_the_share_and_refuses_more_than_a_device_has() -> None:
    assert partition_model("MI300X", 1) == "MI300X"
    assert device_share(partition_model("TPU v4", 2)) == ("TPU v4", Fraction(1, 2))
    for bad in (0, 1025):
        try:
            partition_model("MI300X", bad)
        except ValueError as exc:
            assert "partitions of one device" in str(exc)
        else:
            raise AssertionError(bad)


def test_more_partitions_than_a_device_has_are_refused_with_a_reason() -> None:
    """A capture claiming 1,025 partitions of one device: each is counted with its reason, none billed, no crash;
    1,024 are each billed their share."""
    for n, billed in ((1024, 1024), (1025, 0)):
        parts = [DeviceSample("V", None, f"g.p{i:04}", parent_id="g", busy_pct=Decimal(1)) for i in range(n)]
        out = Parsed()
        events = to_events([DeviceSample("V", "MI300X", "g"), *parts], Placement("n", Decimal(1), 10**18), out)
        gpus = [e for e in events if e["kind"] == "gpu_sample"]
        assert len(gpus) == billed and all(e["gpu_model"] == f"MI300X 1/{n}" for e in gpus)
        assert sum(out.dead_letters.values()) == n - billed, out.dead_letters


def test_a_partition_with_a_model_of_its_own_is_that_model_billed_whole() -> None:
    """MIG instances, named ``<model> MIG <profile>`` under a GPU the scrape has no row of, are devices of that
    model; partitions with no model of their own, or their device's, are its shares."""
    place = Placement("n", Decimal(1), 10**18, model="MI300X")
    for parent, model, want in (
        (None, "H100 MIG 1g.10gb", "H100 MIG 1g.10gb"),
        (DeviceSample("V", "H100", "g"), "H100 MIG 1g.10gb", "H100 MIG 1g.10gb"),
        (DeviceSample("V", "MI300X", "g"), "MI300X", "MI300X 1/3"),
        (DeviceSample("V", "MI300X", "g"), None, "MI300X 1/3"),
        (None, None, "MI300X 1/3"),  # the model --model gives, the device's
        (None, "MI300X", "MI300X 1/3"),  # a part of the table, with no row of its device
        (DeviceSample("V", "AMD Instinct MI300X", "g"), "MI300X", "MI300X 1/3"),  # an alias of the device's part
    ):
        parts = [DeviceSample("V", model, f"g.{i}", parent_id="g", busy_pct=Decimal(1)) for i in range(3)]
        events = to_events([*([parent] if parent else []), *parts], place, Parsed())
        assert {e["gpu_model"] for e in events if e["kind"] == "gpu_sample"} == {want}, (parent, model)


def test_the_reclaim_summary_puts_a_partitions_share_at_stake() -> None:
    """Two partitions of 1/8 of a $16/h device idle for an hour each, and one whole $16/h device for an hour: at
    stake 2 × 2 + 16 $/h over 2/8 + 1 GPU-hours, not 48 $/h over 3 (the summary's SQL over a reclaim table)."""
    con = duckdb.connect()
    con.execute(
        "CREATE TABLE reclaim (sla VARCHAR, gpu_uuid VARCHAR, gpu_model VARCHAR, run_start_ns BIGINT, "
        "trigger_ns BIGINT, usd_per_gpu_hour DECIMAL(18, 6))"
    )
    hour = 3600 * 10**9
    con.executemany(
        "INSERT INTO reclaim VALUES ('Gold', ?, ?, ?, ?, 16)",
        [("n/g.0", "MI300X 1/8", 0, hour), ("n/g.1", "MI300X 1/8", 0, hour), ("n/h", "MI300X", hour, 2 * hour)],
    )
    rows = con.execute(RECLAIMS).fetchall()
    gold = [r for r in rows if r[0] == "Gold"]
    assert [(r[2], r[3], r[4], r[5]) for r in gold] == [(3, "1.25", 20_000_000, "20.00")]


def test_a_neuron_device_is_billed_as_all_its_cores_whether_a_runtime_uses_them_or_not(shared_data: Path) -> None:
    """The inf1.xlarge scrape with only core 0's runtime lines kept: its four cores are still four quarters of the
    device (cores 1-3 at 0 %), so a runtime starting or stopping never changes what a core's share is."""
    text = (shared_data / "accelerators" / "aws-neuron" / "aws_neuron_metrics.txt").read_text(encoding="utf-8")
    only_core_0 = "\n".join(line for line in text.splitlines() if "neuroncore=" not in line or 'neuroncore="0"' in line)
    for scrape in (text, only_core_0):
        events = to_events(parse_scrape(scrape).samples, Placement("inf-a", Decimal(10), T0), Parsed())
        gpus = {e["gpu_uuid"]: (e["gpu_model"], e["sm_util_pct"]) for e in events if e["kind"] == "gpu_sample"}
        assert sorted(gpus) == [f"inf-a/nd0.nc{c}" for c in range(4)]
        assert {m for m, _ in gpus.values()} == {"Inferentia 1/4"}
    assert [gpus[f"inf-a/nd0.nc{c}"][1] for c in (1, 2, 3)] == [0.0, 0.0, 0.0]


def _pane_events(late_whole: bool) -> list[Event]:
    """Eight partitions of 1/8 of a $3.6/h MI300X, each sampled every 10 s for a minute, busy; partition 0's last
    sample, at 50 s, names the whole device instead (a mode switch, a forged sample), arriving in time or, with
    ``late_whole``, after the pane has closed (within the revision horizon)."""
    events: list[Event] = [Price(gpu_model="MI300X", ts_ns=T0 - 10**9, usd_per_gpu_hour="3.6")]
    odd: list[Event] = []
    for t in range(0, 250, 10):  # the 2 min of allowed lateness past the first minute close it
        for i in range(8):
            model = "MI300X" if (i, t) == (0, 50) else "MI300X 1/8"
            common = {"node_id": "n", "gpu_uuid": f"n/g.{i}", "ts_ns": T0 + t * 10**9, "interval_s": 10.0}
            sample = GpuSample(
                **common, gpu_model=model, sm_util_pct=50.0, mem_bw_util_pct=0.0, mem_used_bytes=0,
                mem_total_bytes=1, power_w=100.0, temp_c=40.0,
            )  # fmt: skip
            (odd if late_whole and (i, t) == (0, 50) else events).append(sample)
    return events + odd


def test_a_pane_whose_samples_name_two_shares_bills_the_smaller_on_both_paths_and_in_revisions(
    tmp_path: Path,
) -> None:
    """By text, ``MI300X`` comes before ``MI300X 1/8``: partition 0's first pane was once billed as a whole MI300X,
    8 × its share (and a late sample naming it revised the pane by as much). Each pane keeps the smaller share."""
    share = half_even(Fraction(3_600_000 * 60_000, 8 * MS_PER_HOUR))  # µ$ of a 1/8 for 60 s at $3.6/h
    for late in (False, True):
        events = _pane_events(late)
        records = run(AuditSettings(), events)
        row = bills(records)
        # the health window judges the partition against its share of the peak, too
        assert {r.gpu_model for r in records if isinstance(r, HealthRecord) and r.gpu_uuid == "n/g.0"} == {"MI300X 1/8"}
        first = {gpu: sum(c for (g, start, _), c in row.items() if g == gpu and start == T0) for gpu, *_ in row}
        assert set(first.values()) == {share}, (late, first)
        files = tmp_path / f"in-{late}"
        files.mkdir()
        (files / "e.jsonl").write_text("".join(encode_event(e) + "\n" for e in events))
        with closing_at(1):
            run_embedded(read_inputs(input_files([files])), AuditSettings(), tmp_path / f"out-{late}")
        batch = connect(tmp_path / f"out-{late}").execute(
            "SELECT gpu_uuid, sum(cost_micro_usd) FROM cost WHERE pane_start_ns = ? GROUP BY ALL", [T0]
        )
        assert {c for _, c in batch.fetchall()} == {share}


def test_a_health_window_whose_panes_name_two_shares_keeps_the_smaller() -> None:
    """A GPU whose first minute names the whole device and the rest a partition of it (a mode switch): its audit
    window keeps one model, by the panes' rule, whatever the order the panes close in."""
    events: list[Event] = []
    for t in range(0, 250, 10):
        common = {"node_id": "n", "gpu_uuid": "n/g.0", "ts_ns": T0 + t * 10**9, "interval_s": 10.0}
        events.append(
            GpuSample(
                **common,
                gpu_model="MI300X" if t < 60 else "MI300X 1/8",
                sm_util_pct=50.0,
                mem_bw_util_pct=0.0,
                mem_used_bytes=0,
                mem_total_bytes=1,
                power_w=100.0,
                temp_c=40.0,
            )  # fmt: skip
        )
    health = [r for r in run(AuditSettings(), events) if isinstance(r, HealthRecord)]
    assert health and {r.gpu_model for r in health} == {"MI300X 1/8"}
