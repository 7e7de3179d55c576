"""Device faults: which of a sample's fault fields fail a device's audit window and which only warn.

One place decides, for every vendor, so neither the producer nor the health audit branches on one: the
producer (``gpucost devices --events``) passes each sample of a device and the device's previous sample in
the capture (``before``), and writes what ``counts`` gives as the ``gpu_sample`` event's ``fault_fatal`` and
``fault_warning``; the health audit sums those per window. The classification is done where the raw counters
are, once: the event carries two small counts, not ten counters, and the pipeline keeps no counters per
device between windows. The counters are cumulative as the tools report them, so a fault is new when
its counter rose (a counter that fell was reset — a driver reload — and its whole value is new); the
XID is the last code the driver logged, new when it differs from ``before``'s or when more XID events
have come since (``xid_events``, where the source counts them: a repeat of one XID); a clock slowdown is
a state, reported in every sample that shows it. Without ``before`` everything the sample
reports counts as new: a device's first sample in a capture has nothing to compare.

Fatal (the window fails, the breaker acts): an uncorrectable ECC error, a failed row remapping, a
hardware error of a Neuron execution, a fatal XID (``FATAL_XIDS``). Warnings: corrected ECC errors,
retired pages, remapped rows, link errors, PCIe replays, any other XID, and a clock slowdown that
hardware or heat imposed (``SLOWDOWNS``); an idle GPU or an application clock setting is no fault.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gpucost.schemas.devices import FAULT_FIELDS, DeviceSample, UnitError

__all__ = ["Fault", "FATAL_XIDS", "SLOWDOWNS", "THROTTLE_BITS", "throttle_names", "faults", "is_fatal", "counts"]

#: NVML's clocks event (formerly throttle) reasons, bit → name, as ``nvmlClocksEventReasons`` documents
#: them (docs.nvidia.com/deploy/nvml-api/group__nvmlClocksEventReasons.html); DCGM's
#: ``DCGM_FI_DEV_CLOCK_THROTTLE_REASONS`` / ``CLOCKS_EVENT_REASONS`` is this mask
THROTTLE_BITS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
#: the reasons that mean the device ran slower than asked for a cause outside the workload's control;
#: "throttled" is amd-smi's ``THROTTLE_STATUS: THROTTLED``, which names no cause
SLOWDOWNS = frozenset(
    {"hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "throttled"}
)
#: XIDs that fail the window: the device needs a reset or service, or memory was corrupted beyond
#: correction (docs/sources.md, "Device faults", gives the source of each)
FATAL_XIDS = frozenset({46, 48, 62, 64, 79, 94, 95, 119, 120, 140, 154})
_MAX_MASK = (1 << 64) - 1


def throttle_names(mask: int) -> tuple[str, ...]:
    """The reasons set in an NVML clocks event mask, lowest bit first; a bit NVML does not document is
    kept as ``bit<N>`` rather than dropped. () is "not throttled"."""
    if isinstance(mask, bool) or not isinstance(mask, int) or not 0 <= mask <= _MAX_MASK:
        raise UnitError(f"throttle reasons {mask!r} is not a 64-bit mask")
    return tuple(THROTTLE_BITS.get(1 << n, f"bit{n}") for n in range(mask.bit_length()) if mask >> n & 1)


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault of one device in one window: the fault field, how bad, and what was seen."""

    field: str
    severity: Literal["fatal", "warning"]
    detail: str


def _rise(now: int | None, then: int | None) -> int:
    """How much a cumulative counter rose since ``then``; all of it after a reset or with nothing before."""
    if now is None:
        return 0
    return now if then is None or now < then else now - then


_FATAL_COUNTERS = ("ecc_uncorrected", "hardware_errors")
_WARNING_COUNTERS = ("ecc_corrected", "retired_pages", "remapped_rows", "link_errors", "pcie_replays")


def faults(sample: DeviceSample, before: DeviceSample | None = None) -> tuple[Fault, ...]:
    """The faults ``sample`` shows that ``before`` (the same device, earlier) did not; fatal ones first."""
    found: list[Fault] = []
    for name in _FATAL_COUNTERS + _WARNING_COUNTERS:
        rise = _rise(getattr(sample, name), None if before is None else getattr(before, name))
        if rise:
            found.append(Fault(name, "fatal" if name in _FATAL_COUNTERS else "warning", f"+{rise}"))
    if sample.remap_failed and not (before is not None and before.remap_failed):
        found.append(Fault("remap_failed", "fatal", "row remapping failed"))
    if sample.xid and (before is None or before.xid != sample.xid or _rise(sample.xid_events, before.xid_events)):
        found.append(Fault("xid", "fatal" if sample.xid in FATAL_XIDS else "warning", f"XID {sample.xid}"))
    slow = sorted(SLOWDOWNS & set(sample.throttle_reasons or ()))
    if slow:
        found.append(Fault("throttle_reasons", "warning", ",".join(slow)))
    return tuple(sorted(found, key=lambda f: f.severity != "fatal"))


def is_fatal(sample: DeviceSample, before: DeviceSample | None = None) -> bool:
    """Whether a fault new since ``before`` fails the device's audit window."""
    return any(f.severity == "fatal" for f in faults(sample, before))


def counts(sample: DeviceSample, before: DeviceSample | None = None) -> tuple[int, int] | None:
    """How many of the faults new since ``before`` are fatal and how many warnings: the ``fault_fatal`` and
    ``fault_warning`` of the sample's ``gpu_sample`` event. None when ``sample`` reports no fault field at all
    (not reported, which is not "no faults": that is (0, 0))."""
    if all(getattr(sample, name) is None for name in FAULT_FIELDS):
        return None
    found = faults(sample, before)
    fatal = sum(f.severity == "fatal" for f in found)
    return fatal, len(found) - fatal
