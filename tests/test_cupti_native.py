"""A job that is not Python, collected through the injection library (gpucost_inject.c) built from gpucost's source.

The library runs as CUDA would run it (tests/native_standin/job.c loads it and calls ``InitializeInjection``)
against a C stand-in for libcupti that lays the recorded activity out as CUPTI's own structs of the headers it is
built with.  Expected lines come from the reference conversion (tests/cupti_standin/reference.py) over the same
records and buffers, which shares no code with the library, its frames or their reading.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time
from uuid import UUID

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpucost.cli import main
from gpucost.producers.cupti_injection import record_types
from gpucost.producers.cupti_native import ActivityFolder, ProcessActivity
from gpucost.producers.cupti_records import Identity, Stats
from gpucost.wiring import UsageError
from tests.cupti_standin import cupti as standin
from tests.cupti_standin.reference import ReferenceRecords
from tests.support.cupti_recording import K, kernel, launch, marker, streams
from tests.support.native_cupti import build, collect, environment, write_recording

CONVERSION = ("kernels", "ranges", "unlinked_kernels", "truncated_names", "unmatched_range_ends",
              "open_ranges_at_exit", "bad_records")  # fmt: skip


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    try:
        return build(tmp_path_factory.mktemp("native"))
    except UsageError as exc:  # no C compiler or no CUDA headers (the native extra): say which
        pytest.skip(str(exc))


def named(devices):
    """Each device's UUID as NVML writes it, by Python's uuid module: the MIG instance's for a MIG device."""
    return {d: f"MIG-{UUID(bytes=raw[::-1])}" if mig else f"GPU-{UUID(bytes=raw)}" for d, (mig, raw) in devices.items()}


def reference(buffers, summary, node="n1", devices=None):
    """The reference conversion with the pid and clock offset the command reported for its one process."""
    (process,) = summary["processes"]
    kinds = {int(k): v for k, v in {K.CONCURRENT_KERNEL: "kernel", K.MEMCPY: "memcpy", K.MEMSET: "memset",
             K.RUNTIME: "runtime", K.DRIVER: "runtime", K.MARKER: "marker", K.DEVICE: "device"}.items()}  # fmt: skip
    flags = (int(standin.ActivityFlag.MARKER_START), standin.MARKER_END)
    ref = ReferenceRecords(
        Identity(node, process["pid"], named(devices or {})), process["clock_offset_ns"], kinds, flags, Stats()
    )
    objs = [o for b in buffers for o in ref.add(b)] + ref.finish()
    return [json.dumps(o, separators=(",", ":")) + "\n" for o in objs], ref.stats


devices = st.dictionaries(st.integers(0, 3), st.tuples(st.booleans(), st.binary(min_size=16, max_size=16)))


@settings(max_examples=40, deadline=None)
@given(streams(), st.integers(0, 5), st.integers(0, 9), devices)
def test_any_recording_gives_the_reference_lines(built, tmp_path_factory, stream, n_cuts, code, gpus):
    """Devices CUDA names (DEVICE records) are named so; the others by the fallback, ``<node>/<index>``."""
    records, rnd = stream
    rnd.shuffle(records)
    cuts = sorted(rnd.randint(0, len(records)) for _ in range(n_cuts))
    buffers = [records[a:b] for a, b in zip([0, *cuts], [*cuts, len(records)])]
    tmp = tmp_path_factory.mktemp("run")
    recording = write_recording(tmp / "rec.txt", buffers, dropped=len(records), devices=gpus)
    before = time.time_ns()
    got_code, lines, summary = collect(built, recording, tmp / "k.jsonl", "exit", str(code))
    after = time.time_ns()
    expected, stats = reference(buffers, summary, devices=gpus)
    assert got_code == code and lines == expected
    (process,) = summary["processes"]
    assert {k: process[k] for k in CONVERSION} == {k: getattr(stats, k) for k in CONVERSION}
    assert process["complete"] and process["dropped_by_cupti"] == len(records)
    assert process["bad_frames"] == 0 and process["truncated_bytes"] == 0 and process["unread_bytes"] == 0
    # the offset is the wall clock's at start minus the stand-in's first CUPTI reading, 5,000; drift: 400 less
    assert before - 5_000 <= process["clock_offset_ns"] <= after - 5_000
    assert -400 < process["clock_drift_ns"] + 400 < after - before
    assert not list(tmp.glob(".gpucost-activity-*")), "the activity folder is removed once read"


