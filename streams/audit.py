"""The whole audit as one pure operator: events in, records out, in event time.

Every transport (embedded queue, Kafka agents) drives this same class, so they cannot
disagree. No I/O, no clock: the only inputs are the events and the settings.
"""
from __future__ import annotations

from collections import Counter
from typing import Any

from schemas.codec import Rejected, decode_line, encode_event
from schemas.events import (EbpfTrace, Event, GpuSample, MemAccess, NumaEvent, Price,
                            ProcessSample, TenantBinding)
from schemas.records import CostRecord, DeadLetter, IdleIndexRecord, MaeRecord
from streams.apportion import Weights, apportion
from streams.idle_index import IdleIndex
from streams.mae import Mae
from streams.panes import GpuPanes, PaneTotals
from streams.settings import AuditSettings
from streams.tables import BindingTable, PriceTable

__all__ = ["Auditor", "Output"]

Output = IdleIndexRecord | MaeRecord | CostRecord | DeadLetter


class Auditor:
    """Routes each event to the operator that owns it and collects what closes.

    ``counts`` tallies accepted events by kind and the events that produced no figure:
    ``late`` (dead-lettered) and ``unbilled`` (process samples and NUMA events in a pane
    without any GPU sample, so with no covered time to bill). ``ebpf_trace`` events are
    validated and counted; METRICS.md defines no published figure from them yet.
    """

    def __init__(self, settings: AuditSettings) -> None:
        self.settings = settings
        self.weights = Weights(settings.alpha, settings.beta, settings.gamma)
        self.panes = GpuPanes(settings.pane_ns, settings.lateness_ns, settings.idle_threshold_cp)
        self.idle = IdleIndex(settings.window_ns)
        self.mae = Mae(settings)
        self.bindings = BindingTable()
        self.prices = PriceTable()
        self.counts: Counter[str] = Counter()

    def update(self, event: Event, raw: str | None = None, source: str = "") -> list[Output]:
        """Take one valid event; ``raw``/``source`` only label its dead letter if it is late."""
        if isinstance(event, (GpuSample, ProcessSample, NumaEvent)):
            return self._gpu_keyed(event, raw, source)
        self.counts[event.kind] += 1
        if isinstance(event, MemAccess):
            rec = self.mae.update(event)
            return [rec] if rec is not None else []
        if isinstance(event, TenantBinding):
            self.bindings.update(event)
        elif isinstance(event, Price):
            self.prices.update(event)
        elif not isinstance(event, EbpfTrace):
            raise TypeError(f"not an event: {event!r}")
        return []

    def ingest(self, line: str | bytes, source: str) -> list[Output]:
        """Take one raw line: a dead letter if it is not a valid event, else as ``update``."""
        decoded = decode_line(line)
        raw = line if isinstance(line, str) else line.decode("utf-8", "backslashreplace")
        if isinstance(decoded, Rejected):
            self.counts["rejected"] += 1
            return [DeadLetter(reason=decoded.reason, detail=decoded.detail, kind=decoded.kind,
                               source=source, raw=raw, ts_ns=None, gpu_uuid=None)]
        return self.update(decoded, raw, source)

    def _gpu_keyed(self, event: GpuSample | ProcessSample | NumaEvent, raw: str | None, source: str) -> list[Output]:
        gpu = event.gpu_uuid
        if self.panes.is_late(gpu, event.ts_ns):
            self.counts["late"] += 1
            return [DeadLetter(
                reason="late", kind=event.kind, source=source,
                raw=encode_event(event) if raw is None else raw, ts_ns=event.ts_ns,
                gpu_uuid=gpu, detail=(f"pane of ts_ns {event.ts_ns} closed: GPU {gpu}'s watermark "
                                      f"is {self.panes.watermark(gpu)} ns"))]
        self.counts[event.kind] += 1
        if isinstance(event, GpuSample):
            self.panes.add_gpu_sample(event)
        else:
            tenant = self.bindings.lookup(event.node_id, event.pid, event.ts_ns)
            if isinstance(event, ProcessSample):
                self.panes.add_process_sample(event, tenant)
            else:
                self.panes.add_numa_event(event, tenant)
        return self._close(self.panes.advance(gpu, event.ts_ns))

    def finish(self) -> list[Output]:
        """End of a finite input: close every pane and every MAE window."""
        return self._close(self.panes.close_all()) + list(self.mae.finish())

    def _close(self, panes: list[PaneTotals]) -> list[Output]:
        out: list[Output] = []
        for pane in panes:
            idle = self.idle.on_close(pane)
            if idle is None:
                self.counts["unbilled"] += pane.tenant_events
                continue
            out.append(idle)
            assert pane.gpu_model is not None
            price = self.prices.lookup(pane.gpu_model, pane.pane_start_ns)
            out.extend(apportion(pane, price, self.weights))
        return out

    def to_state(self) -> dict[str, Any]:
        """JSON-serialisable snapshot, for a changelog or a checkpoint."""
        return {"panes": self.panes.to_state(), "idle": self.idle.to_state(),
                "mae": self.mae.to_state(), "bindings": self.bindings.to_state(),
                "prices": self.prices.to_state(), "counts": dict(self.counts)}

    @classmethod
    def from_state(cls, settings: AuditSettings, state: dict[str, Any]) -> "Auditor":
        auditor = cls(settings)
        auditor.panes.restore(state["panes"])
        auditor.idle.restore(state["idle"])
        auditor.mae.restore(state["mae"])
        auditor.bindings = BindingTable.from_state(state["bindings"])
        auditor.prices = PriceTable.from_state(state["prices"])
        auditor.counts = Counter(state["counts"])
        return auditor
