"""``gpucost kernels`` against an independent recomputation: the raw trace read with the standard library
(json with Decimal, sqlite3 SQL), busy time and each kernel's share by brute force over the slices between
event boundaries with exact fractions, and a largest-remainder deal written here, not imported."""

from __future__ import annotations

import gzip
import json
import sqlite3
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpucost.cli import main
from tests.support.kernel_money import DATA, KINETO, deal, half_even

NSYS = sorted((DATA / "pipit-nsys").glob("*.sqlite"))
PRICE = Decimal("2.5")


def brute(kernels: list[tuple[str, int, int]], price: Decimal) -> dict:
    """Per-device figures from (name, start ns, end ns), slice by slice."""
    bounds = sorted({t for _, s, e in kernels for t in (s, e)})
    share: dict[str, Fraction] = {n: Fraction(0) for n, _, _ in kernels}
    busy = 0
    for lo, hi in zip(bounds, bounds[1:]):
        running = [n for n, s, e in kernels if s <= lo and hi <= e and e > s]
        if running:
            busy += hi - lo
            for n in running:
                share[n] += Fraction(hi - lo, len(running))
    micro = half_even(Fraction(busy) * Fraction(price) * 10**6 / (3600 * 10**9))
    return {
        "busy_ns": busy,
        "window_ns": (max(e for _, _, e in kernels) - min(s for _, s, _ in kernels)),
        "cost_micro_usd": micro,
        "busy_by_name": deal(busy, share),
        "micro_by_name": deal(micro, share),
    }


