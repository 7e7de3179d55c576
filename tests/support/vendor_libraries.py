"""Stand-ins for the vendor libraries ``--device-tool amdsmi`` and ``hlml`` read, written from their documentation and
source (no capture of a library's answers exists), for tests/test_vendor_libraries.py:

- ``amdsmi`` (ROCm/amdsmi ``py-interface/amdsmi_interface.py``, ``include/amd_smi/amdsmi.h``): processor handles, a
  dict per query, ``"N/A"`` for a value the GPU does not report, ``amdsmi_vram_usage_t`` in MB (bytes ÷ 1024²),
  power in W, temperature in °C, a process's ``mem`` and ``memory_usage.vram_mem`` in bytes, an unsupported query
  raising ``AmdSmiLibraryException``.
- ``pyhlml`` (``habana-pyhlml`` 1.24): ``hlmlDeviceGet…`` over handles by index, ``bytes`` strings, a PCI info struct
  with ``bus_id``, utilisation an int up to 1.18 and a struct with ``.aip`` from 1.19, power in mW, memory in bytes.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any

__all__ = ["AmdGpu", "GaudiDevice", "amdsmi_module", "pyhlml_module"]


class AmdSmiLibraryException(Exception):  # noqa: N818 (amdsmi's own name)
    def __init__(self, err_code: int) -> None:
        super().__init__(f"Error code: {err_code}")
        self.err_code = err_code


@dataclass
class AmdGpu:
    """One processor handle's answers (a GPU, or one partition of it under the same ``serial``)."""

    bdf: str
    serial: str = "0x1234567890ABCDEF"
    market_name: str = "AMD Instinct MI300X"
    gfx_activity: Any = 0
    power: dict[str, Any] = field(default_factory=lambda: {"current_socket_power": 300, "average_socket_power": "N/A"})
    vram_mb: tuple[Any, Any] = (196_592, 1_024)  # total, used
    temp_c: Any = 40
    ecc: tuple[int, int] = (0, 0)
    processes: list[dict[str, Any]] = field(default_factory=list)
    unsupported: set[str] = field(default_factory=set)  # queries that raise AmdSmiLibraryException


def amdsmi_module(gpus: list[AmdGpu]) -> types.ModuleType:
    """A module answering as ``amdsmi`` does for ``gpus`` (change the list, or its GPUs, between reads)."""
    m = types.ModuleType("amdsmi")
    m.calls = []  # type: ignore[attr-defined]
    m.AmdSmiLibraryException = AmdSmiLibraryException  # type: ignore[attr-defined]
    m.AmdSmiInitFlags = types.SimpleNamespace(INIT_AMD_GPUS=2)  # type: ignore[attr-defined]
    m.AmdSmiTemperatureType = types.SimpleNamespace(EDGE=0, HOTSPOT=1)  # type: ignore[attr-defined]
    m.AmdSmiTemperatureMetric = types.SimpleNamespace(CURRENT=0)  # type: ignore[attr-defined]

    def query(name: str, answer: Any) -> Any:
        def call(h: AmdGpu, *args: Any) -> Any:
            m.calls.append(name)  # type: ignore[attr-defined]
            if name in h.unsupported:
                raise AmdSmiLibraryException(2)  # AMDSMI_STATUS_NOT_SUPPORTED
            return answer(h, *args)

        return call

    m.amdsmi_init = lambda flag: m.calls.append("amdsmi_init")  # type: ignore[attr-defined]
    m.amdsmi_shut_down = lambda: m.calls.append("amdsmi_shut_down")  # type: ignore[attr-defined]
    m.amdsmi_get_processor_handles = lambda: list(gpus)  # type: ignore[attr-defined]
    m.amdsmi_get_gpu_device_bdf = query("bdf", lambda h: h.bdf)  # type: ignore[attr-defined]
    m.amdsmi_get_gpu_asic_info = query(  # type: ignore[attr-defined]
        "asic", lambda h: {"market_name": h.market_name, "asic_serial": h.serial, "vendor_name": "AMD"}
    )
    m.amdsmi_get_gpu_activity = query(  # type: ignore[attr-defined]
        "activity", lambda h: {"gfx_activity": h.gfx_activity, "umc_activity": "N/A", "mm_activity": "N/A"}
    )
    m.amdsmi_get_power_info = query("power", lambda h: dict(h.power))  # type: ignore[attr-defined]
    m.amdsmi_get_gpu_vram_usage = query(  # type: ignore[attr-defined]
        "vram", lambda h: {"vram_total": h.vram_mb[0], "vram_used": h.vram_mb[1]}
    )
    m.amdsmi_get_temp_metric = query("temp", lambda h, sensor, metric: h.temp_c)  # type: ignore[attr-defined]
    m.amdsmi_get_gpu_total_ecc_count = query(  # type: ignore[attr-defined]
        "ecc", lambda h: {"correctable_count": h.ecc[0], "uncorrectable_count": h.ecc[1], "deferred_count": 0}
    )
    m.amdsmi_get_gpu_process_list = query("processes", lambda h: [dict(p) for p in h.processes])  # type: ignore[attr-defined]
    return m


@dataclass
class GaudiDevice:
    bus_id: str
    name: str = "HL-225"
    aip: int = 0
    power_mw: int = 0
    total_bytes: int = 0
    used_bytes: int = 0
    temp_c: int = 0
    ecc_uncorrected: int = 0


def pyhlml_module(devices: list[GaudiDevice], utilization_struct: bool = True) -> types.ModuleType:
    """A module answering as ``pyhlml`` does (``utilization_struct``: 1.19 on, a struct; before, an int)."""
    m = types.ModuleType("pyhlml")
    m.calls = []  # type: ignore[attr-defined]
    m.hlmlInit = lambda: m.calls.append("hlmlInit")  # type: ignore[attr-defined]
    m.hlmlShutdown = lambda: m.calls.append("hlmlShutdown")  # type: ignore[attr-defined]
    m.hlmlDeviceGetCount = lambda: len(devices)  # type: ignore[attr-defined]
    m.hlmlDeviceGetHandleByIndex = lambda i: devices[i]  # type: ignore[attr-defined]
    m.hlmlDeviceGetName = lambda d: d.name.encode()  # type: ignore[attr-defined]
    m.hlmlDeviceGetPCIInfo = lambda d: types.SimpleNamespace(bus_id=d.bus_id.encode(), domain=0)  # type: ignore[attr-defined]
    m.hlmlDeviceGetUtilizationRates = (  # type: ignore[attr-defined]
        (lambda d: types.SimpleNamespace(aip=d.aip, memory=0)) if utilization_struct else (lambda d: d.aip)
    )
    m.hlmlDeviceGetPowerUsage = lambda d: d.power_mw  # type: ignore[attr-defined]
    m.hlmlDeviceGetMemoryInfo = lambda d: types.SimpleNamespace(  # type: ignore[attr-defined]
        total=d.total_bytes, used=d.used_bytes, free=d.total_bytes - d.used_bytes
    )
    m.hlmlDeviceGetTemperature = lambda d, sensor: d.temp_c  # type: ignore[attr-defined]
    m.hlmlDeviceGetTotalECCErrors = lambda d, kind, counter: d.ecc_uncorrected  # type: ignore[attr-defined]
    return m
