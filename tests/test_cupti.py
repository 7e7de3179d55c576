"""The CUPTI collector against a stand-in that replays recorded activity through the collector's own callbacks.

Expected objects come from ``brute_force``, which reads the whole recording at once (no buffers, no order),
so the collector's streaming joins, buffer handling and clock conversion are checked against a reading that
shares none of its code.
"""

from __future__ import annotations

import argparse
import json
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpucost.cli import main
from gpucost.collect_kernels import cmd_collect_kernels
from gpucost.producers.cupti import Collector, Identity
from gpucost.wiring import UsageError
from tests.cupti_standin import cupti as standin
from tests.support.cupti_recording import NODE, PID, K, copy, kernel, launch, marker, recordings, replay, streams


def brute_force(records: list, offset: int) -> list[dict]:
    """Every kernel with the runtime record of its correlation id; every start marker with its end."""
    launches = {r.correlation_id: r for r in records if r.kind in (K.RUNTIME, K.DRIVER)}
    ends = {r.id: r for r in records if r.kind == K.MARKER and r.flags_ == standin.MARKER_END}
    out = []
    for r in records:
        if r.kind in (K.CONCURRENT_KERNEL, K.MEMCPY, K.MEMSET):
            cat = {K.MEMCPY: "memcpy", K.MEMSET: "memset"}.get(r.kind) or (
                "communication" if r.name.split("_")[0] in ("ncclKernel", "ncclDevKernel") else "kernel"
            )
            obj = {
                "kind": "kernel_activity",
                "node_id": NODE,
                "pid": PID,
                "gpu_uuid": f"{NODE}/{r.device_id}",
                "device": r.device_id,
                "stream": r.stream_id,
                "correlation_id": r.correlation_id,
                "category": cat,
                "name": getattr(r, "name", cat),
                "start_ns": r.start + offset,
                "end_ns": r.end + offset,
                "source": "cupti",
            }
            if r.kind == K.CONCURRENT_KERNEL:
                obj |= {"grid": [2, 1, 1], "block": [128, 1, 1], "registers_per_thread": 32, "shared_memory_bytes": 64}
            else:
                obj["bytes"] = 4096
            if r.correlation_id in launches:
                obj |= {
                    "launch_tid": launches[r.correlation_id].thread_id,
                    "launch_ns": launches[r.correlation_id].start + offset,
                }
            out.append(obj)
        elif r.kind == K.MARKER and r.flags_ == standin.ActivityFlag.MARKER_START and r.id in ends:
            out.append(
                {
                    "kind": "annotation_range",
                    "node_id": NODE,
                    "pid": PID,
                    "tid": r.object_id.pt.thread_id,
                    "domain": r.domain or "default",
                    "name": r.name,
                    "start_ns": r.timestamp + offset,
                    "end_ns": ends[r.id].timestamp + offset,
                    "source": "cupti",
                }
            )
    return out


def canonical(objs: list[dict]) -> list[str]:
    return sorted(json.dumps(o, sort_keys=True) for o in objs)


@settings(max_examples=150, deadline=None)
@given(recordings(), st.integers(-(10**15), 10**15), st.integers(0, 5))
def test_any_buffering_and_order_gives_the_brute_force_reading(recording, offset, n_cuts):
    records, rnd = recording
    shuffled = list(records)
    rnd.shuffle(shuffled)  # completion out of order, also across buffers
    cuts = sorted(rnd.randint(0, len(shuffled)) for _ in range(n_cuts))
    buffers = [shuffled[a:b] for a, b in zip([0, *cuts], [*cuts, len(shuffled)])]
    # wall clock reads 2·offset-ish around a CUPTI clock of 0: the midpoint rule gives exactly `offset`
    got, stats, requested = replay(buffers, wall=(offset - 3, offset + 3, offset, offset))
    # a kernel's range path needs the host's records in the order they happened (checked below)
    assert canonical([{k: v for k, v in o.items() if k != "range_path"} for o in got]) == canonical(
        brute_force(records, offset)
    )
    assert requested == len(buffers)
    assert stats.kernels == sum(o["kind"] == "kernel_activity" for o in got)
    assert stats.unlinked_kernels == sum("launch_tid" not in o for o in got if o["kind"] == "kernel_activity")


def test_dropped_records_and_clock_drift_are_reported():
    got, stats, _ = replay([[kernel(1, 10, 20)]], dropped=17, wall=(100, 100, 190, 210), clock=(0, 50))
    assert stats.dropped_by_cupti == 17
    assert stats.clock_drift_ns == (200 - 50) - 100
    assert got[0]["start_ns"] == 110 and got[0]["end_ns"] == 120


