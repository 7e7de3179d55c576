"""NVIDIA dcgm-exporter ``/metrics`` scrape as neutral samples, faults included.

The scrape is read once (``read``: each device's series, the last value of each metric) for both of
its readers: ``sample_of`` makes the neutral sample that ``gpucost devices`` prints, and the billing
source (``gpucost.producers.dcgm``) bills that sample, taking from the same series only what the
neutral model has no field for (memory-copy and profiling activity, PCIe rates, the host and pod
labels). So each DCGM metric is mapped in one place. Devices are named by ``device_of`` (the
``UUID``, a MIG instance ``UUID/GI-<id>`` under its GPU), and values the exporter writes as huge
sentinels (its "blank") are counted, never read.

Busy time is ``DCGM_FI_DEV_GPU_UTIL``, else the profiling ratio ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` as a
percentage (clamped to 0–100: the exporter's rounding may pass 1). Counters are cumulative as DCGM
keeps them: ECC counts are the volatile ones (since the driver loaded) where the scrape has them,
else the aggregate (lifetime) ones; retired pages add the single- and double-bit causes, remapped
rows the correctable and uncorrectable ones, link errors the four NVLink error totals. The XID is
DCGM's last XID value, and the clocks event mask is decoded into NVML's names
(``gpucost.schemas.faults.throttle_names``). A blank gauge lets the next metric of its field stand in
(both measure the present); a blank counter does not, as its stand-in counts from another origin (the
lifetime ECC count for a blank volatile one would read as a burst of new errors).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal

from gpucost.producers.accelerators.capture import guarded
from gpucost.producers.accelerators.prometheus import series
from gpucost.schemas.devices import FAULT_FIELDS, DeviceSample, Parsed, number, to_bytes, to_count, to_pct, to_watts
from gpucost.schemas.faults import throttle_names

__all__ = ["Series", "device_of", "is_blank", "parse", "ratio_pct", "read", "sample_of"]

VENDOR = "NVIDIA"
#: DCGM's blank values (dcgm_structs.h, ``DCGM_*_BLANK``: a base and its error codes above it, such as NOT_FOUND
#: and NOT_SUPPORTED): a 64-bit integer field's from 0x7ffffffffffffff0 (9223372036854775794 is one), a double's
#: from 2^47, a 32-bit integer field's from 0x7ffffff0 to 0x7fffffff. The scrape does not say a field's type, so
#: any value at or above 2^47 (no metric read here comes near it) or in the 32-bit range is blank: a 64-bit field that
#: really had one of those 16 values would be misread as blank.
FP64_BLANK = 2**47
INT32_BLANKS = range(0x7FFFFFF0, 0x80000000)


def is_blank(value: Decimal) -> bool:
    """Whether ``value`` is one of DCGM's blank values (``FP64_BLANK``, ``INT32_BLANKS``), or its negative."""
    return abs(value) >= FP64_BLANK or (value == value.to_integral_value() and int(abs(value)) in INT32_BLANKS)


_Convert = Callable[[Decimal], object]


def device_of(labels: dict[str, str]) -> tuple[str, str | None, str]:
    """(device, parent, model suffix) of a sample with a ``UUID`` label: the GPU itself, or with MIG its
    instance ``UUID/GI-<GPU_I_ID>`` under the GPU, the model then suffixed `` MIG <GPU_I_PROFILE>``."""
    uuid, instance, profile = labels["UUID"], labels.get("GPU_I_ID"), labels.get("GPU_I_PROFILE")
    if not instance:
        return uuid, None, ""
    return f"{uuid}/GI-{instance}", uuid, f" MIG {profile}" if profile else ""


def _flag(value: Decimal) -> bool:
    return to_count(value) != 0


def _mask(value: Decimal) -> tuple[str, ...]:
    return throttle_names(to_count(value))


def ratio_pct(value: Decimal) -> Decimal:
    """A profiling ratio (0–1) as a percentage, clamped to 0–100 (the exporter's rounding may pass 1)."""
    return min(Decimal(100), max(Decimal(0), value * 100))


#: metric → (field, conversion); of two metrics for one field the earlier in this table wins (a blank gauge lets the
#: next stand in, a blank counter does not), and of one metric seen twice (two scrapes in one file) the later
_ONE: dict[str, tuple[str, _Convert]] = {
    "DCGM_FI_DEV_GPU_UTIL": ("busy_pct", to_pct),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("busy_pct", ratio_pct),
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", to_watts),
    "DCGM_FI_DEV_GPU_TEMP": ("temperature_c", number),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("ecc_corrected", to_count),
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": ("ecc_corrected", to_count),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("ecc_uncorrected", to_count),
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": ("ecc_uncorrected", to_count),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("remap_failed", _flag),
    "DCGM_FI_DEV_XID_ERRORS": ("xid", to_count),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": ("throttle_reasons", _mask),
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": ("throttle_reasons", _mask),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("pcie_replays", to_count),
}
_BY_FIELD: dict[str, list[str]] = {}
for _metric, (_field, _) in _ONE.items():
    _BY_FIELD.setdefault(_field, []).append(_metric)
