"""``streams.efficiency`` on its own: EFU, ΔBW and the diagnosis of one closed pane, recomputed from
docs/definitions.md, "Efficiency: EFU, ΔBW, diagnosis", with exact fractions."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

from hypothesis import given
from hypothesis import strategies as st

from gpucost.streams.efficiency import GPU_PID, Efficiency
from gpucost.streams.pane_totals import PaneTotals
from gpucost.streams.settings import AuditSettings
from tests.support.panes import closing

PEAKS = {"default": Decimal("100"), "H100": Decimal("989.5"), "H100 NVL": Decimal("835")}
SETTINGS = AuditSettings(peak_tops=PEAKS, compute_bound_efu=Decimal("0.5"), memory_bound_bw=Decimal("0.25"))
CP = 10_000  # 100 % in hundredths of a percent


def expected(pane: PaneTotals) -> list[dict]:
    """The definition's figures, GPU row first then processes by pid, as exact fractions."""
    model = pane.gpu_model or ""
    hits = [k for k in PEAKS if k != "default" and k.casefold() in model.casefold()]
    peak = Fraction(PEAKS[max(hits, key=len)] if hits else PEAKS["default"])
    capacity = peak * 10**12 * Fraction(pane.covered_ms, 1000)
    if pane.dram_ms:
        bw, bw_source = Fraction(pane.dram_cp_ms, CP * pane.dram_ms), "dram_active"
    else:
        bw, bw_source = Fraction(pane.bw_cp_ms, CP * pane.covered_ms), "mem_bw_util"

    def row(pid: int, flops: int, efu: Fraction | None, efu_source: str | None) -> dict:
        if pane.busy_cp_ms == 0:
            diagnosis = "idle"
        elif efu is not None and efu >= Fraction(1, 2):
            diagnosis = "compute_bound"
        else:
            diagnosis = "memory_bound" if bw >= Fraction(1, 4) else "latency_bound"
        return {
            "pid": pid,
            "flops": flops,
            "efu": efu,
            "efu_source": efu_source,
            "bw_util": bw,
            "delta_bw": 1 - bw,
            "bw_source": bw_source,
            "diagnosis": diagnosis,
            "peak_tops": peak,
        }

    total = sum(pane.flops.values())
    if pane.flops:
        gpu = row(GPU_PID, total, total / capacity, "flops")
    elif pane.tensor_ms:
        gpu = row(GPU_PID, total, Fraction(pane.tensor_cp_ms, CP * pane.tensor_ms), "tensor_active")
    else:
        gpu = row(GPU_PID, total, None, None)
    return [gpu, *(row(pid, n, n / capacity, "flops") for pid, n in sorted(pane.flops.items()) if pid != GPU_PID)]


def as_published(record: object) -> dict:
    return {
        k: getattr(record, k)
        for k in ("pid", "flops", "efu", "efu_source", "bw_util", "delta_bw", "bw_source", "diagnosis", "peak_tops")
    }


def rounded(row: dict) -> dict:
    """Each exact figure rounded once to a float, as the record holds it."""
    return {k: float(v) if isinstance(v, (Fraction, int)) and k != "pid" else v for k, v in row.items()}


@st.composite
def panes(draw: st.DrawFn) -> PaneTotals:
    covered = draw(st.integers(1, 600_000))
    tensor_ms = draw(st.integers(0, covered))
    dram_ms = draw(st.integers(0, covered))
    return PaneTotals(
        gpu_uuid="GPU-0",
        pane_start_ns=0,
        pane_end_ns=600 * 10**9,
        node_id="node-0",
        gpu_model=draw(st.sampled_from(["NVIDIA H100 80GB HBM3", "NVIDIA H100 NVL", "Tesla T4"])),
        covered_ms=covered,
        busy_cp_ms=draw(st.sampled_from([0, 1, CP * covered])),
        bw_cp_ms=draw(st.integers(0, CP * covered)),
        tensor_ms=tensor_ms,
        tensor_cp_ms=draw(st.integers(0, CP * tensor_ms)),
        dram_ms=dram_ms,
        dram_cp_ms=draw(st.integers(0, CP * dram_ms)),
        flops=draw(st.dictionaries(st.integers(0, 5), st.integers(0, 2**70), max_size=3)),
    )


@given(panes())
def test_each_row_is_the_definitions_exact_figures_rounded_once(pane: PaneTotals) -> None:
    got = [as_published(r) for r in Efficiency(SETTINGS).on_close(closing(pane))]
    assert got == [rounded(row) for row in expected(pane)]


def test_the_longest_model_key_gives_the_peak() -> None:
    pane = PaneTotals(
        gpu_uuid="GPU-0",
        pane_start_ns=0,
        pane_end_ns=1,
        node_id="n",
        gpu_model="NVIDIA H100 NVL",
        covered_ms=1000,
        busy_cp_ms=1,
        flops={7: 835 * 10**12 // 2},
    )
    gpu, process = Efficiency(SETTINGS).on_close(closing(pane))
    assert (gpu.peak_tops, gpu.efu, process.pid, process.efu) == (835.0, 0.5, 7, 0.5)
    assert gpu.diagnosis == "compute_bound"  # EFU exactly at the threshold counts


def test_dram_activity_comes_before_memory_bandwidth_and_a_never_busy_gpu_is_idle() -> None:
    pane = PaneTotals(
        gpu_uuid="GPU-0",
        pane_start_ns=0,
        pane_end_ns=1,
        node_id="n",
        gpu_model="T4",
        covered_ms=1000,
        bw_cp_ms=CP * 1000,
        dram_ms=500,
        dram_cp_ms=CP * 100,
    )
    (gpu,) = Efficiency(SETTINGS).on_close(closing(pane))
    assert (gpu.bw_source, gpu.bw_util, gpu.delta_bw, gpu.efu, gpu.diagnosis) == ("dram_active", 0.2, 0.8, None, "idle")
