"""Device faults read from NVML for the NVML source (docs/sources.md, "Device faults").

The counters are the ones dcgm-exporter reads, through NVML's own field values, one call per device and period
(``nvmlDeviceGetFieldValues``; each field answers for itself, so a GPU that lacks one, retired pages on a GPU that
remaps rows, leaves that field unreported): ECC counts since the driver loaded, the lifetime ones only where the
volatile ones are not supported; retired pages, remapped rows and NVLink errors each summed over their causes or
links; PCIe replays; whether a row remapping failed. Throttling is the clocks event mask now. An XID arrives only as
an NVML event: the source registers for critical XID events at open and drains them each period, so a device's
``xid`` is the last one NVML sent since the run began (0: none), on every device of that physical GPU. A MIG
instance reports its GPU's faults: NVML keeps them per GPU.
"""

from __future__ import annotations

import logging
from collections import Counter
from types import ModuleType
from typing import Any

from gpucost.schemas.devices import DeviceSample
from gpucost.schemas.faults import throttle_names

__all__ = ["NvmlFaults"]

log = logging.getLogger("gpucost.nvml")

#: fault field → the NVML field values it is read from, the first one the GPU supports (volatile before lifetime)
_FIRST = {
    "ecc_corrected": ("NVML_FI_DEV_ECC_SBE_VOL_TOTAL", "NVML_FI_DEV_ECC_SBE_AGG_TOTAL"),
    "ecc_uncorrected": ("NVML_FI_DEV_ECC_DBE_VOL_TOTAL", "NVML_FI_DEV_ECC_DBE_AGG_TOTAL"),
    "pcie_replays": ("NVML_FI_DEV_PCIE_REPLAY_COUNTER",),
    "remap_failed": ("NVML_FI_DEV_REMAPPED_FAILURE",),
}
#: fault field → the NVML field values it sums, those the GPU supports (None where it supports none)
_SUMS = {
    "retired_pages": ("NVML_FI_DEV_RETIRED_SBE", "NVML_FI_DEV_RETIRED_DBE"),
    "remapped_rows": ("NVML_FI_DEV_REMAPPED_COR", "NVML_FI_DEV_REMAPPED_UNC"),
    "link_errors": tuple(
        f"NVML_FI_DEV_NVLINK_{kind}_ERROR_COUNT_TOTAL" for kind in ("CRC_FLIT", "CRC_DATA", "REPLAY", "RECOVERY")
    ),
}
_NAMES = tuple(dict.fromkeys(n for names in (*_FIRST.values(), *_SUMS.values()) for n in names))
#: the member of NVML's value union each value type is read from (``NVML_VALUE_TYPE_*``, in order)
_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


class NvmlFaults:
    """The fault fields of each device, a ``DeviceSample`` with only those (and its id) filled."""

    def __init__(self, nvml: ModuleType, counts: Counter[str]) -> None:
        self.nvml, self.counts = nvml, counts
        self._events: Any = None  # the XID event set, where NVML gives one
        self._xid: dict[str, int] = {}  # physical GPU's UUID → its last XID this run

    def open(self, physical: dict[str, Any]) -> None:
        """Register for critical XID events on each physical GPU (UUID → handle); one that cannot is counted, and
        its devices report no ``xid``."""
        nv = self.nvml
        try:
            self._events = nv.nvmlEventSetCreate()
        except (nv.NVMLError, AttributeError) as exc:
            self.counts["xid_events_unavailable"] += 1
            log.warning("NVML gives no XID events (%s): XIDs are not reported", exc)
            return
        for uuid, handle in physical.items():
            try:
                nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError, self._events)
            except nv.NVMLError as exc:
                self.counts["xid_events_unavailable"] += 1
                log.warning("%s: no XID events (%s)", uuid, exc)
            else:
                self._xid[uuid] = 0

    def drain(self) -> None:
        """Take the XID events NVML has queued since the last drain, without waiting."""
        nv = self.nvml
        while self._events is not None:
            try:
                data = nv.nvmlEventSetWait_v2(self._events, 0)
            except nv.NVMLError_Timeout:
                return
            except nv.NVMLError as exc:
                self.counts["xid_events_failed"] += 1
                log.warning("XID events could not be read (%s)", exc)
                return
            try:
                uuid = nv.nvmlDeviceGetUUID(data.device)
            except nv.NVMLError:
                self.counts["xid_events_failed"] += 1
                continue
            uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
            if uuid in self._xid:
                self._xid[uuid] = int(data.eventData)

    def read(self, device_id: str, handle: Any, physical_uuid: str) -> DeviceSample:
        """The fault fields of the device ``device_id`` whose physical GPU is ``handle``."""
        nv = self.nvml
        values = self._values(handle)
        fields: dict[str, Any] = {}
        for field, names in _FIRST.items():
            fields[field] = next((values[n] for n in names if n in values), None)
        if fields["remap_failed"] is not None:
            fields["remap_failed"] = fields["remap_failed"] != 0
        for field, names in _SUMS.items():
            found = [values[n] for n in names if n in values]
            fields[field] = sum(found) if found else None
        try:
            mask = nv.nvmlDeviceGetCurrentClocksEventReasons(handle)
        except AttributeError:  # a pynvml from before the rename
            mask = nv.nvmlDeviceGetCurrentClocksThrottleReasons(handle)
        except nv.NVMLError_NotSupported:
            mask = None
        fields["throttle_reasons"] = None if mask is None else throttle_names(int(mask))
        fields["xid"] = self._xid.get(physical_uuid)
        return DeviceSample(vendor="NVIDIA", model=None, device_id=device_id, **fields)

    def _values(self, handle: Any) -> dict[str, int]:
        """The supported field values of ``_NAMES``, by name (none where the call itself fails)."""
        nv = self.nvml
        try:
            got = nv.nvmlDeviceGetFieldValues(handle, [getattr(nv, n) for n in _NAMES])
        except (nv.NVMLError, AttributeError) as exc:
            self.counts["fault_fields_unavailable"] += 1
            log.debug("no NVML field values (%s)", exc)
            return {}
        out = {}
        for name, value in zip(_NAMES, got):
            if value.nvmlReturn != nv.NVML_SUCCESS or not 0 <= value.valueType < len(_MEMBERS):
                continue
            try:
                count = int(getattr(value.value, _MEMBERS[value.valueType]))
            except (ValueError, OverflowError):  # a NaN or an infinity where a double is given
                continue
            if count >= 0:  # a negative count is a misread: unreported, never a fault
                out[name] = count
        return out

    def close(self) -> None:
        if self._events is not None:
            self.nvml.nvmlEventSetFree(self._events)
            self._events = None
