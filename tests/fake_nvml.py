"""A fake NVML at the ``pynvml`` boundary, serving what a real nvidia-smi capture shows.

Same function names, and pynvml's own error classes and constants; values are parsed from
``../shared/data/nvidia-smi/`` captures (dmon, pmon, query-compute-apps, -q, -L).
"""

from __future__ import annotations

import ctypes
import re
import types
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml


def sections(path: Path) -> dict[str, str]:
    """``phase :: name`` → raw output of that section of a capture file."""
    parts = re.split(r"^#{20,}\n# (.+?)\n(?:# \$ .*\n)?#{20,}\n", path.read_text(), flags=re.M)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts) - 1, 2)}


@dataclass
class Capture:
    gpu_uuid: str
    name: str
    mig: list[tuple[str, str]]  # (profile, uuid)
    mig_instance: list[tuple[int, int]]  # each MIG device's (GPU instance, compute instance): CIs may share a GI
    mig_processes: dict[int, tuple[int, int]]  # pid → the (GI, CI) it runs in, from the process table
    dmon: list[dict[str, int | None]]
    pmon: list[tuple[int, int | None, int | None]]  # (pid, sm %, mem %), None for '-'
    apps: dict[int, int]  # pid → MiB
    fb_total_mib: int
    fb_used_mib: int
    tx_kb_s: int
    rx_kb_s: int
    #: NVML field values the -q section shows (``NVML_FI_DEV_…`` name → count; a field it does not show is absent:
    #: NOT_SUPPORTED), and the clocks event mask of its active "Clocks Event Reasons"
    fields: dict[str, int] = field(default_factory=dict)
    clocks: int | None = None


#: nvidia-smi -q's "Clocks Event Reasons" lines → NVML's ``nvmlClocksEventReason*`` bits
CLOCK_BITS = {
    "Idle": 0x1,
    "Applications Clocks Setting": 0x2,
    "SW Power Cap": 0x4,
    "HW Slowdown": 0x8,
    "Sync Boost": 0x10,
    "SW Thermal Slowdown": 0x20,
    "HW Thermal Slowdown": 0x40,
    "HW Power Brake Slowdown": 0x80,
    "Display Clock Setting": 0x100,
}


def fault_fields(q: str) -> tuple[dict[str, int], int | None]:
    """The field values and clocks event mask of an ``nvidia-smi -q`` section: ECC counts (SRAM and DRAM, volatile
    and aggregate; correctable as NVML's SBE totals, uncorrectable as its DBE), PCIe replays, remapped rows."""
    out: dict[str, int] = {}
    for scope, suffix in (("Volatile", "VOL"), ("Aggregate", "AGG")):
        ecc = re.search(
            rf"{scope}\s+SRAM Correctable\s+: (\d+)\s+SRAM Uncorrectable Parity\s+: (\d+)\s+"
            rf"SRAM Uncorrectable SEC-DED\s+: (\d+)\s+DRAM Correctable\s+: (\d+)\s+DRAM Uncorrectable\s+: (\d+)",
            q,
        )
        if ecc:
            sram_c, parity, secded, dram_c, dram_u = map(int, ecc.groups())
            out[f"NVML_FI_DEV_ECC_SBE_{suffix}_TOTAL"] = sram_c + dram_c
            out[f"NVML_FI_DEV_ECC_DBE_{suffix}_TOTAL"] = parity + secded + dram_u
    replays = re.search(r"Replays Since Reset\s+: (\d+)", q)
    if replays:
        out["NVML_FI_DEV_PCIE_REPLAY_COUNTER"] = int(replays[1])
    rows = re.search(
        r"Remapped Rows\s+Correctable Error\s+: (\d+)\s+Uncorrectable Error\s+: (\d+)\s+Pending\s+: \w+\s+"
        r"Remapping Failure Occurred\s+: (\w+)",
        q,
    )
    if rows:
        out["NVML_FI_DEV_REMAPPED_COR"], out["NVML_FI_DEV_REMAPPED_UNC"] = int(rows[1]), int(rows[2])
        out["NVML_FI_DEV_REMAPPED_FAILURE"] = int(rows[3] == "Yes")
    block = re.search(r"Clocks Event Reasons\n(.*?)\n    Clocks Event Reasons Counters", q, re.S)
    clocks = None
    if block:
        active = re.findall(r"^\s+(.+?)\s+: Active$", block[1], re.M)
        clocks = sum(CLOCK_BITS[name] for name in active)
    return out, clocks


