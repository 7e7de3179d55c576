"""AWS Neuron: the ``neuron-monitor`` Prometheus scrape and JSON report, and ``neuron-ls`` tables.

A NeuronCore is a partition of its Neuron device: a core row (``nd<D>.nc<C>``) carries its busy
(``neuroncore_utilization_ratio`` summed over the runtimes on it; each runtime is a process,
``runtime_tag`` being its PID) and the device row (``nd<D>``) carries device memory. Neither tool
reports power or temperature: they stay None (the platform table's TDP is an estimate, used only
where a later step needs power). Scrapes and ``neuron-ls`` carry no time. The scrape's faults go on
the device row: ``hardware_ecc_events_total`` (memory and SRAM, corrected and uncorrected, per
device) and ``execution_errors_total{error_type="hardware"}`` (per runtime, so on a one-device host
only), both cumulative since neuron-monitor started.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from gpucost.producers.accelerators.capture import body, guarded, is_missing, json_body, pipe_rows
from gpucost.producers.accelerators.prometheus import series
from gpucost.schemas.devices import DeviceSample, Parsed, ProcessUsage, to_bytes, to_count, to_pct

__all__ = ["parse_scrape", "parse_json", "parse_ls"]

VENDOR = "AWS"
# neuron-ls's "8 GB" is the 8 GiB that neuron-monitor reports for the same inf1 device (8589934592 B)
_LS_UNITS = {"MB": "MiB", "GB": "GiB", "TB": "TiB"}
_METRICS = {
    "neuroncore_utilization_ratio",
    "neuron_runtime_memory_used_bytes",
    "neuron_hardware_info",
    "hardware_ecc_events_total",
    "execution_errors_total",
}


def _model(instance_type: str | None) -> str | None:
    """The chip of an instance family (inf1 → Inferentia, inf2 → Inferentia2, trn1/trn2 → Trainium)."""
    family = (instance_type or "").split(".")[0].rstrip("n")
    return {"inf1": "Inferentia", "inf2": "Inferentia2", "trn1": "Trainium", "trn2": "Trainium2"}.get(family)


@dataclass
class _Readings:
    """What neuron-monitor said, in either of its outputs, before it becomes samples."""

    per_device: int = 0
    device_count: int | None = None  # neuron_device_count: the host's devices, busy or not
    size: int | None = None
    model: str | None = None
    busy: dict[int, dict[int, Decimal]] = field(default_factory=dict)  # core → PID → %
    device_mem: dict[int, int] = field(default_factory=dict)  # PID → device bytes
    ecc: dict[int, dict[str, int]] = field(default_factory=dict)  # device → event_type → count
    hardware_errors: dict[int, int] = field(default_factory=dict)  # PID → failed executions


def _ecc(events: dict[str, int], suffix: str) -> int | None:
    """A device's ECC count of one kind: its memory's and its SRAM's (``mem_ecc_*`` + ``sram_ecc_*``)."""
    kinds = [n for kind, n in events.items() if kind.endswith(suffix)]
    return sum(kinds) if kinds else None


#: more than any Neuron host has (trn2.48xlarge: 16 devices of 8 cores): a larger figure is a misread, and would
#: make a few bytes of a page into millions of samples
MAX_DEVICES, MAX_CORES = 64, 64


