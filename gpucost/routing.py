"""Which topic and key each event goes to, so that every GPU's stream is self-sufficient.

A GPU's panes need the tenant bindings of its node and the prices. The router copies each
binding into the stream of every GPU of its node, and each price into every GPU's stream,
and primes a GPU seen for the first time with everything known so far. Each GPU's key then
carries, in order, everything its results depend on: the worker holding that key computes
what the embedded run computes, however keys are spread over partitions and workers.
"""
from __future__ import annotations

from schemas.events import EbpfTrace, Event, GpuSample, MemAccess, NumaEvent, Price, ProcessSample, TenantBinding

__all__ = ["Route", "Router"]

Route = tuple[str, str, Event]  # (topic suffix, key, event)


class Router:
    def __init__(self) -> None:
        self._prices: list[Price] = []
        self._bindings: dict[str, list[TenantBinding]] = {}
        self._primed: dict[str, set[str]] = {}  # GPU → nodes whose bindings it has been given

    def route(self, ev: Event) -> list[Route]:
        if isinstance(ev, (GpuSample, ProcessSample, NumaEvent, EbpfTrace)):
            gpu, node, out = ev.gpu_uuid, ev.node_id, []
            if gpu not in self._primed:
                self._primed[gpu] = set()
                out += [("events", gpu, p) for p in self._prices]
            if node not in self._primed[gpu]:
                self._primed[gpu].add(node)
                out += [("events", gpu, b) for b in self._bindings.get(node, [])]
            out.append(("events", gpu, ev))
            return out
        if isinstance(ev, MemAccess):
            return [("mem_access", f"{ev.node_id}/{ev.pid}", ev)]
        if isinstance(ev, TenantBinding):
            self._bindings.setdefault(ev.node_id, []).append(ev)
            copies = [("events", g, ev) for g, nodes in self._primed.items() if ev.node_id in nodes]
            return [("bindings", f"{ev.node_id}/{ev.pid}/{ev.ts_ns}", ev), *copies]
        if isinstance(ev, Price):
            self._prices.append(ev)
            return [("prices", f"{ev.gpu_model}/{ev.ts_ns}", ev), *[("events", g, ev) for g in self._primed]]
        raise TypeError(f"not an event: {ev!r}")
