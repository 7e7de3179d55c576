"""The health audit: per GPU, tumbling windows of ``H`` over its closed panes, graded, and a breaker.

docs/definitions.md, "Health audit". The operator sees each closed pane that has GPU samples (the panes
with an idle-index record), in ascending order per GPU, as both paths close them. A window
closes when the pane that ends it closes, or when a pane of a later window does (panes close in
order, and a late event is refused, so nothing more can reach it), or at end of input. A window
none of whose panes had a GPU sample is *skipped*: it publishes nothing, counts as a failed
window for the breaker, and the next record of the GPU says how many were skipped.

Device faults reach it as each pane's sums of its GPU samples' ``fault_fatal`` and ``fault_warning`` (the
producer classified them: ``gpucost.schemas.faults``) and the count of samples that reported them: a fatal
one fails the window (``device_fault``), warnings are counted on the record, and a window none of whose
samples reported faults says None for both. A late sample revises the bill, not a published window.

State per GPU: the open window's few integers and the breaker's state and count, whatever the
window's length: nothing per pane or per sample.

Every comparison is on exact rationals (``Fraction`` of the integer sums and of the decimal
thresholds); a published float is its exact rational rounded once (``float(Fraction)``), so
both paths, and any re-computation, give the same bits, which the snapshot hash needs.
"""

from __future__ import annotations

import re
from collections.abc import Container
from dataclasses import astuple, dataclass
from fractions import Fraction
from functools import lru_cache, reduce
from typing import Any

import numpy as np

from gpucost.schemas.blocks import Emitted
from gpucost.schemas.partitions import device_share
from gpucost.schemas.records import FAIL_REASONS, GRADES, HealthRecord, Output, computed_from
from gpucost.schemas.snapshot import sealed
from gpucost.streams.operator import Closing, ClosingMany
from gpucost.streams.pane_rules import first_model
from gpucost.streams.runs import runs
from gpucost.streams.settings import AuditSettings

__all__ = ["HealthAudit", "peak_tops", "grade_of", "ENTITLEMENT", "Breaker"]

ENTITLEMENT = dict(zip(GRADES, (1.25, 1.0, 0.75, 1.0)))


def peak_tops(table: dict[str, Any], gpu_model: str) -> Fraction:
    """The table's value for the longest key the whole device's model contains, case-insensitively and not followed
    by a letter or digit (ties: the first key in sorted order; ``default`` when none does), × the device's share: a
    partition's peak is its share of its device's (``gpucost.schemas.partitions``). "NVIDIA L40" is no L4 and
    "Trainium3" no Trainium, while "NVIDIA GH200" holds an H200 and "xilinx_u280_gen3x16" a U280."""
    whole, share = device_share(gpu_model)
    return Fraction(_lookup(tuple(sorted(table.items())), whole)) * share


@lru_cache(maxsize=1024)
def _lookup(table: tuple[tuple[str, Any], ...], gpu_model: str) -> Any:
    model = gpu_model.casefold()
    hits = [
        (-len(key), key)
        for key, _ in table
        if key != "default" and re.search(re.escape(key.casefold()) + r"(?![^\W_])", model)
    ]
    return dict(table)[min(hits)[1] if hits else "default"]


def grade_of(kw_per_tops: Fraction | None, sched_deviation: Fraction, settings: AuditSettings) -> str:
    if kw_per_tops is None:
        return "idle"  # no busy time: a spare is not judged on efficiency
    s = settings
    if kw_per_tops < s.excellent_kw_per_tops and sched_deviation < s.excellent_sched_deviation:
        return "excellent"
    if kw_per_tops <= s.good_kw_per_tops and sched_deviation <= s.good_sched_deviation:
        return "good"
    return "needs_optimisation"