def test_bad_records_are_counted_not_fatal():
    backwards = kernel(2, 50, 40)
    broken = standin.record(kind=K.CONCURRENT_KERNEL)  # no fields at all
    got, stats, _ = replay([[backwards, broken, kernel(3, 1, 2)], [marker(9, standin.MARKER_END, 5)]])
    assert [o["correlation_id"] for o in got] == [3]
    assert stats.bad_records == 2 and stats.unmatched_range_ends == 1


def test_long_names_are_truncated_and_counted():
    got, stats, _ = replay([[kernel(1, 0, 1, name="k" * 5000)]])
    assert got[0]["name"] == "k" * 1024 and stats.truncated_names == 1


def test_only_the_calls_that_put_work_on_a_device_are_recorded():
    """Recording every API call made a launch-bound job 6.5 times slower on an H200 (BENCHMARKS.md); the calls
    below are classified by hand from what each does, not by the collector's word rule."""
    _, stats, _ = replay([[kernel(1, 0, 1)]])
    rt, drv = standin.runtime_api_trace_cbid, standin.driver_api_trace_cbid
    no_device_work = {
        rt.cudaGetDevice_v3020,
        rt.cudaStreamSynchronize_v3020,
        rt.cudaLaunchHostFunc_v10000,
        drv.cuCtxGetDevice,
        drv.cuStreamQuery,
    }
    assert standin.STATE["calls_off"] == no_device_work  # launches, copies, sets and bounds stay as they are
    assert stats.api_calls_unrecorded == len(no_device_work)


def test_a_cupti_without_per_call_switches_records_every_call(monkeypatch):
    monkeypatch.delattr(standin, "activity_enable_runtime_api")
    monkeypatch.delattr(standin, "activity_enable_driver_api")
    got, stats, _ = replay([[kernel(1, 0, 1), launch(1, 7, 0)]])
    assert stats.api_calls_unrecorded == 0 and got[0]["launch_tid"] == 7


def test_launches_whose_work_never_comes_do_not_block_later_links():
    """Launch records wait oldest-out: a long run's host functions must not use up the room for later kernels."""
    standin.load([[launch(c, 1, c) for c in range(1, 11)] + [launch(99, 5, 50)], [kernel(99, 60, 70)]])
    got: list[dict] = []
    collector = Collector(standin, Identity(NODE, PID), got.extend, wall_now=lambda: 0, max_pending=4)
    collector.start()
    stats = collector.stop()
    assert [(o["correlation_id"], o.get("launch_tid")) for o in got] == [(99, 5)] and stats.unlinked_kernels == 0


def test_command_runs_the_job_and_writes_json_lines(tmp_path, capsys):
    script = tmp_path / "job.py"
    script.write_text("import sys\nassert sys.argv[1:] == ['--steps', '2']\nsys.exit(3)\n")
    out = tmp_path / "k.jsonl"
    records = [
        kernel(1, 5, 9),
        launch(1, 11, 2),
        marker(1, standin.ActivityFlag.MARKER_START, 1, 11, "step"),
        marker(1, standin.MARKER_END, 10),
    ]
    standin.load([records[2:], records[:2]], dropped=4, clock=(0, 0))
    args = argparse.Namespace(out=str(out), node_id=NODE, job=["--", "python", str(script), "--steps", "2"])
    assert cmd_collect_kernels(args, cupti=standin) == 3
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert {o["kind"] for o in lines} == {"kernel_activity", "annotation_range"}
    summary = json.loads(capsys.readouterr().err.strip().splitlines()[-1])["collect_kernels"]
    assert summary["dropped_by_cupti"] == 4 and summary["kernels"] == 1 and summary["ranges"] == 1


def test_a_cupti_without_a_gpu_is_a_usage_error_not_a_traceback(tmp_path):
    class NotSupportedError(Exception):
        pass

    class NoGpu:
        ActivityKind, ActivityFlag = standin.ActivityKind, standin.ActivityFlag

        @staticmethod
        def get_timestamp() -> int:
            raise NotSupportedError("CUPTI_ERROR_NOT_SUPPORTED")

    script = tmp_path / "job.py"
    script.write_text("pass\n")
    args = argparse.Namespace(out=str(tmp_path / "k.jsonl"), node_id=NODE, job=["--", str(script)])
    with pytest.raises(UsageError, match="NotSupportedError.*NVIDIA GPU"):
        cmd_collect_kernels(args, cupti=NoGpu)
    args.job = ["--", str(tmp_path / "missing.py")]
    with pytest.raises(UsageError, match="no script at"):
        cmd_collect_kernels(args, cupti=standin)


