"""Reading a cupti-python activity record's fields from its bytes, in one step.

cupti-python (13.0.1) wraps each record in an object over a one-element numpy record array that views
CUPTI's buffer; every attribute read goes through ``numpy.recarray.__getattribute__`` and costs about 1.8 µs
on the development machine (``benchmarks/cupti_convert.py``), so the 15 fields of a kernel cost more than
the rest of its conversion.  A record's bytes come in one copy (``_data.tobytes()``, or ``string_at`` of
``int(record)``, the record's address) and one ``struct`` unpack laid out from the module's own numpy dtype
(``activity_kernel10_dtype`` for ``ActivityKernel10``), so no offset is written here.  C strings (kernel
names, NVTX domains and names) are read where their pointer points; a null one reads as ``b""``, as
cupti-python's ``""``.  A reader is used only after it read the first record of its type exactly as the
attributes do; a type without a dtype (the tests' stand-in) or whose check fails is read attribute by
attribute.
"""

from __future__ import annotations

import ctypes
import operator
import re
import struct
from collections.abc import Callable
from typing import Any

#: the fields each kind's conversion needs, in the order ``KernelRecords`` takes them; ``kind`` first
FIELDS: dict[str, tuple[str, ...]] = {
    "kernel": (
        "kind", "correlation_id", "start", "end", "name", "device_id", "stream_id", "grid_x", "grid_y", "grid_z",
        "block_x", "block_y", "block_z", "registers_per_thread", "static_shared_memory", "dynamic_shared_memory",
    ),
    "memcpy": ("kind", "correlation_id", "start", "end", "device_id", "stream_id", "bytes", "name"),
    "runtime": ("kind", "correlation_id", "thread_id", "start"),
    "marker": ("kind", "flags_", "id", "timestamp", "object_id.pt.thread_id", "domain", "name"),
    "device": ("kind", "id", "is_mig_enabled", "uuid", "mig_uuid"),  # read by attributes: one a device
}  # fmt: skip
FIELDS["memset"] = FIELDS["memcpy"]
STRINGS = frozenset({"name", "domain"})  # char* fields; a memcpy has no name (None, as getattr's default)
_CODES = {"i1": "b", "u1": "B", "i2": "h", "u2": "H", "i4": "i", "u4": "I", "i8": "q", "u8": "Q"}

Reader = Callable[[Any], tuple[Any, ...]]


def dtype_name(cls: type) -> str:
    """``ActivityKernel10`` → ``activity_kernel10_dtype``, ``ActivityAPI`` → ``activity_api_dtype``."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", cls.__name__).lower() + "_dtype"


def _offset(dtype: Any, path: str) -> tuple[int, str] | None:
    """A field's byte offset and struct code, following dotted paths through nested (union) dtypes."""
    offset = 0
    for part in path.split("."):
        if dtype.fields is None or part not in dtype.fields:
            return None
        dtype, at = dtype.fields[part][0], dtype.fields[part][1]
        offset += at
    code = _CODES.get(dtype.str[1:])
    return None if code is None else (offset, code)


def raw_reader(dtype: Any, fields: tuple[str, ...]) -> Reader | None:
    """A reader giving ``fields`` of a record laid out as ``dtype``, strings as bytes; None if one is missing."""
    spots = {f: _offset(dtype, f) for f in fields}
    if any(spot is None for f, spot in spots.items() if f not in STRINGS or f in (dtype.fields or {})):
        return None
    present = sorted((spot[0], i, spot[1]) for i, spot in enumerate(spots.values()) if spot is not None)
    layout = struct.Struct("<" + "".join(f"{at}x{code}" if at else code for at, code in _gaps(present)))
    positions = [0] * len(present)
    for place, (_, i, _) in enumerate(present):
        positions[i] = place
    strings = tuple(i for i, f in enumerate(fields) if f in STRINGS)
    absent = tuple(i for i, spot in enumerate(spots.values()) if spot is None)
    size, unpack = dtype.itemsize, layout.unpack_from
    pick = operator.itemgetter(*positions) if len(positions) > 1 else (lambda v: (v[positions[0]],))
    string_at = ctypes.string_at

    def read(record: Any) -> tuple[Any, ...]:
        data = getattr(record, "_data", None)
        values = list(pick(unpack(data.tobytes() if data is not None else string_at(int(record), size))))
        for i in absent:
            values.insert(i, None)
        for i in strings:
            if values[i] is not None:
                values[i] = string_at(values[i]) if values[i] else b""
        return tuple(values)

    return read


def _gaps(present: list[tuple[int, int, str]]) -> list[tuple[int, str]]:
    """(padding before, code) for fields sorted by offset."""
    out, end = [], 0
    for at, _, code in present:
        out.append((at - end, code))
        end = at + struct.calcsize("<" + code)
    return out


def attribute_reader(fields: tuple[str, ...]) -> Reader:
    """The plain reading: each field an attribute read (a memcpy's missing name reads as None)."""
    get = operator.attrgetter(*(f for f in fields if f != "name"))
    if "name" not in fields:
        return get
    at = fields.index("name")

    def read(record: Any) -> tuple[Any, ...]:
        values = get(record)
        return (*values[:at], getattr(record, "name", None), *values[at:])

    return read


def checked(read: Reader, plain: Reader, record: Any) -> bool:
    """Whether ``read`` gives what the attributes give for this record (strings decoded as cupti-python does)."""
    try:
        got = [v.decode() if isinstance(v, bytes) else v for v in read(record)]
        return got == list(plain(record))
    except Exception:  # noqa: BLE001 — a layout that cannot read the record is a layout not to use
        return False
