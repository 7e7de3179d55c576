"""AWS Neuron: the ``neuron-monitor`` Prometheus scrape and ``neuron-ls`` tables.

A NeuronCore is a partition of its Neuron device: a core row (``nd<D>.nc<C>``) carries its busy
(``neuroncore_utilization_ratio`` summed over the runtimes on it; each runtime is a process,
``runtime_tag`` being its PID) and the device row (``nd<D>``) carries device memory. Neither tool
reports power or temperature: they stay None (the platform table's TDP is an estimate, used only
where a later step needs power). Scrapes and ``neuron-ls`` carry no time.
"""
from __future__ import annotations

from decimal import Decimal

from gpucost.producers.accelerators.capture import body, guarded, is_missing, pipe_rows
from gpucost.producers.accelerators.prometheus import series
from gpucost.schemas.devices import DeviceSample, Parsed, ProcessUsage, to_bytes, to_pct

__all__ = ["parse_scrape", "parse_ls"]

VENDOR = "AWS"
# neuron-ls's "8 GB" is the 8 GiB that neuron-monitor reports for the same inf1 device (8589934592 B)
_LS_UNITS = {"MB": "MiB", "GB": "GiB", "TB": "TiB"}
_METRICS = {"neuroncore_utilization_ratio", "neuron_runtime_memory_used_bytes", "neuron_hardware_info"}


def _model(instance_type: str | None) -> str | None:
    """The chip of an instance family (inf1 → Inferentia, inf2 → Inferentia2, trn1/trn2 → Trainium)."""
    family = (instance_type or "").split(".")[0].rstrip("n")
    return {"inf1": "Inferentia", "inf2": "Inferentia2", "trn1": "Trainium", "trn2": "Trainium2"}.get(family)


def parse_scrape(text: str) -> Parsed:
    """neuron-monitor through ``neuron-monitor-prometheus.py``: one row per device and per core."""
    out = Parsed()
    per_device, size, model = 0, None, None
    busy: dict[int, dict[int, Decimal]] = {}
    device_mem: dict[int, Decimal] = {}
    for name, labels, value in series(text, out, _METRICS):
        if name == "neuron_hardware_info":
            per_device = int(labels.get("neuroncore_per_device_count", "0") or 0)
            size = guarded(out, "neuron_device_memory_size", lambda: to_bytes(labels["neuron_device_memory_size"], "B"))
            model = _model(labels.get("instance_type"))
        elif name == "neuroncore_utilization_ratio":
            tag = labels.get("runtime_tag", "")
            core = labels.get("neuroncore", "")
            if not core.isdigit() or not tag.isdigit():
                out.reject(f"{name}: neuroncore {core!r} or runtime_tag {tag!r} is not a number")
                continue
            pct = guarded(out, f"{name} core {core}", lambda: to_pct(value, ratio=True))
            if pct is not None:
                busy.setdefault(int(core), {})[int(tag)] = pct
        elif labels.get("memory_location") == "neuron_device" and labels.get("runtime_tag", "").isdigit():
            device_mem[int(labels["runtime_tag"])] = value
    if not per_device:
        if busy:
            out.reject("neuron-monitor: no neuron_hardware_info, cores cannot be put on devices")
        return out
    devices = sorted({core // per_device for core in busy} | ({0} if size is not None else set()))
    for dev in devices:
        procs = tuple(ProcessUsage(pid, to_bytes(mem, "B"), None) for pid, mem in sorted(device_mem.items()))
        out.samples.append(DeviceSample(
            VENDOR, model, f"nd{dev}", mem_total_bytes=size,
            mem_used_bytes=sum(p.mem_used_bytes or 0 for p in procs) if len(devices) == 1 else None,
            processes=procs if len(devices) == 1 else None))
    if len(devices) > 1 and device_mem:
        out.reject("neuron-monitor: runtime memory is per runtime, not per device, on a multi-device host")
    for core, runtimes in sorted(busy.items()):
        out.samples.append(DeviceSample(
            VENDOR, model, f"nd{core // per_device}.nc{core}", f"nd{core // per_device}",
            busy_pct=min(sum(runtimes.values(), Decimal(0)), Decimal(100)),
            processes=tuple(ProcessUsage(pid, None, pct) for pid, pct in sorted(runtimes.items()))))
    return out


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
            return DeviceSample(VENDOR, model, f"nd{int(row['NEURON DEVICE'])}",
                                mem_total_bytes=None if is_missing(mem) else to_bytes(value, _LS_UNITS[unit.strip()]),
                                processes=tuple(ProcessUsage(p) for p in pids) if has_pids else None)
        got = guarded(out, "neuron-ls row", sample)
        if got is not None:
            out.samples.append(got)
    return out