@dataclass
class _Window:
    """One GPU's open audit window: sums over its panes so far."""

    start_ns: int
    node_id: str
    gpu_model: str
    covered_ms: int = 0
    idle_ms: int = 0
    energy_uj: int = 0
    busy_cp_ms: int = 0
    deviation_ms: int = 0  # Σ dev(p): placed but idle, or busy with nothing placed
    idle_ms_72h: int = 0  # the idle index's sums at the window's last pane
    covered_ms_72h: int = 0
    fault_samples: int = 0  # GPU samples that reported fault fields, and Σ of their fatal and warning counts
    fault_fatal: int = 0
    fault_warning: int = 0
    power_estimated_ms: int = 0  # the covered ms whose power is the platform table's TDP

    def add(
        self,
        node_id: str,
        gpu_model: str,
        covered_ms: int,
        idle_ms: int,
        energy_uj: int,
        busy_cp_ms: int,
        deviation_ms: int,
        idle_ms_72h: int,
        covered_ms_72h: int,
        fault_samples: int,
        fault_fatal: int,
        fault_warning: int,
        power_estimated_ms: int,
    ) -> None:
        self.node_id, self.gpu_model = min(self.node_id, node_id), first_model(self.gpu_model, gpu_model)
        self.covered_ms += covered_ms
        self.idle_ms += idle_ms
        self.energy_uj += energy_uj
        self.busy_cp_ms += busy_cp_ms
        self.deviation_ms += deviation_ms
        self.idle_ms_72h, self.covered_ms_72h = idle_ms_72h, covered_ms_72h
        self.fault_samples += fault_samples
        self.fault_fatal += fault_fatal
        self.fault_warning += fault_warning
        self.power_estimated_ms += power_estimated_ms


@dataclass
class Breaker:
    """A GPU's dual-threshold breaker: its state, the count of windows towards leaving it (coverage met,
    in ``probation``; passes, in ``removed``), and the last window it was advanced by."""

    state: str
    count: int = 0
    last_window: int | None = None

    def advance(self, passed: bool, covered: bool, admission_windows: int, readmit_passes: int) -> None:
        """One window, in window order (a skipped one: neither ``passed`` nor ``covered``)."""
        if self.state == "probation":  # only coverage counts towards admission
            self.count = self.count + 1 if covered else 0
            if self.count >= admission_windows:
                self.state, self.count = "in_service", 0
        elif self.state == "in_service":
            self.state = "in_service" if passed else "observation"
        elif self.state == "observation":
            self.state, self.count = ("in_service", 0) if passed else ("removed", 0)
        else:  # removed: back after consecutive passes, counted from entering it
            self.count = self.count + 1 if passed else 0
            if self.count >= readmit_passes:
                self.state, self.count = "in_service", 0


