"""The seed's packed little-endian ``trace_event`` struct (40 bytes, no padding).

``{u32 pid; u8 gpu_uuid[16]; u64 timestamp_ns; u32 sm_util_pct; u64 flops_64b}``
"""

from __future__ import annotations

import struct
import uuid
from typing import NamedTuple

__all__ = ["TRACE_EVENT_SIZE", "TraceEvent", "decode_trace_event", "encode_trace_event"]

_STRUCT = struct.Struct("<I16sQIQ")
TRACE_EVENT_SIZE = _STRUCT.size
assert TRACE_EVENT_SIZE == 40


class TraceEvent(NamedTuple):
    pid: int
    gpu_uuid: str  # "GPU-" + canonical UUID text of the 16 raw bytes, as NVML prints it
    timestamp_ns: int
    sm_util_pct: int
    flops_64b: int


def decode_trace_event(data: bytes) -> TraceEvent:
    """Decode one record; raises ValueError naming the problem for a wrong length."""
    if len(data) != TRACE_EVENT_SIZE:
        raise ValueError(f"trace_event must be {TRACE_EVENT_SIZE} bytes, got {len(data)}")
    pid, raw_uuid, ts_ns, sm_util, flops = _STRUCT.unpack(data)
    return TraceEvent(pid, f"GPU-{uuid.UUID(bytes=raw_uuid)}", ts_ns, sm_util, flops)


def encode_trace_event(event: TraceEvent) -> bytes:
    text = event.gpu_uuid.removeprefix("GPU-")
    return _STRUCT.pack(event.pid, uuid.UUID(text).bytes, event.timestamp_ns, event.sm_util_pct, event.flops_64b)
