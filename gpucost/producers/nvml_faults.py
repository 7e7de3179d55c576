"""Device faults read from NVML for the NVML source (docs/sources.md, "Device faults").

The counters are the ones dcgm-exporter reads, through NVML's own field values, one call per physical GPU and
period however many MIG instances it has (``nvmlDeviceGetFieldValues``; each field answers for itself, so a GPU
that lacks one, retired pages on a GPU that remaps rows, leaves that field unreported): ECC counts since the driver
loaded, the lifetime ones only where the volatile ones are not supported; retired pages, remapped rows and NVLink
errors each summed over their causes or links; PCIe replays; whether a row remapping failed. Throttling is the
clocks event mask now. An XID arrives only as an NVML event: the source registers for critical XID events at open
and drains them each period, so a device's ``xid`` is the last one NVML sent since the run began (0: none), for its
GPU instance or its whole GPU (of one period's, a fatal one over a later warning), and its ``xid_events`` how many
of them it has kept (so that the same XID again is a new fault). A MIG instance reports its GPU's counters: NVML
keeps them per GPU.
"""

from __future__ import annotations

import logging
from collections import Counter
from types import ModuleType
from typing import Any

from gpucost.schemas.devices import DeviceSample
from gpucost.schemas.faults import FATAL_XIDS, throttle_names

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
#: ``gpuInstanceId`` of an event NVML attributes to no GPU instance (``NVML_GPU_INSTANCE_ID_ANY``)
_WHOLE_GPU = 0xFFFFFFFF
#: the member of NVML's value union each value type is read from (``NVML_VALUE_TYPE_*``, in order)
_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


