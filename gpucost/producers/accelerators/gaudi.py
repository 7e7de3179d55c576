"""Intel Gaudi: ``hl-smi`` tables (two rows per device, as nvidia-smi) and ``hl-smi -Q … -f csv``.

The device is named by its PCI bus id, which survives reboots. In a log whose lines carry a
``[YYYY-MM-DD HH:MM:SS.mmm]`` prefix, each snapshot's time is its device row's prefix, read as UTC
(hl-smi's log has no zone). A process row reads ``AIP PID Type Process-name Usage``; ``N/A`` is an
idle device, and a busy row can lose its closing ``|``. No per-process busy is reported. The
``Volatile Uncorr. ECC`` cell is the device's uncorrectable ECC count since the driver loaded.
CSV headers name units as nvidia-smi does (``memory.used [MiB]``); ``-f csv,nounits`` drops them.
"""

from __future__ import annotations

import csv
import io
import re
from datetime import UTC, datetime

from gpucost.producers.accelerators.capture import body, guarded, is_missing, pipe_rows
from gpucost.schemas.devices import (
    DeviceSample,
    Parsed,
    ProcessUsage,
    UnitError,
    number,
    to_bytes,
    to_count,
    to_pct,
    to_watts,
)

__all__ = ["parse_table", "parse_csv"]

VENDOR = "Intel"
_PREFIX = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)\] \[hlsmi\] \[\w+\] ?")


