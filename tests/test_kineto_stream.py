"""The streaming Kineto reader (rows of columns, launches tied at the end) against the reading it replaced: the
whole file loaded with the standard library's json, every GPU event held until the end and each event made a
model, written out here as it was (issue 38), its range rule applied to operators (``cpu_op``) too, since
operators are now read as ranges are. Generated traces mix kernels, memcpys, memsets, launches
(repeated, missing, shared by a CUDA graph's kernels, after or before their kernels), ranges, operators, flows, metadata
and bad events, in any order, gzip or not; rows, rejects and the report must be equal."""

from __future__ import annotations

import gzip
import json
from collections import Counter, defaultdict
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from gpucost.kernels import kernel_report
from gpucost.producers.kernel_table import RangeTable
from gpucost.producers.kineto import read_kineto
from gpucost.schemas.kernels import AnnotationRange, KernelActivity, rejection_reason

BASE = 1_711_964_646_000_000_000
_TRANSFERS = ("memcpy", "memset")
_CAUGHT = (KeyError, TypeError, ValueError, InvalidOperation, ValidationError)


def _ns(us):
    if isinstance(us, bool) or not isinstance(us, (int, Decimal)):
        raise ValueError("not a number")
    return int((Decimal(_whole_sized(us)) * 1000).to_integral_value(ROUND_HALF_EVEN))


def _whole_sized(v):
    """docs/definitions.md ("Kernel cost", "Bad input"): a decimal of 40 digits or more before its point, or no finite
    number, is no id, count or time; refused before it is made an int (1e999999999 would be a billion digits)."""
    if isinstance(v, Decimal) and (not v.is_finite() or v.adjusted() >= 40):
        raise ValueError(f"{v:.3e} is no id, count or time a trace holds")
    return v


def _int(v):
    return int(_whole_sized(v))


def _name(ev, rejected):
    name = ev["name"]
    if not isinstance(name, str):
        raise ValueError("name is not a string")
    if len(name) > 1024:
        rejected["name longer than 1024 characters, truncated"] += 1
        name = name[:1024]
    return name


def _int_or_none(v):
    return _int(v) if isinstance(v, (int, Decimal)) and not isinstance(v, bool) else None


def whole_file_read(path: Path, node: str):
    """The reader before issue 38, over ``json.loads`` of the whole file: (kernels, ranges, operators, rejected)."""
    raw = path.read_bytes()
    doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw, parse_float=Decimal)
    base = doc.get("baseTimeNanoseconds", 0)
    base = _int(base) if isinstance(base, (int, Decimal)) and not isinstance(base, bool) else 0
    rejected: Counter = Counter()
    launches, pending, kernels = {}, [], []
    launchers: dict[int, list[int]] = defaultdict(list)  # each correlation id's launching pids, one per launch
    spans: dict[str, list] = {"user_annotation": [], "cpu_op": []}
    for ev in doc["traceEvents"]:
        if not isinstance(ev, dict):
            rejected["traceEvents: an item that is not an object"] += 1
            continue
        if ev.get("ph") != "X":
            continue
        cat = ev.get("cat")
        try:
            if cat in ("kernel", "gpu_memcpy", "gpu_memset"):
                pending.append(ev)
            elif cat in ("cuda_runtime", "cuda_driver"):
                launch = (_int(ev["pid"]), _int(ev["tid"]), base + _ns(ev["ts"]))  # read before the id, as before
                corr = _int(ev["args"]["correlation"])
                launches[corr] = launch
                if -(2**63) <= corr < 2**63:  # an id past int64 names no kernel the model takes
                    launchers[corr].append(launches[corr][0])
            elif cat in spans:
                start = base + _ns(ev["ts"])
                spans[cat].append(
                    AnnotationRange(
                        node_id=node,
                        pid=_int(ev["pid"]),
                        tid=_int(ev["tid"]),
                        domain="torch",
                        name=_name(ev, rejected),
                        start_ns=start,
                        end_ns=start + _ns(ev["dur"]),
                        source="kineto",
                    )
                )
        except _CAUGHT as exc:
            rejected[f"{cat}: {rejection_reason(exc)}"] += 1
    again = [pids for pids in launchers.values() if len(pids) > 1]
    if again:
        rejected["cuda_runtime: correlation ids launched more than once (a kernel takes the last launch)"] += len(again)
    if across := sum(len(set(pids)) > 1 for pids in again):
        rejected["cuda_runtime: correlation ids launched by more than one process (a kernel takes the last's)"] += (
            across
        )
    for ev in pending:
        try:
            args = ev.get("args") or {}
            device = _int(args.get("device", ev["pid"]))
            start = base + _ns(ev["ts"])
            corr = _int(args.get("correlation", 0))
            pid, tid, launch_ns = launches.get(corr, (0, None, None))
            name = _name(ev, rejected)
            dims = {k: tuple(_int(v) for v in args[k]) for k in ("grid", "block") if isinstance(args.get(k), list)}
            kind = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}[ev["cat"]]
            kernels.append(
                KernelActivity(
                    node_id=node,
                    pid=pid,
                    gpu_uuid=f"{node}/{device}",
                    device=device,
                    stream=_int(args.get("stream", ev["tid"])),
                    correlation_id=corr,
                    category="communication" if kind == "kernel" and "nccl" in name.lower() else kind,
                    name=name,
                    start_ns=start,
                    end_ns=start + _ns(ev["dur"]),
                    launch_tid=tid,
                    launch_ns=launch_ns,
                    source="kineto",
                    registers_per_thread=_int_or_none(args.get("registers per thread")),
                    bytes=_int_or_none(args.get("bytes")),
                    **dims,
                )
            )
        except _CAUGHT as exc:
            rejected[f"{ev.get('cat')}: {rejection_reason(exc)}"] += 1
    return kernels, spans["user_annotation"], spans["cpu_op"], rejected