#: metric → the field it adds to: counts of one fault kept by cause or by link type (each metric's last value)
_SUM = {
    "DCGM_FI_DEV_RETIRED_SBE": "retired_pages",
    "DCGM_FI_DEV_RETIRED_DBE": "retired_pages",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "remapped_rows",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "remapped_rows",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": "link_errors",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": "link_errors",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": "link_errors",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": "link_errors",
}
_FB = ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED")


@dataclass
class Series:
    """One device's series in one scrape, as read once: its labels and each metric's last value read."""

    parent_id: str | None
    mig: str  # `` MIG <GPU_I_PROFILE>`` for an instance, else ""
    model_name: str | None = None  # the ``modelName`` label of its last sample with one
    host: str | None = None  # the ``Hostname`` (or ``hostname``) label of its last sample
    pod: tuple[str, str, str] | None = None  # (namespace, pod, container) of its last sample naming a pod
    read_any: bool = False  # a sample of a metric read, not blank, was seen: the device has a neutral sample
    #: metric → its last value read, converted (by this module's tables, or by ``read``'s ``raw``)
    values: dict[str, object] = field(default_factory=dict)
    #: the metrics whose last sample for it was blank, or no reading (NaN, a value no reading can have)
    unread: set[str] = field(default_factory=set)

    @property
    def model(self) -> str | None:
        return None if self.model_name is None else self.model_name + self.mig


def _convert(name: str, value: Decimal, raw: Mapping[str, _Convert]) -> object:
    if name in _ONE:
        return _ONE[name][1](value)
    if name in _FB:
        return to_bytes(value, "MiB")
    return to_count(value) if name in _SUM else raw[name](value)


def read(text: str, out: Parsed, raw: Mapping[str, _Convert] | None = None, strict: bool = False) -> dict[str, Series]:
    """Every device with a ``DCGM_FI_`` series in the scrape, by ``device_of``'s name (one whose series are all blank,
    or not read here, too: a MIG GPU is known as its instances' GPU even then), with the last value of each metric
    mapped here and each ``raw`` one (metric → its conversion). What cannot be read is counted in ``out``; with
    ``strict``, a text that is no Prometheus text at all raises ValueError."""
    found: dict[str, Series] = {}
    raw = raw or {}
    wanted = {*_ONE, *_SUM, *_FB, *raw}

    def labelled(name: str, labels: dict[str, str]) -> None:
        if name.startswith("DCGM_FI_") and labels.get("UUID"):
            device, parent, mig = device_of(labels)
            s = found.setdefault(device, Series(parent, mig))
            s.model_name = labels.get("modelName") or s.model_name
            s.host = labels.get("Hostname") or labels.get("hostname")
            if labels.get("pod") and labels.get("namespace"):
                s.pod = (labels["namespace"], labels["pod"], labels.get("container", ""))
            if name in wanted:
                s.unread.add(name)  # until its value is read: NaN or a non-number never reaches the loop below

    for name, labels, value in series(text, out, wanted, labelled, strict):
        if not labels.get("UUID"):
            out.reject(f"{name}: no UUID label")
            continue
        s = found[device_of(labels)[0]]
        if is_blank(value):
            out.reject(f"{name}: blank (sentinel {value})")
            continue
        s.read_any = True
        got = guarded(out, name, lambda name=name, value=value: _convert(name, value, raw))
        if got is not None:
            s.values[name] = got
            s.unread.discard(name)
    return found


def sample_of(device: str, s: Series) -> DeviceSample:
    """The neutral sample of one device's series (no time: a scrape has none)."""
    row: dict[str, object] = {}
    for name, metrics in _BY_FIELD.items():
        for metric in metrics:
            if metric in s.values:
                row[name] = s.values[metric]
                break
            if metric in s.unread and name in FAULT_FIELDS:
                break  # a blank or unreadable counter: a stand-in would count from another origin
    for metric, value in s.values.items():
        if metric in _SUM:
            row[_SUM[metric]] = row.get(_SUM[metric], 0) + value  # type: ignore[operator]
    for metric in s.unread - s.values.keys():
        if metric in _SUM:  # a sum short of a blank or unreadable part would read as a reset, a false fault
            row[_SUM[metric]] = None
    used, free, reserved = (s.values.get(n) for n in _FB)
    row["mem_used_bytes"] = used
    # the device's memory is what DCGM splits into used, free and reserved (older exporters have no reserved)
    row["mem_total_bytes"] = None if used is None or free is None else used + free + (reserved or 0)  # type: ignore[operator]
    return DeviceSample(vendor=VENDOR, model=s.model, device_id=device, parent_id=s.parent_id, **row)  # type: ignore[arg-type]


def parse(text: str) -> Parsed:
    """One sample per GPU or MIG instance in the scrape (no time: a scrape has none)."""
    out = Parsed()
    out.samples = [sample_of(device, s) for device, s in read(text, out).items() if s.read_any]
    return out
