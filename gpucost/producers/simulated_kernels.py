"""The simulated fleet's kernels (``gpucost.producers.simulate``): a profiler on each GPU's jobs for ten minutes of
every eight hours (GPU by GPU at other times), as a team profiles a few steps of a long run (docs/definitions.md,
"Kernel cost in the pipeline").

Each profiled tick, each running job launches a few kernels (a GEMM, an NCCL all-reduce, a copy, an elementwise
kernel) on two streams, some overlapping, some running past the tick and its pane. A profiler's buffers reach the
pipeline in batches: most arrive with the tick, one batch in twenty ten to twenty minutes late, past the lateness and
within the default revision horizon, so that the fleet's kernel lines are revised. The draws come from a generator of
their own, so that every other event of the fleet is as it was without kernels.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import numpy as np

from gpucost.schemas.kernels import KernelActivity

__all__ = ["KERNELS", "PROFILE_EVERY_NS", "PROFILE_NS", "Profiler"]

NS = 1_000_000_000
PROFILE_EVERY_NS = 8 * 3600 * NS
PROFILE_NS = 10 * 60 * NS
#: (name, category, range path) of the kernels a job launches: the ranges a training step opens around them (an
#: annotated job's; one job in three is not annotated, and its kernels carry no path)
KERNELS = (
    ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_tn", "kernel", ("train_step", "forward")),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "communication", ("train_step", "backward", "all_reduce")),
    ("Memcpy HtoD (Pageable -> Device)", "memcpy", ("dataloader",)),
    ("vectorized_elementwise_kernel", "kernel", ("train_step",)),
)


class _Job(Protocol):
    pid: int


class Profiler:
    """One GPU's profiler: its kernels tick by tick, and each batch's delay."""

    def __init__(self, seed: int, index: int, node_id: str, gpu_uuid: str, start_ns: int) -> None:
        self.rng = np.random.default_rng([seed, index, 38])
        # GPU i's profile starts 17·i minutes into each eight hours: an hour's fleet of four GPUs has a profile
        self.node_id, self.gpu_uuid, self.start_ns = node_id, gpu_uuid, start_ns + index * 17 * 60 * NS
        self.index = index
        self.correlation = 0

    def tick(self, ts_ns: int, interval_ns: int, jobs: Iterable[_Job]) -> list[KernelActivity]:
        """The kernels the tick's running ``jobs`` launch, if the profiler is on at ``ts_ns``."""
        if (ts_ns - self.start_ns) % PROFILE_EVERY_NS >= PROFILE_NS:
            return []
        rng, out = self.rng, []
        for job in jobs:
            for i in range(int(rng.integers(1, 5))):
                name, category, path = KERNELS[int(rng.integers(0, len(KERNELS)))]
                start = ts_ns + int(rng.integers(0, interval_ns))
                self.correlation += 1
                out.append(
                    KernelActivity(
                        node_id=self.node_id,
                        pid=job.pid,
                        name=name,
                        start_ns=start,
                        end_ns=start + int(rng.integers(10_000, max(10_001, interval_ns * 2 // 3))),
                        source="cupti",
                        gpu_uuid=self.gpu_uuid,
                        device=self.index % 8,
                        stream=7 + 6 * (i % 2),
                        correlation_id=self.correlation,
                        category=category,
                        range_path=path if job.pid % 3 else None,
                    )
                )
        return out

    def delay_ns(self) -> int:
        """A buffer's delay past its tick: one in twenty ten to twenty minutes, the rest none."""
        return int(self.rng.integers(600, 1200)) * NS if self.rng.random() < 0.05 else 0
