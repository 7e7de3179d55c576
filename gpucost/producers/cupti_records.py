"""CUPTI activity records into ``kernel_activity`` and ``annotation_range`` wire objects (docs/collecting.md).

The buffer callback runs while the job's threads wait for the interpreter lock, so per record it does as
little as it can: one read of the fields it needs (``cupti_layout``: one unpack of the record's bytes for
cupti-python's objects, whose attribute reads cost about 1.8 µs each), the joins, and a tuple; names are
escaped once and cached, and each JSON line is one %-format of a template.  ``objects`` gives the same
records as dicts, field for field what the reference conversion (tests/cupti_standin/reference.py) gives.
"""

from __future__ import annotations

import dataclasses
import json
from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterable
from operator import itemgetter
from typing import Any

from gpucost.producers.cupti_layout import FIELDS, Reader, attribute_reader, checked, dtype_name, raw_reader

MAX_NAME_CHARS = 1024
#: the deepest range path a kernel carries (``gpucost.schemas.kernels.MAX_RANGE_DEPTH``): its outermost levels kept
MAX_RANGE_DEPTH = 32
#: a range without a name, in a kernel's path (a path's names are never empty)
UNNAMED_RANGE = "(unnamed)"
NCCL_PREFIXES = ("ncclKernel", "ncclDevKernel")
DEFAULT_DOMAIN = "default"


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


def device_uuid(raw: Any, mig: bool) -> str:
    """A CUDA ``CUuuid`` (16 bytes, or an object holding them as ``bytes``) as NVML writes it: ``GPU-`` (``MIG-`` for a
    MIG instance) and 8-4-4-4-12 hex digits."""
    h = bytes(getattr(raw, "bytes", raw)).hex()
    if len(h) != 32:
        raise ValueError(f"a UUID of {len(h) // 2} bytes")
    return f"{'MIG' if mig else 'GPU'}-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def category_of(kind: str, name: str) -> str:
    if kind != "kernel":
        return kind
    return "communication" if name.startswith(NCCL_PREFIXES) else "kernel"


def path_name(name: str) -> str:
    """A range's name as a kernel's path carries it: never empty, and valid UTF-8 (a lone surrogate, which an NVTX
    name may hold, would make the whole kernel invalid, not only its path)."""
    return name.encode("utf-8", "replace").decode() if name else UNNAMED_RANGE


class _Json(str):
    """JSON text of a few fields (``"gpu_uuid":…,"device":…``), with their values for the dict form."""

    values: tuple[Any, ...]


def _json(values: tuple[Any, ...], keys: tuple[str, ...]) -> _Json:
    text = _Json(",".join(f"{json.dumps(k)}:{json.dumps(v)}" for k, v in zip(keys, values, strict=True)))
    text.values = values
    return text


_UNSEEN: Any = object()  # a record type not met yet
_CACHED_NAMES = 65_536  # distinct names kept escaped; past it the cache starts over