def _kernel_rows(table) -> list[tuple]:
    cols = [table.column(c).tolist() for c in table.COLUMNS]
    out = []
    for node, dev, cat, name, s, e, pid, tid, lns, nbytes, corr, stream in zip(*cols):
        category = ("kernel", "memcpy", "memset", "communication")[cat]
        row = (table.nodes.values[node], dev, category, table.names.values[name], s, e, pid)
        known = (None if tid < 0 else tid, None if lns < 0 else lns, None if nbytes < 0 else nbytes)
        out.append(row + known + (corr, stream))
    return out


def _model_rows(kernels: list[KernelActivity]) -> list[tuple]:
    return [
        (k.node_id, k.device, k.category, k.name, k.start_ns, k.end_ns, k.pid, k.launch_tid, k.launch_ns)
        + (k.bytes, k.correlation_id, k.stream)
        for k in kernels
    ]


def _range_rows(table) -> list[tuple]:
    cols = [table.column(c).tolist() for c in RangeTable.COLUMNS]  # an operator's work columns are not the old's
    return [(table.nodes.values[n], p, t, table.names.values[m], s, e) for n, p, t, m, s, e in zip(*cols)]


_us = st.one_of(
    st.integers(0, 80_000),
    st.integers(0, 80_000_000).map(lambda ns: f"__{ns // 1000}.{ns % 1000:03d}__"),  # µs with ns digits, as text
)
# ids and times out of every bound; 1e999999999 µs is refused by its magnitude, its event left out by both
_odd = st.sampled_from([-1, 2**33, 2**64, 2**70, -(2**70), "x", None, "__1e999999999__"])
_name_st = st.sampled_from(["gemm", "ncclKernel_AllReduce", "relu", "Memcpy HtoD", "x" * 1030, "y" * 1030 + "nccl"])


@st.composite
def gpu_event(draw):
    cat = draw(st.sampled_from(["kernel", "kernel", "gpu_memcpy", "gpu_memset"]))
    args = {
        "device": draw(st.integers(0, 2)),
        "stream": draw(st.integers(7, 9)),
        "correlation": draw(st.integers(0, 6)),
    }
    if cat != "kernel":
        args["bytes"] = draw(st.integers(0, 1 << 20))
    if draw(st.booleans()):
        args["grid"], args["block"] = [draw(st.integers(1, 64)), 1, 1], [128, 1, 1]
    ev = {"ph": "X", "cat": cat, "name": draw(_name_st), "pid": args["device"], "tid": args["stream"]}
    ev |= {"ts": draw(_us), "dur": draw(_us), "args": args}
    return _spoil(draw, ev, ["ts", "dur", "name", "args.device", "args.correlation", "pid", "args.bytes"])