def test_a_job_killed_leaves_the_buffers_cupti_completed(built, tmp_path):
    """SIGKILL after a flush that is not forced: every buffer but the last was written; no exit frame."""
    first = [kernel(1, 2_000, 2_100), launch(1, 7, 1_990), marker(3, 2, 1_980, tid=7, name="step")]
    buffers = [first, [kernel(2, 3_000, 3_100), launch(2, 7, 2_990), marker(3, standin.MARKER_END, 3_200)]]
    code, lines, summary = collect(built, write_recording(tmp_path / "rec.txt", buffers), tmp_path / "k.jsonl", "kill")
    expected, _ = reference(buffers[:1], summary)
    (process,) = summary["processes"]
    assert code == 137 and lines == expected and len(lines) == 1
    assert not process["complete"] and process["open_ranges_at_exit"] == 1


def test_only_launch_calls_stay_recorded_and_every_kind_is_enabled(built, tmp_path):
    names = {(2, 211): "cudaLaunchKernel_v7000", (2, 17): "cudaGetDevice_v3020", (2, 41): "cudaMemcpyAsync_v3020",
             (2, 273): "cudaLaunchHostFunc_v10000", (1, 307): "cuLaunchKernel", (1, 18): "cuCtxGetDevice",
             (1, 125): "cuStreamQuery", (1, 279): "cuMemsetD8_v2"}  # fmt: skip
    log = tmp_path / "log.txt"
    with environment(CUPTI_STANDIN_LOG=str(log)):
        _, _, summary = collect(built, write_recording(tmp_path / "r.txt", [], names=names), tmp_path / "k.jsonl")
    entries = log.read_text().split("\n")
    assert {int(e.split()[1]) for e in entries if e.startswith("kind ")} == {8, 10, 5, 4, 12, 1, 2}
    assert [e for e in entries if e.startswith("dump ")] == ["dump 8"]  # devices CUDA met before the library came
    off = {(int(d), int(c)) for _, d, c, on in (e.split() for e in entries if e.startswith("api ")) if on == "0"}
    assert off == {(2, 17), (2, 273), (1, 18), (1, 125)}
    assert summary["processes"][0]["api_calls_unrecorded"] == 4


def test_frames_read_in_any_pieces_and_never_crash_on_damage(built, tmp_path):
    records = [kernel(i, 2_000 + i, 2_050 + i, name=f"k{i}") for i in range(1, 30)]
    records += [launch(i, 3, 1_990 + i) for i in range(1, 30, 2)]
    records += [marker(1, 2, 1_000, tid=3, name="outer", domain="d"), marker(1, standin.MARKER_END, 9_000)]
    folder = tmp_path / "act"
    folder.mkdir()
    recording = write_recording(tmp_path / "r", [records])
    env = {"CUDA_INJECTION64_PATH": str(built.library), "GPUCOST_CUPTI_LIBRARY": str(built.cupti),
           "GPUCOST_ACTIVITY_DIR": str(folder), "CUPTI_STANDIN_RECORDS": str(recording)}  # fmt: skip
    subprocess.run([str(built.job)], env=os.environ | env, check=True)
    (file,) = folder.iterdir()
    data = file.read_bytes()

    def read(pieces):
        reader = ProcessActivity("n1", {})
        text = "".join(reader.lines(reader.feed(p)) for p in pieces) + reader.lines(reader.finish())
        return text, reader.summary()

    whole, summary = read([data])
    assert whole.count("\n") == 30 and summary["bad_frames"] == 0
    for step in (1, 7, 100):
        assert read([data[i : i + step] for i in range(0, len(data), step)])[0] == whole
    for cut in range(0, len(data), 13):  # cut anywhere: the whole frames before the cut are read, the rest counted
        _, damaged = read([data[:cut]])
        assert damaged["truncated_bytes"] < len(data)
    huge = struct.pack("<BI", ord("K"), 1 << 30)
    boundary = 0
    while boundary < 200:  # a frame's end past the first 200 bytes, by the frames' own lengths
        boundary += 5 + struct.unpack_from("<I", data, boundary + 1)[0]
    _, damaged = read([data[:boundary], huge, data[boundary:]])
    assert damaged["bad_frames"] == 1 and damaged["unread_bytes"] == len(huge) + len(data) - boundary
    odd = struct.pack("<BI", ord("Z"), 3) + b"abc" + struct.pack("<BI", ord("K"), 2) + b"xy"
    _, damaged = read([data + odd])
    assert damaged["bad_frames"] == 2 and damaged["kernels"] == 29
    _, headless = read([data[data.index(b"K", 40) :]])  # records with no header before them: counted, not read
    assert headless["kernels"] == 0


