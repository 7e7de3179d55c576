"""Which topic and key each event goes to, so that every GPU's stream is self-sufficient.

A GPU's panes need the tenant bindings of its node and the prices. The router copies each
binding into the stream of every GPU of its node, and each price into every GPU's stream,
and primes a GPU seen for the first time with everything known so far. Each GPU's key then
carries, in order, everything its results depend on: the worker holding that key computes
what the embedded run computes, however keys are spread over partitions and workers.

A binding or price re-sent for an instant the router already has goes to the dead-letter
topic once, as the embedded auditor would dead-letter it, rather than once per GPU copy.
"""

from __future__ import annotations

from gpucost.schemas.codec import encode_event
from gpucost.schemas.events import ON_GPU_KEY, Event, MemAccess, Price, TenantBinding
from gpucost.schemas.records import DeadLetter

__all__ = ["Route", "Router", "duplicate_letter"]

Route = tuple[str, str, Event]  # (topic suffix, key, event)


class Router:
    def __init__(self) -> None:
        self._prices: list[Price] = []
        self._price_keys: set[tuple[str, int]] = set()
        self._bindings: dict[str, list[TenantBinding]] = {}
        #: (node, pid) → the instants of its bindings, repeats included (an instant taken twice is dead-lettered),
        #: and the latest binding
        self._binding_times: dict[tuple[str, int], set[int]] = {}
        self._latest: dict[tuple[str, int], TenantBinding] = {}
        self._primed: dict[str, set[str]] = {}  # GPU → nodes whose bindings it has been given
        #: bindings that repeat, later, their process's latest tenant (``binding_unchanged`` to the workers'
        #: ``BindingTable``); routed once each, since a binding arriving later may fall before them
        self.unchanged_bindings = 0

    def route(self, ev: Event) -> list[Route]:
        if isinstance(ev, ON_GPU_KEY):
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
            process = (ev.node_id, ev.pid)
            times = self._binding_times.setdefault(process, set())
            if ev.ts_ns in times:
                return [("dlq", f"{ev.node_id}/{ev.pid}/{ev.ts_ns}", ev)]
            latest = self._latest.get(process)
            if latest is not None and latest.ts_ns < ev.ts_ns and _tenant(latest) == _tenant(ev):
                # a repeat: it changes no lookup now, but a binding that arrives later and falls before it ends
                # at it (``BindingTable``), so it travels like any binding
                self.unchanged_bindings += 1
            times.add(ev.ts_ns)
            if latest is None or latest.ts_ns < ev.ts_ns:
                self._latest[process] = ev
            self._bindings.setdefault(ev.node_id, []).append(ev)
            copies = [("events", g, ev) for g, nodes in self._primed.items() if ev.node_id in nodes]
            return [("bindings", f"{ev.node_id}/{ev.pid}/{ev.ts_ns}", ev), *copies]
        if isinstance(ev, Price):
            if (ev.gpu_model, ev.ts_ns) in self._price_keys:
                return [("dlq", f"{ev.gpu_model}/{ev.ts_ns}", ev)]
            self._price_keys.add((ev.gpu_model, ev.ts_ns))
            self._prices.append(ev)
            return [("prices", f"{ev.gpu_model}/{ev.ts_ns}", ev), *[("events", g, ev) for g in self._primed]]
        raise TypeError(f"not an event: {ev!r}")


def _tenant(b: TenantBinding) -> tuple[str | None, ...]:
    return b.team, b.env, b.app, b.tier, b.sla, b.git_commit, b.ci_pipeline_id


def duplicate_letter(ev: TenantBinding | Price, source: str) -> DeadLetter:
    what = f"pid {ev.pid} on {ev.node_id}" if isinstance(ev, TenantBinding) else ev.gpu_model
    return DeadLetter(
        reason="duplicate",
        kind=ev.kind,
        source=source,
        raw=encode_event(ev),
        ts_ns=ev.ts_ns,
        gpu_uuid=None,
        detail=f"a {ev.kind} of {what} at ts_ns {ev.ts_ns} was already taken; "
        "the first one stays in force (send a correction with a later ts_ns)",
    )