def test_without_cupti_python_the_command_says_what_to_install(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "cupti", None)  # import cupti fails, as without the extra
    script = tmp_path / "job.py"
    script.write_text("pass\n")
    assert main(["collect-kernels", "--out", str(tmp_path / "k.jsonl"), "--", "python", str(script)]) == 2
    assert "pip install 'gpucost[cupti]'" in capsys.readouterr().err


# --- the fast path against the reference conversion, record for record ---


def _run_both(buffers, offset, max_pending, node):
    from gpucost.producers.cupti_records import KernelRecords, Stats
    from tests.cupti_standin import raw
    from tests.cupti_standin.reference import ReferenceRecords

    kinds = {int(k): v for k, v in {K.CONCURRENT_KERNEL: "kernel", K.MEMCPY: "memcpy", K.MEMSET: "memset",
             K.RUNTIME: "runtime", K.DRIVER: "runtime", K.MARKER: "marker", K.DEVICE: "device"}.items()}  # fmt: skip
    flags = (int(standin.ActivityFlag.MARKER_START), standin.MARKER_END)
    identity = Identity(node, PID, {1: 'GPU-1"%'})
    ref = ReferenceRecords(identity, offset, kinds, flags, Stats(), max_pending)
    fast = KernelRecords(identity, offset, kinds, flags, Stats(), max_pending, layouts=raw)
    ref_batches = [ref.add(b) for b in buffers] + [ref.finish()]
    fast_batches = [fast.add(b) for b in buffers] + [fast.finish()]
    return ref, ref_batches, fast, fast_batches


@settings(max_examples=200, deadline=None)
@given(streams(), st.integers(-(10**12), 10**12), st.integers(0, 6), st.integers(1, 6), st.booleans(), st.booleans())
def test_fast_path_gives_exactly_the_reference_records(stream, offset, n_cuts, max_pending, as_raw, odd_node):
    """Same objects, same order, same batches, same stats; JSON Lines byte for byte as json.dumps writes them.
    Records come plain (attribute reads) or shaped as cupti-python's (bytes reads), with small bounds."""
    from tests.cupti_standin import raw

    records, rnd = stream
    rnd.shuffle(records)
    if as_raw:
        records = [raw.raw(r) if len(vars(r)) > 1 else r for r in records]
    cuts = sorted(rnd.randint(0, len(records)) for _ in range(n_cuts))
    buffers = [records[a:b] for a, b in zip([0, *cuts], [*cuts, len(records)])]
    node = 'n"%s\\1' if odd_node else NODE
    ref, ref_batches, fast, fast_batches = _run_both(buffers, offset, max_pending, node)
    assert [fast.objects(b) for b in fast_batches] == ref_batches
    expected = ["".join(json.dumps(o, separators=(",", ":")) + "\n" for o in b) for b in ref_batches]
    assert [fast.lines(b) for b in fast_batches] == expected
    assert fast.stats == ref.stats


def test_cupti_shaped_records_are_read_from_their_bytes(monkeypatch):
    """The bytes reader is what reads cupti-python-shaped records (not the attributes), and gives their values."""
    from tests.cupti_standin import raw

    records = [kernel(1, 1000, 1010, name="gemm"), launch(1, 7, 990), copy(2, 5, 9, kind=K.MEMSET), launch(2, 7, 3)]
    records += [
        marker(4, standin.ActivityFlag.MARKER_START, 980, tid=7, name="step"),
        marker(4, standin.MARKER_END, 1020),
    ]
    ref, ref_batches, fast, fast_batches = _run_both([[raw.raw(r) for r in records]], 0, 10, NODE)
    readers = fast.bytes_readers()
    assert set(readers) == {raw.ActivityKernel10, raw.ActivityAPI, raw.ActivityMemset4, raw.ActivityMarker2}
    assert all(kind is not None for kind in readers.values())
    assert [fast.objects(b) for b in fast_batches] == ref_batches and len(ref_batches[0]) == 3


def test_devices_are_named_by_cuda_s_device_records_not_by_nvml_s_order():
    """CUDA_VISIBLE_DEVICES=2 makes a process's device 0 the node's third GPU: the DEVICE record says which."""
    from tests.support.cupti_recording import device

    uuid = bytes(range(16))
    standin.load([[kernel(1, 10, 20), device(0, uuid), kernel(2, 30, 40)]])
    got: list[dict] = []
    collector = Collector(standin, Identity(NODE, PID, {0: "GPU-nvml-order"}), got.extend)
    collector.start()
    assert K.DEVICE in standin.STATE["enabled"] and standin.STATE["dumped"] == {K.DEVICE}
    collector.stop()
    assert [k["gpu_uuid"] for k in got] == ["GPU-nvml-order", "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"]