class HealthAudit:
    """Row entry ``on_close`` (one closed pane), batch entry ``close_many`` (a block of them), over one state."""

    def __init__(self, settings: AuditSettings, audit_key: bytes | None = None) -> None:
        self.settings = settings
        self.audit_key = audit_key
        self.window_ns = settings.health_window_ns
        self.window_ms = self.window_ns // 1_000_000
        hours = settings.health_window_h
        self.admission_windows = -(-settings.admission_h // hours)  # ⌈admission_h / H⌉ windows
        self._open: dict[str, _Window] = {}
        self._breakers: dict[str, Breaker] = {}

    # --- the row entry ---------------------------------------------------------------------------

    def on_close(self, closing: Closing) -> list[Output]:
        """A closed pane with GPU samples in (each GPU's in ascending order); the records of the windows it
        closes: the GPU's open window if the pane lies past it, then the pane's own if the pane ends it."""
        pane, idle = closing.pane, closing.idle
        assert pane.node_id is not None and pane.gpu_model is not None
        deviation = pane.idle_ms if pane.placed else pane.covered_ms - pane.idle_ms
        return [
            *self._take(
                pane.gpu_uuid,
                pane.pane_start_ns,
                pane.pane_end_ns,
                pane.node_id,
                pane.gpu_model,
                pane.covered_ms,
                pane.idle_ms,
                pane.energy_uj,
                pane.busy_cp_ms,
                deviation,
                idle.idle_ms_72h,
                idle.covered_ms_72h,
                pane.fault_samples,
                pane.fault_fatal,
                pane.fault_warning,
                pane.power_estimated_ms,
            )
        ]

    def _take(self, gpu: str, first_start_ns: int, last_end_ns: int, *sums: Any) -> list[HealthRecord]:
        """Panes of one window of ``gpu``, from ``first_start_ns`` to ``last_end_ns``, summed (``sums`` as
        ``_Window.add`` takes them)."""
        start = first_start_ns - first_start_ns % self.window_ns
        out = []
        window = self._open.get(gpu)
        if window is not None and window.start_ns != start:
            out.append(self._close(gpu))
            window = None
        if window is None:
            window = self._open[gpu] = _Window(start, sums[0], sums[1])
        window.add(*sums)
        if last_end_ns == start + self.window_ns:
            out.append(self._close(gpu))
        return out

    # --- the batch entry -------------------------------------------------------------------------

    def close_many(self, closing: ClosingMany) -> Emitted:
        """``on_close`` of closed panes with GPU samples (each GPU's in ascending order) at once: each
        record with the pane whose close emits it, as ``on_close`` of that pane would."""
        panes = closing.panes
        if not len(panes):
            return Emitted()
        idle_ms_72h = closing.idle.column("idle_ms_72h").to_numpy()
        covered_ms_72h = closing.idle.column("covered_ms_72h").to_numpy()
        gpus, names = panes.gpus  # each pane's GPU, as an index into names
        window = panes.pane_start_ns // self.window_ns
        order = np.lexsort((np.arange(len(panes)), window, gpus))  # by GPU, window, then as they came
        gpu_of, window = gpus[order], window[order]
        firsts, lasts = runs(gpu_of, window)
        deviation = np.where(panes.placed > 0, panes.idle_ms, panes.covered_ms - panes.idle_ms)
        sums = [
            np.add.reduceat(v[order], firsts).tolist()
            for v in (
                panes.covered_ms,
                panes.idle_ms,
                panes.energy_uj,
                panes.busy_cp_ms,
                deviation,
                panes.fault_samples,
                panes.fault_fatal,
                panes.fault_warning,
                panes.power_estimated_ms,
            )
        ]
        node, model = panes.node_id[order], panes.gpu_model[order]
        out: list[tuple[int, Output]] = []
        for r, (lo, hi) in enumerate(zip(firsts.tolist(), lasts.tolist())):
            first, last = int(order[lo]), int(order[hi - 1])
            gpu = names[gpu_of[lo]]
            window_open = self._open.get(gpu)
            if window_open is not None and window_open.start_ns != int(window[lo]) * self.window_ns:
                out.append((first, self._close(gpu)))  # closed by the first pane of a later window
            records = self._take(
                gpu,
                int(panes.pane_start_ns[first]),
                int(panes.pane_end_ns[last]),
                min(node[lo:hi].tolist()),
                reduce(first_model, model[lo:hi].tolist()),
                *(s[r] for s in sums[:5]),
                int(idle_ms_72h[last]),
                int(covered_ms_72h[last]),
                *(s[r] for s in sums[5:]),
            )
            out += [(last, record) for record in records]
        out.sort(key=lambda t: t[0])  # stable: one pane's records keep their order
        return Emitted(tagged=out)

    # --- closing what is left --------------------------------------------------------------------

    def finish(self) -> list[HealthRecord]:
        """End of a finite input: every open window closes, in GPU order."""
        return [self._close(gpu) for gpu in sorted(self._open)]

    def close_silent(
        self, watermark_ns: int, idle_timeout_ns: int, only: Container[str | tuple[str, int]] | None = None
    ) -> list[HealthRecord]:
        """The open windows of GPUs gone silent (of those in ``only``, if given): those that ended
        ``idle_timeout_ns`` or more before ``watermark_ns`` (a later pane of their GPU would have closed them)."""
        return [
            self._close(gpu)
            for gpu in sorted(self._open)
            if self._open[gpu].start_ns + self.window_ns + idle_timeout_ns <= watermark_ns
            and (only is None or gpu in only)
        ]

    def resume_after(self, finished: HealthAudit) -> None:
        """The breakers of ``finished`` (whose windows all closed): a GPU's service history outlives its input."""
        self._breakers = {gpu: Breaker(*astuple(b)) for gpu, b in finished._breakers.items()}

    def _close(self, gpu: str) -> HealthRecord:
        w = self._open.pop(gpu)
        s = self.settings
        k = w.start_ns // self.window_ns
        breaker = self._breakers.get(gpu)
        if breaker is None:
            breaker = self._breakers[gpu] = Breaker("probation" if self.admission_windows else "in_service")
        skipped = 0 if breaker.last_window is None else k - breaker.last_window - 1
        for _ in range(skipped):  # each a failed window, with no coverage
            breaker.advance(False, False, self.admission_windows, s.readmit_passes)
        peak = Fraction(peak_tops(s.peak_tops, w.gpu_model))
        effective_tops = peak * w.busy_cp_ms / (10_000 * w.covered_ms)
        # null, so ungraded ("idle"), with no busy time or no power: a platform that reports none (Neuron, TPU)
        # sends 0 W, which would otherwise grade it excellent and raise its tenants' quota entitlement
        kw_per_tops = Fraction(w.energy_uj, 100 * w.busy_cp_ms) / peak if w.busy_cp_ms and w.energy_uj else None
        deviation = Fraction(w.deviation_ms, w.covered_ms)
        coverage = Fraction(w.covered_ms, self.window_ms)
        grade = grade_of(kw_per_tops, deviation, s)
        covered = coverage >= s.pass_coverage
        checks = (grade == "needs_optimisation", deviation > s.pass_sched_deviation, not covered, w.fault_fatal > 0)
        fails = dict(zip(FAIL_REASONS, checks))
        passed = not any(fails.values())
        breaker.advance(passed, covered, self.admission_windows, s.readmit_passes)
        breaker.last_window = k
        fields = {
            "gpu_uuid": gpu,
            "node_id": w.node_id,
            "gpu_model": w.gpu_model,
            "window_start_ns": w.start_ns,
            "window_end_ns": w.start_ns + self.window_ns,
            "covered_ms": w.covered_ms,
            "idle_ms": w.idle_ms,
            "energy_uj": w.energy_uj,
            "mean_power_w": float(Fraction(w.energy_uj, w.covered_ms * 1000)),
            "effective_tops": float(effective_tops),
            "kw_per_tops": None if kw_per_tops is None else float(kw_per_tops),
            "sched_deviation": float(deviation),
            "idle_index_72h": float(Fraction(w.idle_ms_72h, w.covered_ms_72h)),
            "coverage": float(coverage),
            "grade": grade,
            "entitlement": ENTITLEMENT[grade],
            "passed": passed,
            "fail_reasons": [reason for reason, failed in fails.items() if failed],
            "faults_fatal": w.fault_fatal if w.fault_samples else None,  # None: no sample reported faults
            "faults_warning": w.fault_warning if w.fault_samples else None,
            "power_estimated_ms": w.power_estimated_ms or None,  # None: every sample's power was read
            "windows_skipped": skipped,
            "breaker_state": breaker.state,
        }
        return computed_from(HealthRecord, sealed(fields, self.audit_key))

    # --- state -----------------------------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        return {
            "open": {g: list(astuple(w)) for g, w in self._open.items()},
            "breakers": {g: list(astuple(b)) for g, b in self._breakers.items()},
        }

    @classmethod
    def from_state(cls, state: dict[str, Any], settings: AuditSettings, audit_key: bytes | None = None) -> HealthAudit:
        audit = cls(settings, audit_key)
        audit._open = {g: _Window(*w) for g, w in state["open"].items()}
        audit._breakers = {g: Breaker(*b) for g, b in state["breakers"].items()}
        return audit