def _emit(r: _Readings, out: Parsed) -> Parsed:
    if r.per_device <= 0:
        if r.busy:
            out.reject("neuron-monitor: no neuroncore_per_device_count, cores cannot be put on devices")
        return out
    if r.per_device > MAX_CORES or (r.device_count or 0) > MAX_DEVICES:
        out.reject(
            f"neuron-monitor: {r.device_count} device(s) of {r.per_device} core(s): no host has more than "
            f"{MAX_DEVICES} devices of {MAX_CORES} cores"
        )
        return out
    # the host's devices (neuron_device_count: an idle device too), and any a core or an ECC count names
    beyond = [core for core in r.busy if core // r.per_device >= MAX_DEVICES]
    for core in beyond:
        out.reject(f"neuroncore {core}: beyond the {MAX_DEVICES} devices a host may have")
        del r.busy[core]
    named = {core // r.per_device for core in r.busy} | ({0} if r.size is not None else set()) | set(r.ecc)
    devices = sorted({*range(r.device_count or 0), *(d for d in named if d < MAX_DEVICES)})
    single = len(devices) == 1
    if not single and r.device_mem:
        out.reject("neuron-monitor: runtime memory is per runtime, not per device, on a multi-device host")
    if not single and r.hardware_errors:
        out.reject("neuron-monitor: hardware execution errors are per runtime, not per device, on a multi-device host")
    for dev in devices:
        procs = tuple(ProcessUsage(pid, mem, None) for pid, mem in sorted(r.device_mem.items()))
        out.samples.append(
            DeviceSample(
                VENDOR,
                r.model,
                f"nd{dev}",
                mem_total_bytes=r.size,
                mem_used_bytes=sum(p.mem_used_bytes or 0 for p in procs) if single else None,
                processes=procs if single else None,
                ecc_corrected=_ecc(r.ecc.get(dev, {}), "_ecc_corrected"),
                ecc_uncorrected=_ecc(r.ecc.get(dev, {}), "_ecc_uncorrected"),
                hardware_errors=sum(r.hardware_errors.values()) if single and r.hardware_errors else None,
            )
        )
    # every core of each device, a core no runtime uses at 0 % (neuron-monitor reports only the runtimes' cores): a
    # device's cores are its partitions, each billed its share of it, so their count must not follow the runtimes
    every = {core: {} for dev in devices for core in range(dev * r.per_device, (dev + 1) * r.per_device)}
    for core, runtimes in sorted((every | r.busy).items()):
        total = sum(runtimes.values(), Decimal(0))
        if total > 100:
            out.reject(f"neuroncore {core}: its runtimes' utilisation adds up to {total} %")
            continue
        out.samples.append(
            DeviceSample(
                VENDOR,
                r.model,
                f"nd{core // r.per_device}.nc{core}",
                f"nd{core // r.per_device}",
                busy_pct=total,
                processes=tuple(ProcessUsage(pid, None, pct) for pid, pct in sorted(runtimes.items())),
            )
        )
    return out


def parse_scrape(text: str) -> Parsed:
    """neuron-monitor through ``neuron-monitor-prometheus.py``: one row per device and per core."""
    out, r = Parsed(), _Readings()
    for name, labels, value in series(text, out, _METRICS):
        tag, core = labels.get("runtime_tag", ""), labels.get("neuroncore", "")
        if name == "neuron_hardware_info":
            r.per_device = (
                guarded(
                    out, "neuroncore_per_device_count", lambda labels=labels: int(labels["neuroncore_per_device_count"])
                )
                or 0
            )
            r.size = guarded(
                out,
                "neuron_device_memory_size",
                lambda labels=labels: to_bytes(labels["neuron_device_memory_size"], "B"),
            )
            r.model = _model(labels.get("instance_type"))
            if "neuron_device_count" in labels:
                r.device_count = guarded(
                    out, "neuron_device_count", lambda labels=labels: to_count(labels["neuron_device_count"])
                )
        elif name in ("hardware_ecc_events_total", "execution_errors_total"):
            _fault(name, labels, value, r, out)
        elif not tag.isdecimal():
            out.reject(f"{name}: runtime_tag {tag!r} is not a PID")
        elif name == "neuroncore_utilization_ratio":
            pct = guarded(out, f"{name} core {core}", lambda value=value: to_pct(value, ratio=True))
            if pct is not None and core.isdecimal():
                r.busy.setdefault(int(core), {})[int(tag)] = pct
        elif labels.get("memory_location") == "neuron_device":
            mem = guarded(out, name, lambda value=value: to_bytes(value, "B"))
            if mem is not None:
                r.device_mem[int(tag)] = mem
    return _emit(r, out)


def _fault(name: str, labels: dict[str, str], value: Decimal, r: _Readings, out: Parsed) -> None:
    """An ECC event count of a device, or a runtime's executions failed by the hardware; the other
    ``error_type``s (generic, numerical, transient, model, runtime) are the workload's, not the device's."""
    kind = labels.get("event_type") or labels.get("error_type", "")
    if name == "execution_errors_total" and kind != "hardware":
        return
    count = guarded(out, f"{name} {kind}", lambda: to_count(value))
    key = labels.get("neuron_device_index" if name == "hardware_ecc_events_total" else "runtime_tag", "")
    if count is None:
        return
    if not key.isdecimal() or (name == "hardware_ecc_events_total" and not kind.endswith("corrected")):
        out.reject(f"{name}: {kind!r} of {key!r} is not a known event of a device or runtime")
    elif name == "hardware_ecc_events_total":
        r.ecc.setdefault(int(key), {})[kind] = count
    else:
        r.hardware_errors[int(key)] = count


def parse_json(text: str) -> Parsed:
    """neuron-monitor's own JSON report, laid out as its user guide documents (no public capture found):
    ``neuron_runtime_data[].pid`` with ``report.neuroncore_counters.neuroncores_in_use.<core>.
    neuroncore_utilization`` (%) and ``report.memory_used.neuron_runtime_used_bytes.neuron_device``,
    and ``neuron_hardware_info.neuroncore_per_device_count``."""
    out, r = Parsed(), _Readings()
    data = json_body(text, out, "neuron-monitor", dict, "an object with neuron_runtime_data")
    if data is None:
        return out
    hw = data.get("neuron_hardware_info") or {}
    r.per_device = guarded(out, "neuroncore_per_device_count", lambda: int(hw["neuroncore_per_device_count"])) or 0
    if "neuron_device_count" in hw:
        r.device_count = guarded(out, "neuron_device_count", lambda: to_count(hw["neuron_device_count"]))
    r.model = _model((data.get("instance_info") or {}).get("instance_type"))
    if "neuron_device_memory_size" in hw:
        r.size = guarded(out, "neuron_device_memory_size", lambda: to_bytes(hw["neuron_device_memory_size"], "B"))
    for runtime in data.get("neuron_runtime_data") or []:
        guarded(out, "neuron_runtime_data entry", lambda runtime=runtime: _runtime(runtime, r, out))
    return _emit(r, out)


def _runtime(runtime: dict[str, Any], r: _Readings, out: Parsed) -> None:
    pid, report = int(runtime["pid"]), runtime.get("report") or {}
    cores = (report.get("neuroncore_counters") or {}).get("neuroncores_in_use") or {}
    for core, counters in cores.items():
        if not str(core).isdecimal():
            out.reject(f"neuroncore {core!r}: not a core number")
            continue
        pct = guarded(out, f"neuroncore {core}", lambda counters=counters: to_pct(counters["neuroncore_utilization"]))
        if pct is not None:
            r.busy.setdefault(int(core), {})[pid] = pct
    used = ((report.get("memory_used") or {}).get("neuron_runtime_used_bytes") or {}).get("neuron_device")
    if used is not None:
        r.device_mem[pid] = to_bytes(used, "B")


def parse_ls(text: str) -> Parsed:
    """``neuron-ls``: one row per Neuron device, with its memory size and the PIDs using it."""
    out = Parsed()
    header: list[str] = []
    rows: list[tuple[dict[str, str], list[int]]] = []
    model = None
    for line in body(text):
        if line.strip().startswith("instance-type:"):
            model = _model(line.split(":", 1)[1].strip())
        cells = pipe_rows(line)
        if cells is None:
            continue
        if cells[0] in ("NEURON", "DEVICE"):
            header = [f"{a} {b}".strip() for a, b in zip(header, cells)] if header else cells
            continue
        row = dict(zip(header, cells))
        pid = row.get("PID PID", row.get("PID", ""))
        if row.get("NEURON DEVICE", ""):
            rows.append((row, []))
        elif not rows:
            out.reject("neuron-ls: a continuation row before any device")
            continue
        if pid and not is_missing(pid):
            if pid.isdigit():
                rows[-1][1].append(int(pid))
            else:
                out.reject(f"neuron-ls: PID {pid!r} is not a number")
    has_pids = any(h.startswith("PID") for h in header)
    for row, pids in rows:

        def sample(row: dict[str, str] = row, pids: list[int] = pids) -> DeviceSample:
            mem = row.get("NEURON MEMORY", "")
            value, _, unit = mem.partition(" ")
            return DeviceSample(
                VENDOR,
                model,
                f"nd{int(row['NEURON DEVICE'])}",
                mem_total_bytes=None if is_missing(mem) else to_bytes(value, _LS_UNITS[unit.strip()]),
                processes=tuple(ProcessUsage(p) for p in pids) if has_pids else None,
            )

        got = guarded(out, "neuron-ls row", sample)
        if got is not None:
            out.samples.append(got)
    return out
