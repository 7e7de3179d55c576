"""Live kernel and range collection inside a Python process through NVIDIA's ``cupti-python``.

CUPTI hands activity records over in buffers through two callbacks; ``KernelRecords`` turns them into the
``kernel_activity`` and ``annotation_range`` wire objects (docs/collecting.md).  Why each choice:

- CONCURRENT_KERNEL, not KERNEL: plain KERNEL serialises the job's kernels and would change what we measure.
- RUNTIME records (DRIVER ones for work launched through the driver API, as Triton and cuBLAS do) carry the
  launching thread and the launch time under the kernel's correlation id; a range contains a kernel when it
  is open on that thread at that time, so the link is kept, not GPU-time overlap.
- Only the API calls that put work on a device are recorded (``launch_calls_only``): recording every call
  (``cudaGetDevice`` and the like) made a launch-bound PyTorch job 6.5 times slower on an H200, and NVTX
  markers on top of it 13 times; with launches alone the same job ran within its run-to-run noise
  (``benchmarks/cupti_kinds.py``, BENCHMARKS.md).  MARKER_DATA and NAME records are not enabled: nothing
  here reads them, and they cost 5 % on that job.
- CUPTI timestamps are not epoch time: ``ClockOffset`` samples both clocks at start and at stop, converts
  with the start offset and reports the drift between the two.
- Memory is bounded: kernels wait for their runtime record at most ``max_pending`` at a time (the rest go
  out unlinked and are counted), open ranges likewise, and launch records waiting for their kernel are kept
  oldest-out (a launch whose work never comes, a host function say, must not block later ones); CUPTI owns
  and recycles the buffers.
- Nothing is dropped in silence: CUPTI's dropped-record count and every record we could not use are counted
  in ``stats``, which the command prints at exit.
"""

from __future__ import annotations

import ctypes
import dataclasses
import time
from collections.abc import Callable, Iterable
from typing import Any

MAX_NAME_CHARS = 1024
NCCL_PREFIXES = ("ncclKernel", "ncclDevKernel")
BUFFER_BYTES = 8 * 1024 * 1024
DEFAULT_DOMAIN = "default"
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
        return (before + after) // 2 - gpu


@dataclasses.dataclass
class Stats:
    kernels: int = 0
    ranges: int = 0
    unlinked_kernels: int = 0
    truncated_names: int = 0
    dropped_by_cupti: int = 0
    unmatched_range_ends: int = 0
    open_ranges_at_exit: int = 0
    bad_records: int = 0
    clock_drift_ns: int = 0
    api_calls_unrecorded: int = 0


@dataclasses.dataclass(frozen=True)
class Identity:
    """Where the records come from: the node, the process, and each device index's GPU UUID where known."""

    node_id: str
    pid: int
    gpu_uuids: dict[int, str] = dataclasses.field(default_factory=dict)

    def gpu_uuid(self, device: int) -> str:
        return self.gpu_uuids.get(device, f"{self.node_id}/{device}")


def category_of(kind: str, name: str) -> str:
    if kind != "kernel":
        return kind
    return "communication" if name.startswith(NCCL_PREFIXES) else "kernel"