def _ts_ns(stamp: str) -> int:
    whole, _, frac = stamp.partition(".")
    seconds = int(datetime.strptime(whole, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp())
    return seconds * 10**9 + int((frac + "000000000")[:9])


def _unit(cell: str, units: tuple[str, ...]) -> tuple[str, str]:
    match = re.fullmatch(r"([\d.]+)\s*(" + "|".join(units) + r")", cell.strip())
    if match is None:
        raise UnitError(f"{cell!r} is not a number in {'/'.join(units)}")
    return match[1], match[2]


def _device(
    first: list[str], second: list[str], ts_ns: int | None, procs: dict[str, list[ProcessUsage]], ecc: int | None
) -> DeviceSample:
    index, model = first[0].split()[0], " ".join(first[0].split()[1:-1]) or None
    bus = first[1].split()[0]
    fan_temp_perf_power = second[0].split()
    power = fan_temp_perf_power[3] if len(fan_temp_perf_power) >= 4 else "N/A"
    temp = fan_temp_perf_power[1] if len(fan_temp_perf_power) >= 2 else "N/A"
    used, _, total = second[1].partition("/")
    busy = second[2].split()[0] if second[2].split() else "N/A"
    return DeviceSample(
        VENDOR,
        model,
        bus,
        ts_ns=ts_ns,
        busy_pct=None if is_missing(busy) else to_pct(busy.rstrip("%")),
        power_w=None if is_missing(power) else to_watts(*_unit(power, ("W",))),
        mem_used_bytes=None if is_missing(used) else to_bytes(*_unit(used, ("MiB", "GiB", "KiB"))),
        mem_total_bytes=None if is_missing(total) else to_bytes(*_unit(total, ("MiB", "GiB", "KiB"))),
        temperature_c=None if is_missing(temp) else number(temp.rstrip("C")),
        processes=tuple(procs.get(index, ())),
        ecc_uncorrected=ecc,
    )


def _ecc(first: list[str], header: bool) -> int | None:
    """The device row's third cell, when the header names it ``Volatile Uncorr. ECC`` (a count since the
    driver loaded); another header (``Volatile Uncor-Events``) names something we cannot map."""
    cell = first[2]
    return None if not header or is_missing(cell) else to_count(cell)


def parse_table(text: str) -> Parsed:
    """Every device row pair of every snapshot in the capture."""
    out = Parsed()
    pending: list[tuple[list[str], list[str], int | None]] = []
    procs: dict[str, list[ProcessUsage]] = {}
    first: list[str] | None = None
    in_procs = ecc_header = False

    def flush() -> None:
        for a, b, ts in pending:
            ecc = guarded(out, "hl-smi Volatile Uncorr. ECC", lambda a=a: _ecc(a, ecc_header))  # bad: null, counted
            got = guarded(
                out, f"hl-smi device {a[0].split()[:1]}", lambda a=a, b=b, ts=ts, ecc=ecc: _device(a, b, ts, procs, ecc)
            )
            if got is not None:
                out.samples.append(got)
        pending.clear()
        procs.clear()

    for raw in body(text):
        match = _PREFIX.match(raw)
        ts_ns, line = (_ts_ns(match[1]), raw[match.end() :]) if match else (None, raw)
        if "HL-SMI Version" in line:
            flush()
            in_procs = False
        if "Compute Processes" in line:
            in_procs = True
            continue
        cells = pipe_rows(line.rstrip() + ("" if line.rstrip().endswith("|") else "|"))
        if cells is not None and len(cells) == 3 and "AIP" in cells[0] and "Name" in cells[0]:
            ecc_header = "Uncorr. ECC" in cells[2]
        if cells is None or "AIP" in cells[0] or "Version" in cells[0] or "Fan" in cells[0]:
            continue
        if in_procs:
            parts = cells[0].split()
            if len(parts) >= 2 and parts[1].isdigit():
                mem = guarded(
                    out, "hl-smi process memory", lambda parts=parts: to_bytes(*_unit(parts[-1], ("MiB", "GiB", "KiB")))
                )
                procs.setdefault(parts[0], []).append(ProcessUsage(int(parts[1]), mem, None))
            elif len(parts) >= 2 and not is_missing(parts[1]):
                out.reject(f"hl-smi process row: PID {parts[1]!r} is not a number")
        elif len(cells) == 3 and first is None and cells[0].split() and cells[0].split()[0].isdigit():
            first = cells
        elif len(cells) == 3 and first is not None:
            pending.append((first, cells, ts_ns))
            first = None
    flush()
    return out


_CSV = {
    "utilization.aip": "busy",
    "power.draw": "power",
    "memory.used": "used",
    "memory.total": "total",
    "temperature.aip": "temp",
    "name": "model",
    "bus_id": "bus",
    "index": "index",
    "timestamp": "ts",
}


def parse_csv(text: str) -> Parsed:
    """``hl-smi -Q timestamp,name,bus_id,utilization.aip,power.draw,memory.used,memory.total,temperature.aip
    -f csv``: one sample per row."""
    out = Parsed()
    rows = list(csv.reader(io.StringIO("\n".join(body(text))), skipinitialspace=True))
    if len(rows) < 2:
        out.reject("hl-smi CSV: no device rows")
        return out
    header = []
    for col in rows[0]:
        name, _, unit = col.strip().partition(" [")
        header.append((_CSV.get(name.strip()), unit.rstrip("]")))
    for row in rows[1:]:
        if len(row) != len(header):
            out.reject("hl-smi CSV: a row does not match the header")
            continue
        got = guarded(out, "hl-smi CSV row", lambda row=row: _csv_row(dict(zip(header, row))))
        if got is not None:
            out.samples.append(got)
    return out


def _csv_row(row: dict[tuple[str | None, str], str]) -> DeviceSample:
    vals = {key: (cell.strip(), unit) for (key, unit), cell in row.items() if key}

    def cell(key: str) -> tuple[str, str] | None:
        got = vals.get(key)
        if got is None or is_missing(got[0]):
            return None
        value, unit = got
        if " " in value:  # the unit in the cell too: "24065 MiB"
            value, unit = value.split(" ", 1)
        return value.rstrip("%"), unit

    ts = cell("ts")
    bus = cell("bus") or cell("index")
    if bus is None:
        raise UnitError("no bus_id or index column")
    busy, power, used, total, temp = (cell(k) for k in ("busy", "power", "used", "total", "temp"))
    return DeviceSample(
        VENDOR,
        None if cell("model") is None else vals["model"][0],
        bus[0],
        ts_ns=None if ts is None else _ts_ns(vals["ts"][0].replace("/", "-")),
        busy_pct=None if busy is None else to_pct(busy[0]),
        power_w=None if power is None else to_watts(power[0], power[1] or "W"),
        mem_used_bytes=None if used is None else to_bytes(used[0], used[1] or "MiB"),
        mem_total_bytes=None if total is None else to_bytes(total[0], total[1] or "MiB"),
        temperature_c=None if temp is None else number(temp[0].rstrip("C")),
    )
