"""CPU cost per record of turning CUPTI activity records into JSON Lines (no GPU needed).

The records are shaped like the launch-bound job of ``benchmarks/cupti_overhead.py``: per step an NVTX
range, per matmul a range and five kernels, each with the runtime record of its launch; each buffer holds
the host-side records (launches, markers) of a stretch of steps and then its kernels, as CUPTI delivers
them.  They come in three forms: plain namespaces (attribute reads are cheap), records shaped as
cupti-python 13.0.1's (``tests/cupti_standin/raw.py``: an object over a numpy record array, each attribute
read through it), and, with ``--cupti`` where cupti-python is importable, cupti-python's own objects made
with ``from_ptr`` over the same bytes.  Each is converted by

- ``before``: the conversion the collector used up to this change (``tests/cupti_standin/reference.py``,
  one dict per record, ``int()`` on every field) and its writer, ``json.dumps`` per object;
- ``after``: the collector's ``KernelRecords`` and ``lines`` (what ``collect-kernels`` writes);
- ``read``: only the attribute reads ``before`` makes (what a record's fields cost by themselves),

and the benchmark prints one JSON object: ns per record (best of ``--repetitions``), and after/before; with
``--cupti`` also ``made_by_cupti_python``, the ns per record cupti-python's ``from_ptr`` takes to make its
objects (including copying the bytes into its dtype here): work its buffer callback does before ours runs.

    PYTHONPATH=$PWD python benchmarks/cupti_convert.py --steps 50 --repetitions 5 [--cupti]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from gpucost.producers.cupti_layout import dtype_name
from gpucost.producers.cupti_records import Identity, KernelRecords, Stats
from tests.cupti_standin import cupti as standin
from tests.cupti_standin import raw
from tests.cupti_standin.reference import ReferenceRecords

K = standin.ActivityKind
KINDS = {int(K.CONCURRENT_KERNEL): "kernel", int(K.MEMCPY): "memcpy", int(K.MEMSET): "memset"}
KINDS |= {int(K.RUNTIME): "runtime", int(K.DRIVER): "runtime", int(K.MARKER): "marker"}
FLAGS = (int(standin.ActivityFlag.MARKER_START), standin.MARKER_END)
NAMES = [
    "ampere_sgemm_64x64_nn",
    "void at::native::vectorized_elementwise_kernel<4, at::native::tanh_kernel_cuda(at::TensorIteratorBase&)",
    "void at::native::vectorized_elementwise_kernel<4, at::native::AUnaryFunctor<float, float, float, "
    "at::native::binary_internal::MulFunctor<float> >, std::array<char*, 2ul> >(int, float, std::array)",
    "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)",
    "cutlass::Kernel2<cutlass_80_simt_sgemm_128x32_8x5_nn_align1>(cutlass_80_simt_sgemm_128x32_8x5_nn_align1::Params)",
]


def stream(steps: int, matmuls: int, steps_per_buffer: int) -> list[list[Any]]:
    rec, corr, mid, t = standin.record, 0, 0, 10**9
    buffers, host, device = [], [], []
    for step in range(steps):
        mid += 1
        step_id, t = mid, t + 10
        host.append(rec(kind=K.MARKER, id=step_id, flags_=2, timestamp=t, name="step", domain="",
                        object_id=rec(pt=rec(thread_id=4242))))  # fmt: skip
        for i in range(matmuls):
            mid += 1
            host.append(rec(kind=K.MARKER, id=mid, flags_=2, timestamp=t + 1, name=f"mm{i % 4}", domain="",
                            object_id=rec(pt=rec(thread_id=4242))))  # fmt: skip
            for name in NAMES:
                corr, t = corr + 1, t + 7
                host.append(rec(kind=K.RUNTIME, correlation_id=corr, thread_id=4242, start=t, end=t + 3))
                device.append(rec(kind=K.CONCURRENT_KERNEL, correlation_id=corr, start=t + 20, end=t + 900,
                                  name=name, device_id=0, stream_id=7, grid_x=8, grid_y=8, grid_z=1, block_x=256,
                                  block_y=1, block_z=1, registers_per_thread=64, static_shared_memory=0,
                                  dynamic_shared_memory=4096))  # fmt: skip
            host.append(rec(kind=K.MARKER, id=mid, flags_=4, timestamp=t + 2, name="", domain="",
                            object_id=rec(pt=rec(thread_id=0))))  # fmt: skip
        host.append(rec(kind=K.MARKER, id=step_id, flags_=4, timestamp=t + 3, name="", domain="",
                        object_id=rec(pt=rec(thread_id=0))))  # fmt: skip
        if (step + 1) % steps_per_buffer == 0 or step == steps - 1:
            buffers.append(host + device)
            host, device = [], []
    return buffers


def cupti_objects(buffers: list[list[Any]]) -> list[list[Any]]:
    """cupti-python's own objects over the raw stand-in's bytes (``from_ptr``, as its buffer callback makes)."""
    from cupti import cupti  # noqa: PLC0415 — optional

    sys.unraisablehook = lambda *_: None  # their __dealloc__ asks cupti-python's buffer registry for our arrays
    classes = {t: getattr(cupti, t.__name__) for t in (raw.ActivityKernel10, raw.ActivityAPI, raw.ActivityMarker2)}
    out = []
    for buffer in buffers:
        objs = []
        for r in buffer:
            real = getattr(cupti, dtype_name(type(r)))
            mine = np.frombuffer(bytearray(r.__dict__["_data"].tobytes()), dtype=real)  # same offsets, same bytes
            r.__dict__["_keep"] = mine
            objs.append(classes[type(r)].from_ptr(mine.ctypes.data, readonly=True))
        out.append(objs)
    return out


def before(buffers: list[list[Any]]) -> int:
    records = ReferenceRecords(Identity("node-1", 4242), 0, KINDS, FLAGS, Stats())
    size = 0
    for buffer in buffers:
        size += len("".join(json.dumps(o, separators=(",", ":")) + "\n" for o in records.add(buffer)))
    return size + len("".join(json.dumps(o, separators=(",", ":")) + "\n" for o in records.finish()))


def after(buffers: list[list[Any]], layouts: Any = None) -> int:
    records = KernelRecords(Identity("node-1", 4242), 0, KINDS, FLAGS, Stats(), layouts=layouts)
    return sum(len(records.lines(records.add(b))) for b in buffers) + len(records.lines(records.finish()))


def read_only(buffers: list[list[Any]]) -> int:
    n = 0
    for buffer in buffers:
        for r in buffer:
            n += r.kind
            if r.kind == K.CONCURRENT_KERNEL:
                for f in ("start", "end", "name", "device_id", "stream_id", "correlation_id", "grid_x", "grid_y",
                          "grid_z", "block_x", "block_y", "block_z", "registers_per_thread",
                          "static_shared_memory", "dynamic_shared_memory"):  # fmt: skip
                    getattr(r, f)
            elif r.kind == K.RUNTIME:
                r.correlation_id, r.thread_id, r.start  # noqa: B018
            else:
                r.flags_, r.id, r.timestamp, r.object_id.pt.thread_id, r.domain, r.name  # noqa: B018
    return n


def best_ns(run: Callable[[], Any], records: int, repetitions: int) -> float:
    times = []
    for _ in range(repetitions):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return round(min(times) / records * 1e9, 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--matmuls", type=int, default=40)
    parser.add_argument("--steps-per-buffer", type=int, default=10)
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--cupti", action="store_true", help="also cupti-python's own objects (needs cupti-python)")
    args = parser.parse_args()
    plain = stream(args.steps, args.matmuls, args.steps_per_buffer)
    forms: dict[str, tuple[list[list[Any]], Any]] = {"plain": (plain, None)}
    forms["cupti_shaped"] = ([[raw.raw(r) for r in b] for b in plain], raw)
    if args.cupti:
        from cupti import cupti  # noqa: PLC0415 — optional

        t0 = time.perf_counter()
        forms["cupti_python"] = (cupti_objects(forms["cupti_shaped"][0]), cupti)
        assert before(forms["cupti_python"][0]) == after(forms["cupti_python"][0], cupti)  # reads its bytes right
        made = (time.perf_counter() - t0) / sum(len(b) for b in plain) * 1e9  # from_ptr, before any callback
    records = sum(len(b) for b in plain)
    assert before(plain) == after(plain) == after(forms["cupti_shaped"][0], raw)  # same JSON Lines, same length
    result: dict[str, Any] = {
        "benchmark": "cupti_convert",
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, {platform.system()}",
        "python": platform.python_version(),
        "records": records,
        "buffers": len(plain),
        "ns_per_record": {},
    }
    for form, (buffers, layouts) in forms.items():
        ns = {
            "before": best_ns(lambda b=buffers: before(b), records, args.repetitions),
            "after": best_ns(lambda b=buffers, lay=layouts: after(b, lay), records, args.repetitions),
            "read": best_ns(lambda b=buffers: read_only(b), records, args.repetitions),
        }
        result["ns_per_record"][form] = ns | {"after_over_before": round(ns["after"] / ns["before"], 3)}
    if args.cupti:
        result["ns_per_record"]["cupti_python"]["made_by_cupti_python"] = round(made, 1)
    print(json.dumps(result), flush=True)
    if args.cupti:
        os._exit(0)  # cupti-python's objects over our arrays would complain to its buffer registry at exit
    return 0


if __name__ == "__main__":
    sys.exit(main())
