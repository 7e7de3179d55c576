"""Live mode through a vendor's own Python library, where it is installed: AMD's ``amdsmi``, Intel Gaudi's ``pyhlml``.

Why beside the tools: ``amd-smi`` is itself a Python program that takes about a second to start, too slow to run
every period; a library is opened once and read each period, as NVML is. Each reader gives the neutral samples
(``DeviceSample``) a capture's parser gives, so a library's readings are billed by the same rules
(``events.to_events``) as the tool's output.

What is read, and its units, is the libraries' own documentation and source (ROCm/amdsmi ``amdsmi_interface.py``
and ``amdsmi.h``; HabanaAI ``habana-pyhlml``): no capture of a library's answers exists to test against, so the
tests run these readers on stand-in modules written from that documentation (tests/support/vendor_libraries.py).
A value a library reports as unavailable (amdsmi's ``"N/A"``, an exception for an unsupported query) is None,
"not reported", never 0; a call that fails is counted by its name and the device is still read.
"""

from __future__ import annotations

import contextlib
import importlib
import math
from collections import defaultdict
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from gpucost.producers.accelerators import amd_smi, gaudi
from gpucost.producers.accelerators.capture import guarded, is_missing
from gpucost.schemas.devices import DeviceSample, Parsed, ProcessUsage, to_bytes, to_count, to_pct, to_watts

__all__ = ["LIBRARIES", "AmdSmi", "Hlml", "LibraryUnavailable"]


class LibraryUnavailable(Exception):
    """The library is not installed or cannot start; the message says which and why."""


def _text(value: Any) -> str | None:
    """A library's string (``bytes`` from ctypes, or ``str``), None where it is none or missing (``is_missing``:
    blank, amdsmi's ``"N/A"``)."""
    if value is None:
        return None
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    text = text.strip().strip("\x00")
    return None if is_missing(text) else text


def _known(value: Any) -> Any:
    """``value``, or None where the library has none: None, a missing text (``is_missing``), a NaN."""
    if value is None or (isinstance(value, str) and is_missing(value)):
        return None
    return None if isinstance(value, float) and math.isnan(value) else value


def _celsius(value: Any) -> Decimal:
    """A temperature in °C, within what a device's sensor reads (-60 to 200 °C, the events' bounds): a reading
    outside is a misread, not reported, so that it never costs its device's sample."""
    celsius = Decimal(int(value))
    if not -60 <= celsius <= 200:
        raise ValueError(f"temperature {value} °C is outside -60 to 200 °C")
    return celsius


def _as(out: Parsed, what: str, value: Any, convert: Callable[[Any], Any]) -> Any:
    """``convert(value)``; None where the library has no value, or (counted under ``what``) one out of bounds."""
    return None if _known(value) is None else guarded(out, what, lambda: convert(value))


