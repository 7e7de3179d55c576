"""Validation, the JSON codec and the 40-byte eBPF struct."""

from __future__ import annotations

import json
from decimal import ROUND_HALF_EVEN, Decimal
from fractions import Fraction

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpucost.schemas.arrow import ARROW_SCHEMAS, WIDE_TYPE, wide_array
from gpucost.schemas.codec import Rejected, decode_line, encode_event
from gpucost.schemas.ebpf import decode_trace_event
from gpucost.schemas.events import EVENT_MODELS, TENANT_FIELDS, GpuSample, TenantBinding
from gpucost.schemas.exact import round_scaled
from gpucost.schemas.records import CostRecord, MaeRecord, computed
from gpucost.streams.tables import Tenant
from tests.strategies import streams

GOOD = {
    "kind": "gpu_sample",
    "node_id": "n1",
    "gpu_uuid": "GPU-1",
    "gpu_model": "NVIDIA H100",
    "ts_ns": 1_767_571_200_000_000_000,
    "interval_s": 1.0,
    "sm_util_pct": 50.0,
    "mem_bw_util_pct": 10.0,
    "mem_used_bytes": 10,
    "mem_total_bytes": 100,
    "power_w": 300.0,
    "temp_c": 50.0,
}


def decode(obj: dict) -> object:
    return decode_line(json.dumps(obj))


@given(st.decimals(min_value=0, max_value=10**6, places=6, allow_nan=False), st.sampled_from([100, 1000]))
def test_round_scaled_is_half_even_on_the_decimal_text(value: Decimal, scale: int) -> None:
    exact = Fraction(value) * scale
    floor = exact.numerator // exact.denominator
    rem = exact - floor
    want = floor + (1 if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and floor % 2) else 0)
    assert round_scaled(float(str(value)), scale) == want  # through a float, as JSON delivers it
    assert round_scaled(str(value), scale) == want


def test_float_error_does_not_move_a_rounding() -> None:
    # 0.0005 s and 10.0015 s are below and above their halves in binary; their text is exactly half
    assert (round_scaled(0.0005, 1000), round_scaled(0.0015, 1000), round_scaled(10.0015, 1000)) == (0, 2, 10002)


def test_a_good_event_decodes() -> None:
    ev = decode(GOOD)
    assert isinstance(ev, GpuSample) and ev.interval_ms == 1000 and ev.sm_util_cp == 5000


@pytest.mark.parametrize(
    "field",
    [
        "node_id",
        "gpu_uuid",
        "gpu_model",
        "ts_ns",
        "interval_s",
        "sm_util_pct",
        "mem_bw_util_pct",
        "mem_used_bytes",
        "mem_total_bytes",
        "power_w",
        "temp_c",
    ],
)
def test_each_missing_key_is_named(field: str) -> None:
    bad = {k: v for k, v in GOOD.items() if k != field}
    got = decode(bad)
    assert (
        isinstance(got, Rejected) and got.reason == "missing_field" and field in got.detail and "required" in got.detail
    )


@pytest.mark.parametrize(
    "field,value,words,reason",
    [
        ("sm_util_pct", 100.01, "less than or equal to 100", "out_of_range"),
        ("mem_bw_util_pct", -0.5, "greater than or equal to 0", "negative"),
        ("mem_used_bytes", -1, "greater than or equal to 0", "negative"),
        ("temp_c", -61, "greater than or equal to -60", "out_of_range"),  # below its floor, which is itself negative
        ("interval_s", 0, "greater than 0", "out_of_range"),
        ("interval_s", 0.0004, "rounds to 0 ms", "invalid"),
        ("ts_ns", 1_000_000_000, "greater than or equal to", "timestamp_out_of_range"),  # 1970: a broken clock
        ("ts_ns", 5_000_000_000_000_000_000, "less than", "timestamp_out_of_range"),  # year 2128
        ("ts_ns", 1.7e18, "valid integer", "wrong_type"),  # a float cannot carry nanoseconds
        ("sm_util_pct", "50", "valid number", "wrong_type"),
        ("mem_used_bytes", 1000, "exceeds mem_total_bytes", "invalid"),
        ("power_w", float("inf"), "finite", "non_finite"),
    ],
)
def test_impossible_values_are_rejected_with_a_reason(field: str, value: object, words: str, reason: str) -> None:
    got = decode_line(json.dumps({**GOOD, field: value}))
    assert isinstance(got, Rejected) and got.reason == reason, got
    assert field in got.detail or words == "exceeds mem_total_bytes"
    assert words in got.detail, got.detail


