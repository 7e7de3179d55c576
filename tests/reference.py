"""A batch recomputation of docs/definitions.md over all events at once, written from the contract.

It shares no code with ``streams/``: its own as-of joins, its own largest-remainder split (over an explicit list
of exact fractions), numpy for the entropy. The operators must agree with it record for record.
"""

from __future__ import annotations

import json
import tomllib
from collections import defaultdict
from decimal import Decimal
from fractions import Fraction
from functools import lru_cache
from pathlib import Path

import numpy as np

from gpucost.schemas.events import (
    Allocation,
    EbpfTrace,
    Event,
    GpuSample,
    MemAccess,
    NumaEvent,
    Price,
    ProcessSample,
    TenantBinding,
)
from gpucost.schemas.kernels import KernelActivity
from gpucost.streams.settings import AuditSettings
from tests.support.kernel_reference import kernel_lines

IDLE = "idle"


def half_even(x: Fraction) -> int:
    fl = x.numerator // x.denominator
    rem = x - fl
    if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and fl % 2 == 1):
        return fl + 1
    return fl


def ms(interval_s: float) -> int:
    return half_even(Fraction(Decimal(repr(interval_s))) * 1000)


def cp(pct: float) -> int:
    return half_even(Fraction(Decimal(repr(pct))) * 100)


