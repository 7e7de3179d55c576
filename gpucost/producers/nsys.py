"""Nsight Systems SQLite exports (``nsys export --type sqlite``) as kernel and range events.

Opened read-only. Times are integer ns on the session clock; ``TARGET_INFO_SESSION_START_TIME.utcEpochNs`` makes
them epoch ns. Names are ``StringIds`` ids, a kernel's its ``demangledName`` (the whole signature, as Kineto names
kernels). A kernel is tied to its launch through the ``CUPTI_ACTIVITY_KIND_RUNTIME`` row of the same process and
``correlationId`` (its thread and start; ids repeat across the processes of one export, an MPI job's), and NVTX
ranges are ``NVTX_EVENTS`` rows with an ``end`` (push/pop 59, start/end 60) on a CPU thread. Tables exist only where
data do and the schema moves between versions, so ``sqlite_master`` is read first; rows that cannot be read are
counted by reason, never raised.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from gpucost.producers.kernel_table import KernelTable, RangeTable
from gpucost.schemas.kernels import NAME_MAX_CHARS, AnnotationRange, KernelActivity, rejection_reason

__all__ = ["NsysExport", "read_nsys"]

_NVTX_RANGE_TYPES = (59, 60)
_NVTX_DOMAIN_CREATE = 75


@dataclass
class NsysExport:
    """What one export gave: its kernels and ranges as columns (each row validated by its model, then kept as about
    75 and 36 bytes rather than a model's 1.5 KiB: an export holds millions of kernels), the GPU models by device
    id, and the rows left out by reason."""

    node_id: str
    kernels: KernelTable = field(default_factory=KernelTable)
    ranges: RangeTable = field(default_factory=RangeTable)
    gpu_models: dict[int, str] = field(default_factory=dict)
    rejected: Counter = field(default_factory=Counter)


#: the tables of GPU work, each with its category
_SOURCES = (
    ("CUPTI_ACTIVITY_KIND_KERNEL", "kernel"),
    ("CUPTI_ACTIVITY_KIND_MEMCPY", "memcpy"),
    ("CUPTI_ACTIVITY_KIND_MEMSET", "memset"),
)


def _pid(global_id: int) -> int:
    """nsys serialises (host, pid, tid) in one integer: pid in bits 24..47, tid in the low 24."""
    return (global_id >> 24) & 0xFFFFFF


def read_nsys(path: Path, node_id: str | None = None) -> NsysExport:
    """All kernels, memcpys, memsets and NVTX ranges of one export; ``node_id`` defaults to the file's name."""
    con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    con.text_factory = lambda b: b.decode("utf-8", "replace")
    try:
        return _read(con, node_id or path.name)
    finally:
        con.close()


def _read(con: sqlite3.Connection, node: str) -> NsysExport:
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if not tables & {"CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "NVTX_EVENTS", "TARGET_INFO_GPU"}:
        raise ValueError(
            "no Nsight Systems table (CUPTI_ACTIVITY_KIND_KERNEL, NVTX_EVENTS, TARGET_INFO_GPU, …): an SQLite "
            "database, but not an `nsys export --type sqlite` file"
        )
    out = NsysExport(node_id=node)
    base = 0
    if "TARGET_INFO_SESSION_START_TIME" in tables:
        row = con.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()
        base = row[0] if row and isinstance(row[0], int) else 0
    if not base:
        out.rejected["no TARGET_INFO_SESSION_START_TIME: times are not epoch ns"] += 1
    strings = dict(con.execute("SELECT id, value FROM StringIds")) if "StringIds" in tables else {}
    if "TARGET_INFO_GPU" in tables:
        out.gpu_models = {i: n for i, n in con.execute("SELECT id, name FROM TARGET_INFO_GPU") if n}
    launches: dict[tuple[int, int], tuple[int, int]] = {}  # (pid, correlation id) → (thread, launch ns)
    work = [t for t, _ in _SOURCES if t in tables]
    if "CUPTI_ACTIVITY_KIND_RUNTIME" in tables and work:
        # only the API calls that started GPU work: the runtime table holds every call (copies, syncs, queries), many
        # times the kernels, and SQLite, not a Python dict, holds the set of ids that did
        used = " UNION ".join(f"SELECT correlationId FROM {t}" for t in work)
        for corr, tid, start in con.execute(
            "SELECT correlationId, globalTid, start FROM CUPTI_ACTIVITY_KIND_RUNTIME "
            f"WHERE correlationId IN ({used}) ORDER BY start DESC"
        ):  # the earliest row of a correlation wins; ids repeat across the processes of one export (an MPI job's)
            if corr is not None and tid is not None:
                launches[_pid(tid), corr] = (tid & 0xFFFFFF, base + start)
    for table, category in _SOURCES:
        if table not in tables:
            continue
        extra = (
            "demangledName, gridX, gridY, gridZ, blockX, blockY, blockZ, registersPerThread, "
            "staticSharedMemory + dynamicSharedMemory"
            if category == "kernel"
            else "bytes"
        )
        query = f"SELECT start, end, deviceId, streamId, correlationId, globalPid, {extra} FROM {table}"
        for row in con.execute(query):
            try:
                out.kernels.append(_activity(row, node, base, category, strings, launches, out.rejected))
            except (TypeError, ValueError, ValidationError) as exc:
                out.rejected[f"{table}: {rejection_reason(exc)}"] += 1
    if "NVTX_EVENTS" in tables:
        _ranges(con, node, base, strings, out)
    return out


def _activity(row, node, base, category, strings, launches, rejected) -> KernelActivity:
    start, end, device, stream, corr, gpid = row[:6]
    tid, launch_ns = launches.get((_pid(gpid or 0), corr), (None, None))
    fields: dict = {}
    if category == "kernel":
        name = strings.get(row[6]) or f"kernel {row[6]}"
        category = "communication" if "nccl" in name.lower() else "kernel"
        fields = {
            "grid": tuple(row[7:10]),
            "block": tuple(row[10:13]),
            "registers_per_thread": row[13],
            "shared_memory_bytes": row[14],
        }
    else:
        name = f"[{category}]"
        fields = {"bytes": row[6]}
    if len(name) > NAME_MAX_CHARS:
        rejected["name longer than 1024 characters, truncated"] += 1
        name = name[:NAME_MAX_CHARS]
    return KernelActivity(
        node_id=node,
        pid=_pid(gpid or 0),
        gpu_uuid=f"{node}/{device}",
        device=device,
        stream=stream,
        correlation_id=corr or 0,
        category=category,
        name=name,
        start_ns=base + start,
        end_ns=base + end,
        launch_tid=tid,
        launch_ns=launch_ns,
        source="nsys",
        **fields,
    )


def _ranges(con: sqlite3.Connection, node: str, base: int, strings: dict, out: NsysExport) -> None:
    domains = {
        d: t
        for d, t in con.execute("SELECT domainId, text FROM NVTX_EVENTS WHERE eventType = ?", (_NVTX_DOMAIN_CREATE,))
        if t
    }
    rows = con.execute(
        f"SELECT start, end, text, textId, globalTid, domainId FROM NVTX_EVENTS WHERE eventType IN {_NVTX_RANGE_TYPES}"
    )
    for start, end, text, text_id, gtid, domain in rows:
        try:
            if end is None or gtid is None:
                raise ValueError("range without an end or a thread")
            name = (text or strings.get(text_id) or "(unnamed)")[:NAME_MAX_CHARS]
            out.ranges.append(
                AnnotationRange(
                    node_id=node,
                    pid=_pid(gtid),
                    tid=gtid & 0xFFFFFF,
                    domain=domains.get(domain, "default"),
                    name=name,
                    start_ns=base + start,
                    end_ns=base + end,
                    source="nsys",
                )
            )
        except (TypeError, ValueError, ValidationError) as exc:
            out.rejected[f"NVTX_EVENTS: {rejection_reason(exc)}"] += 1
