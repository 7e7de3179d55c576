"""A profiler's kernels replayed after the samples of their time (late, within the revision horizon) against the
same kernels in time order, in one run (issue 38): seconds and kernel cost records of each.

``python -m benchmarks.late_kernels --kernels 250 1000 10000`` feeds one GPU's samples (a GPU sample and a sample
of one bound process a minute, eight minutes) and ``N`` kernels of 0.5 s on two streams, three names, all in the
second minute, through ``Auditor.update`` and ``finish``: once with the kernels after every sample (the pane has
closed: each is late), once with each kernel placed at its start. A JSON line per size. Late kernels were one
revision of the pane each (O(N²) records and time); they are now gathered into one revision of each pane.
"""

from __future__ import annotations

import argparse
import json
import time
from decimal import Decimal

from gpucost.schemas.events import Event, GpuSample, Price, ProcessSample, TenantBinding
from gpucost.schemas.kernels import KernelActivity
from gpucost.schemas.records import KernelCostRecord
from gpucost.streams.audit import Auditor
from gpucost.streams.settings import AuditSettings

NS = 10**9
BASE_NS = 1_767_571_200 * NS
PANE_NS = 60 * NS


def samples(panes: int) -> list[Event]:
    out: list[Event] = [
        Price(gpu_model="H100", ts_ns=BASE_NS - 3600 * NS, usd_per_gpu_hour=Decimal("3.6")),
        TenantBinding(node_id="n", pid=1, ts_ns=BASE_NS, team="a", env="prod", app="x", tier="t", sla="Gold"),
    ]
    for p in range(panes):
        at = BASE_NS + p * PANE_NS
        out += [
            GpuSample(
                node_id="n",
                gpu_uuid="GPU-0",
                gpu_model="H100",
                ts_ns=at,
                interval_s=60.0,
                sm_util_pct=100.0,
                mem_bw_util_pct=0.0,
                mem_used_bytes=1,
                mem_total_bytes=2,
                power_w=100.0,
                temp_c=40.0,
            ),
            ProcessSample(
                node_id="n",
                gpu_uuid="GPU-0",
                pid=1,
                ts_ns=at + 1,
                interval_s=60.0,
                sm_util_pct=100.0,
                mem_bw_util_pct=0.0,
                mem_used_bytes=1,
            ),
        ]
    return out


def kernels(n: int) -> list[Event]:
    """``n`` kernels of 0.5 s in the second pane, on two streams a quarter second apart, of three names."""
    out: list[Event] = []
    for i in range(n):
        start = BASE_NS + PANE_NS + (i % 50) * NS + (i % 2) * NS // 4
        out.append(
            KernelActivity(
                node_id="n",
                pid=1,
                name=f"k{i % 3}",
                start_ns=start,
                end_ns=start + NS // 2,
                gpu_uuid="GPU-0",
                device=0,
                stream=i % 2,
                correlation_id=i,
                category="kernel",
            )
        )
    return out


def replay(events: list[Event]) -> tuple[float, int]:
    auditor = Auditor(AuditSettings(pane_s=60))
    start = time.perf_counter()
    out = [o for e in events for o in auditor.update(e)] + auditor.finish()
    return time.perf_counter() - start, sum(isinstance(r, KernelCostRecord) for r in out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--kernels", type=int, nargs="+", default=[250, 1000, 10000])
    args = p.parse_args()
    for n in args.kernels:
        fleet, late = samples(8), kernels(n)
        late_s, late_records = replay(fleet + late)
        on_s, on_records = replay(fleet[:2] + sorted(fleet[2:] + late, key=lambda e: e.ts_ns))
        print(
            json.dumps(
                {
                    "kernels": n,
                    "late_s": round(late_s, 3),
                    "late_records": late_records,
                    "in_order_s": round(on_s, 3),
                    "in_order_records": on_records,
                    "late_over_in_order": round(late_s / on_s, 2),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
