"""The kernels of a batch, taken where the row path takes them without cutting the batch (issue 39).

Why: one profiler buffer in twenty comes minutes late, so its kernels revise closed panes; each used to cut the
batch (``gpucost.streams.columnar.revising_rows``), and a cut costs the batch path's fixed work for a short stretch
(a replay of a profiled fleet paid about half its time for them, BENCHMARKS.md, benchmark 1).

A kernel moves no watermark and changes nothing but the kernel lines of the panes it joins, so where the row path
takes it is decided by its GPU's watermark at its row, read from the batch's verdicts (``GpuPanes.judge_many``),
and what it does can be replayed in row order once the batch's closes are done:

- **On time** at its row (its first pane open; every later one then is too): it joins open panes, which close
  only at later rows, so the batch takes it before its closes, as it takes an on-time kernel that
  ``revising_rows`` cleared.
- **Late**, all its panes closed at its row: nothing else in the batch changes those panes (a row that could, a
  late sample, binding or allocation, cut it), so after the closes the kernel is judged by the watermark at its
  row (``Auditor.late_kernel``) and joins them, pending; a GPU's pending panes are republished at its next
  sample, process sample or NUMA event that decodes, before that row's outputs (``LateData.settle_kernels``),
  every late kernel before that row included and none after, as the row path does. The panes left pending
  before the batch settle the same way, at their GPU's first such row.
- **Late at its start and on time at its end** (a kernel over a pane's boundary): ``revising_rows`` cuts the
  batch there, judging by watermarks at or above the true ones; a kernel of one pane it lets through is one of
  the two above whichever the true watermark says.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gpucost.schemas.kernels import KernelActivity
from gpucost.streams.pane_rules import NO_TS, pane_closed
from gpucost.streams.pane_totals import PaneRows, Verdicts
from gpucost.streams.row_path import RowPath

__all__ = ["KernelPlan", "plan_kernels"]


@dataclass
class KernelPlan:
    """Where a batch's kernels go: ``on_time`` (row, kernel), taken before the closes; ``late`` (row, kernel, its
    GPU's watermark at that row), taken after them in row order; ``settles``, each row at which a GPU's pending
    panes are republished before its outputs, and that GPU."""

    on_time: list[tuple[int, KernelActivity]] = field(default_factory=list)
    late: list[tuple[int, KernelActivity, int | None]] = field(default_factory=list)
    settles: dict[int, str] = field(default_factory=dict)

    def rows(self) -> list[int]:
        """The rows whose outputs the late kernels and the settles place: the closes' blocks are cut there."""
        return [*(i for i, _, _ in self.late), *self.settles]

    def in_order(self) -> list[tuple[int, KernelActivity | str, int | None]]:
        """The late kernels and the settles by row: (row, kernel and its watermark, or the GPU settled, None)."""
        steps: list[tuple[int, KernelActivity | str, int | None]] = [*self.late]
        steps += [(row, gpu, None) for row, gpu in self.settles.items()]
        return sorted(steps, key=lambda s: s[0])


def plan_kernels(
    auditor: RowPath,
    kernels: list[tuple[int, KernelActivity]],
    rows: PaneRows,
    verdicts: Verdicts,
    keyed: np.ndarray,
    gpu: np.ndarray,
    gpu_names: list[str],
) -> KernelPlan:
    """Where the batch's ``kernels`` (by row, each valid) go, given the batch's GPU-keyed ``rows`` and their
    ``verdicts``, and its rows of a sample, process sample or NUMA event that decodes (``keyed``), each GPU's as
    its code in ``gpu`` into ``gpu_names``; read before the batch changes the ``auditor``'s state."""
    plan = KernelPlan()
    pane_ns, lateness_ns = auditor.settings.pane_ns, auditor.settings.lateness_ns
    codes = {name: code for code, name in enumerate(gpu_names)}
    found: dict[str, np.ndarray] = {}

    def keyed_of(name: str) -> np.ndarray:
        if (rows_of := found.get(name)) is None:
            rows_of = found[name] = np.flatnonzero(keyed & (gpu == codes.get(name, -2)))
        return rows_of

    spans = {name: (int(lo), int(hi)) for name, lo, hi in zip(rows.names, rows.starts, rows.ends)}
    for i, k in kernels:
        lo, hi = spans.get(k.gpu_uuid, (0, 0))
        before = int(np.searchsorted(rows.row[lo:hi], i))  # the GPU's rows that came before the kernel
        if before:  # the GPU's largest time at the kernel's row, as the batch's verdicts count it
            high: int | None = int(verdicts.high[lo + before - 1])
            high = None if high == NO_TS else high
        else:  # as the state holds it before the batch (a forgotten GPU's, too)
            held = auditor.panes.watermark(k.gpu_uuid)
            high = None if held is None else held + lateness_ns
        if high is None or not pane_closed(k.start_ns, high, pane_ns, lateness_ns):
            plan.on_time.append((i, k))
            continue
        plan.late.append((i, k, high - lateness_ns))
        after = keyed_of(k.gpu_uuid)
        if (nxt := int(np.searchsorted(after, i))) < len(after):
            plan.settles[int(after[nxt])] = k.gpu_uuid
    for name in auditor.kernel_revisions_pending():
        if len(first := keyed_of(name)):
            plan.settles[int(first[0])] = name
    return plan