class KernelRecords:
    """Turns CUPTI activity records (any order, any buffer boundaries) into wire objects.

    ``kinds`` maps CUPTI's ActivityKind members to our names, so the same code serves the real module and
    the stand-in the tests use.
    """

    def __init__(
        self,
        identity: Identity,
        offset_ns: int,
        kinds: dict[int, str],
        marker_flags: tuple[int, int],
        stats: Stats,
        max_pending: int = 100_000,
    ) -> None:
        self._id, self._offset_ns, self._kinds, self.stats = identity, offset_ns, kinds, stats
        self._start_flag, self._end_flag = marker_flags
        self._max_pending = max_pending
        self._launches: dict[int, tuple[int, int]] = {}  # correlation id → (tid, launch cupti ns), awaited
        self._pending: dict[int, dict[str, Any]] = {}  # correlation id → kernel awaiting its launch
        self._open: dict[int, tuple[str, str, int, int]] = {}  # marker id → (domain, name, tid, start ns)
        self._early_ends: dict[int, int] = {}  # marker id → end ns, for an end delivered before its start

    def add(self, records: Iterable[Any]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for record in records:
            try:
                self._one(record, out)
            except (AttributeError, TypeError, ValueError):
                self.stats.bad_records += 1
        return out

    def finish(self) -> list[dict[str, Any]]:
        """At exit: kernels whose launch never came go out unlinked; ranges never closed are counted."""
        out = list(self._pending.values())
        self.stats.unlinked_kernels += len(out)
        self.stats.open_ranges_at_exit += len(self._open)
        self.stats.unmatched_range_ends += len(self._early_ends)
        self._early_ends.clear()
        self._pending.clear()
        self._open.clear()
        self._launches.clear()
        return out

    def _epoch(self, cupti_ns: int) -> int:
        return int(cupti_ns) + self._offset_ns

    def _one(self, record: Any, out: list[dict[str, Any]]) -> None:
        kind = self._kinds.get(int(record.kind))
        if kind in ("kernel", "memcpy", "memset"):
            self._device_work(kind, record, out)
        elif kind == "runtime":
            corr = int(record.correlation_id)
            kernel = self._pending.pop(corr, None)
            if kernel is not None:
                kernel["launch_tid"], kernel["launch_ns"] = int(record.thread_id), self._epoch(record.start)
                out.append(kernel)
            else:
                if len(self._launches) >= self._max_pending:
                    del self._launches[next(iter(self._launches))]  # oldest out
                self._launches[corr] = (int(record.thread_id), int(record.start))
        elif kind == "marker":
            self._marker(record, out)

    def _device_work(self, kind: str, record: Any, out: list[dict[str, Any]]) -> None:
        start, end = self._epoch(record.start), self._epoch(record.end)
        if end < start:
            self.stats.bad_records += 1
            return
        name = str(getattr(record, "name", None) or kind)
        if len(name) > MAX_NAME_CHARS:
            name = name[:MAX_NAME_CHARS]
            self.stats.truncated_names += 1
        device = int(record.device_id)
        obj: dict[str, Any] = {
            "kind": "kernel_activity",
            "node_id": self._id.node_id,
            "pid": self._id.pid,
            "gpu_uuid": self._id.gpu_uuid(device),
            "device": device,
            "stream": int(record.stream_id),
            "correlation_id": int(record.correlation_id),
            "category": category_of(kind, name),
            "name": name,
            "start_ns": start,
            "end_ns": end,
            "source": "cupti",
        }
        if kind == "kernel":
            obj["grid"] = [int(record.grid_x), int(record.grid_y), int(record.grid_z)]
            obj["block"] = [int(record.block_x), int(record.block_y), int(record.block_z)]
            obj["registers_per_thread"] = int(record.registers_per_thread)
            obj["shared_memory_bytes"] = int(record.static_shared_memory) + int(record.dynamic_shared_memory)
        else:
            obj["bytes"] = int(record.bytes)
        self.stats.kernels += 1
        launch = self._launches.pop(obj["correlation_id"], None)
        if launch is not None:
            obj["launch_tid"], obj["launch_ns"] = launch[0], self._epoch(launch[1])
            out.append(obj)
        elif len(self._pending) < self._max_pending:
            self._pending[obj["correlation_id"]] = obj
        else:
            self.stats.unlinked_kernels += 1
            out.append(obj)

    def _marker(self, record: Any, out: list[dict[str, Any]]) -> None:
        flags, marker_id = int(record.flags_), int(record.id)
        if flags & self._start_flag:
            tid = int(record.object_id.pt.thread_id)
            opened = (str(record.domain or "") or DEFAULT_DOMAIN, str(record.name or ""), tid, int(record.timestamp))
            end = self._early_ends.pop(marker_id, None)
            if end is not None:
                self._range(opened, end, out)
            elif len(self._open) < self._max_pending:
                self._open[marker_id] = opened
            else:
                self.stats.open_ranges_at_exit += 1
        elif flags & self._end_flag:  # instantaneous markers carry no duration, so no money
            start = self._open.pop(marker_id, None)
            if start is not None:
                self._range(start, int(record.timestamp), out)
            elif len(self._early_ends) < self._max_pending:
                self._early_ends[marker_id] = int(record.timestamp)
            else:
                self.stats.unmatched_range_ends += 1

    def _range(self, opened: tuple[str, str, int, int], end: int, out: list[dict[str, Any]]) -> None:
        domain, name, tid, start = opened
        self.stats.ranges += 1
        out.append(
            {
                "kind": "annotation_range",
                "node_id": self._id.node_id,
                "pid": self._id.pid,
                "tid": tid,
                "domain": domain,
                "name": name[:MAX_NAME_CHARS],
                "start_ns": self._epoch(start),
                "end_ns": self._epoch(end),
                "source": "cupti",
            }
        )


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
        sink: Callable[[list[dict[str, Any]]], None],
        wall_now: Callable[[], int] = time.time_ns,
    ) -> None:
        self._cupti, self._sink, self._wall_now = cupti, sink, wall_now
        kind = cupti.ActivityKind
        self._enabled = [kind.CONCURRENT_KERNEL, kind.RUNTIME, kind.DRIVER, kind.MARKER, kind.MEMCPY, kind.MEMSET]
        names = {
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
            identity, self._start_offset, {int(k): v for k, v in names.items()}, flags, self.stats
        )
        self._stopped = False

    def start(self) -> None:
        self._cupti.activity_register_callbacks(self._buffer_requested, self._buffer_completed)
        for kind in self._enabled:
            self._cupti.activity_enable(kind)
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
        self._sink(self.records.finish())
        return self.stats

    @staticmethod
    def _buffer_requested() -> tuple[int, int]:
        return BUFFER_BYTES, 0  # 0: as many records as fit

    def _buffer_completed(self, activities: Iterable[Any]) -> None:
        batch = self.records.add(activities)
        if batch:
            self._sink(batch)
