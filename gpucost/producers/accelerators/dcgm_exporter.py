"""NVIDIA dcgm-exporter ``/metrics`` scrape as neutral samples, faults included.

The billing path reads the same scrape into events (``gpucost.producers.dcgm``) and takes each
device's faults from this reading, which is also the one ``gpucost devices`` prints. Devices are
named as there (``device_of``: the ``UUID``, a MIG instance ``UUID/GI-<id>`` under its GPU), and
values the exporter writes as huge sentinels (its "blank") are counted, never read.

Counters are cumulative as DCGM keeps them: ECC counts are the volatile ones (since the driver
loaded) where the scrape has them, else the aggregate (lifetime) ones; retired pages add the
single- and double-bit causes, remapped rows the correctable and uncorrectable ones, link errors
the four NVLink error totals. The XID is DCGM's last XID value, and the clocks event mask is decoded
into NVML's names (``gpucost.schemas.faults.throttle_names``).
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal

from gpucost.producers.accelerators.capture import guarded
from gpucost.producers.accelerators.prometheus import series
from gpucost.schemas.devices import DeviceSample, Parsed, number, to_bytes, to_count, to_pct, to_watts
from gpucost.schemas.faults import throttle_names

__all__ = ["SENTINEL_MIN", "device_of", "parse"]

VENDOR = "NVIDIA"
SENTINEL_MIN = 2**62  # dcgm-exporter's "blank" values, e.g. 9223372036854775794
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


#: metric → (field, conversion); of two metrics for one field the earlier in this table wins, and of one
#: metric seen twice (two scrapes in one file) the later, as on the billing path
_ONE: dict[str, tuple[str, _Convert]] = {
    "DCGM_FI_DEV_GPU_UTIL": ("busy_pct", to_pct),
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
_RANK = {name: rank for rank, name in enumerate(_ONE)}
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


def parse(text: str) -> Parsed:
    """One sample per GPU or MIG instance in the scrape (no time: a scrape has none)."""
    out = Parsed()
    rows: dict[str, dict[str, object]] = {}
    ranks: dict[tuple[str, str], int] = {}
    last: dict[str, dict[str, int]] = {}  # device → metric → its last value (bytes for memory, else a count)
    blank: dict[tuple[str, str], int] = {}  # (device, field) → the best rank of a metric of it that was blank
    for name, labels, value in series(text, out, {*_ONE, *_SUM, *_FB}):
        if not labels.get("UUID"):
            out.reject(f"{name}: no UUID label")
            continue
        device, parent, mig = device_of(labels)
        if value >= SENTINEL_MIN:
            out.reject(f"{name}: blank (sentinel {value})")
            if name in _ONE:  # the field is unread this scrape: a metric after it in _ONE never stands in
                blank[device, _ONE[name][0]] = min(_RANK[name], blank.get((device, _ONE[name][0]), len(_RANK)))
            continue
        model = labels.get("modelName")
        row = rows.setdefault(device, {"model": None if model is None else model + mig, "parent_id": parent})
        if name in _FB or name in _SUM:
            unit = "MiB" if name in _FB else None
            got = guarded(out, name, lambda unit=unit, value=value: to_bytes(value, unit) if unit else to_count(value))
            if got is not None:
                last.setdefault(device, {})[name] = got
        elif _RANK[name] <= ranks.get((device, _ONE[name][0]), len(_RANK)):
            field, convert = _ONE[name]
            got = guarded(out, name, lambda convert=convert, value=value: convert(value))
            if got is not None:
                row[field], ranks[device, field] = got, _RANK[name]
    for (device, field), rank in blank.items():
        if device in rows and ranks.get((device, field), len(_RANK)) > rank:
            rows[device].pop(field, None)  # e.g. the lifetime ECC count, where the volatile one was blank
    for device, row in rows.items():
        used, free, reserved = (last.get(device, {}).get(n) for n in _FB)
        totals: dict[str, int] = {}
        for name, count in last.get(device, {}).items():
            if name in _SUM:
                totals[_SUM[name]] = totals.get(_SUM[name], 0) + count
        row.update(totals)
        row["mem_used_bytes"] = used
        # the device's memory is what DCGM splits into used, free and reserved (older exporters have no reserved)
        row["mem_total_bytes"] = None if used is None or free is None else used + free + (reserved or 0)
        out.samples.append(DeviceSample(vendor=VENDOR, device_id=device, **row))  # type: ignore[arg-type]
    return out