def _report(capsys, files, price=PRICE) -> dict:
    assert main(["kernels", *map(str, files), "--usd-per-gpu-hour", str(price), "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def _assert_device(device: dict, expected: dict) -> None:
    assert (device["busy_ns"], device["window_ns"], device["cost_micro_usd"]) == (
        expected["busy_ns"],
        expected["window_ns"],
        expected["cost_micro_usd"],
    )
    assert {k["name"]: k["busy_ns"] for k in device["kernels"]} == expected["busy_by_name"]
    assert {k["name"]: k["cost_micro_usd"] for k in device["kernels"]} == expected["micro_by_name"]
    top = [r for r in device["ranges"] if "/" not in r["path"]]
    assert sum(r["cost_micro_usd"] for r in top) <= device["cost_micro_usd"]
    for r in device["ranges"]:  # each level within its parent
        children = [c for c in device["ranges"] if c["path"].rsplit("/", 1)[0] == r["path"] and "/" in c["path"]]
        assert sum(c["cost_micro_usd"] for c in children) <= r["cost_micro_usd"]
        assert sum(c["busy_ns"] for c in children) <= r["busy_ns"]


def _kineto_raw(path: Path) -> dict[int, list[tuple[str, int, int]]]:
    doc = json.loads(gzip.decompress(path.read_bytes()), parse_float=Decimal)
    base = doc.get("baseTimeNanoseconds", 0)
    out: dict[int, list] = {}
    for ev in doc["traceEvents"]:
        if ev.get("ph") == "X" and ev.get("cat") == "kernel":
            start = base + int(Decimal(ev["ts"]) * 1000)
            out.setdefault(ev["args"]["device"], []).append(
                (ev["name"][:1024], start, start + int(Decimal(ev["dur"]) * 1000))
            )
    return out


@pytest.mark.skipif(not KINETO, reason="../shared/data/profiler-traces/hta-kineto/ is absent")
@pytest.mark.parametrize("path", KINETO, ids=lambda p: p.name)
def test_kineto_traces_equal_brute_force(capsys, path):
    report = _report(capsys, [path])
    raw = _kineto_raw(path)
    assert [(d["device"]["node"], d["device"]["device"]) for d in report["devices"]] == [
        (path.name, dev) for dev in sorted(raw)
    ]
    for d in report["devices"]:
        _assert_device(d, brute(raw[d["device"]["device"]], PRICE))


@pytest.mark.skipif(not NSYS, reason="../shared/data/profiler-traces/pipit-nsys/ is absent")
def test_nsys_export_equals_sql_and_ranges_follow_the_launch(capsys):
    report = _report(capsys, NSYS)
    con = sqlite3.connect(f"{NSYS[0].as_uri()}?mode=ro", uri=True)
    base = con.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()[0]
    rows = con.execute(
        "SELECT s.value, k.start, k.end FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.demangledName"
    ).fetchall()
    (device,) = report["devices"]
    assert device["gpu_model"] == "NVIDIA A100-SXM4-40GB"
    _assert_device(device, brute([(n, base + s, base + e) for n, s, e in rows], PRICE))
    # the 5 saxpy kernels are launched inside the host's `saxpy` NVTX ranges, which last µs while they last ms
    assert {r["path"]: r["busy_ns"] for r in device["ranges"]} == {"saxpy": device["busy_ns"]}
    assert {t["category"] for t in device["transfers"]} == {"memcpy"}
    assert sum(t["calls"] for t in device["transfers"]) == 15


def _kineto_file(tmp_path: Path, kernels, base: int | None) -> Path:
    events = [
        {
            "ph": "X",
            "cat": "kernel",
            "name": n,
            "pid": 0,
            "tid": stream,
            "ts": ts,
            "dur": dur,
            "args": {"device": 0, "stream": stream, "correlation": i},
        }
        for i, (n, stream, ts, dur) in enumerate(kernels)
    ]
    doc = {"traceEvents": events} | ({"baseTimeNanoseconds": base} if base is not None else {})
    path = tmp_path / "t.json"
    # µs written as decimal text with ns digits, as Kineto does
    path.write_text(json.dumps(doc).replace('"__', "").replace('__"', ""))
    return path


kernel_st = st.tuples(
    st.sampled_from(["gemm", "nccl:all_reduce", "relu", "b"]),
    st.integers(0, 3),
    st.integers(0, 50_000),
    st.integers(0, 20_000),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(kernel_st, min_size=1, max_size=25), st.sampled_from(["2.5", "0.000001", "98.765432", "4000"]))
def test_generated_traces_equal_brute_force(tmp_path_factory, kernels, price):
    tmp = tmp_path_factory.mktemp("k")
    base = 1_711_964_646_000_000_000
    # ts and dur in µs with three ns decimals, as text, so the reader must parse them exactly
    rows = [(n, s, f"__{t // 1000}.{t % 1000:03d}__", f"__{d // 1000}.{d % 1000:03d}__") for n, s, t, d in kernels]
    path = _kineto_file(tmp, rows, base)
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["kernels", str(path), "--usd-per-gpu-hour", price]) == 0
    (device,) = json.loads(out.getvalue())["devices"]
    expected = brute([(n, base + t, base + t + d) for n, _, t, d in kernels], Decimal(price))
    _assert_device(device, expected)
    assert {k["name"]: k["category"] for k in device["kernels"]} == {
        n: "communication" if n.startswith("nccl") else "kernel" for n, *_ in kernels
    }


def test_bad_events_are_counted_not_raised(capsys, tmp_path):
    base = 1_711_964_646_000_000_000
    path = _kineto_file(tmp_path, [("ok", 0, 1, 2), ("neg", 0, 5, -3), ("text", 0, "x", 1)], base)
    report = _report(capsys, [path])
    assert [k["name"] for k in report["devices"][0]["kernels"]] == ["ok"]
    assert sum(report["rejected"].values()) == 2


def test_unreadable_file_is_a_usage_error(capsys, tmp_path):
    junk = tmp_path / "junk.json"
    junk.write_text("{not json")
    assert main(["kernels", str(junk)]) == 2
    assert "cannot be read as a Kineto trace or nsys SQLite export" in capsys.readouterr().err
    (tmp_path / "empty.jsonl").write_text("")  # ijson's message draws a caret over three lines
    assert main(["kernels", str(tmp_path / "empty.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "premature EOF" in err, err
    assert main(["kernels", str(tmp_path / "absent.json")]) == 2


@pytest.mark.parametrize("price", ["-1", "NaN", "Infinity", "2.1234567", "two"])
def test_a_price_that_is_not_one_is_a_usage_error(capsys, tmp_path, price):
    """A negative price once billed kernels negative micro-dollars."""
    trace = tmp_path / "t.json"
    trace.write_text('{"traceEvents": []}')
    assert main(["kernels", str(trace), "--usd-per-gpu-hour", price]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--usd-per-gpu-hour" in err and "give a price such as 2.5" in err
    assert "class" not in err  # decimal's internals (ConversionSyntax) are not the user's words


WIRE = {
    "kind": "kernel_activity",
    "node_id": "n1",
    "pid": 7,
    "gpu_uuid": "GPU-1",
    "device": 0,
    "stream": 7,
    "correlation_id": 3,
    "category": "communication",
    "name": "ncclKernel_AllReduce",
    "start_ns": 1_700_000_000 * 10**9,
    "end_ns": 1_700_000_000 * 10**9 + 5,
    "launch_tid": 9,
    "launch_ns": 1_700_000_000 * 10**9 - 40,
    "grid": [1, 2, 3],
    "block": [256, 1, 1],
    "source": "cupti",
}


def test_wire_format_round_trips_and_refuses_what_cannot_be():
    from pydantic import ValidationError

    from gpucost.schemas.kernels import AnnotationRange, KernelActivity

    k = KernelActivity.model_validate_json(json.dumps(WIRE))
    assert json.loads(k.model_dump_json(exclude_none=True)) == WIRE
    for bad in (
        {"end_ns": WIRE["start_ns"] - 1},
        {"name": "x" * 1025},
        {"category": "compute"},
        {"extra": 1},
        {"start_ns": 5, "end_ns": 6},
    ):
        with pytest.raises(ValidationError):
            KernelActivity.model_validate_json(json.dumps(WIRE | bad))
    r = {
        "kind": "annotation_range",
        "node_id": "n1",
        "pid": 7,
        "tid": 9,
        "domain": "default",
        "name": "step",
        "start_ns": WIRE["start_ns"],
        "end_ns": WIRE["end_ns"],
    }
    assert AnnotationRange.model_validate_json(json.dumps(r)).name == "step"


range_st = st.tuples(st.sampled_from(["step", "fwd", "bwd"]), st.integers(0, 60), st.integers(0, 60))


@settings(max_examples=40, deadline=None)
@given(
    st.lists(kernel_st, min_size=1, max_size=15),
    st.lists(range_st, max_size=6),
    st.lists(st.integers(0, 120), min_size=15, max_size=15),
    st.lists(st.booleans(), min_size=15, max_size=15),
)
def test_ranges_hold_the_kernels_launched_inside_them(tmp_path_factory, kernels, spans, launch_us, on_thread_1):
    """Each range path's figures are within one unit per nesting level of its exact share, computed here from
    the launches (thread and time), never from GPU time; children never exceed their parent."""
    tmp = tmp_path_factory.mktemp("r")
    base = 1_711_964_646_000_000_000
    events = [
        {"ph": "X", "cat": "user_annotation", "name": n, "pid": 1, "tid": 1, "ts": s, "dur": d} for n, s, d in spans
    ]
    rows = []
    for i, (n, stream, t, d) in enumerate(kernels):
        tid = 1 if on_thread_1[i] else 2
        events.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "pid": 1,
                "tid": tid,
                "ts": launch_us[i],
                "dur": 1,
                "args": {"correlation": i},
            }
        )
        events.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": n,
                "pid": 0,
                "tid": stream,
                "ts": t // 1000,
                "dur": d // 1000,
                "args": {"device": 0, "stream": stream, "correlation": i},
            }
        )
        opened = sorted(  # ties of start and end: the file's order, a call before the calls it makes
            (s, -(s + dd), j, rn) for j, (rn, s, dd) in enumerate(spans) if tid == 1 and s <= launch_us[i] <= s + dd
        )
        rows.append(
            (n, base + (t // 1000) * 1000, base + (t // 1000 + d // 1000) * 1000, tuple(rn for *_, rn in opened))
        )
    path = tmp / "t.json"
    path.write_text(json.dumps({"baseTimeNanoseconds": base, "traceEvents": events}))
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["kernels", str(path), "--usd-per-gpu-hour", "3600"]) == 0
    (device,) = json.loads(out.getvalue())["devices"]
    # each kernel's exact share of busy time, slice by slice
    bounds = sorted({t for _, s, e, _ in rows for t in (s, e)})
    share = [Fraction(0)] * len(rows)
    for lo, hi in zip(bounds, bounds[1:]):
        running = [i for i, (_, s, e, _) in enumerate(rows) if s <= lo and hi <= e and e > s]
        for i in running:
            share[i] += Fraction(hi - lo, len(running))
    busy = sum(share)
    got = {r["path"]: r for r in device["ranges"]}
    expected_paths = {"/".join(p[:j]) for *_, p in rows for j in range(1, len(p) + 1)}
    assert set(got) <= expected_paths
    for p in expected_paths:
        parts = tuple(p.split("/"))
        exact = sum(s for s, (*_, kp) in zip(share, rows) if kp[: len(parts)] == parts)
        r = got.get(p, {"busy_ns": 0, "cost_micro_usd": 0})
        assert abs(r["busy_ns"] - exact) <= len(parts)
        if busy:
            assert abs(r["cost_micro_usd"] - Fraction(device["cost_micro_usd"]) * exact / busy) <= len(parts)
        children = [c for q, c in got.items() if q.rsplit("/", 1)[0] == p and q.count("/") == p.count("/") + 1]
        assert sum(c["busy_ns"] for c in children) <= r["busy_ns"]


def test_ranges_opened_together_nest_the_longer_outside():
    import numpy as np

    from gpucost.streams.kernel_split import Spans, range_paths

    # (thread, name, start, end): inner and outer open together on thread 1, other on thread 2
    rows = [(1, 0, 0, 50), (1, 1, 0, 100), (2, 2, 0, 100)]
    spans = Spans(*(np.array(c, dtype=np.int64) for c in zip(*rows)), names=["inner", "outer", "other"])
    # launches (thread, ns): inside both, inside outer only, unknown
    tid, ns = np.array([1, 1, -1], dtype=np.int64), np.array([10, 60, -1], dtype=np.int64)
    paths, innermost = range_paths(tid, ns, spans)
    assert paths == [("outer", "inner"), ("outer",), ()]
    assert innermost.tolist() == [0, 1, -1]  # each kernel's innermost open span, as its row in ``spans``
