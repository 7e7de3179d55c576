"""The injection library's frames into ``kernel_activity`` and ``annotation_range`` lines, by the Python collector's
own joins (``KernelRecords``), so that a process that is not Python is collected by the same rules.

The library (``gpucost/producers/native/gpucost_inject.c``, whose head comment lays the frames out) writes each
process's records to ``activity-<pid>-<ns>.bin`` in a folder of the collector's; ``ActivityFolder`` reads every
such file as it grows, so lines come out while the job runs and a process killed with SIGKILL leaves the frames of the
buffers CUPTI had completed.  The files are the library's, but nothing in them is trusted: a frame longer than the
library ever writes, or too short for its kind, ends that file's reading or is skipped, and is counted.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from gpucost.producers.cupti import ClockOffset
from gpucost.producers.cupti_records import Identity, KernelRecords, Stats

FRAME_HEAD = struct.Struct("<BI")
#: a frame's payload bound: the library's largest is a marker with two strings of at most 65,535 bytes
MAX_FRAME_BYTES = 1 << 18
MAGIC = b"GPUCOST1"
_HEADER = struct.Struct("<8sIqQq")
_END = struct.Struct("<qQqQI")
_KERNEL = struct.Struct("<IQQIIiiiiiiHii")
_WORK = struct.Struct("<IQQIIQ")
_LAUNCH = struct.Struct("<IIQ")
_MARKER = struct.Struct("<IIQIH")
_DEVICE = struct.Struct("<IB16s")
#: a record frame's tag → the kind ``KernelRecords`` knows it by (the tag is the record's kind field)
KINDS = {ord("K"): "kernel", ord("C"): "memcpy", ord("S"): "memset", ord("R"): "runtime", ord("M"): "marker",
         ord("D"): "device"}  # fmt: skip
#: CUPTI_ACTIVITY_FLAG_MARKER_START and _END, as the C header defines them
MARKER_FLAGS = (1 << 1, 1 << 2)
FILE_PREFIX, FILE_SUFFIX = "activity-", ".bin"
READ_BYTES = 1 << 20


class ProcessActivity:
    """One process's frames, fed in pieces of any size; each ``feed`` gives the rows its whole frames made."""

    def __init__(self, node_id: str, gpu_uuids: dict[int, str], max_pending: int = 100_000) -> None:
        self._node_id, self._gpu_uuids, self._max_pending = node_id, gpu_uuids, max_pending
        self._rest = b""
        self._broken = False
        self.stats = Stats()
        self.records: KernelRecords | None = None  # made at the header frame, which holds the pid and the clock
        self.pid: int | None = None
        self.offset_ns: int | None = None
        self.complete = False  # the exit frame came: CUPTI's buffers were flushed
        self.bad_frames = 0
        self.unread_bytes = 0  # after a frame that cannot be one: nothing after it can be placed, so it is counted

    def feed(self, data: bytes) -> list[tuple[Any, ...]]:
        if self._broken:
            self.unread_bytes += len(data)
            return []
        buf, at, read = self._rest + data, 0, []
        while len(buf) - at >= FRAME_HEAD.size:
            tag, length = FRAME_HEAD.unpack_from(buf, at)
            if length > MAX_FRAME_BYTES:  # not a frame the library writes: nothing after it can be placed
                self.bad_frames += 1
                self.unread_bytes += len(buf) - at
                self._broken, buf, at = True, b"", 0
                break
            end = at + FRAME_HEAD.size + length
            if end > len(buf):
                break
            try:
                self._frame(tag, buf[at + FRAME_HEAD.size : end], read)
            except (struct.error, ValueError):
                self.bad_frames += 1
            at = end
        self._rest = buf[at:]
        return self.records.add_read(read) if self.records is not None and read else []

    def _frame(self, tag: int, payload: bytes, read: list[tuple[str, tuple[Any, ...]]]) -> None:
        kind = KINDS.get(tag)
        if kind is not None and self.records is None:
            raise ValueError("a record before the header")
        if kind == "kernel":
            v = _KERNEL.unpack_from(payload)
            read.append((kind, (tag, v[0], v[1], v[2], payload[_KERNEL.size :], *v[3:])))
        elif kind in ("memcpy", "memset"):
            read.append((kind, (tag, *_WORK.unpack_from(payload), None)))
        elif kind == "runtime":
            read.append((kind, (tag, *_LAUNCH.unpack_from(payload))))
        elif kind == "marker":
            flags, marker_id, ts, tid, n = _MARKER.unpack_from(payload)
            domain, name = payload[_MARKER.size : _MARKER.size + n], payload[_MARKER.size + n :]
            read.append((kind, (tag, flags, marker_id, ts, tid, domain, name)))
        elif kind == "device":  # the library writes the UUID it chose (the MIG instance's on a MIG device)
            device, mig, raw = _DEVICE.unpack_from(payload)
            read.append((kind, (tag, device, mig, raw, raw)))
        elif tag == ord("H") and self.records is None:
            magic, pid, before, gpu, after = _HEADER.unpack_from(payload)
            if magic != MAGIC:
                raise ValueError("not the library's header")
            self.pid, self.offset_ns = pid, ClockOffset.of(before, gpu, after)
            identity = Identity(self._node_id, pid, dict(self._gpu_uuids))  # its own: DEVICE records name them
            self.records = KernelRecords(identity, self.offset_ns, KINDS, MARKER_FLAGS, self.stats, self._max_pending)
        elif tag == ord("E") and self.offset_ns is not None:
            before, gpu, after, dropped, unrecorded = _END.unpack_from(payload)
            self.stats.clock_drift_ns = ClockOffset.of(before, gpu, after) - self.offset_ns
            self.stats.dropped_by_cupti += dropped
            self.stats.api_calls_unrecorded = unrecorded
            self.complete = True
        else:
            raise ValueError(f"an unknown frame {tag}")

    def finish(self) -> list[tuple[Any, ...]]:
        """At the end of the file: what still waits goes out (``KernelRecords.finish``)."""
        return self.records.finish() if self.records is not None else []

    def summary(self) -> dict[str, Any]:
        """What the command prints for this process; ``truncated_bytes`` is a last frame cut short (SIGKILL, a full
        disk), ``unread_bytes`` what followed a frame longer than the library writes, ``complete`` false a process that
        never ran its exit handler (records in unfinished buffers lost)."""
        head = {"pid": self.pid, "clock_offset_ns": self.offset_ns, "complete": self.complete}
        tail = {"bad_frames": self.bad_frames, "truncated_bytes": len(self._rest), "unread_bytes": self.unread_bytes}
        return head | vars(self.stats) | tail

    def lines(self, rows: list[tuple[Any, ...]]) -> str:
        return self.records.lines(rows) if self.records is not None else ""