@given(st.floats(allow_nan=True, allow_infinity=True).filter(lambda x: not 0 <= x <= 100))
def test_any_percentage_outside_0_100_is_rejected(x: float) -> None:
    got = decode_line(json.dumps({**GOOD, "sm_util_pct": x}))
    assert isinstance(got, Rejected) and "sm_util_pct" in got.detail


@pytest.mark.parametrize(
    "line,reason",
    [
        ("{not json", "malformed_json"),
        (b"\xff\xfe{}", "malformed_json"),
        ("[1, 2]", "not_an_object"),
        ('{"kind": "gpu_smaple"}', "unknown_kind"),
        ('{"no_kind": 1}', "unknown_kind"),
        ('{"kind": 7}', "unknown_kind"),
    ],
)
def test_lines_that_are_not_events(line: str | bytes, reason: str) -> None:
    got = decode_line(line)
    assert isinstance(got, Rejected) and got.reason == reason


@pytest.mark.parametrize(
    "binding,words",
    [
        ({"team": "a:b"}, "must not contain ':'"),
        ({"team": "idle"}, "reserved"),
        ({"sla": "Platinum"}, "sla"),
    ],
)
def test_bindings_that_would_corrupt_tenant_keys(binding: dict, words: str) -> None:
    base = {
        "kind": "tenant_binding",
        "node_id": "n",
        "pid": 1,
        "ts_ns": GOOD["ts_ns"],
        "team": "t",
        "env": "e",
        "app": "a",
        "tier": "x",
        "sla": "Gold",
    }
    got = decode({**base, **binding})
    assert isinstance(got, Rejected) and words in got.detail


def test_price_with_more_than_six_places_is_rejected() -> None:
    got = decode({"kind": "price", "gpu_model": "H100", "ts_ns": GOOD["ts_ns"], "usd_per_gpu_hour": 2.1234567})
    assert isinstance(got, Rejected) and "6 decimal places" in got.detail


@pytest.mark.slow
@given(streams(max_span_s=600))
def test_every_event_survives_the_json_round_trip(events: list) -> None:
    for ev in events:
        back = decode_line(encode_event(ev))
        assert back == ev and type(back) is type(ev)


def test_trace_event_decodes_hand_built_bytes() -> None:
    uuid_bytes = bytes(range(16))
    blob = (
        (4242).to_bytes(4, "little")
        + uuid_bytes
        + (1_767_571_200_123_456_789).to_bytes(8, "little")
        + (87).to_bytes(4, "little")
        + (2**63 + 5).to_bytes(8, "little")
    )
    ev = decode_trace_event(blob)
    assert ev == (4242, "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f", 1_767_571_200_123_456_789, 87, 2**63 + 5)
    line = json.dumps({"kind": "ebpf_trace", "node_id": "n", "trace_hex": blob.hex()})
    got = decode_line(line)
    assert not isinstance(got, Rejected) and json.loads(encode_event(got))["trace_hex"] == blob.hex()


@pytest.mark.parametrize("hexstr,words", [("00" * 39, "40 bytes, got 39"), ("zz" * 40, "not hex")])
def test_bad_trace_events_are_rejected(hexstr: str, words: str) -> None:
    got = decode({"kind": "ebpf_trace", "node_id": "n", "trace_hex": hexstr})
    assert isinstance(got, Rejected) and words in got.detail


def test_trace_with_impossible_utilisation_is_rejected() -> None:
    blob = bytes(4) + bytes(16) + (1_767_571_200 * 10**9).to_bytes(8, "little") + (250).to_bytes(4, "little") + bytes(8)
    got = decode({"kind": "ebpf_trace", "node_id": "n", "trace_hex": blob.hex()})
    assert isinstance(got, Rejected) and "sm_util_pct" in got.detail


def test_every_kind_has_a_model() -> None:
    assert set(EVENT_MODELS) == {
        "gpu_sample",
        "process_sample",
        "mem_access",
        "numa_event",
        "ebpf_trace",
        "tenant_binding",
        "price",
        "allocation",
        "kernel_activity",
    }


