"""The straightforward conversion the collector used before its fast path: one dict per record, ``int()`` on
every field.  Kept as the reference the fast path must equal record for record (tests/test_cupti.py) and as
the "before" of ``benchmarks/cupti_convert.py``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from uuid import UUID

from gpucost.producers.cupti_records import (
    DEFAULT_DOMAIN,
    MAX_NAME_CHARS,
    MAX_RANGE_DEPTH,
    UNNAMED_RANGE,
    Identity,
    Stats,
    category_of,
)


class ReferenceRecords:
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
        #: correlation id → (tid, launch cupti ns, the names of the ranges open then), awaited
        self._launches: dict[int, tuple[int, int, list[str]]] = {}
        self._pending: dict[int, dict[str, Any]] = {}  # correlation id → kernel awaiting its launch
        self._open: dict[int, tuple[str, str, int, int]] = {}  # marker id → (domain, name, tid, start ns)
        self._early_ends: dict[int, int] = {}  # marker id → end ns, for an end delivered before its start
        self._uuids: dict[int, str] = {}  # devices named by a DEVICE record

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
            corr, tid, start = int(record.correlation_id), int(record.thread_id), int(record.start)
            # every range begun on the thread by the launch and not yet ended, the earliest begun first
            path = [
                name[:MAX_NAME_CHARS].encode("utf-8", "replace").decode() or UNNAMED_RANGE
                for _, name, t, begun in sorted(self._open.values(), key=lambda o: (o[3], o[1][:MAX_NAME_CHARS]))
                if t == tid and begun <= start
            ][:MAX_RANGE_DEPTH]
            kernel = self._pending.pop(corr, None)
            if kernel is not None:
                kernel["launch_tid"], kernel["launch_ns"] = tid, self._epoch(start)
                if path:
                    kernel["range_path"] = path
                out.append(kernel)
            else:
                if len(self._launches) >= self._max_pending:
                    del self._launches[next(iter(self._launches))]  # oldest out
                self._launches[corr] = (tid, start, path)
        elif kind == "marker":
            self._marker(record, out)
        elif kind == "device":  # the kernels read after it are on the GPU CUDA names (Python's uuid writes it)
            mig = bool(record.is_mig_enabled)
            raw = record.mig_uuid if mig else record.uuid
            uuid = UUID(bytes=bytes(getattr(raw, "bytes", raw)))  # bytes, or cuda.bindings' CUuuid holding them
            self._uuids[int(record.id)] = f"{'MIG' if mig else 'GPU'}-{uuid}"

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
            "gpu_uuid": self._uuids.get(device) or self._id.gpu_uuid(device),
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
            if launch[2]:
                obj["range_path"] = launch[2]
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
