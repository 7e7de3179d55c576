"""``rocm-smi --showallinfo --json`` (older ROCm): an object of ``cardN`` plus ``system``.

Every value is a string and the unit sits in the key. The identity is ``Unique ID``, else
``Serial Number``, else ``PCI Bus`` (the first two can be ``N/A`` or ``"0"``). ``Card series`` can
be a bare PCI vendor id (``0x1002``): the model is then not reported. rocm-smi lists processes
under ``system`` with no GPU named, so they cannot be put on a device: each is counted, not used.
"""

from __future__ import annotations

import re
from typing import Any

from gpucost.producers.accelerators.capture import guarded, is_missing, json_body
from gpucost.schemas.devices import DeviceSample, Parsed, number, to_bytes, to_pct, to_watts

__all__ = ["parse"]

VENDOR = "AMD"
_POWER_KEYS = ("Average Graphics Package Power (W)", "Current Socket Graphics Package Power (W)")
_TEMP_KEYS = ("Temperature (Sensor edge) (C)", "Temperature (Sensor junction) (C)")


def _first(card: dict[str, Any], keys: tuple[str, ...]) -> str | None:
    return next((card[k] for k in keys if k in card and not is_missing(str(card[k]))), None)


def _identity(card: dict[str, Any], name: str) -> str:
    for key in ("Unique ID", "Serial Number", "PCI Bus"):
        value = str(card.get(key, "N/A"))
        if not is_missing(value) and value != "0":
            return value
    return name


def _card(name: str, card: dict[str, Any]) -> DeviceSample:
    series = card.get("Card series", card.get("Card Series"))
    model = None if series is None or re.fullmatch(r"0x[0-9a-fA-F]+", str(series)) else str(series)
    power, temp = _first(card, _POWER_KEYS), _first(card, _TEMP_KEYS)
    busy = _first(card, ("GPU use (%)",))
    used, total = _first(card, ("VRAM Total Used Memory (B)",)), _first(card, ("VRAM Total Memory (B)",))
    return DeviceSample(
        VENDOR,
        model,
        _identity(card, name),
        busy_pct=None if busy is None else to_pct(busy),
        power_w=None if power is None else to_watts(power),
        mem_used_bytes=None if used is None else to_bytes(used, "B"),
        mem_total_bytes=None if total is None else to_bytes(total, "B"),
        temperature_c=None if temp is None else number(temp),
    )


def parse(text: str) -> Parsed:
    """Every ``cardN`` as one sample (the capture has no time)."""
    out = Parsed()
    for name, card in (json_body(text, out, "rocm-smi", dict, "an object of cardN") or {}).items():
        if name == "system" and isinstance(card, dict):
            for _ in (k for k in card if k.startswith("PID")):
                out.reject("rocm-smi process: listed per system, not per GPU")
        elif re.fullmatch(r"card\d+", name) and isinstance(card, dict):
            sample = guarded(out, f"rocm-smi {name}", lambda name=name, card=card: _card(name, card))
            if sample is not None:
                out.samples.append(sample)
        else:
            out.reject(f"rocm-smi JSON: {name!r} is neither cardN nor system")
    return out