def parse(path: Path, phase: str) -> Capture:
    s = sections(path)
    gpu = re.search(r"GPU 0: (.+?) \(UUID: (\S+)\)", s["capabilities :: list (-L)"])
    assert gpu
    mig = re.findall(r"MIG (\S+)\s+Device\s+\d+: \(UUID: (\S+)\)", s["capabilities :: list (-L)"])
    dmon = []
    for line in s[f"{phase} :: dmon (per-device monitor, incl. PCIe rx/tx)"].splitlines():
        cols = line.split()
        if cols and cols[0].isdigit():
            num = lambda c: None if c == "-" else int(c)  # noqa: E731  ('-': not reported, e.g. under MIG)
            dmon.append({"pwr": num(cols[1]), "gtemp": num(cols[2]), "sm": num(cols[4]), "mem": num(cols[5])})
    pmon = []
    for line in s[f"{phase} :: pmon (per-process monitor)"].splitlines():
        cols = line.split()
        if len(cols) > 4 and cols[0].isdigit() and cols[1].isdigit():
            pmon.append(
                (int(cols[1]), None if cols[3] == "-" else int(cols[3]), None if cols[4] == "-" else int(cols[4]))
            )
    apps = {
        int(m[0]): int(m[1])
        for m in re.findall(r", (\d+), [^,]+, (\d+) MiB", s[f"{phase} :: query-compute-apps (per-process)"])
    }
    q = s[f"{phase} :: query (-q)"]
    instances = [
        (int(g), int(c)) for g, c in re.findall(r"GPU Instance ID\s+: (\d+)\s+Compute Instance ID\s+: (\d+)", q)
    ]
    table = s[f"{phase} :: nvidia-smi (default table)"]
    placed = {
        int(pid): (int(g), int(c)) for g, c, pid in re.findall(r"^\|\s+0\s+(\d+)\s+(\d+)\s+(\d+)\s+C\s", table, re.M)
    }
    fields, clocks = fault_fields(q)
    fb = re.search(r"FB Memory Usage\s+Total\s+: (\d+) MiB\s+Reserved\s+: \d+ MiB\s+Used\s+: (\d+) MiB", q)
    tx = re.search(r"Tx Throughput\s+: (\d+) KB/s", q)
    rx = re.search(r"Rx Throughput\s+: (\d+) KB/s", q)
    assert fb and tx and rx
    return Capture(
        gpu[2],
        gpu[1],
        mig,
        instances,
        placed,
        dmon,
        pmon,
        apps,
        int(fb[1]),
        int(fb[2]),
        int(tx[1]),
        int(rx[1]),
        fields,
        clocks,
    )


@dataclass
class Sample:
    pid: int
    timeStamp: int
    smUtil: int
    memUtil: int


@dataclass
class FakeState:
    capture: Capture
    now_us: int = 1_000_000  # pmon rows are one per second per process, starting here
    tick: int = 0  # which dmon row is current
    init_error: int | None = None
    mig_enabled: bool = False
    unsupported: set[str] = field(default_factory=set)
    lost_after_calls: int | None = None
    calls: int = 0
    #: GPM, where the GPU supports it (None: it does not): per source ("gpu0", or a GPU instance id) the
    #: (busy, tensor, dram) % that ``nvmlGpmMetricsGet`` gives over a period ending at each tick
    gpm: dict[Any, list[tuple[float, float, float]]] | None = None
    gpm_unsupported: set[str] = field(default_factory=set)  # GPM metric constants answered NOT_SUPPORTED
    #: the XIDs NVML will send as critical XID events, the first first (on the physical GPU; an (XID, GPU instance)
    #: pair for one NVML attributes to a MIG GPU instance); None: no XID events
    xids: list[int | tuple[int, int]] | None = field(default_factory=list)
    #: field value name → the NVML error its next reads answer (other than NOT_SUPPORTED: a read that failed)
    field_errors: dict[str, int] = field(default_factory=dict)
    clocks_error: int | None = None  # the NVML error the clocks event reasons call raises
    fault_calls: Counter[str] = field(default_factory=Counter)  # calls of the fault readings, by function


