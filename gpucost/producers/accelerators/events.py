"""Neutral device samples as the pipeline's events: what ``gpucost devices FILE… --events OUT`` writes.

Nothing here branches on a vendor: every rule reads the neutral ``DeviceSample`` fields
(docs/sources.md, "Billing a mixed fleet", states each rule and why).

- **What is billed.** A device is billed as its partitions when the capture has partitions of it at
  that time (the parent gets no event, so it is never billed too), else as itself. Each of ``n``
  partitions that takes its device's model is billed as ``<model> 1/<n>``: its share of the device's
  price and peak (``gpucost.schemas.partitions``), so the device costs its price once; a partition with
  a model of its own (a MIG profile) is a device of that model.
- **What partitions share.** The parent row alone carries the power, memory and temperature the tool
  repeats on every partition; each partition without its own figure takes an equal share of the
  parent's power (in integer mW) and memory (in bytes), split by largest remainder with the odd
  units to the first partitions by id, so the shares add up to the parent's figure exactly; the
  temperature is the parent's.
- **What is not reported** is never a silent 0: ``power_w`` falls back to the platform table's
  ``tdp_w`` (with the event's ``power_estimated`` true), else 0; ``temp_c``, ``mem_bw_util_pct``,
  memory and busy without a reading are 0. Each such field is named in the event's ``not_reported``.
- **Processes.** A process's busy is its own reading, else an equal share (in hundredths of a
  percent, largest remainder) of what its device's busy leaves after the processes that report theirs.
  What the device's busy leaves after all of them (all of it, for a device whose tool names no process)
  is a process sample of the device's own synthetic pid that no binding names: billed to
  ``unattributed``, never to idle, as dcgm-exporter's busy time no pod claims is.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any

from pydantic import ValidationError

from gpucost.producers.synthetic import unclaimed_pid
from gpucost.schemas.devices import FAULT_FIELDS, DeviceSample, Parsed, ProcessUsage, platform_for
from gpucost.schemas.events import GpuSample, ProcessSample
from gpucost.schemas.exact import round_scaled
from gpucost.schemas.faults import counts
from gpucost.schemas.partitions import MAX_PARTITIONS, partition_model

__all__ = ["FaultBaseline", "Placement", "at_ns", "shares", "to_events", "with_faults"]

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


@dataclass(frozen=True)
class Placement:
    """Where and how the capture was taken, as far as it does not say itself."""

    node: str
    interval_s: Decimal | None = None  # the step of a capture with one time per device
    at_ns: int | None = None  # the time of a capture without times
    model: str | None = None  # the model of devices whose capture names none


def at_ns(text: str) -> int:
    """An ISO-8601 time with its zone as integer ns since the epoch; ValueError saying what is wrong."""
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"--at {text!r} is not an ISO-8601 time such as 2026-12-04T18:00:00Z") from None
    if when.tzinfo is None:
        raise ValueError(f"--at {text!r} has no zone: add Z (UTC) or +HH:MM")
    gap = when - _EPOCH
    return (gap.days * 86_400 + gap.seconds) * 10**9 + gap.microseconds * 1000


def shares(total: int, n: int) -> list[int]:
    """``total`` split into ``n`` equal integer shares by largest remainder: the ``total mod n`` odd
    units go to the first shares (equal remainders, ties to the smaller id)."""
    q, r = divmod(total, n)
    return [q + (i < r) for i in range(n)]


def _steps(times: dict[str, list[int]], fallback: Decimal | None) -> dict[tuple[str, int], Decimal | None]:
    """Each (device, time)'s interval in s: the gap to the device's previous time (its first time takes
    the gap to its second), or ``fallback`` for a device the capture shows once."""
    out: dict[tuple[str, int], Decimal | None] = {}
    for device, ts in times.items():
        ts = sorted(set(ts))
        for i, t in enumerate(ts):
            gap = None if len(ts) < 2 else (ts[1] - ts[0] if i == 0 else t - ts[i - 1])
            out[(device, t)] = fallback if gap is None else Decimal(gap) / 10**9
    return out


def _w(value: int, scale: int) -> float:
    """An integer count of 1/scale units as the float whose shortest text is that exact decimal."""
    return float(Decimal(value) / scale)


class _Fields:
    """One billed device's figures: which are not reported (the ``not_reported`` label), and whether its power is
    the platform table's TDP (the event's ``power_estimated`` field, which the health audit reads)."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.not_reported: list[str] = []
        self.power_estimated = False

    def labelled(self, wire: dict[str, Any]) -> dict[str, Any]:
        if self.power_estimated:
            wire["power_estimated"] = True
        if self.not_reported:
            wire["not_reported"] = self.not_reported
        return wire


