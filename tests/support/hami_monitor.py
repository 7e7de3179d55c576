"""A HAMi vGPU monitor's ``/metrics`` written from its documentation (Project-HAMi/website, "Real-time device
usage endpoint": the ``hami_*`` metrics and their labels; HAMi's cmd/vGPUmonitor/metrics.go for the older names
``--legacy-metrics`` writes), for tests/test_hami.py. No real scrape is in the shared data: the text is built here
from those two sources, in either spelling."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Container", "Gpu", "metrics_text"]


@dataclass(frozen=True)
class Container:
    namespace: str
    pod: str
    name: str
    util: str  # the value as the monitor writes it ("45", "12.5")
    mem_bytes: int | None = None
    limit_bytes: int | None = None


@dataclass(frozen=True)
class Gpu:
    uuid: str
    util: str | None  # None: the host figures are missing (the monitor's NVML call failed)
    mem_bytes: int = 0
    power_w: str | None = None
    temp_c: str | None = None
    mem_ctrl: str | None = None
    containers: tuple[Container, ...] = field(default_factory=tuple)


_HOST = {  # field: (hami_* name, older name or None)
    "util": ("hami_host_gpu_utilization_ratio", "HostCoreUtilization"),
    "mem_bytes": ("hami_host_gpu_memory_used_bytes", "HostGPUMemoryUsage"),
    "power_w": ("hami_host_gpu_power_usage_watts", None),
    "temp_c": ("hami_host_gpu_temperature_celsius", None),
    "mem_ctrl": ("hami_host_gpu_memory_controller_utilization_ratio", None),
}
_CONTAINER = {
    "util": ("hami_container_device_utilization_ratio", "Device_utilization_desc_of_container"),
    "mem_bytes": ("hami_container_device_memory_bytes", "vGPU_device_memory_usage_in_bytes"),
    "limit_bytes": ("hami_vgpu_memory_limit_bytes", "vGPU_device_memory_limit_in_bytes"),
}


def _line(name: str, labels: dict[str, str], value: object) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return f"{name}{{{inner}}} {value}"


def metrics_text(gpus: list[Gpu], node: str, legacy: bool = False, model: str = "NVIDIA-H100") -> str:
    """The scrape of ``gpus`` on ``node``: the ``hami_*`` names, or with ``legacy`` the older names and labels
    where the monitor has them (the rest stay ``hami_*``, as a monitor with ``--legacy-metrics`` writes both)."""
    lines = []
    for i, g in enumerate(gpus):
        new = {"node": node, "device_index": str(i), "device_uuid": g.uuid, "device_type": model, "zone": "vGPU"}
        old_labels = {"nodeid": node, "deviceidx": str(i), "deviceuuid": g.uuid, "devicetype": model, "zone": "vGPU"}
        for attr, (name, old) in _HOST.items():
            value = getattr(g, attr)
            if g.util is None or value is None:
                continue  # no host figures at all: the monitor's NVML call failed
            lines.append(_line(old, old_labels, value) if legacy and old else _line(name, new, value))
        for c in g.containers:
            for attr, (name, old) in _CONTAINER.items():
                value = getattr(c, attr)
                if value is None:
                    continue
                if legacy:
                    labels = {"podnamespace": c.namespace, "podname": c.pod, "ctrname": c.name, "vdeviceid": str(i)}
                    labels |= {"deviceuuid": g.uuid, "zone": "vGPU"}
                else:
                    labels = {"namespace": c.namespace, "pod": c.pod, "container": c.name, "vdevice_index": str(i)}
                    labels |= {"device_uuid": g.uuid, "zone": "vGPU"}
                lines.append(_line(old if legacy else name, labels, value))
    return "# HELP hami_host_gpu_utilization_ratio GPU core utilization ratio (0-100)\n" + "\n".join(lines) + "\n"
