"""A profiler's kernels replayed after the samples of their time (late, within the revision horizon) against the
same kernels in time order, in one run (issue 38): seconds and kernel cost records of each.

``python -m benchmarks.late_kernels --kernels 250 1000 10000`` feeds one GPU's samples (a GPU sample and a sample
of one bound process a minute, eight minutes: ``tests.support.kernel_fleet``) and ``N`` kernels of 0.5 s on two
streams, three names, all in the second minute, through ``Auditor.update`` and ``finish``: once with the kernels
after every sample (the pane has closed: each is late), once with each kernel placed at its start. A JSON line per
size. Late kernels were one revision of the pane each (O(N²) records and time); they are now gathered into one
revision of each pane.
"""

from __future__ import annotations

import argparse
import json
import time

from gpucost.schemas.events import Event
from gpucost.schemas.records import KernelCostRecord
from gpucost.streams.audit import Auditor
from gpucost.streams.settings import AuditSettings
from tests.support.kernel_fleet import fleet, kernel


def kernels(n: int) -> list[Event]:
    """``n`` kernels of 0.5 s in the second pane, on two streams a quarter second apart, of three names."""
    starts = [60 + (i % 50) + 0.25 * (i % 2) for i in range(n)]
    return [kernel(s, s + 0.5, f"k{i % 3}", stream=i % 2, corr=i) for i, s in enumerate(starts)]


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
        samples, late = fleet(8), kernels(n)
        late_s, late_records = replay(samples + late)
        on_s, on_records = replay(samples[:2] + sorted(samples[2:] + late, key=lambda e: e.ts_ns))
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
