"""Every part of the platform table is judged against its own peak (docs/definitions.md, "Health audit"): the
health audit's ``effective_tops`` and EFU's ``peak_tops`` of a device named by a row, or by one of its aliases, or
by a longer name holding one (``NVIDIA H100 80GB HBM3``), are that row's dense peak: FP16, else BF16, else INT8.
The expected peak is read here from ``platforms.toml`` itself with tomllib, never through the code under test."""

from __future__ import annotations

import tomllib
from fractions import Fraction
from pathlib import Path

import pytest

from gpucost.schemas.events import GpuSample, Price, ProcessSample
from gpucost.schemas.records import EfficiencyRecord, HealthRecord
from gpucost.streams.audit import Auditor
from gpucost.streams.settings import AuditSettings

TABLE = tomllib.loads((Path(__file__).parents[1] / "gpucost" / "schemas" / "platforms.toml").read_text())
S = 10**9
T0 = 1_780_000_000 * S - (1_780_000_000 * S) % (3600 * S)


def peak(row: dict) -> Fraction | None:
    for precision in ("fp16", "bf16", "int8"):
        if precision in row:
            return Fraction(str(row[precision]))
    return None


NAMES = [(name, name) for name in TABLE] + [
    (name, alias) for name, row in TABLE.items() for alias in row.get("aliases", [])
]


def judged(model: str) -> tuple[list[EfficiencyRecord], list[HealthRecord]]:
    """An hour of one device of ``model``, 40 % busy, through the auditor's default settings."""
    auditor = Auditor(AuditSettings())
    out = auditor.update(Price(gpu_model="default", ts_ns=T0 - S, usd_per_gpu_hour="2"))
    for t in range(T0, T0 + 3600 * S + 1, 60 * S):
        common = {"node_id": "n", "gpu_uuid": "GPU-1", "ts_ns": t, "interval_s": 60.0, "sm_util_pct": 40.0}
        common |= {"mem_bw_util_pct": 10.0, "mem_used_bytes": 1}
        out += auditor.update(GpuSample(**common, gpu_model=model, mem_total_bytes=2, power_w=300.0, temp_c=50))
        out += auditor.update(ProcessSample(**common, pid=7))
    out += auditor.finish()
    return [r for r in out if isinstance(r, EfficiencyRecord)], [r for r in out if isinstance(r, HealthRecord)]


@pytest.mark.parametrize(("row", "model"), NAMES, ids=[m for _, m in NAMES])
def test_a_device_of_each_part_is_judged_against_its_own_peak(row: str, model: str) -> None:
    want = peak(TABLE[row])
    efficiency, health = judged(f"{model} (rev 2)" if model == row else model)  # a longer name holding it, too
    assert efficiency and health
    expected = want if want is not None else Fraction(100)  # a part with no peak: the table's default, no guess
    assert {Fraction(r.peak_tops).limit_denominator(1000) for r in efficiency} == {expected}
    for h in health:
        assert h.effective_tops == pytest.approx(float(expected * Fraction(40, 100)), rel=1e-12)


@pytest.mark.parametrize(
    ("model", "row"),
    [
        ("NVIDIA L40", None),  # a part of its own, not an L4: unknown, so the default
        ("Trainium3", None),  # not a Trainium (Trn1)
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA GH200 480GB", "H200"),  # a name holding a part's name, followed by no letter or digit
        ("xilinx_u280_gen3x16_xdma_base_1", "Alveo U280"),
        ("MI300X 1/8", "MI300X"),  # a partition: its share of its device's peak
    ],
)
def test_a_key_followed_by_a_letter_or_digit_is_another_part(model: str, row: str | None) -> None:
    want = Fraction(100) if row is None else peak(TABLE[row])
    assert want is not None
    share = Fraction(1, 8) if model.endswith(" 1/8") else Fraction(1)
    efficiency, _ = judged(model)
    assert {Fraction(r.peak_tops).limit_denominator(10**6) for r in efficiency} == {want * share}
