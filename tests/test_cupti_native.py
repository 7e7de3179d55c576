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
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpucost.cli import main
from gpucost.producers.cupti_injection import record_types
from gpucost.producers.cupti_native import ProcessActivity
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


def reference(buffers, summary, node="n1"):
    """The reference conversion with the pid and clock offset the command reported for its one process."""
    (process,) = summary["processes"]
    kinds = {int(k): v for k, v in {K.CONCURRENT_KERNEL: "kernel", K.MEMCPY: "memcpy", K.MEMSET: "memset",
             K.RUNTIME: "runtime", K.DRIVER: "runtime", K.MARKER: "marker"}.items()}  # fmt: skip
    flags = (int(standin.ActivityFlag.MARKER_START), standin.MARKER_END)
    ref = ReferenceRecords(Identity(node, process["pid"]), process["clock_offset_ns"], kinds, flags, Stats())
    objs = [o for b in buffers for o in ref.add(b)] + ref.finish()
    return [json.dumps(o, separators=(",", ":")) + "\n" for o in objs], ref.stats


@settings(max_examples=40, deadline=None)
@given(streams(), st.integers(0, 5), st.integers(0, 9))
def test_any_recording_gives_the_reference_lines(built, tmp_path_factory, stream, n_cuts, code):
    records, rnd = stream
    rnd.shuffle(records)
    cuts = sorted(rnd.randint(0, len(records)) for _ in range(n_cuts))
    buffers = [records[a:b] for a, b in zip([0, *cuts], [*cuts, len(records)])]
    tmp = tmp_path_factory.mktemp("run")
    recording = write_recording(tmp / "rec.txt", buffers, dropped=len(records))
    before = time.time_ns()
    got_code, lines, summary = collect(built, recording, tmp / "k.jsonl", "exit", str(code))
    after = time.time_ns()
    expected, stats = reference(buffers, summary)
    assert got_code == code and lines == expected
    (process,) = summary["processes"]
    assert {k: process[k] for k in CONVERSION} == {k: getattr(stats, k) for k in CONVERSION}
    assert process["complete"] and process["dropped_by_cupti"] == len(records)
    assert process["bad_frames"] == 0 and process["truncated_bytes"] == 0
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
    assert {int(e.split()[1]) for e in entries if e.startswith("kind ")} == {10, 5, 4, 12, 1, 2}
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
    _, damaged = read([data[:200], huge, data[200:]])
    assert damaged["bad_frames"] >= 1
    odd = struct.pack("<BI", ord("Z"), 3) + b"abc" + struct.pack("<BI", ord("K"), 2) + b"xy"
    _, damaged = read([data + odd])
    assert damaged["bad_frames"] == 2 and damaged["kernels"] == 29
    _, headless = read([data[data.index(b"K", 40) :]])  # records with no header before them: counted, not read
    assert headless["kernels"] == 0


def test_record_types_are_the_newest_the_header_declares(tmp_path):
    header = tmp_path / "cupti_activity.h"
    body = "} CUpti_ActivityKernel9;\n} CUpti_ActivityKernel10;\n} CUpti_ActivityKernel2;\n"
    header.write_text(body + "} CUpti_ActivityMemcpy6;\n} CUpti_ActivityMemcpyPtoP4;\n} CUpti_ActivityMemset4;\n")
    newest = {"KERNEL_RECORD": "CUpti_ActivityKernel10", "MEMCPY_RECORD": "CUpti_ActivityMemcpy6"}
    assert record_types([tmp_path]) == newest | {"MEMSET_RECORD": "CUpti_ActivityMemset4"}


def test_without_headers_or_a_program_the_command_says_what_to_do(tmp_path, capsys):
    with environment(GPUCOST_CUDA_INCLUDE=str(tmp_path)):
        assert main(["collect-kernels", "--out", str(tmp_path / "k"), "--", "true"]) == 2
    assert "gpucost[native]" in capsys.readouterr().err
    assert main(["collect-kernels", "--out", str(tmp_path / "k"), "--", str(tmp_path / "nothing-here")]) == 2
    err = capsys.readouterr().err
    assert "no program" in err and "Traceback" not in err
