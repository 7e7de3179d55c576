"""CUPTI activity records as the stand-in replays them (tests/cupti_standin), and a replay through the collector:
what tests/test_cupti.py and tests/test_cupti_ranges.py build their recordings from."""

from __future__ import annotations

from hypothesis import strategies as st

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


def device(device_id: int, uuid: bytes, mig: bool = False) -> object:
    """A DEVICE record: CUDA's device ``device_id`` is GPU ``uuid`` (its MIG instance's UUID: the reversed bytes)."""
    return standin.record(kind=K.DEVICE, id=device_id, uuid=uuid, is_mig_enabled=int(mig), mig_uuid=uuid[::-1])


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


@st.composite
def recordings(draw):
    records, n = [], draw(st.integers(0, 12))
    for corr in range(1, n + 1):
        start = draw(st.integers(0, 10**12))
        kind = draw(st.sampled_from([K.CONCURRENT_KERNEL, K.CONCURRENT_KERNEL, K.MEMCPY, K.MEMSET]))
        if kind == K.CONCURRENT_KERNEL:
            name = draw(st.sampled_from(["gemm", "ncclDevKernel_AllReduce", "ncclKernel_x", "nccl_not"]))
            records.append(
                kernel(corr, start, start + draw(st.integers(0, 10**6)), name=name, device=draw(st.integers(0, 3)))
            )
        else:
            records.append(copy(corr, start, start + 10, kind=kind))
        if draw(st.booleans()):
            records.append(
                launch(corr, draw(st.integers(1, 3)), start - 100, kind=draw(st.sampled_from([K.RUNTIME, K.DRIVER])))
            )
    for mid in range(draw(st.integers(0, 5))):
        ts = draw(st.integers(0, 10**12))
        records.append(
            marker(
                mid,
                standin.ActivityFlag.MARKER_START,
                ts,
                tid=mid % 2,
                name=f"r{mid}",
                domain=draw(st.sampled_from(["", "torch"])),
            )
        )
        if draw(st.booleans()):
            records.append(marker(mid, standin.MARKER_END, ts + draw(st.integers(0, 10**6))))
    return records, draw(st.randoms())


STRANGE = ["gemm", 'a"b\\c', "100%d %s", "é→ü", "ncclDevKernel_x", "k" * 1024, "k" * 1025, ""]


@st.composite
def streams(draw):
    """Records of every kind in any order, some broken, with names that need escaping; times CUPTI-sized."""
    records, _ = draw(recordings())
    for r in records:  # CUPTI's clocks are unsigned: keep every time positive
        for field in ("start", "end", "timestamp"):
            if hasattr(r, field):
                setattr(r, field, getattr(r, field) + 1000)
        if hasattr(r, "name") and draw(st.booleans()):
            r.name = draw(st.sampled_from(STRANGE))
        if hasattr(r, "domain") and draw(st.booleans()):
            r.domain = draw(st.sampled_from(STRANGE))
    for corr in draw(st.lists(st.integers(1, 15), max_size=4)):  # launches and work sharing ids
        records.append(launch(corr, 9, 2000 + corr))
    if draw(st.booleans()):
        records.append(kernel(99, 50, 40))  # ends before it starts
    for d in draw(st.lists(st.integers(0, 3), max_size=3)):  # devices CUDA names, anywhere among the records
        records.append(device(d, draw(st.binary(min_size=16, max_size=16)), draw(st.booleans())))
    if draw(st.booleans()):  # a marker id begun again, on another thread, before its end
        records.append(marker(0, standin.ActivityFlag.MARKER_START, 1500, tid=draw(st.integers(0, 2)), name="again"))
    return records, draw(st.randoms())