class NvmlFaults:
    """The fault fields of each device, a ``DeviceSample`` with only those (and its id) filled. Reading faults never
    stops a sample: an NVML error in it leaves the field unreported, but a GPU fallen off the bus, which the sample
    handles (``NVMLError_GpuIsLost``)."""

    def __init__(self, nvml: ModuleType, counts: Counter[str]) -> None:
        self.nvml, self.counts = nvml, counts
        self._events: Any = None  # the XID event set, where NVML gives one
        #: physical GPU's UUID → per GPU instance (None: the whole GPU) its last XID this run, as (its order, XID, how
        #: many XID events it has had)
        self._xid: dict[str, dict[int | None, tuple[int, int, int]]] = {}
        self._xids_seen = 0
        #: (physical GPU's UUID, GPU instance) whose XID this period is fatal: kept over later warnings, of its own
        #: key or of another key a device also reads
        self._fatal_now: set[tuple[str, int | None]] = set()
        self._period: dict[str, dict[str, Any]] = {}  # physical GPU's UUID → its fault fields read this period
        self._warned: set[str] = set()

    def open(self, physical: dict[str, Any]) -> None:
        """Register for critical XID events on each physical GPU (UUID → handle); one that cannot is counted, and
        its devices report no ``xid``."""
        nv = self.nvml
        try:
            if not hasattr(nv, "nvmlEventSetWait_v2"):
                raise AttributeError("this pynvml has no nvmlEventSetWait_v2")
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
                self._xid[uuid] = {None: (0, 0, 0)}

    def begin(self) -> None:
        """A new period: take the XID events NVML has queued since the last, without waiting, and forget the fault
        fields read (each physical GPU's are read once a period, however many MIG instances it has). Of several
        XIDs of one GPU (or GPU instance) in a period, a fatal one is kept over a warning. An XID NVML attributes to
        a MIG GPU instance is that instance's; any other, the whole GPU's."""
        self._period.clear()
        fatal_now = self._fatal_now
        fatal_now.clear()
        nv = self.nvml
        while self._events is not None:
            try:
                data = nv.nvmlEventSetWait_v2(self._events, 0)
                uuid = nv.nvmlDeviceGetUUID(data.device)
            except nv.NVMLError_Timeout:
                return
            except nv.NVMLError as exc:
                self._failed("xid_events_failed", f"XID events could not be read ({exc})")
                return
            uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
            xid, instance = int(data.eventData), int(getattr(data, "gpuInstanceId", _WHOLE_GPU))
            key = (uuid, None if instance == _WHOLE_GPU else instance)
            if uuid not in self._xid:
                self.counts["xid_event_unknown_gpu"] += 1
            elif key not in fatal_now:
                self._xids_seen += 1
                had = self._xid[uuid].get(key[1], (0, 0, 0))[2]
                self._xid[uuid][key[1]] = (self._xids_seen, xid, had + 1)
                if xid in FATAL_XIDS:
                    fatal_now.add(key)

    def read(self, device_id: str, handle: Any, physical_uuid: str, gpu_instance: int | None = None) -> DeviceSample:
        """The fault fields of the device ``device_id`` whose physical GPU is ``handle``: a MIG instance's
        ``gpu_instance`` has the XIDs of its GPU instance and of the whole GPU (one whose instance is not known, every
        XID of its GPU)."""
        fields = self._period.get(physical_uuid)
        if fields is None:
            fields = self._period[physical_uuid] = self._read(handle)
        seen = self._xid.get(physical_uuid)
        if seen is None:
            return DeviceSample(vendor="NVIDIA", model=None, device_id=device_id, **fields)
        mine = [k for k in seen if gpu_instance is None or k in (None, gpu_instance)]
        fatal = [seen[k] for k in mine if (physical_uuid, k) in self._fatal_now]
        xid = max(fatal or [seen[k] for k in mine])[1]  # this period's fatal XID over a later warning of another key
        events = sum(seen[k][2] for k in mine)
        return DeviceSample(vendor="NVIDIA", model=None, device_id=device_id, xid=xid, xid_events=events, **fields)

    def _read(self, handle: Any) -> dict[str, Any]:
        values, failed = self._values(handle)
        fields: dict[str, Any] = {}
        for field, names in _FIRST.items():  # the first the GPU supports; unread where it failed this time
            supported = [n for n in names if n in values or n in failed]
            fields[field] = values.get(supported[0]) if supported else None
        if fields["remap_failed"] is not None:
            fields["remap_failed"] = fields["remap_failed"] != 0
        for field, names in _SUMS.items():  # unread where a part failed this time: a sum short of it is no reset
            found = [values[n] for n in names if n in values]
            fields[field] = sum(found) if found and not failed.intersection(names) else None
        fields["throttle_reasons"] = self._clocks(handle)
        return fields

    def _clocks(self, handle: Any) -> tuple[str, ...] | None:
        nv = self.nvml
        try:
            try:
                mask = nv.nvmlDeviceGetCurrentClocksEventReasons(handle)
            except (AttributeError, nv.NVMLError_FunctionNotFound):  # a pynvml or a driver from before the rename
                mask = nv.nvmlDeviceGetCurrentClocksThrottleReasons(handle)
        except nv.NVMLError_GpuIsLost:
            raise
        except nv.NVMLError_NotSupported:
            return None
        except nv.NVMLError as exc:
            self._failed("clocks_failed", f"clocks event reasons could not be read ({exc})")
            return None
        return throttle_names(int(mask))

    def _values(self, handle: Any) -> tuple[dict[str, int], set[str]]:
        """The field values of ``_NAMES`` read, by name, and the names whose read failed other than as not
        supported (none where the call itself fails: every field is then unread)."""
        nv = self.nvml
        try:
            got = nv.nvmlDeviceGetFieldValues(handle, [getattr(nv, n) for n in _NAMES])
        except nv.NVMLError_GpuIsLost:
            raise
        except (nv.NVMLError, AttributeError) as exc:
            self._failed("fault_fields_unavailable", f"no NVML field values ({exc})")
            return {}, set()
        out: dict[str, int] = {}
        failed: set[str] = set()
        for name, value in zip(_NAMES, got):
            if value.nvmlReturn == nv.NVML_ERROR_NOT_SUPPORTED:
                continue
            count = None
            if value.nvmlReturn == nv.NVML_SUCCESS and 0 <= value.valueType < len(_MEMBERS):
                try:
                    count = int(getattr(value.value, _MEMBERS[value.valueType]))
                except (ValueError, OverflowError):  # a NaN or an infinity where a double is given
                    count = None
            if count is None or count < 0:  # an error, or a misread: unread this time, never a fault
                failed.add(name)
            else:
                out[name] = count
        return out, failed

    def _failed(self, reason: str, message: str) -> None:
        """Counted each time, logged once a run."""
        self.counts[reason] += 1
        if reason not in self._warned:
            self._warned.add(reason)
            log.warning("%s", message)

    def close(self) -> None:
        if self._events is not None:
            events, self._events = self._events, None
            try:
                self.nvml.nvmlEventSetFree(events)
            except self.nvml.NVMLError as exc:
                log.warning("the XID event set could not be freed (%s)", exc)
