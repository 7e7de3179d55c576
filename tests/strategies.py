"""Hypothesis strategies: random fleets' event streams and the settings to audit them with."""

from __future__ import annotations

import uuid
from decimal import Decimal

from hypothesis import strategies as st

from gpucost.schemas.events import (
    SHARING_MODES,
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

NS = 1_000_000_000
BASE_NS = 1_767_571_200 * NS
#: two names of one platform row (the table's and NVML's), whose prices stand in for each other's
MODELS = ("H100", "NVIDIA H100 80GB HBM3", "H200", "L40S")

# (α, β, γ); the zeros make Σw = 0 possible while SM work exists
WEIGHTS = [
    ("0.6", "0.3", "0.1"),
    ("1", "0", "0"),
    ("0", "1", "0"),
    ("0", "0", "1"),
    ("0.333333", "0.333333", "0.333334"),
    ("0", "0.5", "0.5"),
]


@st.composite
def settings_st(draw: st.DrawFn, revisions: bool = False) -> AuditSettings:
    """Random settings; without ``revisions``, late data are dead letters (the reference's rule), with them
    the revision horizon is drawn too (0, shorter than the streams, or all of them)."""
    alpha, beta, gamma = map(Decimal, draw(st.sampled_from(WEIGHTS)))
    pane_s = draw(st.sampled_from([60, 420, 600]))  # 420: an idle window that is not a whole number of panes
    return AuditSettings(
        pane_s=pane_s,
        health_window_h=7 if pane_s == 420 else draw(st.sampled_from([1, 2])),  # H a whole number of panes
        admission_h=draw(st.sampled_from([0, 1, 2])),
        lateness_s=draw(st.sampled_from([0, 120, 600])),
        max_jump_s=draw(st.sampled_from([30, 300, 86_400])),  # 30: most gaps of these streams are jumps
        window_h=1,  # streams span up to 3 h, so the window really slides
        alpha=alpha,
        beta=beta,
        gamma=gamma,
        mae_window=draw(st.sampled_from([8, 50])),
        mae_bins=draw(st.sampled_from([4, 256])),
        mae_hi=draw(st.sampled_from([1 << 16, 1 << 32])),
        revision_horizon_s=draw(st.sampled_from([0, 600, 3600, 6 * 3600])) if revisions else 0,
    )


# utilisation with up to 3 decimals, so rounding to 1/100 % is exercised; zero often
pct = st.one_of(st.just(0.0), st.integers(0, 100).map(float), st.integers(0, 100_000).map(lambda x: x / 1000))
interval = st.one_of(
    st.sampled_from([1.0, 10.0, 10.0005, 59.9995, 0.0015]), st.integers(6, 1_200_000).map(lambda x: x / 10_000)
)
tenant = st.tuples(
    st.sampled_from(["search", "ads", "vision"]),
    st.sampled_from(["prod", "dev", ""]),
    st.just("app"),
    st.just("online"),
    st.sampled_from(["Gold", "Bronze"]),
    # given as "" or left out: one tenant (``Tenant.canonical``), whichever a process's binding says
    st.one_of(st.none(), st.just(""), st.just("abc123")),
    st.one_of(st.none(), st.just(""), st.just("77")),
    # labels: none, an empty object (no labels, the same tenant), or a few, one value with the key's separator
    st.one_of(
        st.none(),
        st.just({}),
        st.sampled_from([{"namespace": "ml"}, {"pod": "p-1", "namespace": "ml"}, {"app.kubernetes.io/name": "a:b"}]),
    ),
)


#: the categories of the kernel names generated here (any other is a ``kernel``)
CATEGORY_OF = {"Memcpy HtoD": "memcpy", "ncclDevKernel_AllReduce": "communication"}


@st.composite
def streams(draw: st.DrawFn, max_span_s: int = 3 * 3600) -> list[Event]:
    """Bindings and prices first (in random order), then the rest in arrival order with delays."""
    span_ns = draw(st.integers(60, max_span_s)) * NS
    # mostly whole seconds, so events land exactly on pane ends and watermarks; some at any ns
    ts = st.one_of(
        st.integers(0, span_ns // NS).map(lambda x: BASE_NS + x * NS), st.integers(BASE_NS, BASE_NS + span_ns)
    )
    # UUIDs as NVML gives them: an eBPF trace carries its GPU as the UUID's 16 bytes
    gpus = [
        (f"GPU-{uuid.UUID(int=i)}", f"node-{i % 2}", draw(st.sampled_from(MODELS)))
        for i in range(draw(st.integers(1, 3)))
    ]
    pids = [1, 2, 3, 4]
    head: list[Event] = []
    for node in {n for _, n, _ in gpus}:
        for pid in pids:
            for _ in range(draw(st.integers(0, 2))):
                t = draw(tenant)
                head.append(
                    TenantBinding(
                        node_id=node,
                        pid=pid,
                        ts_ns=draw(ts),
                        team=t[0],
                        env=t[1],
                        app=t[2],
                        tier=t[3],
                        sla=t[4],
                        git_commit=t[5],
                        ci_pipeline_id=t[6],
                        labels=t[7],
                    )
                )
    for model in draw(st.lists(st.sampled_from(MODELS + ("default",)), unique=True)):
        for _ in range(draw(st.integers(1, 2))):
            head.append(
                Price(
                    gpu_model=model,
                    ts_ns=draw(st.integers(BASE_NS - 3600 * NS, BASE_NS + span_ns)),
                    usd_per_gpu_hour=Decimal(draw(st.integers(0, 9_999_999))) / 1_000_000,
                )
            )
    head = draw(st.permutations(head))
    head += [head[i] for i in draw(st.lists(st.integers(0, len(head) - 1), max_size=2))] if head else []

    body: list[Event] = []
    for gpu, node, model in gpus:
        profiled = draw(st.booleans())  # DCGM profiling or GPM: tensor and DRAM activity on most samples
        for _ in range(draw(st.integers(0, 40))):
            tensor, dram = (draw(st.one_of(st.none(), pct)) if profiled else None for _ in range(2))
            body.append(
                GpuSample(
                    node_id=node,
                    gpu_uuid=gpu,
                    gpu_model=model,
                    ts_ns=draw(ts),
                    interval_s=draw(interval),
                    sm_util_pct=draw(pct),
                    mem_bw_util_pct=draw(pct),
                    mem_used_bytes=1,
                    mem_total_bytes=2,
                    power_w=100.0,
                    temp_c=40.0,
                    tensor_active_pct=tensor,
                    dram_active_pct=dram,
                    power_estimated=draw(st.sampled_from([None, None, False, True])),  # the platform's TDP
                )
            )
        for _ in range(draw(st.integers(0, 8))):  # BLAS calls (FLOPs, past 2^63 too) and kernel launches
            body.append(
                EbpfTrace(
                    node_id=node,
                    gpu_uuid=gpu,
                    pid=draw(st.sampled_from([0, *pids])),
                    ts_ns=draw(ts),
                    sm_util_pct=draw(st.integers(0, 100)),
                    trace_source=draw(st.sampled_from(["blas", "launch"])),
                    flops_64b=draw(st.one_of(st.integers(0, 10**15), st.integers(0, (1 << 64) - 1))),
                )
            )
        for _ in range(draw(st.integers(0, 40))):
            body.append(
                ProcessSample(
                    node_id=node,
                    gpu_uuid=gpu,
                    pid=draw(st.sampled_from(pids)),
                    ts_ns=draw(ts),
                    interval_s=draw(interval),
                    sm_util_pct=draw(pct),
                    mem_bw_util_pct=draw(pct),
                    mem_used_bytes=1,
                )
            )
        for _ in range(draw(st.integers(0, 8))):
            body.append(
                NumaEvent(
                    node_id=node,
                    gpu_uuid=gpu,
                    pid=draw(st.sampled_from(pids)),
                    ts_ns=draw(ts),
                    hops=draw(st.integers(0, 3)),
                    latency_weight=draw(st.integers(0, 40)),
                )
            )
        # kernels: overlapping, crossing pane ends, of zero length; most while a sample of their process runs
        mine = [(e.pid, e.ts_ns) for e in body if isinstance(e, ProcessSample) and e.gpu_uuid == gpu]
        for _ in range(draw(st.integers(0, 12))):
            pid, start = (
                draw(st.sampled_from(mine))
                if mine and draw(st.integers(0, 3))
                else (draw(st.sampled_from(pids)), draw(ts))
            )
            start += draw(st.integers(0, 5 * NS))
            kernel = draw(st.sampled_from(["gemm", "ncclDevKernel_AllReduce", "Memcpy HtoD", "elementwise"]))
            body.append(
                KernelActivity(
                    node_id=node,
                    pid=pid,
                    name=kernel,
                    start_ns=start,
                    end_ns=start + draw(st.one_of(st.just(0), st.integers(1, 10**6), st.integers(1, 900 * NS))),
                    gpu_uuid=gpu,
                    device=0,
                    stream=draw(st.integers(0, 2)),
                    correlation_id=draw(st.integers(0, 20)),
                    category={"Memcpy HtoD": "memcpy", "ncclDevKernel_AllReduce": "communication"}.get(
                        kernel, "kernel"
                    ),
                )
            )
        for a in range(draw(st.integers(0, 3))):  # a scheduler's holds on the device, and the ends of some
            sharing = draw(st.sampled_from(SHARING_MODES))
            whole = sharing in ("exclusive", "mig")  # the whole device, or a share of it
            num, den = (1, 1) if whole else draw(st.sampled_from([(1, 1), (1, 4), (1, 3), (30, 100), (2, 7)]))
            t = draw(tenant)
            hold = Allocation(
                node_id=node,
                gpu_uuid=gpu,
                allocation_id=f"pod-{a}",
                ts_ns=draw(ts),
                sharing=sharing,
                fraction_num=num,
                fraction_den=den,
                team=t[0],
                env=t[1],
                sla=t[4],  # a tier: a held-only tenant is an SLA candidate (docs/definitions.md, "SLA tiers")
                labels=t[7],
            )
            body.append(hold)
            if draw(st.booleans()):
                body.append(hold.model_copy(update={"end_ts_ns": hold.ts_ns + draw(st.integers(1, 3600)) * NS}))
    for _ in range(draw(st.integers(0, 120))):
        addr = draw(
            st.one_of(st.integers(0, (1 << 16) - 1), st.integers(0, (1 << 32) - 1), st.integers(1 << 32, (1 << 64) - 1))
        )
        body.append(
            MemAccess(
                node_id=draw(st.sampled_from(["node-0", "node-1"])),
                pid=draw(st.sampled_from(pids)),
                ts_ns=draw(ts),
                address=addr,
            )
        )
    # re-sent events (a producer retry): never billed twice
    body += [body[i] for i in draw(st.lists(st.integers(0, len(body) - 1), max_size=6))] if body else []
    # arrival = event time + a delay; big delays make late events
    max_delay = draw(st.sampled_from([0, 60, 400, 3600])) * NS
    delays = [draw(st.integers(0, max_delay)) for _ in body]
    order = sorted(range(len(body)), key=lambda i: (body[i].ts_ns + delays[i], i))
    return head + [body[i] for i in order]