def test_record_types_are_the_newest_the_header_declares(tmp_path):
    header = tmp_path / "cupti_activity.h"
    body = "} CUpti_ActivityKernel9;\n} CUpti_ActivityKernel10;\n} CUpti_ActivityKernel2;\n"
    header.write_text(body + "} CUpti_ActivityMemcpy6;\n} CUpti_ActivityMemcpyPtoP4;\n} CUpti_ActivityMemset4;\n"
                      "} CUpti_ActivityDevice5;\n")  # fmt: skip
    newest = {"KERNEL_RECORD": "CUpti_ActivityKernel10", "MEMCPY_RECORD": "CUpti_ActivityMemcpy6"}
    newest |= {"MEMSET_RECORD": "CUpti_ActivityMemset4", "DEVICE_RECORD": "CUpti_ActivityDevice5"}
    assert record_types([tmp_path]) == newest


def test_without_headers_or_a_program_the_command_says_what_to_do(tmp_path, capsys):
    with environment(GPUCOST_CUDA_INCLUDE=str(tmp_path)):
        assert main(["collect-kernels", "--out", str(tmp_path / "k"), "--", "true"]) == 2
    assert "gpucost[native]" in capsys.readouterr().err
    assert main(["collect-kernels", "--out", str(tmp_path / "k"), "--", str(tmp_path / "nothing-here")]) == 2
    err = capsys.readouterr().err
    assert "no program" in err and "Traceback" not in err


def test_a_forked_child_writes_nothing_and_an_exec_is_a_process_of_its_own(built, tmp_path):
    """A child forked without exec shares the parent's CUPTI state and exit handler, not its file: the lines are the
    parent's once. A process that execs after CUDA started keeps its pid and starts CUDA again: a second file."""
    buffers = [[kernel(1, 2_000, 2_100), launch(1, 7, 1_990)], [kernel(2, 3_000, 3_100)]]
    recording = write_recording(tmp_path / "rec.txt", buffers, dropped=3)
    code, lines, summary = collect(built, recording, tmp_path / "k.jsonl", "fork")
    assert code == 0 and lines == reference(buffers, summary)[0]
    assert summary["processes"][0]["dropped_by_cupti"] == 3 and "warnings" not in summary
    code, lines, summary = collect(built, recording, tmp_path / "k.jsonl", "exec")
    first, second = summary["processes"]
    assert code == 0 and first["pid"] == second["pid"] and not first["complete"] and second["complete"]
    assert lines == reference(buffers, {"processes": [second]})[0] and summary["warnings"]


def test_a_start_cupti_refuses_half_way_collects_nothing_of_that_process(built, tmp_path):
    log = tmp_path / "log.txt"
    recording = write_recording(tmp_path / "rec.txt", [[kernel(1, 2_000, 2_100)]])
    with environment(CUPTI_STANDIN_REFUSE="12", CUPTI_STANDIN_LOG=str(log)):
        code, lines, summary = collect(built, recording, tmp_path / "k.jsonl", "exit", "0")
    assert code == 0 and lines == [] and summary["processes"] == [] and summary["warnings"]
    entries = log.read_text().split()
    enabled = {int(k) for w, k in zip(entries, entries[1:]) if w == "kind"}
    assert enabled and enabled == {int(k) for w, k in zip(entries, entries[1:]) if w == "off"}  # every one undone


