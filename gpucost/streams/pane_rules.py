"""The rules of a pane, each once, for the row entry (``gpucost.streams.panes``) and the batch entry
(``gpucost.streams.pane_batch``) of ``GpuPanes``, and for the batch path's cuts (``gpucost.streams.columnar``):
which pane a time falls in, when a pane has closed (so an event in it is late), when a sample overlaps
another of its device, how a GPU's largest time moves (``jump``).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np

from gpucost.schemas.partitions import device_share

__all__ = [
    "KINDS",
    "GPU",
    "PROC",
    "NUMA",
    "TRACE",
    "NO_TS",
    "pane_start_ns",
    "pane_closed",
    "last_pane_ns",
    "overlaps",
    "first_name",
    "first_model",
    "model_order",
    "still_pending",
    "jump",
    "gpu_sums",
    "process_sums",
    "numa_sum",
    "who_code",
    "energy_uj",
]

#: the kinds of event a pane counts, by their code in ``PaneRows.kind`` (traces move no watermark:
#: docs/definitions.md, "Time, panes and watermarks")
KINDS = ("gpu_sample", "process_sample", "numa_event", "ebpf_trace")
GPU, PROC, NUMA, TRACE = range(len(KINDS))
NO_TS = np.iinfo(np.int64).min  # no time yet


def pane_start_ns(ts_ns: Any, pane_ns: int) -> Any:
    """Start of the epoch-aligned pane holding ``ts_ns``; of an int, or elementwise of an int64 array."""
    return ts_ns - ts_ns % pane_ns


def last_pane_ns(start_ns: Any, end_ns: Any, pane_ns: int) -> Any:
    """Start of the last pane an interval ``[start_ns, end_ns)`` touches (a kernel's, docs/definitions.md,
    "Kernel cost in the pipeline"): its last instant's, or its start's for one of length 0. It touches every
    pane from its start's to this one. Of ints, or elementwise of int64 arrays (the clamp is a product, not
    ``max``, so that both read it alike)."""
    first = pane_start_ns(start_ns, pane_ns)
    beyond = (end_ns - first - 1) // pane_ns  # whole panes past the first that its last instant lies in
    return first + pane_ns * (beyond * (beyond > 0))


def pane_closed(ts_ns: Any, max_ts_ns: Any, pane_ns: int, lateness_ns: int) -> Any:
    """Whether the pane holding ``ts_ns`` has closed once its GPU's largest time is ``max_ts_ns``: its end at
    or before the watermark, ``max_ts_ns − lateness_ns`` (docs/definitions.md, "Time, panes and watermarks").
    An event in it is late. Of ints, or elementwise of int64 arrays; written with additions only, so that
    a "no time yet" far below every time (``NO_TS``) never wraps around."""
    return ts_ns - ts_ns % pane_ns + pane_ns + lateness_ns <= max_ts_ns


def overlaps(gap_ns: Any, interval_ms: Any) -> Any:
    """Whether a sample ``gap_ns`` from an accepted one of its device lies closer than three quarters of
    its own interval (docs/definitions.md, "Inputs and what is refused": one sampler per device): a second
    sampler's, which would bill the
    device's time twice. Exact in integers: 4·gap < 3·interval; of ints, or elementwise of int64 arrays."""
    return 4 * gap_ns < 3_000_000 * interval_ms


def first_name(current: str | None, value: str) -> str:
    """The name a pane keeps: order-independent if a GPU ever reported two names within one pane."""
    return value if current is None or value < current else current


def model_order(gpu_model: str) -> tuple[Fraction, str]:
    """The order by which a pane, and a health window, keeps the first of the models its GPU reported in it: the
    smallest share of a device first, then the text (``gpucost.schemas.partitions``). A GPU reports one model; two
    in one pane are a partition count that changed within it (a mode switch) or a forged sample, and by text
    ``MI300X`` would come before ``MI300X 1/8`` and bill the partition's whole pane as the whole device. The smaller
    share bills the pane no more than either reading claims (docs/definitions.md, "Partitions"). A total order, so
    order-independent: each path, and a revision, keeps the same one."""
    return device_share(gpu_model)[1], gpu_model


def first_model(current: str | None, value: str) -> str:
    """``first_name`` of a pane's GPU model, by ``model_order``."""
    return value if current is None or model_order(value) < model_order(current) else current


def jump(max_ts: int | None, pending: int | None, ts_ns: int, max_jump_ns: int) -> tuple[int | None, int | None]:
    """A GPU's largest ``ts_ns`` and pending jump after it takes an accepted event at ``ts_ns``.

    One bad clock reading must not close every pane up to it (an hour-early sample once made the
    next 1,428 events of its GPU late). So an event more than ``max_jump_ns`` ahead of the largest is
    counted in its pane but only held, as the pending jump; a second such event confirms it: the
    largest becomes the nearer of the two, and the further stays pending if it is still a jump from
    there. A pending jump the largest has caught up with is dropped (``still_pending``), here too (a state
    written before ``GpuPanes.close_silent`` dropped it)."""
    pending = still_pending(max_ts, pending)
    if max_ts is not None and ts_ns > max_ts + max_jump_ns:
        if pending is None:
            return max_ts, ts_ns
        near, far = sorted((pending, ts_ns))
        if far - near > max_jump_ns:
            return near, far
        return far, None
    max_ts = ts_ns if max_ts is None else max(max_ts, ts_ns)
    return max_ts, still_pending(max_ts, pending)


def still_pending(max_ts: int | None, pending: int | None) -> int | None:
    """A GPU's pending jump while its largest ``ts_ns`` is below it; None once the largest has caught up with it (an
    event, or a silent close that moves the largest: kept below it, the next jump took it as the largest, the
    watermark moved back, and a pane already billed opened and was billed again)."""
    return None if pending is None or (max_ts is not None and pending <= max_ts) else pending


def gpu_sums(interval_ms: Any, sm_cp: Any, power_mw: Any, idle_threshold_cp: int) -> tuple[Any, Any, Any, Any]:
    """What one GPU sample adds to its pane (docs/definitions.md, "Idle index" and "Cost split"): covered ms,
    idle ms (its whole interval when its SM utilisation is below the idle threshold), busy (sm_util_cp · ms)
    and energy (power_mw · ms, µJ). Of ints, or elementwise of integer arrays: the row entry, the batch entry
    and the revision log all take a pane's sums from here."""
    return interval_ms, interval_ms * (sm_cp < idle_threshold_cp), sm_cp * interval_ms, energy_uj(power_mw, interval_ms)


def energy_uj(power_mw: Any, interval_ms: Any) -> Any:
    """What one GPU sample adds to its pane's energy: power_mw · ms, in µJ (of ints or of integer arrays)."""
    return power_mw * interval_ms


def process_sums(interval_ms: Any, sm_cp: Any, bw_cp: Any) -> tuple[Any, Any]:
    """What one process sample adds to its tenant's sums in the pane: sm_util_cp · ms and mem_bw_util_cp · ms."""
    return sm_cp * interval_ms, bw_cp * interval_ms


def numa_sum(hops: Any, latency_weight: Any) -> Any:
    """What one NUMA event adds to its tenant's sum in the pane: hops · latency_weight."""
    return hops * latency_weight


def who_code(gpu: Any, code: Any, pid: Any) -> Any:
    """(GPU, kind, pid) in one integer, of ints or of int64 arrays: 2 bits of kind, 33 of pid + 1, and the
    GPU's index above (a batch holds far fewer than the 2^28 GPUs that would overflow)."""
    return (gpu << 35) | (code << 33) | (pid + 1)
