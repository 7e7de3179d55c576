"""``amd-smi`` captures: ``monitor`` tables (with their process table), the indented ``metric`` and
``process`` text, and ``--json`` output.

amd-smi names GPUs by index only, so ``device_id`` is ``gpu<N>``. Its ``MB``/``GB`` are binary
(amdsmi divides bytes by 1024² and 1024³), read here as MiB/GiB; text sizes such as ``10.1 GB`` are
rounded for display, so the bytes are only as exact as the printed digits. ``GFX``/``ENC`` per
process are cumulative engine nanoseconds, not a fraction: a process's busy is not reported.
``GFX_BUSY_INST`` lists each compute partition (``XCP_n``) with its XCDs: a partition becomes a
device ``gpu<N>.xcp<n>`` whose parent ``gpu<N>`` alone carries power, temperature and memory.
Faults: ``monitor``'s ``SINGLE_ECC``/``DOUBLE_ECC``/``PCIE_REPLAY`` (cumulative counts), ``metric``'s
``ECC: TOTAL_CORRECTABLE_COUNT``/``TOTAL_UNCORRECTABLE_COUNT`` and ``POWER: THROTTLE_STATUS``.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

from gpucost.producers.accelerators.capture import body, guarded, is_missing, json_body
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

__all__ = ["parse_text", "parse_json"]

VENDOR = "AMD"
_SIZE_UNITS = {"B": "B", "KB": "KiB", "MB": "MiB", "GB": "GiB", "TB": "TiB"}


def _split(cell: str) -> tuple[str, str]:
    value, _, unit = cell.strip().partition(" ")
    return value, unit.strip()


def _size(cell: str) -> int | None:
    if is_missing(cell):
        return None
    value, unit = _split(cell)
    if unit not in _SIZE_UNITS:
        raise UnitError(f"unknown size unit in {cell!r}")
    return to_bytes(value, _SIZE_UNITS[unit])


def _watts(cell: str) -> Decimal | None:
    return None if is_missing(cell) else to_watts(*_split(cell))


def _pct(cell: str) -> Decimal | None:
    return None if is_missing(cell) else to_pct(_split(cell)[0])


def _temp(cell: str) -> Decimal | None:
    return None if is_missing(cell) else number(_split(cell)[0])


def _count(cell: str) -> int | None:
    return None if is_missing(cell) else to_count(cell)


_THROTTLE = {"UNTHROTTLED": (), "THROTTLED": ("throttled",)}  # amd-smi's status names no cause


def _throttle(cell: str) -> tuple[str, ...] | None:
    if is_missing(cell):
        return None
    if cell.strip() not in _THROTTLE:
        raise UnitError(f"throttle status {cell!r} is neither THROTTLED nor UNTHROTTLED")
    return _THROTTLE[cell.strip()]


def _monitor_count(out: Parsed, row: dict[str, str], column: str) -> int | None:
    """A fault column's count; a bad cell is counted and left null, the row's readings stand."""
    return guarded(out, f"amd-smi monitor {column}", lambda: _count(row.get(column, "N/A")))


def _columns(line: str) -> list[str]:
    return re.split(r"\s{2,}", line.strip())


def _monitor(lines: list[str], out: Parsed) -> None:
    """``amd-smi monitor``: a GPU table, optionally followed by ``PROCESS INFO:`` and its table."""
    header: list[str] = []
    procs: dict[str, list[ProcessUsage]] = {}
    has_procs = any(line.strip() == "PROCESS INFO:" for line in lines)
    rows: list[dict[str, str]] = []
    for line in lines:
        if not line.strip() or line.strip() == "PROCESS INFO:":
            continue
        cells = _columns(line)
        if cells[0] == "GPU":
            header = cells
            continue
        if len(cells) != len(header):
            out.reject(f"amd-smi monitor: row does not match its header: {line.strip()[:60]!r}")
            continue
        row = dict(zip(header, cells))
        if "PID" in row:
            pid = guarded(out, "amd-smi process row", lambda row=row: int(row["PID"]))
            if pid is not None:
                mem = guarded(out, "amd-smi process VRAM_MEM", lambda row=row: _size(row.get("VRAM_MEM", "N/A")))
                procs.setdefault(row["GPU"], []).append(ProcessUsage(pid, mem, None))
        else:
            rows.append(row)
    for row in rows:

        def sample(row: dict[str, str] = row) -> DeviceSample:
            return DeviceSample(
                VENDOR,
                None,
                f"gpu{int(row['GPU'])}",
                busy_pct=_pct(row.get("GFX_UTIL", "N/A")),
                power_w=_watts(row.get("POWER", "N/A")),
                mem_used_bytes=_size(row.get("VRAM_USED", "N/A")),
                mem_total_bytes=_size(row.get("VRAM_TOTAL", "N/A")),
                temperature_c=_temp(row.get("GPU_TEMP", "N/A")),
                processes=tuple(procs.get(row["GPU"], ())) if has_procs else None,
                ecc_corrected=_monitor_count(out, row, "SINGLE_ECC"),
                ecc_uncorrected=_monitor_count(out, row, "DOUBLE_ECC"),
                pcie_replays=_monitor_count(out, row, "PCIE_REPLAY"),
            )

        got = guarded(out, "amd-smi monitor row", sample)
        if got is not None:
            out.samples.append(got)


class _Node:
    """One ``KEY: value`` line of indented text and the lines indented under it."""

    __slots__ = ("key", "value", "children")

    def __init__(self, key: str, value: str) -> None:
        self.key, self.value = key, value
        self.children: list[_Node] = []

    def get(self, *path: str) -> _Node | None:
        node: _Node | None = self
        for key in path:
            node = next((c for c in node.children if c.key == key), None) if node else None
        return node

    def text(self, *path: str) -> str:
        node = self.get(*path)
        return node.value if node is not None and node.value else "N/A"


def _tree(lines: list[str]) -> _Node:
    """Indented ``KEY: value`` text as a tree; a ``[...]`` array wrapped over lines is joined."""
    root = _Node("", "")
    stack: list[tuple[int, _Node]] = [(-1, root)]
    pending: _Node | None = None
    for line in lines:
        if not line.strip() or line.strip() == "...":
            continue
        if pending is not None:
            pending.value += " " + line.strip()
            pending = None if "]" in line else pending
            continue
        indent = len(line) - len(line.lstrip())
        key, _, value = line.strip().partition(":")
        while stack[-1][0] >= indent:
            stack.pop()
        node = _Node(key.strip(), value.strip())
        stack[-1][1].children.append(node)
        stack.append((indent, node))
        if node.value.startswith("[") and "]" not in node.value:
            pending = node
    return root


def _xcp_busy(cell: str) -> Decimal | None:
    """A partition's busy: the mean of its XCDs' reported values (``N/A`` slots are absent XCDs)."""
    known = [_pct(v) for v in cell.strip("[]").split(",") if not is_missing(v)]
    return sum(known, Decimal(0)) / len(known) if known else None  # type: ignore[arg-type]


def _gpu(node: _Node, out: Parsed) -> None:
    dev = f"gpu{int(node.value)}"
    procs = []
    for info in (c for c in node.children if c.key == "PROCESS_INFO"):
        pid = guarded(out, "amd-smi process PID", lambda info=info: int(info.text("PID")))
        mem = guarded(out, "amd-smi process VRAM_MEM", lambda info=info: _size(info.text("MEMORY_USAGE", "VRAM_MEM")))
        if pid is not None:
            procs.append(ProcessUsage(pid, mem, None))
    sample = guarded(
        out,
        f"amd-smi {dev}",
        lambda: DeviceSample(
            VENDOR,
            None,
            dev,
            busy_pct=_pct(node.text("USAGE", "GFX_ACTIVITY")),
            power_w=_watts(node.text("POWER", "SOCKET_POWER")),
            mem_used_bytes=_size(node.text("MEM_USAGE", "USED_VRAM")),
            mem_total_bytes=_size(node.text("MEM_USAGE", "TOTAL_VRAM")),
            temperature_c=_temp(node.text("TEMPERATURE", "HOTSPOT")),
            processes=tuple(procs) if node.get("PROCESS_INFO") is not None else None,
            ecc_corrected=guarded(out, "amd-smi ECC", lambda: _count(node.text("ECC", "TOTAL_CORRECTABLE_COUNT"))),
            ecc_uncorrected=guarded(out, "amd-smi ECC", lambda: _count(node.text("ECC", "TOTAL_UNCORRECTABLE_COUNT"))),
            throttle_reasons=guarded(out, "amd-smi POWER", lambda: _throttle(node.text("POWER", "THROTTLE_STATUS"))),
        ),
    )
    if sample is not None:
        out.samples.append(sample)
    for xcp in getattr(node.get("USAGE", "GFX_BUSY_INST"), "children", []):
        busy = guarded(out, f"amd-smi {dev} {xcp.key}", lambda xcp=xcp: _xcp_busy(xcp.value))
        out.samples.append(DeviceSample(VENDOR, None, f"{dev}.{xcp.key.lower().replace('_', '')}", dev, busy_pct=busy))


def parse_text(text: str) -> Parsed:
    """Any amd-smi text capture: a ``monitor`` table or ``GPU: N`` blocks."""
    out = Parsed()
    lines = body(text)
    if any(_columns(line)[0] == "GPU" and "POWER" in line for line in lines if line.strip()):
        _monitor(lines, out)
        return out
    for node in _tree(lines).children:
        if node.key == "GPU" and node.value.isdigit():
            _gpu(node, out)
        else:
            out.reject(f"amd-smi text: {node.key!r} is not a 'GPU: N' block")
    return out


def _unit_value(field: Any) -> tuple[Any, str]:
    if isinstance(field, dict):
        return field.get("value"), str(field.get("unit", ""))
    return field, ""


def _json_size(field: Any) -> int | None:
    value, unit = _unit_value(field)
    if value is None or value == "N/A":
        return None
    if unit not in _SIZE_UNITS:
        raise UnitError(f"unknown size unit {unit!r}")
    return to_bytes(value, _SIZE_UNITS[unit])


def _json_opt(field: Any, convert: Any) -> Any:
    value, unit = _unit_value(field)
    return None if value is None or value == "N/A" else convert(value, unit)


def _json_count(value: Any, _unit: str) -> int:
    return to_count(value)


def _json_throttle(value: Any, _unit: str) -> tuple[str, ...] | None:
    return _throttle(str(value))


def _json_gpu(entry: dict[str, Any], out: Parsed) -> None:
    dev = f"gpu{int(entry['gpu'])}"
    procs = None
    if "process_list" in entry:
        procs = []
        for item in entry["process_list"]:
            info = item.get("process_info", item) if isinstance(item, dict) else {}
            pid = guarded(out, "amd-smi JSON process pid", lambda info=info: int(info["pid"]))
            mem = guarded(
                out,
                "amd-smi JSON process vram_mem",
                lambda info=info: _json_size((info.get("memory_usage") or {}).get("vram_mem")),
            )
            if pid is not None:
                procs.append(ProcessUsage(pid, mem, None))
    power, usage = entry.get("power") or {}, entry.get("usage") or {}
    mem, temp, ecc = entry.get("mem_usage") or {}, entry.get("temperature") or {}, entry.get("ecc") or {}
    out.samples.append(
        DeviceSample(
            VENDOR,
            None,
            dev,
            busy_pct=_json_opt(usage.get("gfx_activity"), lambda v, _u: to_pct(v)),
            power_w=_json_opt(power.get("socket_power"), lambda v, u: to_watts(v, u or "W")),
            mem_used_bytes=_json_size(mem.get("used_vram")),
            mem_total_bytes=_json_size(mem.get("total_vram")),
            temperature_c=_json_opt(temp.get("hotspot"), lambda v, _u: number(v)),
            processes=None if procs is None else tuple(procs),
            # a bad fault value is counted and left null; the GPU's readings stand
            ecc_corrected=guarded(
                out, "amd-smi JSON ecc", lambda: _json_opt(ecc.get("total_correctable_count"), _json_count)
            ),
            ecc_uncorrected=guarded(
                out, "amd-smi JSON ecc", lambda: _json_opt(ecc.get("total_uncorrectable_count"), _json_count)
            ),
            throttle_reasons=guarded(
                out, "amd-smi JSON throttle_status", lambda: _json_opt(power.get("throttle_status"), _json_throttle)
            ),
        )
    )


def parse_json(text: str) -> Parsed:
    """amd-smi ``--json`` output: a list of ``{"gpu": N, ...}`` objects."""
    out = Parsed()
    for entry in json_body(text, out, "amd-smi", list, "a list of GPU objects") or []:
        if not isinstance(entry, dict) or "gpu" not in entry:
            out.reject("amd-smi JSON: an entry without 'gpu'")
            continue
        guarded(out, "amd-smi JSON GPU", lambda entry=entry: _json_gpu(entry, out))
    return out
