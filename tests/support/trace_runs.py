"""Running ``gpucost trace-events`` in the tests and comparing what it wrote with ``trace_oracle``'s reading of the
raw file; small Kineto traces written by hand."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from gpucost.schemas.codec import decode_line
from gpucost.schemas.kernels import KernelActivity
from tests.support.cli import gpucost
from tests.support.kernel_money import DATA

NSYS = DATA / "pipit-nsys" / "saxpy-mpi-cuda_nsys_perlmutter0.sqlite"
CATS = {"ranges": ("user_annotation",), "operators": ("cpu_op",), "both": ("user_annotation", "cpu_op")}
FIELDS = ("node_id", "pid", "gpu_uuid", "device", "name", "category", "end_ns", "launch_tid", "launch_ns")


def convert(tmp_path: Path, *args: str, check: bool = True) -> tuple[dict, dict, object]:
    """Run the command; its events by (correlation id, start ns, stream) and its summary (and the process)."""
    out = tmp_path / "kernels.jsonl"
    proc = gpucost("trace-events", *args, "--out", str(out), check=check)
    if proc.returncode:
        return {}, {}, proc
    events = {}
    for line in out.read_text().splitlines():
        ev = decode_line(line)
        assert isinstance(ev, KernelActivity), ev  # the pipeline's own decoder takes every line
        key = (ev.correlation_id, ev.start_ns, ev.stream)
        assert key not in events
        events[key] = ev
    return events, json.loads(proc.stderr)["trace_events"], proc


def same(events: dict, expected: dict) -> None:
    assert events.keys() == expected.keys()
    for key, want in expected.items():
        got = events[key]
        assert {f: getattr(got, f) for f in FIELDS} == {f: want[f] for f in FIELDS}, key
        assert (list(got.range_path) if got.range_path else None) == want["range_path"], key


def trace_pid(path: Path) -> int:
    with gzip.open(path, "rt") as f:
        pids = {e["pid"] for e in json.load(f)["traceEvents"] if e.get("cat") == "cuda_runtime"}
    assert len(pids) == 1
    return pids.pop()


def write_trace(tmp_path: Path, events: list[dict]) -> Path:
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"baseTimeNanoseconds": 1_767_571_200 * 10**9, "traceEvents": events}))
    return path


def span(cat: str, name: str, ts: int, dur: int, **args: object) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 7, "tid": 8, "ts": ts, "dur": dur, "args": args}


def gpu_event(corr: int, ts: int, device: int = 0) -> dict:
    args = {"correlation": corr, "device": device, "stream": 3}
    return {"ph": "X", "cat": "kernel", "name": "k", "pid": device, "tid": 3, "ts": ts, "dur": 5, "args": args}


def small_trace(tmp_path: Path) -> Path:
    return write_trace(tmp_path, [span("cuda_runtime", "cudaLaunchKernel", 50, 1, correlation=1), gpu_event(1, 60)])
