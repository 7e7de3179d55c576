"""What ``gpucost trace-events`` should write for a trace, worked out from the raw file with the standard library
(json, sqlite3) alone, sharing no code with the readers: each kernel by (correlation id, start ns, stream), with
its process, launch, GPU and range path (the spans open on its launching thread at its launch, outermost first:
earlier start, then the longer, then a range before an operator, then the file's order)."""

from __future__ import annotations

import gzip
import json
import sqlite3
from collections import defaultdict
from pathlib import Path

from tests.support.kernel_money import ns, raw_events

NAME_MAX = 1024  # the readers cut a longer name (docs/kernels.md)
KINETO_GPU = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}

Key = tuple[int, int, int]  # (correlation id, start ns, stream)


def _rank(event: dict, order: int) -> tuple[int, int]:
    """A span's place among spans of one start and end: a range outside an operator (``record_function`` wraps
    what it calls), then the order of the file (a call before the calls it makes)."""
    return (event["cat"] != "user_annotation", order)


def _path(spans: list[tuple[int, int, int, str]], at: int) -> list[str] | None:
    """The names of ``spans`` (start, end, rank, name) open at ``at``: by start, then the longer, then the rank."""
    open_ = sorted((s, -e, rank, name[:NAME_MAX]) for s, e, rank, name in spans if s <= at <= e)
    return [name for *_, name in open_][:32] or None


def kineto(path: Path, node: str, uuids: dict[int, str], pids: dict[int, int], cats: tuple[str, ...]) -> dict:
    """The events of a Kineto trace, ``cats`` the host span categories a path is made of."""
    with gzip.open(path, "rt") if path.suffix == ".gz" else path.open() as f:
        doc = json.load(f)
    launches, host, gpu = raw_events(doc, spans=cats, gpu=tuple(KINETO_GPU))
    base = int(doc.get("baseTimeNanoseconds", 0))
    out: dict[Key, dict] = {}
    for ev in gpu:
        args = ev.get("args", {})
        corr, start = args.get("correlation", 0), base + ns(ev["ts"])
        if corr not in launches:
            continue  # no process known: left out
        pid, tid, at = launches[corr]
        device = args.get("device", ev["pid"])
        name = ev["name"][:NAME_MAX]
        category = KINETO_GPU[ev["cat"]]
        key = (corr, start, args.get("stream", ev["tid"]))
        assert key not in out, key
        out[key] = {
            "node_id": node,
            "pid": pids.get(pid, pid),
            "gpu_uuid": uuids.get(device, f"{node}/{device}"),
            "device": device,
            "name": name,
            "category": "communication" if category == "kernel" and "nccl" in name.lower() else category,
            "end_ns": start + ns(ev["dur"]),
            "launch_tid": tid,
            "launch_ns": at,
            "range_path": _path(
                [(s, e, _rank(x, i), x["name"]) for i, (s, e, x) in enumerate(host.get((pid, tid), []))], at
            ),
        }
    return out


def nsys(path: Path, node: str, uuids: dict[int, str]) -> dict:
    """The kernels, copies and sets of an Nsight Systems export with their NVTX paths, by SQL over its tables (a
    kernel's launch is the earliest runtime row of its process and correlation id)."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    base = con.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()[0]
    launch = {}  # (pid, correlation id): correlation ids repeat across an export's processes
    for corr, gtid, start in con.execute(
        "SELECT correlationId, globalTid, start FROM CUPTI_ACTIVITY_KIND_RUNTIME ORDER BY start"
    ):
        launch.setdefault(((gtid >> 24) & 0xFFFFFF, corr), (gtid, start))
    ranges = defaultdict(list)
    for gtid, s, e, text, text_id in con.execute(
        "SELECT globalTid, start, end, text, textId FROM NVTX_EVENTS WHERE eventType IN (59, 60) AND end IS NOT NULL"
    ):
        name = text or con.execute("SELECT value FROM StringIds WHERE id = ?", (text_id,)).fetchone()[0]
        ranges[gtid].append((s, e, len(ranges[gtid]), name))
    out: dict[Key, dict] = {}
    rows = [
        *con.execute(
            "SELECT 'kernel', k.start, k.end, k.deviceId, k.streamId, k.correlationId, k.globalPid, s.value "
            "FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.demangledName"
        ),
        *con.execute(
            "SELECT 'memcpy', start, end, deviceId, streamId, correlationId, globalPid, '[memcpy]' "
            "FROM CUPTI_ACTIVITY_KIND_MEMCPY"
        ),
        *con.execute(
            "SELECT 'memset', start, end, deviceId, streamId, correlationId, globalPid, '[memset]' "
            "FROM CUPTI_ACTIVITY_KIND_MEMSET"
        ),
    ]
    for category, start, end, device, stream, corr, gpid, name in rows:
        pid = (gpid >> 24) & 0xFFFFFF
        gtid, at = launch.get((pid, corr), (None, None))
        out[(corr, base + start, stream)] = {
            "node_id": node,
            "pid": pid,
            "gpu_uuid": uuids.get(device, f"{node}/{device}"),
            "device": device,
            "name": name,
            "category": category,
            "end_ns": base + end,
            "launch_tid": None if gtid is None else gtid & 0xFFFFFF,
            "launch_ns": None if at is None else base + at,
            "range_path": None if gtid is None else _path(ranges[gtid], at),
        }
    con.close()
    return out
