"""The SLA tiers read straight from the accepted events (docs/definitions.md, "SLA tiers"), the batch reference's
part for them: its own candidates, runs and triggers, sharing with ``streams/`` no code (the verdicts, the as-of
lookup and the exact units are ``tests.reference``'s)."""

from __future__ import annotations

import math
from collections import defaultdict
from decimal import Decimal
from fractions import Fraction

from gpucost.schemas.events import Allocation, Event, GpuSample, Price, ProcessSample, TenantBinding
from gpucost.streams.settings import AuditSettings
from tests.reference import as_of, cp, ms, verdicts, wire_labels

_FIELDS = ("team", "env", "app", "tier", "sla", "git_commit", "ci_pipeline_id")


def sla(events: list[Event], s: AuditSettings) -> tuple[dict[tuple, tuple], dict[tuple, tuple]]:
    """docs/definitions.md, "SLA tiers", read straight from the accepted events: the quota records by (GPU, pane
    start, tenant key) and the reclaim triggers by (GPU, tenant key, run start).

    A pane with GPU samples is judged; its candidates are the tenants with process samples there (the binding as
    of each sample) and the tenants whose allocations cover all of it (a hold's fields; one per key), unless some
    tenant with usage there holds nothing on the device. A hold is
    taken as final: the callers send each hold and its end before the panes it covers close (the operator reads
    the holds as they stand at a pane's close, and revises no SLA record)."""
    kept = [ev for ev, verdict in zip(events, verdicts(events, s)) if verdict is None]
    bound: dict[tuple[str, int], dict[int, tuple]] = defaultdict(dict)
    prices: dict[str, dict[int, Decimal]] = defaultdict(dict)
    holds: dict[tuple[str, str], list] = {}  # (GPU, allocation id) → [start, end or None, tenant]
    for ev in kept:
        if isinstance(ev, TenantBinding):
            bound[(ev.node_id, ev.pid)][ev.ts_ns] = (*(getattr(ev, f) for f in _FIELDS), wire_labels(ev))
        elif isinstance(ev, Price):
            prices[ev.gpu_model][ev.ts_ns] = ev.usd_per_gpu_hour
        elif isinstance(ev, Allocation):
            hold = holds.setdefault(
                (ev.gpu_uuid, ev.allocation_id), [ev.ts_ns, None, (*(getattr(ev, f) for f in _FIELDS), wire_labels(ev))]
            )
            hold[1] = ev.end_ts_ns if ev.end_ts_ns is not None else hold[1]
    P = s.pane_ns
    covered: dict[tuple[str, int], int] = defaultdict(int)  # Σ interval_ms of the GPU samples
    where: dict[tuple[str, int], tuple[str, str]] = {}  # (node, model) of a pane
    use: dict[tuple[str, int], dict[tuple, int]] = defaultdict(lambda: defaultdict(int))  # Σ sm_cp · ms per tenant
    for ev in kept:
        if isinstance(ev, GpuSample):
            covered[(ev.gpu_uuid, ev.ts_ns // P * P)] += ms(ev.interval_s)
            where.setdefault((ev.gpu_uuid, ev.ts_ns // P * P), (ev.node_id, ev.gpu_model))
        elif isinstance(ev, ProcessSample):
            t = as_of(bound.get((ev.node_id, ev.pid), {}), ev.ts_ns) or ("unattributed",) + (None,) * 7
            use[(ev.gpu_uuid, ev.ts_ns // P * P)][t] += cp(ev.sm_util_pct) * ms(ev.interval_s)

    def key(t: tuple) -> str:  # the fields joined; labels, the last, after one more ':' only where there are any
        return ":".join("" if v is None else v for v in (t if t[-1] is not None else t[:-1]))

    quotas: dict[tuple, tuple] = {}
    reclaims: dict[tuple, tuple] = {}
    runs: dict[tuple[str, str], tuple[int, int]] = {}  # (GPU, key) → (run start, last idle pane start)
    for gpu, start in sorted(covered):
        c = covered[(gpu, start)]
        if not c:
            continue
        candidates: dict[str, tuple[tuple, int, bool]] = {}  # key → (tenant, Σ sm, held)
        for t, sm in use[(gpu, start)].items():
            candidates[key(t)] = (t, sm, False)
        spans: dict[str, list[tuple[int, int]]] = defaultdict(list)  # each holder's holds, clipped to the pane
        fields: dict[str, tuple] = {}
        for (g, _), (h_start, h_end, t) in holds.items():
            if g == gpu and h_start < start + P and (h_end is None or h_end > start):
                spans[key(t)].append((max(h_start, start), start + P if h_end is None else min(h_end, start + P)))
                fields.setdefault(key(t), t)
        # usage under a key that holds nothing here may be a holder's: then none is judged on its holds alone
        unheld_busy = any(sm > 0 and key(t) not in spans for t, sm in use[(gpu, start)].items())
        for k, parts in spans.items():
            covered_to = start  # the instant up to which its holds cover the pane, without a gap
            for a, b in sorted(parts):
                covered_to = max(covered_to, b) if a <= covered_to else covered_to
            had = candidates.get(k)
            if had is not None:
                candidates[k] = (had[0], had[1], True)
            elif covered_to >= start + P and not unheld_busy:
                candidates[k] = (fields[k], 0, True)
        for k in sorted(candidates):
            t, sm, held = candidates[k]
            tier = s.sla_tiers.get(t[4] or "")
            if tier is None:
                continue
            threshold = Fraction(tier.threshold_pct) * 100  # in 1/100 %
            util = Fraction(sm, c)
            idle = util < threshold if threshold else sm == 0
            run_ms = 0
            if idle:
                before = runs.get((gpu, k))
                run_start = before[0] if before is not None and before[1] == start - P else start
                runs[(gpu, k)] = (run_start, start)
                run_ms = (start - run_start + P) // 1_000_000
                reached = tier.duration_s * 1000
                if run_ms >= reached and run_ms - P // 1_000_000 < reached:
                    price = as_of(prices.get(where[(gpu, start)][1], {}), start)
                    price = as_of(prices.get("default", {}), start) if price is None else price
                    reclaims[(gpu, k, run_start)] = (
                        *where[(gpu, start)],
                        t[0],
                        t[1],
                        t[2],
                        t[3],
                        t[4],
                        start + P,
                        run_ms,
                        run_start + tier.max_idle_s * 1_000_000_000,
                        price,
                        held,
                    )
            else:
                runs.pop((gpu, k), None)
            base = float(tier.quota_base)
            scale = (
                base * (0.3 + 0.7 * math.exp(-(run_ms / 1000) / 300))
                if run_ms
                else base * min(1.5, 1 + 0.5 * float(util / 10_000))
            )
            quotas[(gpu, start, k)] = (t[0], t[4], float(util / 100), run_ms, scale)
    return quotas, reclaims