@st.composite
def launch_event(draw):
    ev = {"ph": "X", "cat": draw(st.sampled_from(["cuda_runtime", "cuda_driver"])), "name": "cudaLaunchKernel"}
    ev |= {"pid": draw(st.integers(1, 2)), "tid": draw(st.integers(1, 3)), "ts": draw(_us), "dur": 3}
    ev["args"] = {"correlation": draw(st.integers(0, 5)), "External id": draw(st.integers(0, 9))}
    return _spoil(draw, ev, ["pid", "tid", "ts", "args.correlation"])


@st.composite
def range_event(draw):
    ev = {"ph": "X", "cat": draw(st.sampled_from(["user_annotation", "cpu_op"]))}
    ev["name"] = draw(st.sampled_from(["step", "fwd", "bwd", "z" * 1030]))
    ev |= {"pid": draw(st.integers(1, 2)), "tid": draw(st.integers(1, 3)), "ts": draw(_us), "dur": draw(_us)}
    return _spoil(draw, ev, ["pid", "tid", "ts", "dur", "name"])


def _spoil(draw, ev: dict, fields: list[str]) -> dict:
    """Now and then, one or two fields made out of bounds, of the wrong type, or left out."""
    if draw(st.integers(0, 5)):
        return ev
    for field in draw(st.lists(st.sampled_from(fields), min_size=1, max_size=2, unique=True)):
        where, key = (ev["args"], field[5:]) if field.startswith("args.") else (ev, field)
        if draw(st.booleans()):
            where.pop(key, None)
        else:  # 1e999999999 too, as an id or a time: refused by its magnitude before int() would build it
            where[key] = draw(_odd)
    return ev


_other = st.sampled_from(
    [
        {"ph": "s", "id": 3, "pid": 1, "tid": 1, "ts": 5, "cat": "ac2g", "name": "ac2g"},  # a flow's two ends
        {"ph": "f", "id": 3, "pid": 0, "tid": 7, "ts": 9, "cat": "ac2g", "name": "ac2g", "bp": "e"},
        {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "GPU 0"}},
        {"ph": "X", "cat": "gpu_user_annotation", "name": "fwd", "pid": 0, "tid": 7, "ts": 4, "dur": 2},
        [1, 2],
        "not an event",
    ]
)
_event = st.one_of(gpu_event(), gpu_event(), launch_event(), launch_event(), range_event(), _other)


def _write(tmp: Path, events: list, base: int | None, base_last: bool, gz: bool) -> Path:
    head = {} if base is None else {"baseTimeNanoseconds": base}
    doc = {"traceEvents": events} | head if base_last else head | {"traceEvents": events}
    doc["deviceProperties"] = [{"id": 0, "name": "NVIDIA H100"}, {"id": 1, "name": "NVIDIA H200"}]
    text = json.dumps(doc).replace('"__', "").replace('__"', "").encode()
    path = tmp / ("rank.json.gz" if gz else "rank.json")
    path.write_bytes(gzip.compress(text) if gz else text)
    return path


def _read_both(path: Path):
    try:
        new = read_kineto(path)
    except Exception as exc:  # what no event may raise (an ``args`` that is not an object): both must raise it
        new = ("raised", type(exc), str(exc))
    try:
        old = whole_file_read(path, path.name)
    except Exception as exc:
        old = ("raised", type(exc), str(exc))
    return new, old