class KernelRecords:
    """Turns CUPTI activity records (any order, any buffer boundaries) into wire objects.

    ``kinds`` maps CUPTI's ActivityKind members to our names, so the same code serves the real module and the
    stand-in the tests use; ``layouts`` is the module whose ``*_dtype`` lay out its record types' bytes.
    ``add`` gives rows (tuples, the first item their JSON template); ``lines`` renders them as
    ``json.dumps(obj, separators=(",", ":"))`` would ``objects``' dicts, byte for byte.
    """

    def __init__(
        self,
        identity: Identity,
        offset_ns: int,
        kinds: dict[int, str],
        marker_flags: tuple[int, int],
        stats: Stats,
        max_pending: int = 100_000,
        layouts: Any = None,
    ) -> None:
        self._id, self._offset_ns, self.stats, self._layouts = identity, offset_ns, stats, layouts
        self._start_flag, self._end_flag = marker_flags
        self._max_pending = max_pending
        #: correlation id → (tid, launch cupti ns, range path's JSON or None), awaited
        self._launches: dict[int, tuple[int, int, str | None]] = {}
        self._pending: dict[int, tuple[Any, ...]] = {}  # correlation id → kernel row awaiting its launch
        self._open: dict[int, tuple[int, _Json, int]] = {}  # marker id → (tid, domain and name, start ns)
        self._early_ends: dict[int, int] = {}  # marker id → end ns, for an end delivered before its start
        #: tid → its open ranges as (start ns, name, marker id), in that order: the outermost first
        self._stacks: dict[int, list[tuple[int, str, int]]] = {}
        self._paths: dict[tuple[str, ...], str] = {}  # a range path → its JSON array
        #: tid → (the latest start among its open ranges, the JSON array of them all): a launch after that start has
        #: that path, found without a sort (a thread's ranges change far less often than it launches)
        self._whole: dict[int, tuple[int, str | None]] = {}
        self._devices: dict[int, _Json] = {}
        self._uuids: dict[int, str] = {}  # devices named by CUDA (``name_device``), over the identity's guesses
        self._names: dict[str, dict[Any, _Json]] = {"kernel": {}, "memcpy": {}, "memset": {}}
        self._kernel_names = self._names["kernel"]
        self._labels: dict[tuple[Any, Any], _Json] = {}
        handlers = {"kernel": self._kernel, "memcpy": self._copy, "memset": self._copy}
        handlers |= {"runtime": self._launch, "marker": self._marker, "device": self._device_record}
        self._kinds = {k: name for k, name in kinds.items() if name in handlers}
        self._handlers = {name: handlers[name] for name in self._kinds.values()}
        self._plain = {name: attribute_reader(FIELDS[name]) for name in handlers}
        self._plain["marker"] = self._plain_marker
        self._readers: dict[type, tuple[str, Reader] | None] = {}  # record type → (kind, bytes reader) or None
        work = '%s,"stream":%d,"correlation_id":%d,%s,"start_ns":%d,"end_ns":%d,"source":"cupti",'
        kernel = work + '"grid":[%d,%d,%d],"block":[%d,%d,%d],"registers_per_thread":%d,"shared_memory_bytes":%d'
        link = ',"launch_tid":%d,"launch_ns":%d'
        ends = ("}\n", link + "}\n", link + ',"range_path":%s}\n')
        self._kernel_u, self._kernel_l, self._kernel_p = (self._template("kernel_activity", kernel + e) for e in ends)
        copy = work + '"bytes":%d'
        self._copy_u, self._copy_l, self._copy_p = (self._template("kernel_activity", copy + e) for e in ends)
        self._linked = {self._kernel_u: self._kernel_l, self._copy_u: self._copy_l}
        self._pathed = {self._kernel_u: self._kernel_p, self._copy_u: self._copy_p}
        self._range_t = self._template("annotation_range", '"tid":%d,%s,"start_ns":%d,"end_ns":%d,"source":"cupti"}\n')

    def bytes_readers(self) -> dict[type, str | None]:
        """Each record type met so far, and the kind its bytes are read as (None: read by attributes, the slower
        fallback taken where its bytes disagreed with its attributes): what tells a check on a real GPU, and the
        tests, that the fast path is the one in use."""
        return {t: (r[0] if r else None) for t, r in self._readers.items()}

    def _template(self, kind: str, tail: str) -> str:
        """A row's %-template; its first item is the template itself, printed as nothing by ``%.0s``."""
        head = _json((kind, self._id.node_id, self._id.pid), ("kind", "node_id", "pid"))
        return "%.0s{" + (head + ",").replace("%", "%%") + tail

    def add(self, records: Iterable[Any]) -> list[tuple[Any, ...]]:
        out: list[tuple[Any, ...]] = []
        kinds, handlers, plain, readers = self._kinds, self._handlers, self._plain, self._readers.get
        for record in records:
            try:
                reader = readers(type(record), _UNSEEN)
                if reader is _UNSEEN:
                    reader = self._reader(record)
                if reader is not None:
                    fields = reader[1](record)
                    kind = kinds.get(fields[0])
                    if kind != reader[0]:  # another kind in the same type: read it plainly
                        kind = kinds.get(record.kind)
                        fields = plain[kind](record) if kind is not None else ()
                else:
                    kind = kinds.get(record.kind)
                    fields = plain[kind](record) if kind is not None else ()
                if kind is not None:
                    handlers[kind](fields, kind, out)
            except (AttributeError, TypeError, ValueError):
                self.stats.bad_records += 1
        return out

    def add_read(self, records: Iterable[tuple[str, tuple[Any, ...]]]) -> list[tuple[Any, ...]]:
        """Records already read into ``FIELDS`` order, each with its kind's name (the injection library's frames,
        ``cupti_native``): the joins alone, as ``add`` does them."""
        out: list[tuple[Any, ...]] = []
        handlers = self._handlers
        for kind, fields in records:
            try:
                handlers[kind](fields, kind, out)
            except (TypeError, ValueError):
                self.stats.bad_records += 1
        return out

    def name_device(self, device: int, uuid: str) -> None:
        """A device's UUID as CUDA gives it (a DEVICE record: whichever GPU ``CUDA_VISIBLE_DEVICES`` made this
        process's device N), over the one NVML's index order gave."""
        self._uuids[device] = uuid
        self._devices.pop(device, None)

    def _reader(self, record: Any) -> tuple[str, Reader] | None:
        """The bytes reader for a record's type, made and checked on its first record; None: read attributes."""
        dtype = getattr(self._layouts, dtype_name(type(record)), None)
        kind = self._kinds.get(record.kind)
        if dtype is None or kind is None:
            if dtype is None:
                self._readers[type(record)] = None
            return None
        read = raw_reader(dtype, FIELDS[kind])
        ok = read is not None and checked(read, attribute_reader(FIELDS[kind]), record)
        self._readers[type(record)] = (kind, read) if ok and read is not None else None
        return self._readers[type(record)]

    def _plain_marker(self, record: Any) -> tuple[Any, ...]:
        """A marker's fields; an end's thread, domain and name are not read (an end record need not have them)."""
        kind, flags, marker_id, timestamp = record.kind, record.flags_, record.id, record.timestamp
        if flags & self._start_flag:
            return (kind, flags, marker_id, timestamp, record.object_id.pt.thread_id, record.domain, record.name)
        return (kind, flags, marker_id, timestamp, 0, None, None)

    def finish(self) -> list[tuple[Any, ...]]:
        """At exit: kernels whose launch never came go out unlinked; ranges never closed are counted."""
        out = list(self._pending.values())
        self.stats.unlinked_kernels += len(out)
        self.stats.open_ranges_at_exit += len(self._open)
        self.stats.unmatched_range_ends += len(self._early_ends)
        for waiting in (self._early_ends, self._pending, self._open, self._launches, self._stacks, self._whole):
            waiting.clear()
        return out

    @staticmethod
    def lines(rows: list[tuple[Any, ...]]) -> str:
        return "".join([row[0] % row for row in rows])

    def objects(self, rows: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
        return [self._object(row) for row in rows]

    def _object(self, row: tuple[Any, ...]) -> dict[str, Any]:
        template, node, pid = row[0], self._id.node_id, self._id.pid
        if template is self._range_t:
            (domain, name), source = row[2].values, "cupti"
            obj = {"kind": "annotation_range", "node_id": node, "pid": pid, "tid": row[1], "domain": domain}
            return obj | {"name": name, "start_ns": row[3], "end_ns": row[4], "source": source}
        (uuid, device), (category, name), stream, corr = row[1].values, row[4].values, row[2], row[3]
        obj = {"kind": "kernel_activity", "node_id": node, "pid": pid, "gpu_uuid": uuid, "device": device}
        obj |= {"stream": stream, "correlation_id": corr, "category": category, "name": name, "start_ns": row[5]}
        obj |= {"end_ns": row[6], "source": "cupti"}
        if template in (self._kernel_u, self._kernel_l, self._kernel_p):
            obj |= {"grid": list(row[7:10]), "block": list(row[10:13]), "registers_per_thread": row[13]}
            obj["shared_memory_bytes"], rest = row[14], row[15:]
        else:
            obj["bytes"], rest = row[7], row[8:]
        if rest:
            obj["launch_tid"], obj["launch_ns"] = rest[:2]
        if len(rest) > 2:
            obj["range_path"] = json.loads(rest[2])
        return obj

    def _device(self, device: int) -> _Json:
        uuid = self._uuids.get(device) or self._id.gpu_uuid(device)
        return self._devices.setdefault(device, _json((uuid, device), ("gpu_uuid", "device")))

    def _device_record(self, fields: tuple[Any, ...], _: str, __: list[tuple[Any, ...]]) -> None:
        """A DEVICE record: the UUID of this process's device ``id`` (a MIG instance's), for the kernels read after."""
        ___, device, mig, uuid, mig_uuid = fields
        self.name_device(int(device), device_uuid(mig_uuid if mig else uuid, bool(mig)))

    def _name(self, kind: str, raw: Any) -> _Json:
        name = str((raw.decode(errors="replace") if isinstance(raw, bytes) else raw) or kind)
        if len(name) > MAX_NAME_CHARS:  # not cached, so that each such record is counted
            self.stats.truncated_names += 1
            return _json((category_of(kind, name), name[:MAX_NAME_CHARS]), ("category", "name"))
        if len(self._names[kind]) >= _CACHED_NAMES:
            self._names[kind].clear()
        return self._names[kind].setdefault(raw, _json((category_of(kind, name), name), ("category", "name")))

    def _kernel(self, fields: tuple[Any, ...], _: str, out: list[tuple[Any, ...]]) -> None:
        __, corr, start, end, name, device, stream, gx, gy, gz, bx, by, bz, regs, static, dynamic = fields
        if end < start:
            self.stats.bad_records += 1
            return
        named = self._kernel_names.get(name) or self._name("kernel", name)
        dev = self._devices.get(device) or self._device(device)
        off = self._offset_ns
        self.stats.kernels += 1
        launch = self._launches.pop(corr, None)
        if launch is not None:
            tid, at, path = launch
            if path is None:
                row = (self._kernel_l, dev, stream, corr, named, start + off, end + off, gx, gy, gz, bx, by, bz, regs)
                out.append((*row, static + dynamic, tid, at + off))
            else:
                row = (self._kernel_p, dev, stream, corr, named, start + off, end + off, gx, gy, gz, bx, by, bz, regs)
                out.append((*row, static + dynamic, tid, at + off, path))
        else:
            row = (self._kernel_u, dev, stream, corr, named, start + off, end + off, gx, gy, gz, bx, by, bz, regs)
            self._wait((*row, static + dynamic), corr, out)

    def _copy(self, fields: tuple[Any, ...], kind: str, out: list[tuple[Any, ...]]) -> None:
        _, corr, start, end, device, stream, size, raw = fields
        if end < start:
            self.stats.bad_records += 1
            return
        named = self._names[kind].get(raw) or self._name(kind, raw)
        dev = self._devices.get(device) or self._device(device)
        row = (self._copy_u, dev, stream, corr, named, start + self._offset_ns, end + self._offset_ns, size)
        self.stats.kernels += 1
        launch = self._launches.pop(corr, None)
        if launch is not None:
            tid, at, path = launch
            if path is None:
                out.append((self._copy_l, *row[1:], tid, at + self._offset_ns))
            else:
                out.append((self._copy_p, *row[1:], tid, at + self._offset_ns, path))
        else:
            self._wait(row, corr, out)

    def _wait(self, row: tuple[Any, ...], corr: int, out: list[tuple[Any, ...]]) -> None:
        if len(self._pending) < self._max_pending:
            self._pending[corr] = row
        else:
            self.stats.unlinked_kernels += 1
            out.append(row)

    def _launch(self, fields: tuple[Any, ...], _: str, out: list[tuple[Any, ...]]) -> None:
        __, corr, tid, start = fields
        whole = self._whole.get(tid)
        path = whole[1] if whole is not None and whole[0] <= start else self._path(tid, start)
        row = self._pending.pop(corr, None)
        if row is not None:
            if path is None:
                out.append((self._linked[row[0]], *row[1:], tid, start + self._offset_ns))
            else:
                out.append((self._pathed[row[0]], *row[1:], tid, start + self._offset_ns, path))
            return
        if len(self._launches) >= self._max_pending:
            del self._launches[next(iter(self._launches))]  # oldest out
        self._launches[corr] = (tid, start, path)

    def _path(self, tid: int, start: int) -> str | None:
        """The JSON array of the ranges open on ``tid`` at a launch at ``start``, outermost (earliest begun) first; None
        for none. Records of the host's calls and markers come in the order they happened, so the ranges open when a
        launch's record is read are those open at the launch (less any begun after it, left out by time)."""
        opened = self._stacks.get(tid, [])
        begun = bisect_right(opened, start, key=itemgetter(0))
        names = tuple(path_name(name) for _, name, _ in opened[: min(begun, MAX_RANGE_DEPTH)])
        text = self._paths.get(names) if names else None
        if names and text is None:
            if len(self._paths) >= _CACHED_NAMES:
                self._paths.clear()
            text = self._paths[names] = json.dumps(names, separators=(",", ":"))
        if begun == len(opened):  # every open range taken: the path of any launch after the last start
            self._whole[tid] = (opened[-1][0] if opened else -1, text)
        return text

    def _marker(self, fields: tuple[Any, ...], _: str, out: list[tuple[Any, ...]]) -> None:
        __, flags, marker_id, timestamp, tid, domain, name = fields
        if flags & self._start_flag:
            label = self._labels.get((domain, name)) or self._label(domain, name)
            end = self._early_ends.pop(marker_id, None)
            if end is not None:
                self._range(tid, label, timestamp, end, out)
            elif len(self._open) < self._max_pending:
                was = self._open.get(marker_id)
                if was is not None:  # an id begun again before its end: the earlier range is open no more
                    self._unstack(marker_id, was)
                self._open[marker_id] = (tid, label, timestamp)
                insort(self._stacks.setdefault(tid, []), (timestamp, label.values[1], marker_id))
                self._whole.pop(tid, None)
            else:
                self.stats.open_ranges_at_exit += 1
        elif flags & self._end_flag:  # instantaneous markers carry no duration, so no money
            opened = self._open.pop(marker_id, None)
            if opened is not None:
                self._unstack(marker_id, opened)
                self._range(*opened, timestamp, out)
            elif len(self._early_ends) < self._max_pending:
                self._early_ends[marker_id] = timestamp
            else:
                self.stats.unmatched_range_ends += 1

    def _unstack(self, marker_id: int, opened: tuple[int, _Json, int]) -> None:
        """An open range of a thread ends: out of its stack (found by bisection: a stack may hold many)."""
        tid, label, start = opened
        stack = self._stacks[tid]
        del stack[bisect_left(stack, (start, label.values[1], marker_id))]
        if not stack:
            del self._stacks[tid]
        self._whole.pop(tid, None)

    def _label(self, domain: Any, name: Any) -> _Json:
        if len(self._labels) >= _CACHED_NAMES:
            self._labels.clear()
        domain, name = (v.decode(errors="replace") if isinstance(v, bytes) else v for v in (domain, name))
        values = (str(domain or "") or DEFAULT_DOMAIN, str(name or "")[:MAX_NAME_CHARS])
        return self._labels.setdefault((domain, name), _json(values, ("domain", "name")))

    def _range(self, tid: int, label: _Json, start: int, end: int, out: list[tuple[Any, ...]]) -> None:
        self.stats.ranges += 1
        out.append((self._range_t, tid, label, start + self._offset_ns, end + self._offset_ns))
