"""Live kernel and range collection inside a Python process through NVIDIA's ``cupti-python``.

CUPTI hands activity records over in buffers through two callbacks; ``KernelRecords`` turns them into the
``kernel_activity`` and ``annotation_range`` wire objects (docs/collecting.md).  Why each choice:

- CONCURRENT_KERNEL, not KERNEL: plain KERNEL serialises the job's kernels and would change what we measure.
- RUNTIME records (DRIVER ones for work launched through the driver API, as Triton and cuBLAS do) carry the
  launching thread and the launch time under the kernel's correlation id; a range contains a kernel when it
  is open on that thread at that time, so the link is kept, not GPU-time overlap.
- Only the API calls that put work on a device are recorded (``launch_calls_only``): recording every call
  made a launch-bound PyTorch job 6.5 times slower on an H200 (``benchmarks/cupti_kinds.py``, BENCHMARKS.md).
  MARKER_DATA and NAME records are not enabled: nothing here reads them, and they cost 5 % on that job.
- Per record, the buffer callback does as little as it can, since the job's threads wait for the interpreter
  lock meanwhile (``cupti_records``, ``cupti_layout``).
- CUPTI timestamps are not epoch time: ``ClockOffset`` converts with the offset sampled at start; at stop
  it reports the drift.
- Memory is bounded: at most ``max_pending`` kernels wait for their runtime record (the rest go out unlinked,
  counted), open ranges likewise; launches awaiting their kernel are kept oldest-out (a host function's never
  comes).  No activity object outlives the callback: cupti-python's pin their buffer until freed.
- Nothing is dropped in silence: CUPTI's dropped-record count and every record we could not use are counted
  in ``stats``, which the command prints at exit.
"""

from __future__ import annotations

import ctypes
import dataclasses
import time
from collections.abc import Callable, Iterable
from typing import Any

from gpucost.producers.cupti_records import Identity, KernelRecords, Stats

__all__ = ["ClockOffset", "Collector", "Identity", "KernelRecords", "Stats"]

BUFFER_BYTES = 8 * 1024 * 1024
#: API calls whose records are kept: those that launch kernels or copies (host functions launch no device work)
LAUNCH_CALL_WORDS = ("Launch", "Memcpy", "Memset")
#: an API-call enumeration's bounds, not calls
NOT_CALLS = ("INVALID", "SIZE", "FORCE_INT")


@dataclasses.dataclass
class ClockOffset:
    """Epoch ns = CUPTI ns + ``offset_ns``, sampled as the midpoint of two wall-clock reads around CUPTI's."""

    offset_ns: int
    drift_ns: int = 0

    @staticmethod
    def sample(cupti_now: Callable[[], int], wall_now: Callable[[], int] = time.time_ns) -> int:
        before = wall_now()
        gpu = cupti_now()
        after = wall_now()
        return ClockOffset.of(before, gpu, after)

    @staticmethod
    def of(before: int, gpu: int, after: int) -> int:
        """The offset from CUPTI's reading ``gpu`` taken between the wall readings ``before`` and ``after``."""
        return (before + after) // 2 - gpu


def is_launch_call(name: str) -> bool:
    return any(word in name for word in LAUNCH_CALL_WORDS) and "HostFunc" not in name


def launch_calls_only(cupti: Any) -> int:
    """Stops the runtime and driver API records of every call that puts no work on a device; returns how many.

    An older cupti-python without the per-call switches keeps recording every call (slower, still correct).
    """
    off = 0
    for calls_name, switch_name in (
        ("runtime_api_trace_cbid", "activity_enable_runtime_api"),
        ("driver_api_trace_cbid", "activity_enable_driver_api"),
    ):
        calls, switch = getattr(cupti, calls_name, None), getattr(cupti, switch_name, None)
        if calls is None or switch is None:
            continue
        for call in calls:
            if call.name in NOT_CALLS or is_launch_call(call.name):
                continue
            try:
                switch(int(call), 0)
            except Exception:  # noqa: BLE001 — a call CUPTI will not switch stays recorded: slower, still right
                continue
            off += 1
    return off