class _Reader:
    """A library opened once (``open``), read each period (``read``), closed at the end (``close``)."""

    name = "library"
    module = ""

    def __init__(self, lib: Any = None) -> None:
        self.lib = lib

    def open(self) -> None:
        if self.lib is None:
            try:
                self.lib = importlib.import_module(self.module)
            except ImportError as exc:
                why = f"{self.name}: the Python module {self.module!r} is not installed ({exc})"
                raise LibraryUnavailable(why) from None
        try:
            self._start()
        except Exception as exc:  # noqa: BLE001 (each library raises its own class, or ctypes' errors)
            raise LibraryUnavailable(f"{self.name}: cannot start ({type(exc).__name__}: {exc})") from None

    def _start(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        with contextlib.suppress(Exception):  # closing a library that failed is nothing to report
            self._stop()

    def _stop(self) -> None:
        raise NotImplementedError

    def _call(self, out: Parsed, what: str, call: Callable[[], Any]) -> Any:
        """``call()``, or None counted under ``what`` where the library refuses it (unsupported, a lost device)."""
        try:
            return call()
        except Exception as exc:  # noqa: BLE001 (the library's own exception classes)
            out.reject(f"{self.name}: {what} failed ({type(exc).__name__})")
            return None

    def read(self) -> Parsed:
        out = Parsed()
        try:
            self._read(out)
        except Exception as exc:  # noqa: BLE001 (a library that fails as a whole this period: counted, never fatal)
            out.reject(f"{self.name}: cannot list its devices ({type(exc).__name__})")
        return out

    def _read(self, out: Parsed) -> None:
        raise NotImplementedError


class AmdSmi(_Reader):
    """AMD GPUs through ``amdsmi``. A processor handle is a GPU, or in a compute partition mode (CPX, DPX…) one
    partition; the partitions of one GPU share its ``asic_serial``: they become partitions under it, the GPU's
    row alone carrying its power, memory and temperature (read from its first partition, which the library
    repeats on each), each partition its own busy and processes."""

    name, module = "amdsmi", "amdsmi"

    def _start(self) -> None:
        self.lib.amdsmi_init(self.lib.AmdSmiInitFlags.INIT_AMD_GPUS)

    def _stop(self) -> None:
        self.lib.amdsmi_shut_down()

    def _read(self, out: Parsed) -> None:
        lib = self.lib
        by_serial: dict[str, list[tuple[str, Any, dict[str, Any]]]] = defaultdict(list)
        for h in lib.amdsmi_get_processor_handles():
            bdf = _text(self._call(out, "amdsmi_get_gpu_device_bdf", lambda h=h: lib.amdsmi_get_gpu_device_bdf(h)))
            if bdf is None:
                continue  # a device with no bus address cannot be named from one period to the next
            asic = self._call(out, "amdsmi_get_gpu_asic_info", lambda h=h: lib.amdsmi_get_gpu_asic_info(h)) or {}
            serial = _text(asic.get("asic_serial", "")) or bdf
            by_serial[serial].append((bdf, h, asic))
        for serial, handles in sorted(by_serial.items()):
            handles.sort(key=lambda t: t[0])
            model = _text(handles[0][2].get("market_name", ""))
            whole = self._whole(out, handles[0][1])
            if len(handles) == 1:
                out.samples.append(
                    DeviceSample(amd_smi.VENDOR, model, handles[0][0], **whole, **self._own(out, handles[0][1]))
                )
                continue
            out.samples.append(DeviceSample(amd_smi.VENDOR, model, serial, **whole))
            for bdf, h, _ in handles:
                out.samples.append(DeviceSample(amd_smi.VENDOR, model, bdf, parent_id=serial, **self._own(out, h)))

    def _own(self, out: Parsed, h: Any) -> dict[str, Any]:
        """What a GPU or a partition reports of itself: busy, processes."""
        lib = self.lib
        activity = self._call(out, "amdsmi_get_gpu_activity", lambda: lib.amdsmi_get_gpu_activity(h)) or {}
        listed = self._call(out, "amdsmi_get_gpu_process_list", lambda: lib.amdsmi_get_gpu_process_list(h))
        procs = []
        for p in listed or []:
            info = (  # ROCm 6.1 lists handles, each read with amdsmi_get_gpu_process_info
                p
                if isinstance(p, dict)
                else self._call(out, "amdsmi_get_gpu_process_info", lambda p=p: lib.amdsmi_get_gpu_process_info(h, p))
            )
            pid = _as(out, "amdsmi process pid", (info or {}).get("pid"), to_count)
            if pid is None:
                continue
            vram = (info.get("memory_usage") or {}).get("vram_mem", info.get("mem"))  # bytes
            procs.append(ProcessUsage(pid, _as(out, "amdsmi process memory", vram, lambda v: to_bytes(v, "B")), None))
        return {
            "busy_pct": _as(out, "amdsmi gfx_activity", activity.get("gfx_activity"), to_pct),
            "processes": None if listed is None else tuple(procs),
        }

    def _whole(self, out: Parsed, h: Any) -> dict[str, Any]:
        """What the whole GPU reports (each partition repeating it): power, memory, temperature, ECC counts."""
        lib = self.lib
        power = self._call(out, "amdsmi_get_power_info", lambda: lib.amdsmi_get_power_info(h)) or {}
        powers = (_known(power.get(k)) for k in ("current_socket_power", "socket_power", "average_socket_power"))
        vram = self._call(out, "amdsmi_get_gpu_vram_usage", lambda: lib.amdsmi_get_gpu_vram_usage(h)) or {}
        hotspot, current = lib.AmdSmiTemperatureType.HOTSPOT, lib.AmdSmiTemperatureMetric.CURRENT
        temp = self._call(out, "amdsmi_get_temp_metric", lambda: lib.amdsmi_get_temp_metric(h, hotspot, current))
        ecc = self._call(out, "amdsmi_get_gpu_total_ecc_count", lambda: lib.amdsmi_get_gpu_total_ecc_count(h)) or {}

        def mib(value: Any) -> int:  # amdsmi_vram_usage_t is in MB, the library dividing bytes by 1024 × 1024
            return to_bytes(value, "MiB")

        return {
            "power_w": _as(out, "amdsmi power", next((v for v in powers if v is not None), None), to_watts),
            "mem_total_bytes": _as(out, "amdsmi vram_total", vram.get("vram_total"), mib),
            "mem_used_bytes": _as(out, "amdsmi vram_used", vram.get("vram_used"), mib),
            "temperature_c": _as(out, "amdsmi temperature", temp, _celsius),
            "ecc_corrected": _as(out, "amdsmi ecc", ecc.get("correctable_count"), to_count),
            "ecc_uncorrected": _as(out, "amdsmi ecc", ecc.get("uncorrectable_count"), to_count),
        }


class Hlml(_Reader):
    """Intel Gaudi through ``pyhlml`` (the ``habana-pyhlml`` package, over the driver's ``libhlml.so``): each device
    by its PCI bus id, as ``hl-smi`` names it. HLML lists no processes: a device's busy time is ``unattributed``."""

    name, module = "hlml", "pyhlml"

    def _start(self) -> None:
        self.lib.hlmlInit()

    def _stop(self) -> None:
        self.lib.hlmlShutdown()

    def _read(self, out: Parsed) -> None:
        lib = self.lib
        for i in range(int(lib.hlmlDeviceGetCount())):
            h = self._call(out, "hlmlDeviceGetHandleByIndex", lambda i=i: lib.hlmlDeviceGetHandleByIndex(i))
            pci = (
                None if h is None else self._call(out, "hlmlDeviceGetPCIInfo", lambda h=h: lib.hlmlDeviceGetPCIInfo(h))
            )
            bus_id = None if pci is None else _text(pci.bus_id)
            if bus_id is None:
                continue
            name = _text(self._call(out, "hlmlDeviceGetName", lambda h=h: lib.hlmlDeviceGetName(h)) or "")
            util = self._call(out, "hlmlDeviceGetUtilizationRates", lambda h=h: lib.hlmlDeviceGetUtilizationRates(h))
            aip = getattr(util, "aip", util)  # an int up to 1.18, a struct with .aip from 1.19
            mw = self._call(out, "hlmlDeviceGetPowerUsage", lambda h=h: lib.hlmlDeviceGetPowerUsage(h))
            mem = self._call(out, "hlmlDeviceGetMemoryInfo", lambda h=h: lib.hlmlDeviceGetMemoryInfo(h))
            temp = self._call(out, "hlmlDeviceGetTemperature", lambda h=h: lib.hlmlDeviceGetTemperature(h, 0))  # ON_AIP
            ecc = self._call(  # uncorrected (1), volatile (0): since the driver loaded, as the other sources count
                out, "hlmlDeviceGetTotalECCErrors", lambda h=h: lib.hlmlDeviceGetTotalECCErrors(h, 1, 0)
            )
            out.samples.append(
                DeviceSample(
                    gaudi.VENDOR,
                    name,
                    bus_id,
                    busy_pct=_as(out, "hlml aip", aip, to_pct),
                    power_w=_as(out, "hlml power", mw, lambda v: to_watts(v, "mW")),
                    mem_total_bytes=_as(out, "hlml memory", getattr(mem, "total", None), lambda v: to_bytes(v, "B")),
                    mem_used_bytes=_as(out, "hlml memory", getattr(mem, "used", None), lambda v: to_bytes(v, "B")),
                    temperature_c=_as(out, "hlml temperature", temp, _celsius),
                    ecc_uncorrected=_as(out, "hlml ecc", ecc, to_count),
                )
            )


#: the libraries ``--device-tool`` may name, by the name it takes
LIBRARIES: dict[str, type[_Reader]] = {"amdsmi": AmdSmi, "hlml": Hlml}