def _figures(
    s: DeviceSample,
    parent: DeviceSample | None,
    row: tuple[str, dict[str, Any]] | None,
    at: tuple[int, int],
    out: Parsed,
) -> _Fields:
    """The figures of ``s``, share ``at[0]`` of ``at[1]`` partitions of ``parent`` (or the device itself), whose
    platform row is ``row``."""
    f = _Fields()
    root = parent or s
    share, of = at
    if s.power_w is not None:
        f.values["power_mw"] = round_scaled(s.power_w, 1000)
    elif root.power_w is not None:
        f.values["power_mw"] = shares(round_scaled(root.power_w, 1000), of)[share]
    elif row is not None and "tdp_w" in row[1]:
        f.values["power_mw"] = shares(round_scaled(Decimal(row[1]["tdp_w"]), 1000), of)[share]
        f.power_estimated = True
    else:
        f.values["power_mw"] = 0
        f.not_reported.append("power_w")
    for name in ("mem_total_bytes", "mem_used_bytes"):
        own, whole = getattr(s, name), getattr(root, name)
        if own is None and whole is not None and parent is not None:
            own = shares(whole, of)[share]
        if name == "mem_used_bytes" and own is not None and own > f.values["mem_total_bytes"]:
            # a misread, or a total the tool does not give: not reported, never the device's whole sample
            out.reject(f"{s.device_id}: memory used over its total (or with none), not reported")
            own = None
        f.values[name] = 0 if own is None else own
        if own is None:
            f.not_reported.append(name)
    temp = s.temperature_c if s.temperature_c is not None else root.temperature_c
    if temp is not None and not -60 <= temp <= 200:  # a misread: not reported, never the device's whole sample
        out.reject(f"{s.device_id}: temperature outside -60 to 200 °C, not reported")
        temp = None
    f.values["temp_c"] = 0.0 if temp is None else float(temp)
    f.values["busy_cp"] = 0 if s.busy_pct is None else round_scaled(s.busy_pct, 100)
    f.not_reported += [n for n, v in (("temp_c", temp), ("sm_util_pct", s.busy_pct)) if v is None]
    f.not_reported.append("mem_bw_util_pct")
    return f


def _checked(model: type[GpuSample] | type[ProcessSample], wire: dict[str, Any], out: Parsed) -> list[dict[str, Any]]:
    try:
        model.model_validate(wire)
    except ValidationError as exc:
        first = exc.errors()[0]
        out.reject(f"{wire['kind']} of {wire['gpu_uuid']}: {'.'.join(map(str, first['loc']))}: {first['msg']}")
        return []
    return [wire]


def _plus(a: Any, b: Any) -> Any:
    return None if a is None and b is None else (a or 0) + (b or 0)


def _by_pid(processes: tuple[ProcessUsage, ...]) -> list[ProcessUsage]:
    """The processes of one device by pid: one listed twice (a tool listing each of its allocations) is one, its
    memory and its own busy summed, so that it is one process sample, billed its whole share."""
    merged: dict[int, ProcessUsage] = {}
    for p in processes:
        q = merged.get(p.pid)
        merged[p.pid] = (
            p
            if q is None
            else ProcessUsage(p.pid, _plus(q.mem_used_bytes, p.mem_used_bytes), _plus(q.busy_pct, p.busy_pct))
        )
    return sorted(merged.values(), key=lambda p: p.pid)