def fake_pynvml(state: FakeState) -> types.ModuleType:
    """A module with pynvml's errors and constants and these fakes for its functions."""
    mod = types.ModuleType("pynvml")
    for name in dir(pynvml):
        if name.startswith(("NVMLError", "NVML_", "c_nvmlGpm", "nvmlEventType")):
            setattr(mod, name, getattr(pynvml, name))
    cap = state.capture
    per_cycle = max(1, len({p for p, _, _ in cap.pmon}))

    def err(code: int) -> pynvml.NVMLError:
        return pynvml.NVMLError(code)

    def check(handle: Any, what: str) -> None:
        state.calls += 1
        if state.lost_after_calls is not None and state.calls > state.lost_after_calls and handle == "gpu0":
            raise err(pynvml.NVML_ERROR_GPU_IS_LOST)
        if what in state.unsupported or (handle != "gpu0" and what == "utilization"):
            raise err(pynvml.NVML_ERROR_NOT_SUPPORTED)  # MIG instances: no utilisation counters

    def init() -> None:
        if state.init_error is not None:
            raise err(state.init_error)

    def mig_handle(h: Any, j: int) -> str:
        if j >= len(cap.mig):
            raise err(pynvml.NVML_ERROR_NOT_FOUND)
        return f"mig{j}"

    def process_utilization(h: Any, last_seen_us: int) -> list[Sample]:
        if state.mig_enabled:
            raise err(pynvml.NVML_ERROR_NOT_SUPPORTED)  # NVML: not supported on MIG-enabled GPUs
        out = []
        for i, (pid, sm, mem) in enumerate(cap.pmon):
            ts = 1_000_000 * (1 + i // per_cycle)
            if sm is not None and last_seen_us < ts <= state.now_us:
                out.append(Sample(pid, ts, sm, mem or 0))
        if not out:
            raise err(pynvml.NVML_ERROR_NOT_FOUND)
        return out

    gpm_samples: dict[int, tuple[Any, int]] = {}  # a GPM sample buffer's address → (source, tick) it holds

    def gpm_alloc() -> Any:
        address = 0x1000 + 16 * len(gpm_samples)
        gpm_samples[address] = (None, -1)
        return ctypes.cast(ctypes.c_void_p(address), pynvml.c_nvmlGpmSample_t)

    def gpm_take(source: Any, buffer: Any) -> None:
        if state.gpm is None or source not in state.gpm:
            raise err(pynvml.NVML_ERROR_NOT_SUPPORTED if state.gpm is None else pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpm_samples[ctypes.cast(buffer, ctypes.c_void_p).value] = (source, state.tick)  # type: ignore[index]

    def gpm_metrics(get: Any) -> Any:
        """Values of the later sample's source and tick; two samples of different sources are NVML's error."""
        (a, _), (b, tick) = (gpm_samples[ctypes.cast(p, ctypes.c_void_p).value] for p in (get.sample1, get.sample2))
        if a is None or a != b or get.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
            raise err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        assert state.gpm is not None
        rows = state.gpm[b]
        values = dict(
            zip(
                ("NVML_GPM_METRIC_GRAPHICS_UTIL", "NVML_GPM_METRIC_ANY_TENSOR_UTIL", "NVML_GPM_METRIC_DRAM_BW_UTIL"),
                rows[tick % len(rows)],
            )
        )
        for i in range(get.numMetrics):
            name = next((n for n in values if getattr(pynvml, n) == get.metrics[i].metricId), None)
            if name is None or name in state.gpm_unsupported:
                get.metrics[i].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
            else:
                get.metrics[i].nvmlReturn, get.metrics[i].value = pynvml.NVML_SUCCESS, values[name]
        return get

    def mig_parent_only(h: Any, call: Any) -> Any:
        if h != "gpu0":
            raise err(pynvml.NVML_ERROR_INVALID_ARGUMENT)  # a GPM sample of a MIG instance is taken on its parent
        return call()

    mod.nvmlGpmQueryDeviceSupport = lambda h: mig_parent_only(
        h, lambda: types.SimpleNamespace(isSupportedDevice=int(state.gpm is not None))
    )
    mod.nvmlGpmSampleAlloc = gpm_alloc
    mod.nvmlGpmSampleFree = lambda buffer: None
    mod.nvmlGpmSampleGet = lambda h, buffer: mig_parent_only(h, lambda: gpm_take("gpu0", buffer))
    mod.nvmlGpmMigSampleGet = lambda h, gi, buffer: mig_parent_only(h, lambda: gpm_take(gi, buffer))
    mod.nvmlGpmMetricsGet = gpm_metrics
    mod.nvmlDeviceGetGpuInstanceId = lambda h: cap.mig_instance[int(h[3:])][0]

    def field_values(h: Any, ids: list[int]) -> list[Any]:
        """``cap.fields`` (which a test may change) as NVML's field values, each with its own return."""
        if h != "gpu0" or "fields" in state.unsupported:
            raise err(pynvml.NVML_ERROR_NOT_SUPPORTED if h == "gpu0" else pynvml.NVML_ERROR_INVALID_ARGUMENT)
        state.fault_calls["nvmlDeviceGetFieldValues"] += 1
        names = {getattr(pynvml, n): n for n in dir(pynvml) if n.startswith("NVML_FI_")}
        answer = lambda n: (  # noqa: E731
            state.field_errors.get(n, pynvml.NVML_SUCCESS) if n in cap.fields else pynvml.NVML_ERROR_NOT_SUPPORTED
        )
        return [
            types.SimpleNamespace(
                nvmlReturn=answer(names[i]),
                valueType=pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
                value=types.SimpleNamespace(ullVal=cap.fields.get(names[i], 0)),
            )
            for i in ids
        ]

    def clocks(h: Any) -> int:
        state.fault_calls["nvmlDeviceGetCurrentClocksEventReasons"] += 1
        if state.clocks_error is not None:
            raise err(state.clocks_error)
        if h != "gpu0" or cap.clocks is None:
            raise err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return cap.clocks

    def event_wait(events: Any, timeout_ms: int) -> Any:
        assert events == "xid-events" and timeout_ms == 0  # the source never waits
        if not state.xids:
            raise err(pynvml.NVML_ERROR_TIMEOUT)
        xid = state.xids.pop(0)
        xid, instance = xid if isinstance(xid, tuple) else (xid, 0xFFFFFFFF)  # NVML's "no GPU instance"
        return types.SimpleNamespace(device="gpu0", eventData=xid, gpuInstanceId=instance)

    def register(h: Any, kinds: int, events: Any) -> None:
        if state.xids is None or kinds != pynvml.nvmlEventTypeXidCriticalError:
            raise err(pynvml.NVML_ERROR_NOT_SUPPORTED)

    mod.nvmlDeviceGetFieldValues = field_values
    mod.nvmlDeviceGetCurrentClocksEventReasons = clocks
    mod.nvmlDeviceGetCurrentClocksThrottleReasons = lambda h: (state.fault_calls.update(["throttle"]), cap.clocks)[1]
    mod.nvmlEventSetCreate = lambda: "xid-events"
    mod.nvmlDeviceRegisterEvents = register
    mod.nvmlEventSetWait_v2 = event_wait
    mod.nvmlEventSetFree = lambda events: None

    row = lambda: cap.dmon[state.tick % len(cap.dmon)]  # noqa: E731
    mod.nvmlInit = init
    mod.nvmlShutdown = lambda: None
    mod.nvmlDeviceGetCount = lambda: 1
    mod.nvmlDeviceGetHandleByIndex = lambda i: "gpu0"
    mod.nvmlDeviceGetName = lambda h: cap.name if h == "gpu0" else f"{cap.name} MIG {cap.mig[int(h[3:])][0]}"
    mod.nvmlDeviceGetUUID = lambda h: cap.gpu_uuid if h == "gpu0" else cap.mig[int(h[3:])][1]
    mod.nvmlDeviceGetMigMode = lambda h: (int(state.mig_enabled), int(state.mig_enabled))
    mod.nvmlDeviceGetMaxMigDeviceCount = lambda h: 7
    mod.nvmlDeviceGetMigDeviceHandleByIndex = mig_handle
    mod.nvmlDeviceGetUtilizationRates = lambda h: (
        check(h, "utilization"),
        types.SimpleNamespace(gpu=row()["sm"], memory=row()["mem"]),
    )[1]
    mod.nvmlDeviceGetMemoryInfo = lambda h: (
        check(h, "memory"),
        types.SimpleNamespace(
            total=cap.fb_total_mib << 20, used=cap.fb_used_mib << 20, free=(cap.fb_total_mib - cap.fb_used_mib) << 20
        ),
    )[1]
    mod.nvmlDeviceGetPowerUsage = lambda h: (check(h, "power"), row()["pwr"] * 1000)[1]
    mod.nvmlDeviceGetTemperature = lambda h, sensor: (check(h, "temperature"), row()["gtemp"])[1]
    mod.nvmlDeviceGetPcieThroughput = lambda h, counter: (
        check(h, "pcie"),
        cap.tx_kb_s if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else cap.rx_kb_s,
    )[1]
    mod.nvmlDeviceGetProcessUtilization = process_utilization
    mod.nvmlDeviceGetComputeRunningProcesses = lambda h: [
        types.SimpleNamespace(pid=p, usedGpuMemory=mib << 20)
        for p, mib in cap.apps.items()
        if (h == "gpu0") != state.mig_enabled
        and (h == "gpu0" or cap.mig_processes.get(p) == cap.mig_instance[int(h[3:])])
    ]
    return mod