def test_a_name_that_is_not_utf8_keeps_its_kernel_with_the_bad_bytes_replaced(built, tmp_path):
    bad = b"gemm\xff\xfe" + "é".encode()[:1]
    k = kernel(1, 2_000, 2_100)
    k.name = bad
    range_start = marker(2, 2, 1_900, tid=7, name=b"st\xffep")
    buffers = [[range_start, k, launch(1, 7, 1_990), marker(2, standin.MARKER_END, 2_500)]]
    _, lines, summary = collect(built, write_recording(tmp_path / "rec.txt", buffers), tmp_path / "k.jsonl")
    rows = [json.loads(line) for line in lines]
    assert {r["name"] for r in rows} == {bad.decode(errors="replace"), b"st\xffep".decode(errors="replace")}
    (kernel_row,) = [r for r in rows if r["kind"] == "kernel_activity"]
    assert kernel_row["range_path"] == [b"st\xffep".decode(errors="replace")]
    assert summary["processes"][0]["bad_records"] == 0


def test_errors_of_the_set_up_are_said_not_raised(built, tmp_path, capsys):
    args = ["collect-kernels", "--cupti-library", str(built.cupti), "--", str(built.job)]
    assert main(["collect-kernels", "--out", str(tmp_path / "no" / "k.jsonl"), *args[1:]]) == 2
    assert main(["collect-kernels", "--out", str(tmp_path), *args[1:]]) == 2  # a folder: nothing starts
    with environment(CC='gcc "'):
        assert main(["collect-kernels", "--out", str(tmp_path / "k.jsonl"), *args[1:]]) == 2
    with environment(CC="/nonexistent/cc", XDG_CACHE_HOME=str(tmp_path / "cache")):
        assert main(["collect-kernels", "--out", str(tmp_path / "k.jsonl"), *args[1:]]) == 2
    (tmp_path / "file").write_text("")
    with environment(XDG_CACHE_HOME=str(tmp_path / "file")):
        assert main(["collect-kernels", "--out", str(tmp_path / "k.jsonl"), *args[1:]]) == 2
    err = capsys.readouterr().err
    assert "cannot be written" in err and "could not run" in err and "could not be written" in err
    assert "cannot be read as words" in err and "Traceback" not in err
    assert not list(tmp_path.glob(".gpucost-activity-*")) and not (tmp_path / "k.jsonl").exists()


def test_each_process_s_file_is_read_on_its_own_and_closed_at_its_exit_frame(built, tmp_path):
    """A job of many processes (a launcher's ranks) would otherwise hold a descriptor for each; and one process's
    devices are not another's (its CUDA_VISIBLE_DEVICES)."""
    folder = tmp_path / "act"
    folder.mkdir()
    env = {"CUDA_INJECTION64_PATH": str(built.library), "GPUCOST_CUPTI_LIBRARY": str(built.cupti),
           "GPUCOST_ACTIVITY_DIR": str(folder)}  # fmt: skip
    gpu = {0: (False, bytes(range(16)))}
    for i in range(5):
        recording = write_recording(tmp_path / f"r{i}", [[kernel(1, 2_000, 2_100)]], devices=gpu if i == 0 else {})
        subprocess.run([str(built.job)], env=os.environ | env | {"CUPTI_STANDIN_RECORDS": str(recording)}, check=True)
    files = ActivityFolder(folder, "n1", {})
    before = len(os.listdir("/proc/self/fd"))
    rows = [json.loads(line) for line in "".join(files.poll()).splitlines()]
    assert len(os.listdir("/proc/self/fd")) == before and len(files.summaries()) == 5
    assert sorted(r["gpu_uuid"] for r in rows) == sorted([named(gpu)[0]] + ["n1/0"] * 4)


def test_the_job_can_still_be_interrupted(built, tmp_path):
    """The command outlives a Ctrl-C without passing it on; the job must still receive it (an ignored signal stays
    ignored across exec, so the command cannot simply ignore it)."""
    command = [sys.executable, "-m", "gpucost.cli", "collect-kernels", "--out", str(tmp_path / "k.jsonl"),
               "--injection-library", str(built.library), "--cupti-library", str(built.cupti), "--",
               "sh", "-c", "grep SigIgn /proc/self/status"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    ignored = int(done.stdout.split()[-1], 16)
    assert not ignored & (1 << (2 - 1)), done.stdout  # SIGINT is signal 2: bit 1 of the mask
