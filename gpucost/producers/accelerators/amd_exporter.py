"""AMD Device Metrics Exporter ``/metrics`` scrape.

Older releases label with ``GPU_UUID``/``SERIAL_NUMBER``, newer ones with ``gpu_id``, ``gpu_uuid``,
``serial_number``, ``card_model``, ``gpu_compute_partition_type`` and ``gpu_partition_id``; the
docs mask labels as ``xxxx``, which count as absent. Memory gauges are MB (their ``# HELP`` says
so); amd-smi's MB is binary and the exporter reads the same library, so MB is read as MiB.
In a compute-partition mode other than ``spx`` each partition (``gpu<gpu_id>``) is a device under
its socket (the serial number, else ``socket<gpu_id - gpu_partition_id>``), and a socket row alone
carries the power, temperature and memory every partition repeats, and the ECC and PCIe replay
counts, which amd-smi keeps per socket.
"""

from __future__ import annotations

from decimal import Decimal

from gpucost.producers.accelerators.capture import guarded
from gpucost.producers.accelerators.prometheus import series
from gpucost.schemas.devices import DeviceSample, Parsed, to_bytes, to_count, to_pct, to_watts

__all__ = ["parse"]

VENDOR = "AMD"
_FIELDS = {
    "gpu_power_usage": "power_w",
    "gpu_gfx_activity": "busy_pct",
    "gpu_usage": "busy_pct",
    "gpu_used_vram": "mem_used_bytes",
    "gpu_total_vram": "mem_total_bytes",
    "gpu_total_memory": "mem_total_bytes",
    "gpu_junction_temperature": "temperature_c",
    "gpu_edge_temperature": "temperature_c",
    "gpu_clock": "",
    # faults, from the exporter's metric list (docs/configuration/metricslist.md), not from a capture
    "gpu_ecc_correct_total": "ecc_corrected",
    "gpu_ecc_uncorrect_total": "ecc_uncorrected",
    "pcie_replay_count": "pcie_replays",
}
_RANK = {name: rank for rank, name in enumerate(_FIELDS)}  # of two metrics for one field, the earlier wins
_COUNTS = ("ecc_corrected", "ecc_uncorrected", "pcie_replays")
_SHARED = ("power_w", "temperature_c", "mem_used_bytes", "mem_total_bytes", *_COUNTS)


def _label(labels: dict[str, str], *names: str) -> str | None:
    return next((labels[n] for n in names if labels.get(n) not in (None, "", "xxxx")), None)


def _convert(field: str, value: Decimal) -> object:
    if field == "power_w":
        return to_watts(value)
    if field == "busy_pct":
        return to_pct(value)
    if field.startswith("mem_"):
        return to_bytes(value, "MiB")
    if field in _COUNTS:
        return to_count(value)
    return value


def parse(text: str) -> Parsed:
    """One sample per GPU (or partition, and its socket) found in the scrape (no time: a scrape has none)."""
    out = Parsed()
    devices: dict[str, dict[str, object]] = {}
    ranks: dict[tuple[str, str], int] = {}
    for name, labels, value in series(text, out, set(_FIELDS)):
        gpu_id = _label(labels, "gpu_id")
        ident = _label(labels, "GPU_UUID", "gpu_uuid", "SERIAL_NUMBER", "serial_number") or (
            None if gpu_id is None else f"gpu{gpu_id}"
        )
        if ident is None:
            out.reject(f"{name}: no GPU label")
            continue
        mode, part = labels.get("gpu_compute_partition_type", "spx"), labels.get("gpu_partition_id", "0")
        partition = mode != "spx" and gpu_id is not None and part.isdigit()
        if partition:  # the partitions share the socket's serial: the logical id tells them apart
            ident = f"gpu{gpu_id}"
        row = devices.setdefault(ident, {"model": _label(labels, "card_model")})
        if partition:
            row["parent_id"] = _label(labels, "serial_number") or f"socket{int(str(gpu_id)) - int(part)}"
        field = _FIELDS[name]
        if field and _RANK[name] < ranks.get((ident, field), len(_RANK)):
            got = guarded(out, name, lambda field=field, value=value: _convert(field, value))
            if got is not None:
                row[field], ranks[ident, field] = got, _RANK[name]
    sockets: dict[str, dict[str, object]] = {}
    for row in devices.values():
        if row.get("parent_id") is not None:  # the socket carries what its partitions repeat
            socket = sockets.setdefault(str(row["parent_id"]), {"model": row.get("model")})
            for k in _SHARED:
                if k in row:
                    socket.setdefault(k, row.pop(k))
    devices.update(sockets)
    for ident, row in devices.items():  # row holds DeviceSample fields only: model, parent_id, readings
        out.samples.append(DeviceSample(vendor=VENDOR, device_id=ident, **row))  # type: ignore[arg-type]
    return out
