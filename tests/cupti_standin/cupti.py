"""Replays recorded activity buffers through whatever callbacks the collector registers, as CUPTI would.

``load`` sets what the "GPU" did: buffers (each a list of records, delivered in the given order, which
may be out of time order), the count CUPTI would report as dropped, and CUPTI's clock (``clock`` values are
returned by successive ``get_timestamp`` calls).  Records are plain namespaces with CUPTI's field names.
"""

from __future__ import annotations

import ctypes
import enum
from types import SimpleNamespace
from typing import Any


class ActivityKind(enum.IntEnum):
    MEMCPY = 1
    MEMSET = 2
    KERNEL = 3
    DRIVER = 4
    RUNTIME = 5
    DEVICE = 8
    NAME = 11
    MARKER = 12
    MARKER_DATA = 13
    CONCURRENT_KERNEL = 10


class ActivityFlag(enum.IntEnum):
    """As in cupti-python 13.4's stubs: MARKER_END is not a listed member (the collector uses 1 << 2)."""

    FLUSH_FORCED = 1
    MARKER_INSTANTANEOUS = 1
    MARKER_START = 2


MARKER_END = 4


class runtime_api_trace_cbid(enum.IntEnum):  # cupti-python's spelling
    """A sample of CUDA 13's runtime calls under their real ids, bounds included."""

    INVALID = 0
    cudaGetDevice_v3020 = 17
    cudaMemcpy_v3020 = 31
    cudaMemcpyAsync_v3020 = 41
    cudaStreamSynchronize_v3020 = 131
    cudaLaunchKernel_v7000 = 211
    cudaLaunchHostFunc_v10000 = 273
    cudaGraphLaunch_v10000 = 311
    cudaMemsetAsync_v3020 = 52
    SIZE = 500
    FORCE_INT = 0x7FFFFFFF


class driver_api_trace_cbid(enum.IntEnum):  # cupti-python's spelling
    INVALID = 0
    cuCtxGetDevice = 18
    cuLaunchKernel = 307
    cuLaunchKernelEx = 652
    cuMemcpyHtoDAsync_v2 = 279
    cuStreamQuery = 125
    SIZE = 800
    FORCE_INT = 0x7FFFFFFF


STATE: dict[str, Any] = {}


def load(buffers: list[list[Any]], dropped: int = 0, clock: tuple[int, ...] = (0, 0)) -> None:
    STATE.clear()
    STATE.update(
        buffers=list(buffers),
        dropped=dropped,
        clock=list(clock),
        enabled=set(),
        callbacks=None,
        requested=0,
        calls_off=set(),
        dumped=set(),
    )


def record(**fields: Any) -> SimpleNamespace:
    return SimpleNamespace(**fields)


def activity_register_callbacks(requested: Any, completed: Any) -> None:
    STATE["callbacks"] = (requested, completed)


def activity_enable(kind: int) -> None:
    STATE["enabled"].add(ActivityKind(kind))


def activity_enable_and_dump(kind: int) -> None:
    STATE["dumped"].add(ActivityKind(kind))
    activity_enable(kind)


def activity_disable(kind: int) -> None:
    STATE["enabled"].discard(ActivityKind(kind))


def activity_enable_runtime_api(cbid: int, enable: int) -> None:
    assert ActivityKind.RUNTIME in STATE["enabled"], "CUPTI wants RUNTIME enabled before a call is switched"
    (STATE["calls_off"].discard if enable else STATE["calls_off"].add)(runtime_api_trace_cbid(cbid))


def activity_enable_driver_api(cbid: int, enable: int) -> None:
    assert ActivityKind.DRIVER in STATE["enabled"], "CUPTI wants DRIVER enabled before a call is switched"
    (STATE["calls_off"].discard if enable else STATE["calls_off"].add)(driver_api_trace_cbid(cbid))


def get_timestamp() -> int:
    return STATE["clock"].pop(0)


def activity_flush_all(flag: int) -> None:
    """Delivers every recorded buffer, each after a buffer request, as CUPTI does at a forced flush."""
    assert flag == ActivityFlag.FLUSH_FORCED
    requested, completed = STATE["callbacks"]
    while STATE["buffers"]:
        size, max_records = requested()
        assert size > 0 and max_records >= 0
        STATE["requested"] += 1
        completed(STATE["buffers"].pop(0))


def activity_get_num_dropped_records(context: int, stream_id: int, dropped: int) -> None:
    ctypes.c_size_t.from_address(dropped).value = STATE["dropped"]
    STATE["dropped"] = 0
