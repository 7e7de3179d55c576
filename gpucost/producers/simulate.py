"""A deterministic synthetic GPU fleet, producing events as fast as the CPU allows.

Each GPU draws from its own generator seeded by ``(seed, gpu index)``, so a fleet of N
GPUs is the first N GPUs of any larger fleet with the same seed. Events come out in
arrival order: mostly in event time, some delayed by up to ``max_delay_s`` (within the
default lateness), as a real network delivers them.
"""

from __future__ import annotations

import heapq
import math
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal

import numpy as np

from gpucost.producers.simulated_kernels import Profiler
from gpucost.schemas.events import (
    TENANT_FIELDS,
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

__all__ = ["FleetSpec", "GPU_MODELS", "simulate"]

NS = 1_000_000_000
HOUR_NS = 3600 * NS
GIB = 1 << 30

#: (model name as NVML reports it, USD per GPU-hour or None for "uses the default price", memory)
GPU_MODELS: tuple[tuple[str, str | None, int], ...] = (
    ("NVIDIA H100 80GB HBM3", "3.990000", 80 * GIB),
    ("NVIDIA H200", "4.540000", 141 * GIB),
    ("NVIDIA A100-SXM4-80GB", "2.210000", 80 * GIB),
    ("NVIDIA L40S", None, 48 * GIB),
)
DEFAULT_PRICE = "1.250000"
TENANTS: tuple[tuple[str, str, str, str, str], ...] = (
    ("search", "prod", "ranker", "online", "Gold"),
    ("search", "staging", "ranker", "online", "Silver"),
    ("ads", "prod", "ctr-model", "batch", "Silver"),
    ("vision", "prod", "detector", "online", "Gold"),
    ("vision", "dev", "detector", "batch", "Bronze"),
    ("nlp", "prod", "llm-serve", "online", "Gold"),
    ("nlp", "research", "llm-train", "batch", "Bronze"),
    ("platform", "prod", "embedder", "batch", "Silver"),
)
PATTERNS = ("stream", "random", "hot", "wide64")


@dataclass(frozen=True)
class FleetSpec:
    gpus: int = 8
    hours: float = 74.0
    seed: int = 0
    interval_s: float = 10.0
    gpus_per_node: int = 4
    # 2025-01-06T00:00:00Z, a Monday: even the longest fleet (366 days) ends in the past, so a worker's
    # clock never refuses its events as future_timestamp
    start_ns: int = 1_736_121_600 * NS
    max_delay_s: float = 30.0
    #: jobs whose binding reaches the node after their first samples (as Kubernetes labels often do), by up to
    #: ``late_binding_max_s``: their revisions re-attribute what was counted ``unattributed`` meanwhile
    late_binding_fraction: float = 0.1
    late_binding_max_s: float = 1800.0
    addresses_per_hour: int = 192
    unbound_fraction: float = 0.1
    #: the power model (``_Gpu.events``): a GPU sample's watts are ``idle_power_w`` plus these times the sum of
    #: its processes' SM %, their memory-bandwidth %, and the tick's NUMA Σ hops · latency_weight per ms, plus
    #: noise: known coefficients, which ``gpucost fit-weights`` must recover (tests/test_fit.py); ``simulate``'s
    #: ``power_by_model`` gives chosen models others
    idle_power_w: float = 70.0
    watts_per_sm_pct: float = 3.0
    watts_per_bw_pct: float = 1.5
    watt_ms_per_numa: float = 20_000.0
    #: each bound job's pod holds its GPU from before its process starts until after it ends (``allocation``
    #: events, docs/definitions.md, "Allocation basis"): time-sliced, MPS or exclusive by GPU, so that the
    #: allocation basis, and the gap between what was held and what was used, have something to split
    allocations: bool = True

    def __post_init__(self) -> None:
        for name in ("gpus", "gpus_per_node"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be ≥ 1, got {getattr(self, name)}")
        if not 0 < self.hours <= 24 * 366:
            raise ValueError(f"hours must be in (0, 8784], got {self.hours}")
        if not 0.001 <= self.interval_s <= 3600:
            raise ValueError(f"interval_s must be in [0.001, 3600], got {self.interval_s}")
        if not 0 <= self.late_binding_fraction <= 1:
            raise ValueError(f"late_binding_fraction must be in [0, 1], got {self.late_binding_fraction}")

    @property
    def end_ns(self) -> int:
        return self.start_ns + int(self.hours * HOUR_NS)


@dataclass
class _Job:
    pid: int
    start_ns: int
    end_ns: int
    sm_base: float
    bw_base: float
    pattern: str
    region: int
    tenant: tuple[str, str, str, str, str] | None
    git_commit: str
    ci_pipeline_id: str | None


def _diurnal(ts_ns: int) -> float:
    hours = ts_ns / HOUR_NS
    return 0.55 + 0.45 * math.sin(2 * math.pi * (hours - 9) / 24)


def _pct(x: float) -> float:
    return round(min(100.0, max(0.0, x)), 2)


#: a power model: idle W, W per SM %, W per memory-bandwidth %, W·ms per NUMA Σ hops · latency_weight
Power = tuple[float, float, float, float]


class _Gpu:
    """One GPU's events, generated lazily tick by tick."""

    def __init__(self, spec: FleetSpec, index: int, power_by_model: Mapping[str, Power]) -> None:
        self.spec = spec
        self.index = index
        self.rng = np.random.default_rng([spec.seed, index])
        self.node_id = f"node-{index // spec.gpus_per_node:03d}"
        self.uuid = f"GPU-{uuid.UUID(bytes=self.rng.bytes(16))}"
        self.model, _, self.mem_total = GPU_MODELS[int(self.rng.integers(len(GPU_MODELS)))]
        self.power = power_by_model.get(
            self.model, (spec.idle_power_w, spec.watts_per_sm_pct, spec.watts_per_bw_pct, spec.watt_ms_per_numa)
        )
        self.pid_base = 10_000 + 1_000 * (index % spec.gpus_per_node)
        self.jobs = self._schedule()
        self.profiler = Profiler(spec.seed, index, self.node_id, self.uuid, spec.start_ns)

    def _schedule(self) -> list[_Job]:
        """Bursts of 1–3 concurrent jobs separated by idle gaps, some of them many hours long."""
        rng, spec, jobs = self.rng, self.spec, []
        t = spec.start_ns + int(rng.exponential(2 * HOUR_NS))
        while t < spec.end_ns:
            for _ in range(int(rng.integers(1, 4))):
                start = t + int(rng.integers(0, 20 * 60)) * NS
                tenant = None if rng.random() < spec.unbound_fraction else TENANTS[int(rng.integers(len(TENANTS)))]
                jobs.append(
                    _Job(
                        pid=self.pid_base + len(jobs),
                        start_ns=start,
                        end_ns=start + int(rng.exponential(5 * HOUR_NS)) + 10 * 60 * NS,
                        sm_base=float(rng.uniform(10, 70)),
                        bw_base=float(rng.uniform(5, 60)),
                        pattern=PATTERNS[int(rng.integers(len(PATTERNS)))],
                        region=int(rng.integers(0, 1 << 32 - 28)) << 28,
                        tenant=tenant,
                        git_commit=rng.bytes(20).hex()[:12],
                        ci_pipeline_id=None if rng.random() < 0.5 else str(int(rng.integers(10**5, 10**6))),
                    )
                )
            gap_h = rng.exponential(14.0) if rng.random() < 0.3 else rng.exponential(1.5)
            t = max(j.end_ns for j in jobs) + int(gap_h * HOUR_NS)
        return jobs

    def _binding_delay(self, job: _Job) -> int:
        late = int(job.git_commit[:4], 16) < 65536 * self.spec.late_binding_fraction
        return int(job.git_commit[4:10], 16) % max(1, int(self.spec.late_binding_max_s)) * NS + NS if late else 0

    def _allocations(self) -> Iterator[Allocation]:
        """Each bound job's hold on the GPU, and its end if it falls within the fleet's time: from 1 to 16 minutes
        before the process starts until 0 to 45 minutes after it ends (a pod scheduled, then its container
        starting; a finished job's pod left running), all from the job's commit digits so that no random draw
        moves. The GPU's mode by its index: time-slicing in 4 replicas, MPS at 25 to 100 %, or exclusive (its
        jobs then overlap past the device: an oversubscribed hold). The pod names its tenant as the job's binding
        does, all seven fields, so that what it held and what it used meet in ``allocation_gap``."""
        mode = ("time_slicing", "mps", "time_slicing", "exclusive")[self.index % 4]
        for j in self.jobs:
            if j.tenant is None:
                continue
            digits = int(j.git_commit[:8], 16)
            num, den = {"time_slicing": (1, 4), "mps": (25 * (1 + digits % 4), 100), "exclusive": (1, 1)}[mode]
            start = j.start_ns - (1 + digits % 16) * 60 * NS
            end = j.end_ns + (digits >> 4) % 46 * 60 * NS
            hold = Allocation(
                node_id=self.node_id,
                gpu_uuid=self.uuid,
                allocation_id=f"pod-{j.pid}",
                ts_ns=start,
                sharing=mode,
                fraction_num=num,
                fraction_den=den,
                **dict(zip(TENANT_FIELDS, (*j.tenant, j.git_commit, j.ci_pipeline_id))),
                origin="kubernetes",
            )
            yield hold
            if end < self.spec.end_ns:
                yield hold.model_copy(update={"end_ts_ns": end})

    def _address(self, job: _Job) -> int:
        rng = self.rng
        if job.pattern == "stream":
            return job.region + int(rng.integers(0, 1 << 28)) // 4096 * 4096
        if job.pattern == "random":
            return int(rng.integers(0, 1 << 32))
        if job.pattern == "hot":
            hot = rng.random() < 0.9
            return job.region + int(rng.integers(0, 1 << 22)) if hot else int(rng.integers(0, 1 << 32))
        return (0x7F00 << 32) + int(rng.integers(0, 1 << 40)) if rng.random() < 0.8 else int(rng.integers(0, 1 << 32))

    def events(self) -> Iterator[tuple[int, Event]]:
        """(arrival_ns, event) in arrival order."""
        spec, rng = self.spec, self.rng
        step_ns = int(spec.interval_s * NS)
        pending: list[tuple[int, int, Event]] = []
        seq = 0
        addr_p = spec.addresses_per_hour * spec.interval_s / 3600 / 16  # bursts of 16
        bound = {j.pid for j in self.jobs if j.tenant is None}
        if spec.allocations:
            for ev in self._allocations():
                heapq.heappush(pending, (ev.end_ts_ns or ev.ts_ns, seq, ev))
                seq += 1
        for tick in range(spec.start_ns, spec.end_ns, step_ns):
            ts = tick + int(rng.integers(0, 50)) * 1_000_000
            interval = round(spec.interval_s + float(rng.normal(0, 0.002)), 4)
            active = [j for j in self.jobs if j.start_ns <= tick < j.end_ns]
            out: list[Event] = []
            for j in active:
                if j.pid not in bound:
                    bound.add(j.pid)
                    assert j.tenant is not None
                    team, env, app, tier, sla = j.tenant
                    # published before the process's first sample, with no delay; or, for some jobs (chosen from
                    # their commit's digits, so that no random draw moves), late
                    heapq.heappush(
                        pending,
                        (
                            ts - NS + self._binding_delay(j),
                            seq,
                            TenantBinding(
                                node_id=self.node_id,
                                pid=j.pid,
                                ts_ns=j.start_ns,
                                team=team,
                                env=env,
                                app=app,
                                tier=tier,
                                sla=sla,
                                git_commit=j.git_commit,
                                ci_pipeline_id=j.ci_pipeline_id,
                            ),
                        ),
                    )
                    seq += 1
            load = _diurnal(ts)
            sm = [_pct(j.sm_base * load + rng.normal(0, 4)) for j in active]
            bw = [_pct(j.bw_base * load + rng.normal(0, 3)) for j in active]
            used = sum(int(2 * GIB + j.sm_base * 0.6 * GIB) for j in active)
            # the GPU sample's draws first (their order fixes every later draw), its power once the tick's NUMA
            # events are known
            gpu_sm, gpu_bw = (_pct(sum(sm) + abs(rng.normal(0, 0.8))), _pct(sum(bw) + abs(rng.normal(0, 0.5))))
            noise = float(rng.normal(0, 3)) if active else 0.0
            pcie = [int(rng.integers(0, 10**6)) * max(1, len(active)) for _ in range(2)]
            hopper = "H100" in self.model or "H200" in self.model  # GPM / DCGM profiling: tensor and DRAM activity
            numa = 0
            for j, s, b in zip(active, sm, bw):
                out.append(
                    ProcessSample(
                        node_id=self.node_id,
                        gpu_uuid=self.uuid,
                        pid=j.pid,
                        ts_ns=ts + 1_000_000,
                        interval_s=interval,
                        sm_util_pct=s,
                        mem_bw_util_pct=b,
                        mem_used_bytes=int(2 * GIB + j.sm_base * 0.6 * GIB),
                    )
                )
                if rng.random() < 0.02:
                    out.append(
                        NumaEvent(
                            node_id=self.node_id,
                            gpu_uuid=self.uuid,
                            pid=j.pid,
                            ts_ns=ts + 2_000_000,
                            hops=int(rng.integers(0, 3)),
                            latency_weight=int(rng.integers(1, 50)),
                        )
                    )
                    numa += out[-1].hops * out[-1].latency_weight
                if rng.random() < addr_p:
                    out.extend(
                        MemAccess(node_id=self.node_id, pid=j.pid, ts_ns=ts + 3_000_000 + k, address=self._address(j))
                        for k in range(16)
                    )
                if rng.random() < 0.002:  # a batched GEMM seen by the cuBLAS uprobes: 2·m·n·k·batch FLOPs
                    x = int(rng.integers(0, 1 << 62))
                    dims = [256 * (1 + (x >> shift) % 32) for shift in (0, 5, 10)]  # m, n, k
                    out.append(
                        EbpfTrace(
                            node_id=self.node_id,
                            pid=j.pid,
                            gpu_uuid=self.uuid,
                            ts_ns=ts + 4_000_000,
                            sm_util_pct=int(s),
                            flops_64b=2 * math.prod(dims) * (1 + (x >> 15) % 64),
                            trace_source="blas",
                        )
                    )
            idle_w, per_sm, per_bw, per_numa = self.power
            power = idle_w + per_sm * sum(sm) + per_bw * sum(bw) + per_numa * numa / (interval * 1000) + noise
            out.insert(
                0,
                GpuSample(
                    node_id=self.node_id,
                    gpu_uuid=self.uuid,
                    gpu_model=self.model,
                    ts_ns=ts,
                    interval_s=interval,
                    sm_util_pct=gpu_sm,
                    mem_bw_util_pct=gpu_bw,
                    mem_used_bytes=min(used, self.mem_total),
                    mem_total_bytes=self.mem_total,
                    power_w=round(min(10_000.0, max(0.0, power)), 1),
                    temp_c=round(31 + 0.4 * sum(sm) / max(1, len(active)), 1),
                    pcie_tx_bytes_s=pcie[0],
                    pcie_rx_bytes_s=pcie[1],
                    tensor_active_pct=_pct(0.55 * gpu_sm) if hopper else None,
                    dram_active_pct=_pct(0.9 * gpu_bw) if hopper else None,
                ),
            )
            # mostly prompt; 2 % of ticks arrive late by up to max_delay_s (within the lateness)
            delay = int(rng.uniform(0, spec.max_delay_s) * NS) if rng.random() < 0.02 else 0
            for ev in out:
                heapq.heappush(pending, (ts + delay, seq, ev))
                seq += 1
            kernels = self.profiler.tick(ts, step_ns, active)  # a profiled tick's kernels, as one buffer
            late = self.profiler.delay_ns() if kernels else 0
            for ev in kernels:
                heapq.heappush(pending, (ts + delay + late, seq, ev))
                seq += 1
            horizon = tick - int(spec.max_delay_s * NS) - NS
            while pending and pending[0][0] <= horizon:
                arrival, _, ev = heapq.heappop(pending)
                yield arrival, ev
        while pending:
            arrival, _, ev = heapq.heappop(pending)
            yield arrival, ev


def _prices(spec: FleetSpec) -> list[Price]:
    day_before = spec.start_ns - 24 * HOUR_NS
    prices = [
        Price(gpu_model=m, ts_ns=day_before, usd_per_gpu_hour=Decimal(p)) for m, p, _ in GPU_MODELS if p is not None
    ]
    prices.append(Price(gpu_model="default", ts_ns=day_before, usd_per_gpu_hour=Decimal(DEFAULT_PRICE)))
    # a mid-run price cut, to exercise the as-of join at the pane start
    prices.append(
        Price(gpu_model=GPU_MODELS[0][0], ts_ns=spec.start_ns + 36 * HOUR_NS, usd_per_gpu_hour=Decimal("3.490000"))
    )
    return prices


def simulate(spec: FleetSpec, power_by_model: Mapping[str, Power] | None = None) -> Iterator[Event]:
    """Every event of the fleet in arrival order, prices first. ``power_by_model`` gives the models it names a power
    formula of their own (the others draw by ``FleetSpec``'s): a mixed fleet whose platforms draw unlike each other,
    for the per-platform fit of ``gpucost fit-weights`` (tests/test_calibration_fleet.py). It draws nothing from the
    generators, so every other field of every event stays as without it. It is an argument, not a ``FleetSpec``
    field, because a spec's fields are a simulated run's identity in its checkpoint (gpucost/run.py): one more would
    make every checkpoint written before it another run's."""
    power = dict(power_by_model or {})
    models = [m for m, *_ in GPU_MODELS]
    for model in power:
        if model not in models:
            raise ValueError(f"power_by_model names {model!r}, which is no simulated model: name one of {models}")
    prices = _prices(spec)
    yield from (p for p in prices if p.ts_ns <= spec.start_ns)
    later = [(p.ts_ns, -1, i, p) for i, p in enumerate(prices) if p.ts_ns > spec.start_ns]
    streams = [((arr, g, i, ev) for i, (arr, ev) in enumerate(_Gpu(spec, g, power).events())) for g in range(spec.gpus)]
    for _, _, _, ev in heapq.merge(later, *streams, key=lambda x: (x[0], x[1], x[2])):
        yield ev
