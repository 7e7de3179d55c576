"""Google TPU: ``tpu-info`` tables (Markdown pipes in recent releases, box drawing in early ones).

A chip is a device ``tpu<N>``, ``N`` being the runtime's chip id (the ``Chip``/``Device`` column of
the utilisation table, or the ``Core ID`` of ``--metric duty_cycle_percent``, one row per chip).
Duty cycle is the busy fraction; HBM ``used / total`` GiB are display-rounded to 0.01 GiB. The
chips table names chips by device file (``/dev/vfio/0``, ``/dev/accel0``); its type gives the model
and its PID the process on the chip, joined only where the device number equals the runtime id
(runtime ids can be 8, 9, 12, 13 on a host whose chips are /dev/vfio/0–3: those PIDs are counted,
not guessed). tpu-info reports no power, temperature, per-process memory or per-process busy.
``Last update:`` (streaming mode) is the sample time; otherwise there is none.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

from gpucost.producers.accelerators.capture import body, guarded, is_missing, pipe_rows
from gpucost.schemas.devices import DeviceSample, Parsed, ProcessUsage, UnitError, to_bytes, to_pct

__all__ = ["parse"]

VENDOR = "Google"
_TITLES = ("TPU", "TensorCore")


def _tables(lines: list[str]) -> dict[str, list[dict[str, str]]]:
    """Each table under its title line, as rows of header → cell."""
    tables: dict[str, list[dict[str, str]]] = {}
    title, header = "", None
    for line in lines:
        cells = pipe_rows(line)
        if cells is None:
            if line.strip() and not re.fullmatch(r"[\s|\-=+:┏┳┓┡╇┩└┴┘━─]*", line.strip()):
                title, header = line.strip(), None
            continue
        if header is None:
            header = cells
            tables[title] = []
        else:
            tables[title].append(dict(zip(header, cells)))
    return tables


def _hbm(cell: str) -> tuple[int, int]:
    match = re.fullmatch(r"([\d.]+) GiB / ([\d.]+) GiB", cell.strip())
    if match is None:
        raise UnitError(f"HBM {cell!r} is not 'used GiB / total GiB'")
    return to_bytes(match[1], "GiB"), to_bytes(match[2], "GiB")


def _pct(cell: str) -> object:
    return None if is_missing(cell) else to_pct(cell.strip().rstrip("%"))


def parse(text: str) -> Parsed:
    """Every chip the utilisation (or HBM / duty-cycle) tables name, one sample each."""
    out = Parsed()
    lines = body(text)
    ts_ns = None
    model = None
    for line in lines:
        if line.startswith("Last update:"):
            stamp = datetime.strptime(line.split(":", 1)[1].strip(), "%Y-%m-%d %H:%M:%S UTC")
            ts_ns = int(stamp.replace(tzinfo=UTC).timestamp()) * 10**9
        elif line.startswith("Accelerator type:"):
            model = f"TPU {line.split(':', 1)[1].strip()}"
    tables = _tables(lines)
    chips: dict[int, dict[str, object]] = {}
    pids: dict[int, set[int]] = {}
    for title, rows in tables.items():
        for row in rows:
            key = next((row[k] for k in ("Chip", "Device", "Core ID", "Chip ID") if k in row), None)
            if key is None:
                continue
            if key.startswith("/dev/"):
                number = int(re.sub(r"\D", "", key) or -1)
                if "Type" in row and not is_missing(row["Type"]):
                    model = model or row["Type"].removesuffix(" chip")
                if "PID" in row and row["PID"].isdigit():
                    pids.setdefault(number, set()).add(int(row["PID"]))
                continue
            if title.startswith("TensorCore") or not key.isdigit():
                continue  # per-TensorCore utilisation is MXU use, not the chip's busy (docs/sources.md)
            chip = chips.setdefault(int(key), {})
            for col, cell in row.items():
                if "HBM" in col or "Memory usage" in col:
                    got = guarded(out, f"tpu-info chip {key} HBM", lambda cell=cell: _hbm(cell))
                    if got is not None:
                        chip["used"], chip["total"] = got
                elif "Duty" in col:
                    busy = guarded(out, f"tpu-info chip {key} duty cycle", lambda cell=cell: _pct(cell))
                    if busy is not None:
                        chip["busy"] = busy
    for number in sorted(set(pids) - set(chips)) if chips else []:
        out.reject(f"tpu-info: PIDs of /dev chip {number} match no runtime chip id")
    for chip_id, chip in sorted(chips.items()):
        procs = pids.get(chip_id)
        out.samples.append(
            DeviceSample(
                VENDOR,
                model,
                f"tpu{chip_id}",
                ts_ns=ts_ns,
                busy_pct=chip.get("busy"),  # type: ignore[arg-type]
                mem_used_bytes=chip.get("used"),
                mem_total_bytes=chip.get("total"),  # type: ignore[arg-type]
                processes=None if procs is None else tuple(ProcessUsage(p) for p in sorted(procs)),
            )
        )
    if not chips and pids:  # a chips/process table alone: the chips, with their processes
        for number, procs in sorted(pids.items()):
            out.samples.append(
                DeviceSample(
                    VENDOR, model, f"tpu{number}", ts_ns=ts_ns, processes=tuple(ProcessUsage(p) for p in sorted(procs))
                )
            )
    return out
