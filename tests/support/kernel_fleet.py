"""A fleet of one GPU and its kernels, worked out by hand (tests/test_kernel_cost.py, tests/test_kernel_revisions.py),
and the readings of kernel cost lines summed over revisions."""

from __future__ import annotations

from collections import defaultdict
from decimal import Decimal
from fractions import Fraction

from gpucost.schemas.blocks import expand
from gpucost.schemas.codec import encode_event
from gpucost.schemas.events import Event, GpuSample, Price, ProcessSample, TenantBinding
from gpucost.schemas.kernels import KernelActivity
from gpucost.schemas.records import CostRecord, KernelCostRecord, Output
from gpucost.streams.audit import Auditor
from tests.strategies import BASE_NS, NS

PANE = 60 * NS


def kernel(
    start_s: float,
    end_s: float,
    name: str = "gemm",
    pid: int = 1,
    stream: int = 7,
    corr: int = 0,
    path: tuple[str, ...] | None = None,
) -> Event:
    category = "memcpy" if name.startswith("Memcpy") else "communication" if name.startswith("nccl") else "kernel"
    return KernelActivity(
        node_id="n",
        pid=pid,
        name=name,
        start_ns=BASE_NS + int(start_s * NS),
        end_ns=BASE_NS + int(end_s * NS),
        gpu_uuid="GPU-0",
        device=0,
        stream=stream,
        correlation_id=corr,
        category=category,
        range_path=path,
    )


def fleet(panes: int, sm_pct: float = 100.0) -> list[Event]:
    """A price of 3.6 $/h (1 µ$ a covered ms), pid 1 bound to team a, and one GPU sample and one sample of pid 1 a
    pane, each covering the whole pane at ``sm_pct``: pid 1's tenant pays ``60_000 × sm_pct / 100`` µ$ a pane."""
    out: list[Event] = [
        Price(gpu_model="H100", ts_ns=BASE_NS - 3600 * NS, usd_per_gpu_hour=Decimal("3.6")),
        TenantBinding(node_id="n", pid=1, ts_ns=BASE_NS, team="a", env="prod", app="x", tier="t", sla="Gold"),
    ]
    for p in range(panes):
        at = BASE_NS + p * PANE
        out.append(
            GpuSample(
                node_id="n",
                gpu_uuid="GPU-0",
                gpu_model="H100",
                ts_ns=at,
                interval_s=60.0,
                sm_util_pct=sm_pct,
                mem_bw_util_pct=0.0,
                mem_used_bytes=1,
                mem_total_bytes=2,
                power_w=100.0,
                temp_c=40.0,
            )
        )
        out.append(
            ProcessSample(
                node_id="n",
                gpu_uuid="GPU-0",
                pid=1,
                ts_ns=at + 1,
                interval_s=60.0,
                sm_util_pct=sm_pct,
                mem_bw_util_pct=0.0,
                mem_used_bytes=1,
            )
        )
    return out


def feed(auditor: Auditor, events: list[Event], batch: bool) -> list[Output]:
    """``events`` through the auditor's row entry, or as encoded lines through its batch entry (``batch``)."""
    if batch:
        return expand(auditor.ingest_lines([encode_event(e).encode() for e in events], str))
    return [o for e in events for o in auditor.update(e)]


def lines(out: list[Output]) -> dict[tuple[int, str, str], tuple[int, int, int]]:
    """Each line summed over revisions, by (pane, tenant's team, kernel): µ$, then the latest busy ns and calls."""
    money: dict[tuple[int, str, str], int] = defaultdict(int)
    latest: dict[tuple[int, str, str], KernelCostRecord] = {}
    for r in out:
        if isinstance(r, KernelCostRecord):
            key = ((r.pane_start_ns - BASE_NS) // PANE, r.team, r.kernel)
            money[key] += r.cost_micro_usd
            if key not in latest or latest[key].revision < r.revision:
                latest[key] = r
    return {k: (money[k], latest[k].busy_ns, latest[k].calls) for k in money}


def binding(pid: int, at_s: int, team: str) -> TenantBinding:
    return TenantBinding(
        node_id="n", pid=pid, ts_ns=BASE_NS + at_s * NS, team=team, env="p", app="x", tier="t", sla="Gold"
    )


def paid_as_billed(out: list[Output]) -> bool:
    """Whether every tenant's kernel lines of every pane, summed over revisions, are its cost there, summed over
    revisions, or 0 (all its kernels moved to another tenant)."""
    cost: dict[tuple[int, str], int] = defaultdict(int)
    paid: dict[tuple[int, str], int] = defaultdict(int)
    for r in out:
        if isinstance(r, CostRecord):
            cost[(r.pane_start_ns, r.tenant_key)] += r.cost_micro_usd
        elif isinstance(r, KernelCostRecord):
            paid[(r.pane_start_ns, r.tenant_key)] += r.cost_micro_usd
    return bool(paid) and all(usd in (0, cost.get(key, 0)) for key, usd in paid.items())


def billed(out: list[Output]) -> dict[tuple[int, str, str], tuple[int, int, int]]:
    """``lines`` but for those a revision emptied (summed to nothing, a run in time order never has them)."""
    return {k: v for k, v in lines(out).items() if v != (0, 0, 0)}


def brute(kernels: list[KernelActivity], lo: int, hi: int) -> tuple[int, dict[tuple[str, ...], Fraction]]:
    """The union of the computing kernels' time in [lo, hi) and each path prefix's exact share of it: every slice
    between two consecutive starts or ends shared equally by the kernels running in it."""
    spans = [(max(k.start_ns, lo), min(k.end_ns, hi), k.range_path or ()) for k in kernels]
    edges = sorted({t for s, e, _ in spans for t in (s, e)})
    busy, share = 0, defaultdict(Fraction)
    for a, b in zip(edges, edges[1:]):
        running = [p for s, e, p in spans if s <= a and b <= e and s < e]
        if running:
            busy += b - a
            for path in running:
                for depth in range(len(path) + 1):
                    share[path[:depth]] += Fraction(b - a, len(running))
    return busy, share