class ActivityFolder:
    """Every process's file in the folder the library writes to, each read as it grows."""

    def __init__(self, folder: Path, node_id: str, gpu_uuids: dict[int, str]) -> None:
        self._folder, self._node_id, self._gpu_uuids = folder, node_id, gpu_uuids
        self._open: dict[str, tuple[IO[bytes], ProcessActivity]] = {}
        self._done: dict[str, ProcessActivity] = {}  # read to their exit frame: their files closed

    def poll(self) -> Iterator[str]:
        """The lines of every frame written since the last poll (files in name order, each in its own order)."""
        for name in sorted(os.listdir(self._folder)):
            ours = name.startswith(FILE_PREFIX) and name.endswith(FILE_SUFFIX)
            if ours and name not in self._open and name not in self._done:
                reader = ProcessActivity(self._node_id, self._gpu_uuids)
                self._open[name] = ((self._folder / name).open("rb"), reader)
        for name, (file, reader) in list(self._open.items()):
            while data := file.read(READ_BYTES):
                if text := reader.lines(reader.feed(data)):
                    yield text
            if reader.complete:  # the library wrote its last frame: the file is closed (a job of many processes
                file.close()  # would otherwise run out of file descriptors here)
                del self._open[name]
                self._done[name] = reader
                if text := reader.lines(reader.finish()):
                    yield text

    def finish(self) -> Iterator[str]:
        """After the job: the last frames, then what each process's joins still hold."""
        yield from self.poll()
        for name, (file, reader) in list(self._open.items()):
            file.close()
            del self._open[name]
            self._done[name] = reader
            if text := reader.lines(reader.finish()):
                yield text

    def close(self) -> None:
        for file, _ in self._open.values():
            file.close()

    def summaries(self) -> list[dict[str, Any]]:
        """Each process's summary, in its file's name order (the pid's digits as text, then the start)."""
        return [self._done[name].summary() for name in sorted(self._done)]
