"""The accelerator-neutral device sample: one reading of one device or partition.

Every vendor's tool is parsed into ``DeviceSample`` so nothing downstream branches on a vendor.
A field the capture does not report is ``None`` ("not reported"), never 0. Values are exact:
percentages and watts are ``Decimal`` read from the capture's text, sizes are integer bytes
converted from the capture's unit and rounded half-even once (``to_bytes``).

Partitions (AMD compute partitions XCP, Neuron cores of a Neuron device) are devices of their own
with ``parent_id`` naming the whole device. The parent alone carries what the partitions share
and the tool repeats for each of them — power, temperature and the device's memory — so power and
memory are never counted twice; a partition row carries its own busy fraction and processes.

Fault fields (``FAULT_FIELDS``) are what the tool says about the device's health: counters are
cumulative as the tool reports them (since the driver or monitor started), never per interval, so
an audit window takes the difference of two samples (``gpucost.schemas.faults``).
"""

from __future__ import annotations

import json
import tomllib
from collections import Counter
from dataclasses import dataclass, field, fields
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from pathlib import Path
from typing import Any

from gpucost.schemas.exact import round_scaled

__all__ = [
    "ProcessUsage",
    "DeviceSample",
    "Parsed",
    "UnitError",
    "to_bytes",
    "to_watts",
    "to_pct",
    "to_count",
    "FAULT_FIELDS",
    "number",
    "sample_json",
    "platforms",
    "platform_for",
    "platform_names",
    "platform_peaks",
    "PEAK_PRECISIONS",
]

# Binary units are what the tools print as MiB/GiB; plain "MB"/"GB" are SI unless a parser
# knows its tool means binary (amd-smi does) and passes the binary unit instead.
_BYTES = {
    "B": 1,
    "KiB": 1 << 10,
    "MiB": 1 << 20,
    "GiB": 1 << 30,
    "TiB": 1 << 40,
    "KB": 10**3,
    "kB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
}
_WATTS = {"W": Decimal(1), "mW": Decimal("0.001"), "kW": Decimal(1000)}
_MAX_BYTES = 1 << 60  # an exabyte: larger is a misread, not a device's memory
_MAX_WATTS = Decimal(100_000)


class UnitError(ValueError):
    """A value or unit that cannot be a reading; the message says which and why."""


def number(text: str | int | float | Decimal) -> Decimal:
    """The exact decimal of a capture's number text; raises ``UnitError`` for anything else."""
    try:
        value = (
            Decimal(repr(text))
            if isinstance(text, float)
            else Decimal(text if not isinstance(text, str) else text.strip())
        )
    except (InvalidOperation, ValueError, TypeError):
        raise UnitError(f"{text!r} is not a number") from None
    if isinstance(text, bool) or not value.is_finite():
        raise UnitError(f"{text!r} is not a finite number")
    return value


def to_bytes(value: str | int | float | Decimal, unit: str) -> int:
    """``value`` in ``unit`` as integer bytes, rounded half-even (``"1.5", "KiB"`` → 1536)."""
    if unit not in _BYTES:
        raise UnitError(f"unknown size unit {unit!r} (known: {', '.join(_BYTES)})")
    exact = number(value)
    if exact < 0 or exact * _BYTES[unit] > _MAX_BYTES:
        raise UnitError(f"size {value} {unit} is outside 0 to 1 EiB")
    return round_scaled(exact, _BYTES[unit])


def to_watts(value: str | int | float | Decimal, unit: str = "W") -> Decimal:
    """``value`` in W or mW as exact watts (``"1500", "mW"`` → 1.5)."""
    if unit not in _WATTS:
        raise UnitError(f"unknown power unit {unit!r} (known: {', '.join(_WATTS)})")
    watts = number(value) * _WATTS[unit]
    if watts < 0 or watts > _MAX_WATTS:
        raise UnitError(f"power {value} {unit} is outside 0 to 100 kW")
    return watts


def to_pct(value: str | int | float | Decimal, *, ratio: bool = False) -> Decimal:
    """A percentage (or, with ``ratio``, a 0–1 fraction) as an exact percentage in 0–100."""
    pct = number(value) * (100 if ratio else 1)
    if pct < 0 or pct > 100:
        raise UnitError(f"busy {value}{'' if ratio else ' %'} is outside 0-100 %")
    return pct


def to_count(value: str | int | float | Decimal) -> int:
    """An event counter's reading as an int (``"3"``, ``3.0`` → 3); a fraction or a negative is a misread."""
    exact = number(value)
    if exact < 0 or exact != exact.to_integral_value():
        raise UnitError(f"count {value} is not a whole number 0 or above")
    return int(exact)


@dataclass(frozen=True, slots=True)
class ProcessUsage:
    """One process on one device, as far as the tool reports it."""

    pid: int
    mem_used_bytes: int | None = None
    busy_pct: Decimal | None = None


_FAULT = {"fault": True}  # the metadata that marks a DeviceSample field as a fault field


