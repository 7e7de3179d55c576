"""What the allocation sources' tests share (tests/test_kubernetes_allocations.py, tests/test_slurm_allocations.py):
a pane-aligned clock, GPU samples every 10 s, the allocations a poll sent, and the auditor's bill of a run."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from gpucost.schemas.events import Allocation, Event, GpuSample, Price
from gpucost.schemas.records import AllocationRecord, Output
from gpucost.streams.audit import Auditor
from gpucost.streams.settings import AuditSettings

__all__ = ["END", "PANE", "S", "T0", "audited", "by_party", "polled", "samples", "steady"]

S = 10**9
PANE = 60 * S
T0 = 1_780_000_000 * S - (1_780_000_000 * S) % PANE
END = T0 + 4 * PANE


def samples(node: str, gpus: tuple[str, ...], changes: dict[int, Callable[[], None]]) -> Iterator[Event]:
    """Every 10 s until ``END``, one sample of each GPU; at a time in ``changes``, what the node runs changes first."""
    for t in range(T0, END, 10 * S):
        if t in changes:
            changes[t]()
        for gpu in gpus:
            yield GpuSample(
                node_id=node,
                gpu_uuid=gpu,
                gpu_model="H100",
                ts_ns=t,
                interval_s=10.0,
                sm_util_pct=40.0,
                mem_bw_util_pct=20.0,
                power_w=300,
                mem_used_bytes=1,
                mem_total_bytes=2,
                temp_c=50,
            )


def polled(events: list[Event]) -> list[tuple[int, Allocation]]:
    """Each allocation with the time of the poll that sent it (the GPU event right after it)."""
    out, pending = [], []
    for e in events:
        if isinstance(e, Allocation):
            pending.append(e)
        else:
            out += [(e.ts_ns, a) for a in pending]
            pending = []
    return out


def audited(events: list[Event]) -> list[Output]:
    auditor = Auditor(AuditSettings())
    price = Price(gpu_model="H100", ts_ns=T0 - 3600 * S, usd_per_gpu_hour="3.1415")
    return [r for e in [price, *events] for r in auditor.update(e)] + auditor.finish()


def by_party(out: list[Output]) -> dict[tuple[str, int, str], int]:
    return {
        (r.gpu_uuid, r.pane_start_ns, r.tenant_key): r.cost_micro_usd for r in out if isinstance(r, AllocationRecord)
    }


def steady(gpu: str, ts_ns: int, step_s: int = 10) -> GpuSample:
    """A sample of a device of model ``M`` at half its SMs over the ``step_s`` before ``ts_ns``: the allocation basis
    tests' device, whose cost each hold splits."""
    return GpuSample(
        node_id="n1",
        gpu_uuid=gpu,
        gpu_model="M",
        ts_ns=ts_ns,
        interval_s=float(step_s),
        sm_util_pct=50.0,
        mem_bw_util_pct=10.0,
        power_w=100,
        mem_used_bytes=1,
        mem_total_bytes=2,
        temp_c=40,
    )
