"""Stand-in records shaped as cupti-python 13.0.1's: an object over a one-element numpy record array.

Each attribute read goes through the array, as cupti-python's do, and C strings are pointers into memory
held here; the dtypes give the real offsets of the fields the collector reads (checked against
cupti-python 13.0.1's ``activity_*_dtype``), with the real record sizes.  ``raw(record)`` turns one of
``tests/cupti_standin/cupti.py``'s plain records into this form; ``ActivityMemset4`` has no ``_data``, so
its bytes are read at ``int(record)``, the record's address, as the collector's other way in.
"""

from __future__ import annotations

import ctypes
from types import SimpleNamespace
from typing import Any

import numpy as np

from tests.cupti_standin import cupti as standin

K = standin.ActivityKind


def _dtype(fields: dict[str, tuple[Any, int]], itemsize: int) -> np.dtype:
    names = list(fields)
    return np.dtype(
        {"names": names, "formats": [fields[n][0] for n in names], "offsets": [fields[n][1] for n in names],
         "itemsize": itemsize}
    )  # fmt: skip


_PT = np.dtype({"names": ["process_id", "thread_id"], "formats": ["<u4", "<u4"], "offsets": [0, 4], "itemsize": 12})
activity_kernel10_dtype = _dtype(
    {"kind": ("<i4", 0), "registers_per_thread": ("<u2", 6), "start": ("<u8", 16), "end": ("<u8", 24),
     "device_id": ("<u4", 40), "stream_id": ("<u4", 48), "grid_x": ("<i4", 52), "grid_y": ("<i4", 56),
     "grid_z": ("<i4", 60), "block_x": ("<i4", 64), "block_y": ("<i4", 68), "block_z": ("<i4", 72),
     "static_shared_memory": ("<i4", 76), "dynamic_shared_memory": ("<i4", 80), "correlation_id": ("<u4", 92),
     "name": ("<i8", 104)},
    216,
)  # fmt: skip
activity_api_dtype = _dtype(
    {"kind": ("<i4", 0), "cbid": ("<u4", 4), "start": ("<u8", 8), "end": ("<u8", 16), "process_id": ("<u4", 24),
     "thread_id": ("<u4", 28), "correlation_id": ("<u4", 32), "return_value": ("<u4", 36)},
    40,
)  # fmt: skip
activity_marker2_dtype = _dtype(
    {"kind": ("<i4", 0), "flags_": ("<i4", 4), "timestamp": ("<u8", 8), "id": ("<u4", 16),
     "object_kind": ("<i4", 20), "object_id": (np.dtype({"names": ["pt"], "formats": [_PT], "offsets": [0],
     "itemsize": 12}), 24), "name": ("<i8", 40), "domain": ("<i8", 48)},
    56,
)  # fmt: skip
_COPY = {"kind": ("<i4", 0), "bytes": ("<u8", 8), "start": ("<u8", 16), "end": ("<u8", 24),
         "device_id": ("<u4", 32), "stream_id": ("<u4", 40), "correlation_id": ("<u4", 44)}  # fmt: skip
activity_memcpy6_dtype = _dtype(_COPY, 96)
activity_memset4_dtype = _dtype(_COPY, 88)
activity_device6_dtype = _dtype(
    {
        "kind": ("<i4", 0),
        "id": ("<u4", 112),
        "uuid": ("V16", 120),
        "is_mig_enabled": ("u1", 145),
        "mig_uuid": ("V16", 160),
    },
    192,
)  # fmt: skip (cupti-python 13.4's offsets)

_STRINGS: list[Any] = []  # C strings the records point at, kept alive


class _Record:
    dtype: np.dtype
    _data: Any

    def __init__(self, values: dict[str, Any]) -> None:
        data = np.zeros(1, dtype=self.dtype).view(np.recarray)
        for field, value in values.items():
            if field in ("name", "domain"):
                text = ctypes.create_string_buffer(value.encode()) if value else None
                _STRINGS.append(text)
                value = ctypes.addressof(text) if text is not None else 0
            data[field] = value
        self.__dict__["_data"] = data

    def __getattr__(self, field: str) -> Any:
        if field not in self.dtype.names:
            raise AttributeError(field)
        if self.dtype.fields[field][0].kind == "V":  # a CUuuid: an object holding its bytes, as cuda.bindings' does
            return SimpleNamespace(bytes=self.__dict__["_data"][field][0].tobytes())
        value = int(self.__dict__["_data"][field][0])
        if field in ("name", "domain"):
            return ctypes.string_at(value).decode() if value else ""
        return value

    def __int__(self) -> int:
        return int(self.__dict__["_data"].ctypes.data)


class ActivityKernel10(_Record):
    dtype = activity_kernel10_dtype


class ActivityAPI(_Record):
    dtype = activity_api_dtype


class ActivityMemcpy6(_Record):
    dtype = activity_memcpy6_dtype


class ActivityMemset4(_Record):
    dtype = activity_memset4_dtype

    def __getattribute__(self, field: str) -> Any:
        if field == "_data":
            raise AttributeError(field)  # read at int(record), not through _data
        return super().__getattribute__(field)


class ActivityDevice6(_Record):
    dtype = activity_device6_dtype


class ActivityMarker2(_Record):
    dtype = activity_marker2_dtype

    @property
    def object_id(self) -> SimpleNamespace:
        return SimpleNamespace(
            pt=SimpleNamespace(thread_id=int(self.__dict__["_data"]["object_id"]["pt"]["thread_id"][0]))
        )


_TYPES = {K.CONCURRENT_KERNEL: ActivityKernel10, K.RUNTIME: ActivityAPI, K.DRIVER: ActivityAPI,
          K.MEMCPY: ActivityMemcpy6, K.MEMSET: ActivityMemset4, K.MARKER: ActivityMarker2,
          K.DEVICE: ActivityDevice6}  # fmt: skip


def raw(record: SimpleNamespace) -> _Record:
    """A plain stand-in record as cupti-python would hand it over (its fields all present)."""
    values = dict(vars(record))
    if "object_id" in values:
        values["object_id.pt.thread_id"] = values.pop("object_id").pt.thread_id
    cls = _TYPES[values["kind"]]
    obj = cls({k: v for k, v in values.items() if k != "object_id.pt.thread_id"})
    if "object_id.pt.thread_id" in values:
        obj.__dict__["_data"]["object_id"]["pt"]["thread_id"] = values["object_id.pt.thread_id"]
    return obj
