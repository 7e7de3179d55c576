"""CUPTI activity records as the stand-in replays them (tests/cupti_standin), and a replay through the collector:
what tests/test_cupti.py and tests/test_cupti_ranges.py build their recordings from."""

from __future__ import annotations

from gpucost.producers.cupti import Collector, Identity
from tests.cupti_standin import cupti as standin

K = standin.ActivityKind
NODE, PID = "n1", 4242


def kernel(
    corr: int,
    start: int,
    end: int,
    name: str = "gemm",
    device: int = 0,
    stream: int = 7,
    kind: int = K.CONCURRENT_KERNEL,
) -> object:
    return standin.record(
        kind=kind,
        correlation_id=corr,
        start=start,
        end=end,
        name=name,
        device_id=device,
        stream_id=stream,
        grid_x=2,
        grid_y=1,
        grid_z=1,
        block_x=128,
        block_y=1,
        block_z=1,
        registers_per_thread=32,
        static_shared_memory=16,
        dynamic_shared_memory=48,
    )


def copy(corr: int, start: int, end: int, kind: int = K.MEMCPY) -> object:
    return standin.record(kind=kind, correlation_id=corr, start=start, end=end, device_id=1, stream_id=3, bytes=4096)


def launch(corr: int, tid: int, start: int, kind: int = K.RUNTIME) -> object:
    """A launch call's record: RUNTIME for cudaLaunchKernel, DRIVER for cuLaunchKernel (Triton, cuBLAS)."""
    return standin.record(kind=kind, correlation_id=corr, thread_id=tid, start=start, end=start + 5)


def marker(marker_id: int, flag: int, ts: int, tid: int = 0, name: str = "", domain: str = "") -> object:
    return standin.record(
        kind=K.MARKER,
        id=marker_id,
        flags_=int(flag),
        timestamp=ts,
        name=name,
        domain=domain,
        object_id=standin.record(pt=standin.record(thread_id=tid)),
    )


def replay(
    buffers: list[list],
    dropped: int = 0,
    wall: tuple[int, ...] = (1000, 1000, 1000, 1000),
    clock: tuple[int, int] = (0, 0),
) -> tuple[list[dict], object, int]:
    standin.load(buffers, dropped, clock)
    got: list[dict] = []
    walls = list(wall)
    collector = Collector(standin, Identity(NODE, PID), got.extend, wall_now=lambda: walls.pop(0))
    collector.start()
    stats = collector.stop()
    return got, stats, standin.STATE["requested"]