def dropped_records(cupti: Any) -> int:
    """CUPTI's count of records lost for want of buffer space since the last call (global queue)."""
    dropped = ctypes.c_size_t(0)
    cupti.activity_get_num_dropped_records(0, 0, ctypes.addressof(dropped))
    return int(dropped.value)


class Collector:
    """Enables the activity kinds, hands each completed buffer to ``KernelRecords`` and ``sink``."""

    def __init__(
        self,
        cupti: Any,
        identity: Identity,
        sink: Callable[[Any], object],
        wall_now: Callable[[], int] = time.time_ns,
        text: bool = False,
        max_pending: int = 100_000,
    ) -> None:
        """``sink`` gets each batch as a list of wire objects, or with ``text`` as their JSON Lines in one str;
        ``max_pending`` bounds each table of records waiting for their other half (a kernel for its launch, a
        range's start for its end), so that a long run's memory stays bounded (``KernelRecords``)."""
        self._cupti, self._sink, self._wall_now, self._text = cupti, sink, wall_now, text
        kind = cupti.ActivityKind
        self._enabled = [kind.CONCURRENT_KERNEL, kind.RUNTIME, kind.DRIVER, kind.MARKER, kind.MEMCPY, kind.MEMSET]
        self._enabled.insert(0, kind.DEVICE)  # each device's UUID: device N is whichever GPU CUDA_VISIBLE_DEVICES gave
        names = {
            kind.DEVICE: "device",
            kind.CONCURRENT_KERNEL: "kernel",
            kind.MEMCPY: "memcpy",
            kind.MEMSET: "memset",
            kind.RUNTIME: "runtime",
            kind.DRIVER: "runtime",
            kind.MARKER: "marker",
        }
        self.stats = Stats()
        self._start_offset = ClockOffset.sample(cupti.get_timestamp, wall_now)
        # MARKER_END (CUPTI_ACTIVITY_FLAG_MARKER_END = 1 << 2) is an alias in cupti-python's enum, absent from
        # its stubs; the C header's value is the fallback
        flags = (int(cupti.ActivityFlag.MARKER_START), int(getattr(cupti.ActivityFlag, "MARKER_END", 1 << 2)))
        self.records = KernelRecords(
            identity,
            self._start_offset,
            {int(k): v for k, v in names.items()},
            flags,
            self.stats,
            max_pending=max_pending,
            layouts=cupti,
        )
        self._stopped = False

    def start(self) -> None:
        self._cupti.activity_register_callbacks(self._buffer_requested, self._buffer_completed)
        dump = getattr(self._cupti, "activity_enable_and_dump", None)  # devices CUDA met before CUPTI came
        for kind in self._enabled:
            (dump if dump is not None and kind == self._cupti.ActivityKind.DEVICE else self._cupti.activity_enable)(
                kind
            )
        self.stats.api_calls_unrecorded = launch_calls_only(self._cupti)

    def stop(self) -> Stats:
        """Flush CUPTI's buffers, emit what still waits, and count drops and clock drift; safe to call twice."""
        if self._stopped:
            return self.stats
        self._stopped = True
        self._cupti.activity_flush_all(int(self._cupti.ActivityFlag.FLUSH_FORCED))  # incomplete buffers too
        for kind in self._enabled:
            self._cupti.activity_disable(kind)
        self.stats.dropped_by_cupti += dropped_records(self._cupti)
        self.stats.clock_drift_ns = ClockOffset.sample(self._cupti.get_timestamp, self._wall_now) - self._start_offset
        self._emit(self.records.finish())
        return self.stats

    @staticmethod
    def _buffer_requested() -> tuple[int, int]:
        return BUFFER_BYTES, 0  # 0: as many records as fit

    def _buffer_completed(self, activities: Iterable[Any]) -> None:
        rows = self.records.add(activities)
        if rows:
            self._emit(rows)

    def _emit(self, rows: list[tuple[Any, ...]]) -> None:
        self._sink(self.records.lines(rows) if self._text else self.records.objects(rows))