@settings(max_examples=300, deadline=None)
@given(
    st.lists(_event, min_size=8, max_size=60),
    st.sampled_from([BASE, None]),
    st.booleans(),
    st.booleans(),
    st.one_of(st.none(), st.integers(0, 60)),
)
def test_streaming_reader_equals_the_whole_file_reading(tmp_path_factory, events, base, base_last, gz, fatal):
    if fatal is not None:  # a GPU event whose args is a string: the old reader raised on it, after every launch
        bad = {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1, "dur": 1, "args": "x"}
        events = events[:fatal] + [bad] + events[fatal:]
    path = _write(tmp_path_factory.mktemp("kin"), events, base, base_last, gz)
    new, old = _read_both(path)
    if old[0] == "raised" or (isinstance(new, tuple) and new[0] == "raised"):
        assert new == old
        return
    kernels, ranges, operators, rejected = old
    assert _kernel_rows(new.kernels) == _model_rows(kernels)
    assert _range_rows(new.ranges) == [(r.node_id, r.pid, r.tid, r.name, r.start_ns, r.end_ns) for r in ranges]
    assert _range_rows(new.operators) == [(r.node_id, r.pid, r.tid, r.name, r.start_ns, r.end_ns) for r in operators]
    assert new.rejected == rejected
    assert new.gpu_models == {0: "NVIDIA H100", 1: "NVIDIA H200"}
    price = 2_500_000
    report = kernel_report(new.kernels, new.ranges, {}, price, new.operators)
    assert report == kernel_report(kernels, ranges, {}, price, operators)
    for d in report["devices"]:  # memcpy and memset, summed here from the old reader's models
        sums: dict = {}
        for k in kernels:
            if (k.node_id, k.device) == (d["device"]["node"], d["device"]["device"]) and k.category in _TRANSFERS:
                t = sums.setdefault((k.category, k.name), [0, 0, 0])
                t[0], t[1], t[2] = t[0] + 1, t[1] + k.end_ns - k.start_ns, t[2] + (k.bytes or 0)
        assert {(t["category"], t["name"]): [t["calls"], t["duration_ns"], t["bytes"]] for t in d["transfers"]} == sums


def test_a_graph_launch_and_a_late_or_repeated_launch_are_tied_as_before(tmp_path):
    """One launch for three kernels (a CUDA graph), a launch written after its kernel, a correlation id launched
    twice (the last wins), a launch out of the pid bound (its kernel left out with the model's reason)."""
    k = [
        {"ph": "X", "cat": "kernel", "name": f"k{i}", "pid": 0, "tid": 7, "ts": 10 + i, "dur": 1}
        | {"args": {"device": 0, "stream": 7, "correlation": c}}
        for i, c in enumerate([1, 1, 1, 2, 3, 4, 5])
    ]
    launch = [
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": 5, "tid": 6, "ts": t, "dur": 1}
        | {"args": {"correlation": c}}
        for c, t in [(1, 1), (3, 2), (3, 3)]
    ]
    bad = {"ph": "X", "cat": "cuda_runtime", "name": "l", "pid": 2**40, "tid": 6, "ts": 4, "dur": 1}
    events = launch[:1] + k + launch[1:] + [bad | {"args": {"correlation": 4}}]
    path = _write(tmp_path, events, BASE, False, False)
    new = read_kineto(path)
    rows = {r[3]: (r[6], r[7], r[8]) for r in _kernel_rows(new.kernels)}
    assert rows == {
        "k0": (5, 6, BASE + 1000),
        "k1": (5, 6, BASE + 1000),
        "k2": (5, 6, BASE + 1000),
        "k3": (0, None, None),  # no launch
        "k4": (5, 6, BASE + 3000),  # the later of two
        "k6": (0, None, None),
    }
    assert new.rejected == {
        "kernel: pid: Input should be less than 4294967296": 1,
        "cuda_runtime: correlation ids launched more than once (a kernel takes the last launch)": 1,  # id 3
    }


def test_what_no_event_may_raise_is_raised_as_the_whole_file_reading_raised_it(tmp_path):
    """A GPU event whose ``args`` is text raises only once every launch and range was read, in both readers: a
    range after it with a time of 1e999999999 µs (which overflowed Decimal, and was raised, before it was refused
    by its magnitude) is left out, and the kernel's fault is what the file raises."""
    kernel = {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1, "dur": 1, "args": "x"}
    late = {"ph": "X", "cat": "user_annotation", "name": "r", "pid": 1, "tid": 1, "ts": "__1e999999999__", "dur": 1}
    new, old = _read_both(_write(tmp_path, [kernel, late], BASE, False, False))
    assert new == old and new[1] is AttributeError
    new, old = _read_both(_write(tmp_path, [kernel], BASE, False, True))
    assert new == old and new[1] is AttributeError
