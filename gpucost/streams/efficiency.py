"""Operator-level efficiency per GPU pane and per process: EFU, ΔBW and a roofline diagnosis.

docs/definitions.md, "Efficiency: EFU, ΔBW, diagnosis". Per closed pane with GPU samples: ``flops`` = Σ
``flops_64b`` of the pane's
``blas`` traces; ``efu`` = flops / (peak TOPS · 10^12 · covered_ms / 1000) when there are such traces
(``efu_source = flops``), else the time-weighted mean ``tensor_active_pct`` / 100 of the GPU samples
that carry it (``tensor_active``), else null. ``bw_util`` is the mean ``dram_active_pct`` / 100 where
samples carry it (``dram_active``), else the mean ``mem_bw_util_pct`` / 100 (``mem_bw_util``), and
``delta_bw = 1 − bw_util``. Each process with ``blas`` traces in the pane gets a row of its own (its
FLOPs over the GPU's covered time); pid 0, which no CUDA process has, names the GPU's row.

Every figure is an exact ratio of two integers, rounded once to a float (Python's ``int / int`` is
correctly rounded), and every threshold is compared exactly, by cross-multiplying, so the row entry
(``on_close``) and the batch entry (``close_many``) give the same bits. No state: a pane's figures
are its own.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from gpucost.schemas.arrow import ARROW_SCHEMAS
from gpucost.schemas.blocks import Emitted
from gpucost.schemas.exact import ratios
from gpucost.schemas.records import EfficiencyRecord, Output, computed_from
from gpucost.streams.health import peak_tops
from gpucost.streams.operator import Closing, ClosingMany
from gpucost.streams.settings import AuditSettings

__all__ = ["Efficiency", "GPU_PID"]

GPU_PID = 0  # the pid of a pane's GPU row
FULL_CP = 10_000  # 100 % in hundredths of a percent
#: an exact non-negative ratio as (numerator, denominator), the denominator > 0
Ratio = tuple[int, int]


class Efficiency:
    """Row entry ``on_close`` (one closed pane), batch entry ``close_many`` (a block of them)."""

    def __init__(self, settings: AuditSettings) -> None:
        self.table = settings.peak_tops
        self.compute = settings.compute_bound_efu.as_integer_ratio()
        self.memory = settings.memory_bound_bw.as_integer_ratio()
        self._peaks: dict[str, Ratio] = {}

    def _peak(self, gpu_model: str) -> Ratio:
        peak = self._peaks.get(gpu_model)
        if peak is None:
            peak = self._peaks[gpu_model] = peak_tops(self.table, gpu_model).as_integer_ratio()
        return peak

    def _efu(self, flops: int, peak: Ratio, covered_ms: int) -> Ratio:
        """FLOPs over what the peak does in the covered time: ``peak · 10^12 · covered_ms / 1000``."""
        return flops * peak[1], peak[0] * 1_000_000_000 * covered_ms

    def _diagnosis(self, busy_cp_ms: int, efu: Ratio | None, bw: Ratio) -> str:
        if busy_cp_ms == 0:
            return "idle"
        if efu is not None and _at_least(efu, self.compute):
            return "compute_bound"
        return "memory_bound" if _at_least(bw, self.memory) else "latency_bound"

    # --- the row entry ---------------------------------------------------------------------------

    def on_close(self, closing: Closing) -> list[Output]:
        """A closed pane with GPU samples: its GPU row, then a row per process with ``blas`` traces, by pid."""
        pane = closing.pane
        assert pane.node_id is not None and pane.gpu_model is not None
        peak = self._peak(pane.gpu_model)
        if pane.dram_ms:
            bw, bw_source = (pane.dram_cp_ms, FULL_CP * pane.dram_ms), "dram_active"
        else:
            bw, bw_source = (pane.bw_cp_ms, FULL_CP * pane.covered_ms), "mem_bw_util"
        total = sum(pane.flops.values())
        efu: Ratio | None = None
        efu_source = None
        if pane.flops:
            efu, efu_source = self._efu(total, peak, pane.covered_ms), "flops"
        elif pane.tensor_ms:
            efu, efu_source = (pane.tensor_cp_ms, FULL_CP * pane.tensor_ms), "tensor_active"
        head = (pane.gpu_uuid, pane.node_id, pane.gpu_model, pane.pane_start_ns)
        rows: list[Output] = [
            _record(
                *head,
                GPU_PID,
                total,
                efu,
                efu_source,
                bw,
                bw_source,
                self._diagnosis(pane.busy_cp_ms, efu, bw),
                pane.covered_ms,
                peak,
            )
        ]
        rows += self._processes(head, pane.flops, peak, pane.covered_ms, pane.busy_cp_ms, bw, bw_source)
        return rows

    def _processes(
        self,
        head: tuple[str, str, str, int],
        flops: dict[int, int],
        peak: Ratio,
        covered_ms: int,
        busy_cp_ms: int,
        bw: Ratio,
        bw_source: str,
    ) -> list[EfficiencyRecord]:
        """A row per process with ``blas`` traces (pid 0, the GPU row's, has none of its own), by pid."""
        out = []
        for pid, n in sorted(flops.items()):
            if pid != GPU_PID:
                efu = self._efu(n, peak, covered_ms)
                out.append(
                    _record(
                        *head,
                        pid,
                        n,
                        efu,
                        "flops",
                        bw,
                        bw_source,
                        self._diagnosis(busy_cp_ms, efu, bw),
                        covered_ms,
                        peak,
                    )
                )
        return out

    # --- the batch entry -------------------------------------------------------------------------

    def close_many(self, closing: ClosingMany) -> Emitted:
        """``on_close`` of closed panes with GPU samples at once: the records as a table in the row entry's
        order, with how many each pane has. The GPU rows are columns; panes with traces (few) and their
        processes take the row entry's arithmetic."""
        panes = closing.panes
        n = len(panes)
        covered = panes.covered_ms.astype(object)
        models = panes.gpu_model.tolist()
        peak_of = {m: self._peak(m) for m in set(models)}
        peak = [peak_of[m] for m in models]
        dram = panes.dram_ms > 0
        bw_num = np.where(dram, panes.dram_cp_ms, panes.bw_cp_ms).astype(object)
        bw_den = FULL_CP * np.where(dram, panes.dram_ms, panes.covered_ms).astype(object)
        bw_util, delta_bw = ratios(bw_num, bw_den), ratios(bw_den - bw_num, bw_den)
        bw_source = np.where(dram, "dram_active", "mem_bw_util").astype(object)

        tensor = panes.tensor_ms > 0
        efu = np.where(
            tensor,
            ratios(panes.tensor_cp_ms.astype(object), FULL_CP * np.maximum(panes.tensor_ms, 1).astype(object)),
            np.nan,
        )
        # numpy takes None as an object value here; its stubs accept no None
        efu_source = np.where(tensor, "tensor_active", None).astype(object)  # type: ignore[call-overload]
        compute = tensor & (
            panes.tensor_cp_ms.astype(object) * self.compute[1]
            >= self.compute[0] * FULL_CP * panes.tensor_ms.astype(object)
        ).astype(bool)
        memory = (bw_num * self.memory[1] >= self.memory[0] * bw_den).astype(bool)
        diagnosis = np.where(
            panes.busy_cp_ms == 0,
            "idle",
            np.where(compute, "compute_bound", np.where(memory, "memory_bound", "latency_bound")),
        ).astype(object)
        flops = np.zeros(n, object)
        by_pane: dict[int, dict[int, int]] = {}
        for j, pid, f in zip(panes.f_pane.tolist(), panes.f_pid.tolist(), panes.f_flops.tolist()):
            by_pane.setdefault(j, {})[pid] = f
        processes: list[tuple[int, EfficiencyRecord]] = []
        for j, by_pid in by_pane.items():  # panes with blas traces: EFU from their FLOPs
            flops[j] = total = sum(by_pid.values())
            bw = int(bw_num[j]), int(bw_den[j])
            exact = self._efu(total, peak[j], int(covered[j]))
            efu[j], efu_source[j] = exact[0] / exact[1], "flops"
            diagnosis[j] = self._diagnosis(int(panes.busy_cp_ms[j]), exact, bw)
            head = (panes.gpu_uuid[j], panes.node_id[j], models[j], int(panes.pane_start_ns[j]))
            processes += [
                (j, r)
                for r in self._processes(
                    head, by_pid, peak[j], int(covered[j]), int(panes.busy_cp_ms[j]), bw, str(bw_source[j])
                )
            ]
        gpu = pa.table(
            [
                pa.array(panes.gpu_uuid, pa.string()),
                pa.array(panes.node_id, pa.string()),
                pa.array(models, pa.string()),
                panes.pane_start_ns,
                np.full(n, GPU_PID, np.int64),
                flops.astype(np.float64),
                pa.array(efu, pa.float64(), mask=np.isnan(efu)),
                pa.array(efu_source, pa.string()),
                bw_util,
                delta_bw,
                pa.array(bw_source, pa.string()),
                pa.array(diagnosis, pa.string()),
                panes.covered_ms,
                np.array([p / q for p, q in peak]),
            ],
            schema=ARROW_SCHEMAS["efficiency"],
        )
        counts = np.ones(n, np.int64)
        if not processes:
            return Emitted("efficiency", gpu, counts)
        extra = pa.Table.from_pylist([r.__dict__ for _, r in processes], schema=ARROW_SCHEMAS["efficiency"])
        at = np.array([j for j, _ in processes], np.int64)
        np.add.at(counts, at, 1)
        # each pane's GPU row, then its processes (``_processes`` gives them by pid)
        order = np.argsort(np.concatenate([np.arange(n), at]), kind="stable")
        return Emitted("efficiency", pa.concat_tables([gpu, extra]).take(order), counts)

    def to_state(self) -> dict[str, Any]:
        """Nothing to keep: the peak figures come from the settings."""
        return {}

    @classmethod
    def from_state(cls, state: dict[str, Any], settings: AuditSettings) -> Efficiency:
        return cls(settings)


def _at_least(ratio: Ratio, threshold: Ratio) -> bool:
    return ratio[0] * threshold[1] >= threshold[0] * ratio[1]


def _record(
    gpu_uuid: str,
    node_id: str,
    gpu_model: str,
    pane_start_ns: int,
    pid: int,
    flops: int,
    efu: Ratio | None,
    efu_source: str | None,
    bw: Ratio,
    bw_source: str,
    diagnosis: str,
    covered_ms: int,
    peak: Ratio,
) -> EfficiencyRecord:
    values: dict[str, Any] = {
        "gpu_uuid": gpu_uuid,
        "node_id": node_id,
        "gpu_model": gpu_model,
        "pane_start_ns": pane_start_ns,
        "pid": pid,
        "flops": float(flops),
        "efu": None if efu is None else efu[0] / efu[1],
        "efu_source": efu_source,
        "bw_util": bw[0] / bw[1],
        "delta_bw": (bw[1] - bw[0]) / bw[1],
        "bw_source": bw_source,
        "diagnosis": diagnosis,
        "covered_ms": covered_ms,
        "peak_tops": peak[0] / peak[1],
    }
    return computed_from(EfficiencyRecord, values)