def verdicts(events: list[Event], s: AuditSettings) -> list[str | None]:
    """Per event, in arrival order: ``late`` (its GPU's panes up to it had closed), ``duplicate`` (an accepted
    event with the same key and ts_ns came before), ``overlap`` (a sample nearer than 3/4 of its interval to an
    accepted one of its GPU, or GPU and pid, in its pane: brute force over all of them), or None. Only
    accepted events move a watermark, and one far ahead only once a second confirms it."""
    max_ts: dict[str, int] = {}
    ahead: dict[str, list[int]] = defaultdict(list)  # the jumps each GPU holds: at most one, in fact
    taken: set[tuple] = set()

    def advance(gpu: str, ts: int) -> None:
        """An accepted event far ahead waits for a second one; the two agree on the nearer, or on the
        further if they lie within max_jump of each other."""
        if gpu in max_ts and ts - max_ts[gpu] > s.max_jump_ns:
            ahead[gpu].append(ts)
            if len(ahead[gpu]) == 2:
                near, far = min(ahead[gpu]), max(ahead[gpu])
                max_ts[gpu] = far if far - near <= s.max_jump_ns else near
                ahead[gpu] = [far] if far - near > s.max_jump_ns else []
            return
        max_ts[gpu] = max(max_ts.get(gpu, ts), ts)
        ahead[gpu] = [t for t in ahead[gpu] if t > max_ts[gpu]]

    def prune(gpu: str) -> None:
        """As a device takes a sample or a hold, its holds ended before its watermark less R and a pane are dropped
        (docs/definitions.md, "What a device keeps"): no pane they cover can change any more."""
        if gpu not in max_ts:
            return
        floor = max_ts[gpu] - s.lateness_ns - s.revision_horizon_ns - s.pane_ns
        for key in [k for k, (_, end) in holds.items() if k[0] == gpu and end is not None and end <= floor]:
            gone.add(key)
            del holds[key]

    samples: dict[tuple, list[int]] = defaultdict(list)  # accepted sample times by (GPU, kind, pid, pane)
    stored: dict[tuple[str, int], dict[int, tuple]] = defaultdict(dict)  # each process's bindings taken, by ts_ns
    addresses: dict[tuple[str, int], list[tuple[int, int]]] = defaultdict(list)  # each process's taken, in order
    holds: dict[tuple[str, str], tuple[tuple, int | None]] = {}  # each allocation taken: what is fixed, its end
    gone: set[tuple[str, str]] = set()  # holds dropped past the horizon: one sent again is late, never new
    out: list[str | None] = []
    for ev in events:
        key: tuple | None = None
        verdict = None
        if isinstance(ev, KernelActivity):  # judged by its start, moving no watermark; the same launch again is one
            pane_end = (ev.start_ns // s.pane_ns + 1) * s.pane_ns
            key = ("k", ev.gpu_uuid, ev.pid, ev.stream, ev.correlation_id, ev.start_ns)
            late = ev.gpu_uuid in max_ts and pane_end <= max_ts[ev.gpu_uuid] - s.lateness_ns
            out.append("late" if late else "duplicate" if key in taken else None)
            taken.add(key)
            continue
        if isinstance(ev, (GpuSample, ProcessSample, NumaEvent, EbpfTrace)):
            pane_end = (ev.ts_ns // s.pane_ns + 1) * s.pane_ns
            if ev.gpu_uuid in max_ts and pane_end <= max_ts[ev.gpu_uuid] - s.lateness_ns:
                out.append("late")
                continue
            if isinstance(ev, EbpfTrace):  # moves no watermark; a blas call sent again would count its FLOPs twice
                again = ev.trace_source == "blas" and ("t", ev.gpu_uuid, ev.pid, ev.ts_ns) in taken
                if ev.trace_source == "blas":
                    taken.add(("t", ev.gpu_uuid, ev.pid, ev.ts_ns))
                out.append("duplicate" if again else None)
                continue
            pid = None if isinstance(ev, GpuSample) else ev.pid
            key = (ev.kind, ev.gpu_uuid, pid, ev.ts_ns)
            near = [] if isinstance(ev, NumaEvent) else samples[(ev.kind, ev.gpu_uuid, pid, pane_end)]
            if key in taken:
                verdict = "duplicate"
            elif any(Fraction(abs(t - ev.ts_ns), 1_000_000) < Fraction(3, 4) * ms(ev.interval_s) for t in near):
                verdict = "overlap"
            else:
                near.append(ev.ts_ns)
                advance(ev.gpu_uuid, ev.ts_ns)
                prune(ev.gpu_uuid)
        elif isinstance(ev, TenantBinding):
            key = ("b", ev.node_id, ev.pid, ev.ts_ns)
            held = stored[(ev.node_id, ev.pid)]
            tenant = one_form(
                (ev.team, ev.env, ev.app, ev.tier, ev.sla, ev.git_commit, ev.ci_pipeline_id, wire_labels(ev))
            )
            if held and ev.ts_ns > max(held) and held[max(held)] == tenant and key not in taken:
                taken.add(key)  # a repeat is taken too: sent again, it is a duplicate
                out.append(None)  # repeats, later, the tenant in force: changes nothing, refused for nothing
                continue
            if key not in taken:
                held[ev.ts_ns] = tenant
        elif isinstance(ev, Price):
            key = ("p", ev.gpu_model, ev.ts_ns)
        elif isinstance(ev, Allocation):  # a hold: fixed by its first event, which a later one may only end, once
            hold = holds.get((ev.gpu_uuid, ev.allocation_id))
            if hold is None and (ev.gpu_uuid, ev.allocation_id) in gone:
                out.append("late")
                continue
            fixed = (ev.ts_ns, ev.fraction_num, ev.fraction_den, ev.sharing)
            fixed += one_form(
                (ev.team, ev.env, ev.app, ev.tier, ev.sla, ev.git_commit, ev.ci_pipeline_id, wire_labels(ev))
            )
            if hold is not None:
                if hold[0] != fixed or (hold[1] is not None and ev.end_ts_ns not in (None, hold[1])):
                    verdict = "conflict"
                elif ev.end_ts_ns is None or ev.end_ts_ns == hold[1]:
                    verdict = "duplicate"
            end = ev.end_ts_ns
            # a new hold wholly in closed panes is late (the reference revises none); an end of a hold taken is
            # never late (docs/definitions.md, "Allocation basis", "Late holds revise")
            if verdict is None and hold is None and end is not None and ev.gpu_uuid in max_ts:
                last_pane_end = ((end - 1) // s.pane_ns + 1) * s.pane_ns
                if last_pane_end <= max_ts[ev.gpu_uuid] - s.lateness_ns:
                    verdict = "late"
            if verdict is None:
                holds[(ev.gpu_uuid, ev.allocation_id)] = (fixed, ev.end_ts_ns)
                prune(ev.gpu_uuid)
            out.append(verdict)
            continue
        elif isinstance(ev, MemAccess):  # an address taken before is sent again; one too far back cannot be told
            before = addresses[(ev.node_id, ev.pid)]
            if before and ev.ts_ns < max(t for t, _ in before) - s.lateness_ns:
                verdict = "late"
            elif (ev.ts_ns, ev.address) in before:
                verdict = "duplicate"
            else:
                before.append((ev.ts_ns, ev.address))
        if verdict is None and key in taken:
            verdict = "duplicate"
        if verdict is None and key is not None:
            taken.add(key)
        out.append(verdict)
    return out


def wire_labels(ev: TenantBinding | Allocation) -> str | None:
    """The labels as the wire has them, written out as the definition says: an object's keys sorted, no spaces,
    its text as is; none, or an empty object, is no labels."""
    sent = ev.to_wire().get("labels")
    return json.dumps(dict(sorted(sent.items())), separators=(",", ":"), ensure_ascii=False) if sent else None


def one_form(tenant: tuple) -> tuple:
    """docs/definitions.md, "One key, one tenant": env, app, tier "" where not given, any other "" is none."""
    team, env, app, tier, sla, commit, pipeline, labels = tenant
    return (team, env or "", app or "", tier or "", sla, commit or None, pipeline or None, labels)


def key_of(tenant: tuple) -> str:
    """The fields joined; labels, the last, after one more ':' only where there are any."""
    return ":".join("" if v is None else v for v in (tenant if tenant[-1] is not None else tenant[:-1]))


def as_of(history: dict[int, object], ts: int) -> object | None:
    eligible = [t for t in history if t <= ts]
    return history[max(eligible)] if eligible else None


@lru_cache
def price_names(model: str) -> tuple[str, ...]:
    """The names whose price a model takes, first priced first: its own, its platform table row's name and
    aliases in the file's order, ``default`` (docs/definitions.md, "Tenants and prices"), read from the table's
    file here, not through the product's lookup."""
    with (Path(__file__).parent.parent / "gpucost" / "schemas" / "platforms.toml").open("rb") as f:
        rows = tomllib.load(f)
    names = [[n, *r.get("aliases", [])] for n, r in rows.items()]
    row = next((ns for ns in names if any(model == n or model.startswith(n + "_") for n in ns)), [])
    return (model, *(n for n in row if n != model), "default")


def split(total: int, shares: list[tuple[str, Fraction]]) -> dict[str, int]:
    """Largest remainder, written out plainly: floor each, then hand out the rest in order."""
    base = {k: (total * s).numerator // (total * s).denominator for k, s in shares}
    rest = total - sum(base.values())
    ranked = sorted(shares, key=lambda ks: (-(total * ks[1] - base[ks[0]]), 0 if ks[0] == IDLE else 1, ks[0]))
    for k, _ in ranked[:rest]:
        base[k] += 1
    return base


def reference(events: list[Event], s: AuditSettings) -> dict[str, object]:
    said = verdicts(events, s)
    kept = [ev for ev, verdict in zip(events, said) if verdict is None]
    bindings: dict[tuple[str, int], dict[int, tuple]] = defaultdict(dict)
    prices: dict[str, dict[int, Decimal]] = defaultdict(dict)
    for ev in kept:  # duplicates are gone: one binding/price per instant, the first that arrived
        if isinstance(ev, TenantBinding):
            bindings[(ev.node_id, ev.pid)][ev.ts_ns] = one_form(
                (ev.team, ev.env, ev.app, ev.tier, ev.sla, ev.git_commit, ev.ci_pipeline_id, wire_labels(ev))
            )
        elif isinstance(ev, Price):
            prices[ev.gpu_model][ev.ts_ns] = ev.usd_per_gpu_hour

    def tenant_of(node: str, pid: int, ts: int) -> tuple:
        t = as_of(bindings.get((node, pid), {}), ts)
        return t if t is not None else ("unattributed", None, None, None, None, None, None, None)

    P = s.pane_ns
    panes: dict[tuple[str, int], dict] = defaultdict(
        lambda: {
            "covered": 0,
            "idle": 0,
            "nodes": set(),
            "models": set(),
            "t": defaultdict(lambda: [0, 0, 0]),
            "busy": 0,
            "bw": 0,
            "tensor": [0, 0],
            "dram": [0, 0],
            "flops": defaultdict(int),
        }
    )
    for ev in kept:
        if isinstance(ev, (GpuSample, ProcessSample, NumaEvent, EbpfTrace)):
            pane = panes[(ev.gpu_uuid, ev.ts_ns // P * P)]
        if isinstance(ev, EbpfTrace) and ev.trace_source == "blas":
            pane["flops"][ev.pid] += ev.flops_64b
        if isinstance(ev, GpuSample):
            pane["busy"] += cp(ev.sm_util_pct) * ms(ev.interval_s)
            pane["bw"] += cp(ev.mem_bw_util_pct) * ms(ev.interval_s)
            for name in ("tensor", "dram"):
                value = getattr(ev, f"{name}_active_pct")
                if value is not None:
                    pane[name][0] += cp(value) * ms(ev.interval_s)
                    pane[name][1] += ms(ev.interval_s)
            pane["covered"] += ms(ev.interval_s)
            pane["idle"] += ms(ev.interval_s) if cp(ev.sm_util_pct) < int(s.idle_threshold_pct * 100) else 0
            pane["nodes"].add(ev.node_id)
            pane["models"].add(ev.gpu_model)
        elif isinstance(ev, ProcessSample):
            acc = pane["t"][tenant_of(ev.node_id, ev.pid, ev.ts_ns)]
            acc[0] += cp(ev.sm_util_pct) * ms(ev.interval_s)
            acc[1] += cp(ev.mem_bw_util_pct) * ms(ev.interval_s)
        elif isinstance(ev, NumaEvent):
            pane["t"][tenant_of(ev.node_id, ev.pid, ev.ts_ns)][2] += ev.hops * ev.latency_weight

    idle: dict[tuple[str, int], tuple] = {}
    cost: dict[tuple[str, int, str], tuple] = {}
    billed: dict[tuple[str, int], tuple[int, dict[str, int]]] = {}  # covered ms, and µ$ by tenant
    efficiency: dict[tuple[str, int, int], tuple] = {}
    W = s.window_ns
    a, b, g = Fraction(s.alpha), Fraction(s.beta), Fraction(s.gamma)
    for (gpu, start), p in panes.items():
        if not p["nodes"]:
            continue
        end = start + P
        # the 72 h ending at this pane's end: panes whose end lies in (end − W, end]
        window = [q for (g2, s2), q in panes.items() if g2 == gpu and end - W < s2 + P <= end and q["nodes"]]
        i72, c72 = sum(q["idle"] for q in window), sum(q["covered"] for q in window)
        idle[(gpu, start)] = (min(p["nodes"]), min(p["models"]), p["idle"], p["covered"], i72, c72, i72 / c72)

        model = min(p["models"])
        price = next((q for q in (as_of(prices.get(n, {}), start) for n in price_names(model)) if q is not None), None)
        C = 0 if price is None else half_even(Fraction(price) * 1_000_000 * p["covered"] / 3_600_000)
        keys = {t: key_of(t) for t in p["t"]}
        tot = [sum(v[i] for v in p["t"].values()) for i in range(3)]
        share = {t: [Fraction(v[i], tot[i]) if tot[i] else Fraction(0) for i in range(3)] for t, v in p["t"].items()}
        w = {t: a * x[0] + b * x[1] + g * x[2] for t, x in share.items()}
        wsum = sum(w.values())
        u = Fraction(0) if wsum == 0 else min(Fraction(1), Fraction(tot[0], 10_000 * p["covered"]))
        shares = [(IDLE, 1 - u)] + [(keys[t], u * w[t] / wsum if wsum else Fraction(0)) for t in p["t"]]
        money = split(C, shares)
        billed[(gpu, start)] = (p["covered"], {keys[t]: money[keys[t]] for t in p["t"]})
        cost[(gpu, start, IDLE)] = (money[IDLE], C, 0.0, 0.0, 0.0, 0.0, float(u), price is None)
        for t in p["t"]:
            cost[(gpu, start, keys[t])] = (
                money[keys[t]],
                C,
                *map(float, share[t]),
                float(w[t]),
                float(u),
                price is None,
            )
        efficiency.update(_efficiency(gpu, start, p, model, s))

    mae = []
    by_proc: dict[tuple[str, int], list[MemAccess]] = defaultdict(list)
    for ev in kept:
        if isinstance(ev, MemAccess):
            by_proc[(ev.node_id, ev.pid)].append(ev)
    span = s.mae_hi - s.mae_lo
    for (node, pid), evs in by_proc.items():
        for i in range(0, len(evs), s.mae_window):
            chunk = evs[i : i + s.mae_window]
            inside = [e.address - s.mae_lo for e in chunk if 0 <= e.address - s.mae_lo < span]
            counts = (
                np.bincount(np.array([x * s.mae_bins // span for x in inside], dtype=np.int64), minlength=s.mae_bins)
                if inside
                else np.zeros(1)
            )
            pr = counts[counts > 0] / max(1, len(inside))
            bits = float(-(pr * np.log2(pr)).sum()) if inside else 0.0
            mae.append((node, pid, chunk[0].ts_ns, chunk[-1].ts_ns, len(inside), len(chunk) - len(inside), bits))
    kernels = [ev for ev in kept if isinstance(ev, KernelActivity)]
    return {
        "idle": idle,
        "cost": cost,
        "kernel": kernel_lines(kernels, P, lambda node, pid, ts: key_of(tenant_of(node, pid, ts)), billed),
        "mae": sorted(mae),
        "efficiency": efficiency,
        **{reason: said.count(reason) for reason in ("late", "duplicate", "overlap")},
    }


def _peak(table: dict[str, Decimal], model: str) -> Fraction:
    """The peak table (docs/definitions.md, "Health audit"): the longest key the model name contains,
    case-insensitively; else default."""
    keys = sorted((k for k in table if k != "default" and k.lower() in model.lower()), key=lambda k: (-len(k), k))
    return Fraction(table[keys[0] if keys else "default"])


def _efficiency(gpu: str, start: int, p: dict, model: str, s: AuditSettings) -> dict[tuple[str, int, int], tuple]:
    """docs/definitions.md, "Efficiency: EFU, ΔBW, diagnosis", read straight: the GPU row (pid 0), then one
    per pid with blas traces."""
    peak = _peak(s.peak_tops, model)
    full = peak * 10**12 * Fraction(p["covered"], 1000)  # FLOPs the peak does in the covered time
    if p["dram"][1]:
        bw, bw_source = Fraction(p["dram"][0], 100 * p["dram"][1]) / 100, "dram_active"
    else:
        bw, bw_source = Fraction(p["bw"], 100 * p["covered"]) / 100, "mem_bw_util"

    def diagnose(efu: Fraction | None) -> str:
        if p["busy"] == 0:
            return "idle"
        if efu is not None and efu >= Fraction(s.compute_bound_efu):
            return "compute_bound"
        return "memory_bound" if bw >= Fraction(s.memory_bound_bw) else "latency_bound"

    efu: Fraction | None = None
    source = None
    if p["flops"]:
        efu, source = sum(p["flops"].values()) / full, "flops"
    elif p["tensor"][1]:
        efu, source = Fraction(p["tensor"][0], 100 * p["tensor"][1]) / 100, "tensor_active"
    rows = {
        (gpu, start, 0): (
            float(sum(p["flops"].values())),
            None if efu is None else float(efu),
            source,
            float(bw),
            float(1 - bw),
            bw_source,
            diagnose(efu),
        )
    }
    for pid, flops in p["flops"].items():
        if pid:
            rows[(gpu, start, pid)] = (
                float(flops),
                float(flops / full),
                "flops",
                float(bw),
                float(1 - bw),
                bw_source,
                diagnose(flops / full),
            )
    return rows
