"""AMD/Xilinx Alveo: ``xbutil examine -d <bdf> -r electrical thermal platform -f JSON -o FILE``.

No public capture of this output was found. The layout is taken from XRT's documented report
keys — ``devices[].device_id`` (the PCI BDF), ``electrical.power_consumption_watts`` (a decimal
string, as XRT's own Python reports read it), ``thermals[]`` with ``location_id``/``temp_C``/
``is_present``, and ``platforms[].static_region.vbnv`` — and tested on examples written to that
layout, not on a real card. An FPGA reports no busy fraction and no per-process use: both None.
"""

from __future__ import annotations

from typing import Any

from gpucost.producers.accelerators.capture import guarded, json_body
from gpucost.schemas.devices import DeviceSample, Parsed, number, to_watts

__all__ = ["parse"]

VENDOR = "AMD"
_FPGA_SENSORS = ("fpga0", "fpga")


def _model(device: dict[str, Any]) -> str | None:
    for platform in device.get("platforms") or []:
        vbnv = ((platform or {}).get("static_region") or {}).get("vbnv")
        if vbnv:
            return str(vbnv)
    return None


def _temperature(device: dict[str, Any]) -> Any:
    for sensor in device.get("thermals") or []:
        if sensor.get("location_id") in _FPGA_SENSORS and str(sensor.get("is_present", "true")) == "true":
            return number(str(sensor["temp_C"]))
    return None


def _device(device: dict[str, Any]) -> DeviceSample:
    watts = (device.get("electrical") or {}).get("power_consumption_watts")
    return DeviceSample(
        VENDOR,
        _model(device),
        str(device["device_id"]),
        power_w=None if watts in (None, "", "N/A") else to_watts(str(watts)),
        temperature_c=_temperature(device),
    )


def parse(text: str) -> Parsed:
    """One sample per device of the report (no time: the report has none)."""
    out = Parsed()
    data = json_body(text, out, "xbutil", dict, "an object with a 'devices' list")
    devices = None if data is None else data.get("devices")
    if data is not None and not isinstance(devices, list):
        out.reject("xbutil JSON: no 'devices' list")
    if not isinstance(devices, list):
        return out
    for device in devices:
        if not isinstance(device, dict) or "device_id" not in device:
            out.reject("xbutil JSON: a device without 'device_id'")
            continue
        got = guarded(out, f"xbutil device {device['device_id']}", lambda device=device: _device(device))
        if got is not None:
            out.samples.append(got)
    return out