def _processes(s: DeviceSample, base: dict[str, Any], busy_cp: int, out: Parsed) -> list[dict[str, Any]]:
    procs = _by_pid(s.processes or ())
    own = {p.pid: round_scaled(p.busy_pct, 100) for p in procs if p.busy_pct is not None}
    rest = [p.pid for p in procs if p.busy_pct is None]
    share = dict(zip(rest, shares(max(0, busy_cp - sum(own.values())), len(rest)) if rest else []))
    events: list[dict[str, Any]] = []
    for p in procs:
        not_reported = ["mem_bw_util_pct"] + (["mem_used_bytes"] if p.mem_used_bytes is None else [])
        wire = {
            **base,
            "kind": "process_sample",
            "pid": p.pid,
            "sm_util_pct": _w(own.get(p.pid, share.get(p.pid, 0)), 100),
            "mem_used_bytes": p.mem_used_bytes or 0,
            "not_reported": not_reported,
        }
        if p.pid in share:
            wire["estimated"] = ["sm_util_pct"]
        events += _checked(ProcessSample, wire, out)
    left = busy_cp - sum(own.values()) - sum(share.values())
    if left > 0:  # busy time no process of the capture claims: no one's, never idle (dcgm-exporter's rule)
        wire = {**base, "kind": "process_sample", "pid": unclaimed_pid(base["gpu_uuid"]), "mem_used_bytes": 0}
        events += _checked(
            ProcessSample, {**wire, "sm_util_pct": _w(left, 100), "not_reported": ["mem_bw_util_pct"]}, out
        )
    return events


def _takes_devices_model(s: DeviceSample, parent: DeviceSample | None, own: tuple[str, dict[str, Any]] | None) -> bool:
    """Whether partition ``s`` is billed as its share of its device: it names no model of its own, or its device's
    part (the platform row both names resolve to, an alias included), or with no row of its device a part of the
    platform table. One with a model of its own (a MIG profile, no part of the table) is a device of that model.
    ``own`` is the platform row of ``s``'s model."""
    if s.model is None:
        return True
    if parent is None:
        return own is not None
    return s.model == parent.model or (own is not None and own[0] == (platform_for(parent.model) or ("",))[0])


def to_events(samples: list[DeviceSample], place: Placement, out: Parsed) -> list[dict[str, Any]]:
    """The wire objects (``gpu_sample`` then its ``process_sample``\\ s) of the billed devices of ``samples``;
    what cannot be billed is counted in ``out`` with its reason."""
    groups: dict[int, list[DeviceSample]] = defaultdict(list)
    for s in samples:
        ts = s.ts_ns if s.ts_ns is not None else place.at_ns
        if ts is None:
            out.reject("no sample time in the capture: give --at ISO-TIME")
        else:
            groups[ts].append(s)
    billed: list[tuple[int, DeviceSample, DeviceSample | None, int, int]] = []
    for ts, group in sorted(groups.items()):
        by_id = {s.device_id: s for s in group}
        parts: dict[str, list[DeviceSample]] = defaultdict(list)
        for s in group:
            if s.parent_id is not None:
                parts[s.parent_id].append(s)
        for s in group:
            if s.device_id in parts:
                continue  # billed as its partitions
            parent = by_id.get(s.parent_id) if s.parent_id is not None else None
            siblings = sorted(parts[s.parent_id], key=lambda p: p.device_id) if s.parent_id is not None else [s]
            billed.append((ts, s, parent, siblings.index(s), len(siblings)))
    times: dict[str, list[int]] = defaultdict(list)
    for ts, s, *_ in billed:
        times[s.device_id].append(ts)
    steps = _steps(times, place.interval_s)
    events: list[dict[str, Any]] = []
    for ts, s, parent, share, of in billed:
        step = steps[(s.device_id, ts)]
        model = s.model or (parent.model if parent else None) or place.model
        row = platform_for(model)
        if step is None:
            out.reject("one time per device and no sampling step: give --interval-s S")
            continue
        if model is None:
            out.reject("model not reported: give --model NAME (a platforms.toml row or alias)")
            continue
        if of > MAX_PARTITIONS:
            out.reject(f"more than {MAX_PARTITIONS} partitions of one device: no device has as many")
            continue
        f = _figures(s if s.model else replace(s, model=model), parent, row, (share, of), out)
        whole = row[0] if row else model
        shared = s.parent_id is not None and _takes_devices_model(s, parent, row)
        base = {
            "node_id": place.node,
            "gpu_uuid": f"{place.node}/{s.device_id}",
            "ts_ns": ts,
            "interval_s": _w(round_scaled(step, 1000), 1000),
            "mem_bw_util_pct": 0.0,
        }
        wire = {
            "kind": "gpu_sample",
            **base,
            "gpu_model": partition_model(whole, of) if shared else whole,
            "sm_util_pct": _w(f.values["busy_cp"], 100),
            "mem_used_bytes": f.values["mem_used_bytes"],
            "mem_total_bytes": f.values["mem_total_bytes"],
            "power_w": _w(f.values["power_mw"], 1000),
            "temp_c": f.values["temp_c"],
        }
        if s.parent_id is not None:
            wire["partition_of"] = f"{place.node}/{s.parent_id}"
        gpu = _checked(GpuSample, f.labelled(wire), out)
        events += gpu
        if gpu:
            events += _processes(s, base, f.values["busy_cp"], out)
    return events