@dataclass(frozen=True, slots=True)
class DeviceSample:
    """One device's or partition's reading at one time (``ts_ns`` None: the capture has no time)."""

    vendor: str
    model: str | None
    device_id: str
    parent_id: str | None = None
    ts_ns: int | None = None
    busy_pct: Decimal | None = None
    power_w: Decimal | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    temperature_c: Decimal | None = None
    processes: tuple[ProcessUsage, ...] | None = None
    # faults (docs/definitions.md, "Device faults"): counters cumulative as reported, None = not reported
    ecc_corrected: int | None = field(default=None, metadata=_FAULT)
    ecc_uncorrected: int | None = field(default=None, metadata=_FAULT)
    retired_pages: int | None = field(default=None, metadata=_FAULT)
    remapped_rows: int | None = field(default=None, metadata=_FAULT)
    remap_failed: bool | None = field(default=None, metadata=_FAULT)
    xid: int | None = field(default=None, metadata=_FAULT)  # the last XID the driver logged; 0: none since it loaded
    #: XID events received, cumulative (NVML sends each XID as an event, so a repeat of the last XID is a new one);
    #: None where the tool gives only the last XID (DCGM), whose repeat cannot be told from the same one
    xid_events: int | None = field(default=None, metadata=_FAULT)
    throttle_reasons: tuple[str, ...] | None = field(default=None, metadata=_FAULT)  # (): "not throttled"
    link_errors: int | None = field(default=None, metadata=_FAULT)
    pcie_replays: int | None = field(default=None, metadata=_FAULT)
    hardware_errors: int | None = field(default=None, metadata=_FAULT)


#: the fault fields of ``DeviceSample``, in its order (the JSON output, the text ``faults`` column)
FAULT_FIELDS = tuple(f.name for f in fields(DeviceSample) if f.metadata.get("fault"))


#: distinct reasons a live source counts by their own text (``Parsed.count_into``)
MAX_REASONS = 100


@dataclass
class Parsed:
    """What a parser made of one capture: samples, and the parts it could not use, counted by reason."""

    samples: list[DeviceSample] = field(default_factory=list)
    dead_letters: Counter[str] = field(default_factory=Counter)

    def reject(self, reason: str) -> None:
        self.dead_letters[reason] += 1

    def count_into(self, counts: Counter[str]) -> None:
        """The reasons added to a live source's ``counts``: each under its own text (it names a value, a device) while
        ``counts`` holds fewer than ``MAX_REASONS`` names (the source's own counters among them), a new one after that
        as ``other_reasons``, so that a long run's counters (each a series on ``/metrics``) stay bounded."""
        for reason, n in self.dead_letters.items():
            known = reason in counts or len(counts) < MAX_REASONS
            counts[reason if known else "other_reasons"] += n


def _num(value: Decimal | None) -> str:
    if value is None:
        return "null"
    return format(value.normalize(), "f")


def sample_json(sample: DeviceSample) -> str:
    """The sample as one JSON object, numbers written exactly (no float rounding on the way out)."""
    procs = (
        "null"
        if sample.processes is None
        else "["
        + ",".join(
            f'{{"pid":{p.pid},"mem_used_bytes":{json.dumps(p.mem_used_bytes)},"busy_pct":{_num(p.busy_pct)}}}'
            for p in sample.processes
        )
        + "]"
    )
    return (
        f'{{"vendor":{json.dumps(sample.vendor)},"model":{json.dumps(sample.model)},'
        f'"device_id":{json.dumps(sample.device_id)},"parent_id":{json.dumps(sample.parent_id)},'
        f'"ts_ns":{json.dumps(sample.ts_ns)},"busy_pct":{_num(sample.busy_pct)},'
        f'"power_w":{_num(sample.power_w)},"mem_used_bytes":{json.dumps(sample.mem_used_bytes)},'
        f'"mem_total_bytes":{json.dumps(sample.mem_total_bytes)},'
        f'"temperature_c":{_num(sample.temperature_c)},"processes":{procs}'
        + "".join(f',"{name}":{_fault_json(getattr(sample, name))}' for name in FAULT_FIELDS)
        + "}"
    )


def _fault_json(value: object) -> str:
    return json.dumps(list(value) if isinstance(value, tuple) else value)


#: a part's dense peak is read in the first of these its row gives: FP16 tensor (what the health audit has always
#: judged NVIDIA parts by), BF16 where a part gives no FP16 (TPU, Gaudi), INT8 TOPS where it gives neither
#: (an FPGA)
PEAK_PRECISIONS = ("fp16", "bf16", "int8")


def platform_peaks() -> dict[str, Decimal]:
    """Each platform row's dense peak (``PEAK_PRECISIONS``) under its name and each alias: the health audit's and
    EFU's built-in ``peak_tops`` keys (docs/definitions.md, "Health audit"). A part whose row gives none of them is
    absent, so it takes the table's ``default``, never a guess."""
    out: dict[str, Decimal] = {}
    for name, row in platforms().items():
        peak = next((row[p] for p in PEAK_PRECISIONS if p in row), None)
        if peak is not None:
            out |= dict.fromkeys([name, *row.get("aliases", [])], Decimal(str(peak)))
    return out


@lru_cache(maxsize=1)
def platforms() -> dict[str, dict[str, Any]]:
    """The platform table (``platforms.toml`` beside this module): peak dense TFLOPS, GB/s, TDP per part."""
    with (Path(__file__).parent / "platforms.toml").open("rb") as f:
        return tomllib.load(f)


def platform_for(model: str | None) -> tuple[str, dict[str, Any]] | None:
    """The table row of a tool's model name (exact name or alias, or an alias prefix such as an Alveo
    shell ``xilinx_u280_gen3x16_…``); None for an unknown or unreported model, never a guess."""
    if not model:
        return None
    for name, row in platforms().items():
        names = [name, *row.get("aliases", [])]
        if model in names or any(model.startswith(a + "_") for a in names):
            return name, row
    return None


@lru_cache(maxsize=1024)
def platform_names(model: str) -> tuple[str, ...]:
    """Every name of ``model``'s platform row, the row's own first, then its aliases in the table's order (empty
    for a model of no row): the names a price of the same part may be given under, which a model with no price of
    its own takes in this order (docs/definitions.md, "Tenants and prices"), so that a tool's name (``NVIDIA H100
    80GB HBM3``) and the platform table's (``H100``) price alike whichever of them the price book uses."""
    row = platform_for(model)
    return () if row is None else (row[0], *row[1].get("aliases", []))