@given(st.floats(min_value=0, max_value=1e17, allow_nan=False), st.sampled_from([100, 1000]))
def test_round_scaled_digit_path_equals_the_decimal_path(value: float, scale: int) -> None:
    want = int((Decimal(repr(value)) * scale).to_integral_value(rounding=ROUND_HALF_EVEN))
    assert round_scaled(value, scale) == want


@given(
    st.builds(
        lambda g, t, c, u: dict(
            record_id="0" * 32,
            gpu_uuid=g,
            node_id="n",
            gpu_model="H100",
            pane_start_ns=t,
            pane_end_ns=t + 60,
            tenant_key="k",
            team="k",
            env=None,
            app="a",
            tier=None,
            sla="Gold",
            git_commit=None,
            ci_pipeline_id="7",
            labels=None if c % 3 else '{"namespace":"ml"}',
            t_share=u,
            b_share=0.0,
            l_share=1.0,
            weight=u,
            busy_fraction=u,
            usd_per_gpu_hour=None if c % 2 else Decimal(c) / 100,
            pane_cost_micro_usd=c,
            cost_micro_usd=c // 2,
            unpriced=bool(c % 2),
            revision=0,
            t_num=c * 10**20,
            b_num=c,
            l_num=0,
            busy_num=c * 10**20 + 1,
            covered_ms=60_000,
        ),
        st.text(min_size=1),
        st.integers(0, 2**62),
        st.integers(0, 10**12),
        st.floats(0, 1),
    )
)
def test_computed_records_equal_validated_ones(values: dict[str, object]) -> None:
    built, validated = computed(CostRecord, **values), CostRecord(**values)
    assert built == validated
    assert built.model_dump_json() == validated.model_dump_json()
    assert built.model_fields_set == validated.model_fields_set


def test_computed_records_need_every_field() -> None:
    with pytest.raises(TypeError, match="revision"):
        computed(
            MaeRecord,
            node_id="n",
            pid=1,
            first_ts_ns=0,
            last_ts_ns=0,
            n=0,
            out_of_range=0,
            mae_bits=0.0,
            l2_evictions_per_1k_est=0.0,
            revision=0,
        )


def test_computed_records_need_the_models_field_order() -> None:
    """pydantic writes a record's JSON in its dict's order: another order would change the bytes sent."""
    values = dict(
        node_id="n",
        pid=1,
        first_ts_ns=0,
        last_ts_ns=0,
        n=0,
        out_of_range=0,
        mae_bits=0.0,
        l2_evictions_per_1k_est=0.0,
        revision=0,
    )
    values = {k: values.get(k, "x") for k in MaeRecord.model_fields}
    assert computed(MaeRecord, **values).model_dump_json() == MaeRecord(**values).model_dump_json()
    with pytest.raises(TypeError, match="in order"):
        computed(MaeRecord, **dict(reversed(values.items())))


def test_the_tenant_fields_are_the_bindings_and_cost_records_repeat_them_in_order() -> None:
    """Declared once, on the binding: the tenant, each cost record and its Arrow schema follow it."""
    assert TENANT_FIELDS[0] == "team" and set(TENANT_FIELDS) < set(TenantBinding.model_fields)
    assert Tenant._fields == TENANT_FIELDS
    for names in (list(CostRecord.model_fields), ARROW_SCHEMAS["cost"].names):
        at = names.index("tenant_key") + 1
        assert tuple(names[at : at + len(TENANT_FIELDS)]) == TENANT_FIELDS


@given(st.lists(st.one_of(st.integers(0, 2**63 - 1), st.integers(0, 10**38 - 1)), max_size=30), st.booleans())
def test_a_wide_column_holds_each_integer_exactly_whichever_way_it_is_built(values: list[int], as_int64: bool) -> None:
    """Through int64 where every value fits, one by one past 64 bits: the same decimals as Python's integers."""
    array = np.array(values, object)
    if as_int64 and all(v < 2**63 for v in values):
        array = array.astype(np.int64)
    column = wide_array(array)
    assert column.type == WIDE_TYPE and [int(d) for d in column.to_pylist()] == values
    assert column.equals(pa.array(values, WIDE_TYPE))