def with_faults(
    wire: list[dict[str, Any]],
    samples: list[DeviceSample],
    place: Placement,
    earlier: FaultBaseline | None = None,
) -> list[dict[str, Any]]:
    """Each ``gpu_sample`` with its ``fault_fatal`` and ``fault_warning`` (``gpucost.schemas.faults.counts``: the
    faults new since the device's previous sample in the capture, its first since ``earlier.since`` it, where
    given), where the tool reported fault fields; a partition that reports none has its whole device's, which are
    every partition's. Others are left without."""
    history: dict[str, list[tuple[int, DeviceSample]]] = {}
    for s in samples:
        ts = s.ts_ns if s.ts_ns is not None else place.at_ns
        if ts is not None:
            history.setdefault(s.device_id, []).append((ts, s))
    found: dict[tuple[str, int], tuple[int, int] | None] = {}
    for device, seen in history.items():
        seen.sort(key=lambda t: t[0])  # stable: rows of one time keep the capture's order
        before = None if earlier is None else earlier.since(seen[0][1])
        for ts, s in seen:
            found.setdefault((device, ts), counts(s, before))
            before = s
    prefix = len(place.node) + 1  # gpu_uuid and partition_of are NODE/DEVICE_ID
    for event in wire:
        if event["kind"] != "gpu_sample":
            continue
        got = found.get((event["gpu_uuid"][prefix:], event["ts_ns"]))
        if got is None and "partition_of" in event:
            got = found.get((event["partition_of"][prefix:], event["ts_ns"]))
        if got is not None:
            event["fault_fatal"], event["fault_warning"] = got
    return wire


class FaultBaseline:
    """Each device's fault fields as last read, by device id: what the faults of its next reading are new since, in
    a live source (``with_faults``' ``earlier``). A field a reading leaves out keeps its earlier value, so a reading
    that misses a line (or a failed run) resets no counter, and the line's return is no new fault."""

    def __init__(self) -> None:
        self.before: dict[str, DeviceSample] = {}

    def since(self, s: DeviceSample) -> DeviceSample:
        """The reading ``s``'s faults are new since: its device's last one, where a field had no value ``s``'s own
        (a device, or one of its counters, first read now: what it held before is not the run's)."""
        old = self.before.get(s.device_id)
        return s if old is None else replace(old, **{f: getattr(s, f) for f in FAULT_FIELDS if getattr(old, f) is None})

    def take(self, reading: DeviceSample) -> tuple[int, int] | None:
        """The ``fault_fatal`` and ``fault_warning`` of ``reading``: its faults new ``since`` (None: it reports no
        fault field); the reading then is its device's last. A live source takes the reading of each sample it
        sends, so that the faults of one it skips come with the next."""
        got = counts(reading, self.since(reading))
        self.remember([reading])
        return got

    def remember(self, readings: Iterable[DeviceSample]) -> None:
        for s in readings:
            old = self.before.get(s.device_id)
            kept = {} if old is None else {f: getattr(old, f) for f in FAULT_FIELDS if getattr(s, f) is None}
            self.before[s.device_id] = replace(s, **kept)
