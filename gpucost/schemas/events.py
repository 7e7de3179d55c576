"""Input events: one pydantic model per kind of docs/definitions.md ("Inputs and what is refused"), fields
named as on the wire.

Validation rejects what cannot be true, with a reason a person can act on. Values that
feed money are also exposed normalised to integers (``interval_ms``, ``*_cp`` = hundredths
of a percent), computed once per event from the wire text (see ``gpucost.schemas.exact``).
"""

from __future__ import annotations

from decimal import Decimal
from functools import cached_property
from typing import Annotated, Any, Literal, get_args

from pydantic import AfterValidator, Field, field_validator, model_validator

from gpucost.schemas.ebpf import TraceEvent, decode_trace_event, encode_trace_event
from gpucost.schemas.event_base import TS_MAX_NS, TS_MIN_NS, Ident, Pid, TsNs, WireEvent
from gpucost.schemas.exact import round_scaled
from gpucost.schemas.kernels import KernelActivity
from gpucost.schemas.labels import Labels
from gpucost.schemas.names import RESERVED_SKELETONS, RESERVED_TEAMS, skeleton
from gpucost.schemas.partitions import whole_device

__all__ = [
    "TS_MIN_NS",
    "TS_MAX_NS",
    "MAX_USD_PER_GPU_HOUR",
    "RESERVED_TEAMS",
    "BLANK_TENANT_FIELDS",
    "TENANT_FIELDS",
    "GpuSample",
    "ProcessSample",
    "MemAccess",
    "NumaEvent",
    "TRACE_SOURCES",
    "EbpfTrace",
    "skeleton",
    "Sla",
    "SLAS",
    "Origin",
    "TenantBinding",
    "Price",
    "six_places",
    "SHARING_MODES",
    "Allocation",
    "Event",
    "EVENT_MODELS",
    "GPU_KEYED",
    "ON_GPU_KEY",
]

Pct = Annotated[float, Field(ge=0, le=100, allow_inf_nan=False)]
IntervalS = Annotated[float, Field(gt=0, le=3600, allow_inf_nan=False)]
NonNegBytes = Annotated[int, Field(ge=0, lt=2**63)]
#: faults of one sample: at most one per fault field of a device (``gpucost.schemas.devices.FAULT_FIELDS``)
#: the most faults of one kind a sample may carry (a sample's faults are far fewer: one per fault field)
FAULT_COUNT_MAX = 64
FaultCount = Annotated[int, Field(ge=0, le=FAULT_COUNT_MAX)]


class _Sample(WireEvent):
    node_id: Ident
    gpu_uuid: Ident
    ts_ns: TsNs
    interval_s: IntervalS
    sm_util_pct: Pct
    mem_bw_util_pct: Pct
    mem_used_bytes: NonNegBytes

    @model_validator(mode="after")
    def _interval_not_zero(self) -> _Sample:
        if self.interval_ms == 0:
            raise ValueError(f"interval_s {self.interval_s} rounds to 0 ms; it must be ≥ 0.001 s")
        return self

    @cached_property
    def interval_ms(self) -> int:
        return round_scaled(self.interval_s, 1000)

    @cached_property
    def sm_util_cp(self) -> int:
        return round_scaled(self.sm_util_pct, 100)

    @cached_property
    def mem_bw_util_cp(self) -> int:
        return round_scaled(self.mem_bw_util_pct, 100)


class GpuSample(_Sample):
    kind: Literal["gpu_sample"] = "gpu_sample"
    gpu_model: Ident
    mem_total_bytes: NonNegBytes
    power_w: Annotated[float, Field(ge=0, le=10_000, allow_inf_nan=False)]
    temp_c: Annotated[float, Field(ge=-60, le=200, allow_inf_nan=False)]
    pcie_tx_bytes_s: NonNegBytes | None = None
    pcie_rx_bytes_s: NonNegBytes | None = None
    #: from DCGM profiling or NVML GPM where the GPU has them: the share of time the tensor pipes, and the
    #: DRAM interface, were active (docs/definitions.md, "Efficiency: EFU, ΔBW, diagnosis"; read by the
    #: efficiency operators, not the bill)
    tensor_active_pct: Pct | None = None
    dram_active_pct: Pct | None = None
    #: the device faults new in this sample (docs/definitions.md, "Device faults"), as the producer classified
    #: them with ``gpucost.schemas.faults`` against the device's previous sample: how many fail its health
    #: window and how many only warn. None: the source reports no fault fields (never "no faults", which is 0);
    #: the producer writes both or neither. Read by the health audit, never by the bill.
    fault_fatal: FaultCount | None = None
    fault_warning: FaultCount | None = None
    #: True: ``power_w`` is not a reading but the platform table's TDP (a tool that reports no power for a part
    #: whose row gives a TDP), so the health audit's energy and kW/TOPS over this sample are estimates and its
    #: record says so (docs/definitions.md, "Health audit"). Absent or False: the device's own reading.
    power_estimated: bool | None = None

    @cached_property
    def tensor_active_cp(self) -> int | None:
        """``tensor_active_pct`` in hundredths of a percent, rounded once (None: not measured)."""
        return None if self.tensor_active_pct is None else round_scaled(self.tensor_active_pct, 100)

    @cached_property
    def dram_active_cp(self) -> int | None:
        return None if self.dram_active_pct is None else round_scaled(self.dram_active_pct, 100)

    @cached_property
    def power_mw(self) -> int:
        """``power_w`` in integer milliwatts, rounded once, half-even from its decimal text (the health
        audit's energy is exact in µJ from here on)."""
        return round_scaled(self.power_w, 1000)

    @model_validator(mode="after")
    def _used_within_total(self) -> GpuSample:
        if self.mem_used_bytes > self.mem_total_bytes:
            raise ValueError(f"mem_used_bytes {self.mem_used_bytes} exceeds mem_total_bytes {self.mem_total_bytes}")
        return self


class ProcessSample(_Sample):
    kind: Literal["process_sample"] = "process_sample"
    pid: Pid


class MemAccess(WireEvent):
    kind: Literal["mem_access"] = "mem_access"
    node_id: Ident
    pid: Pid
    ts_ns: TsNs
    address: Annotated[int, Field(ge=0, lt=2**64)]


class NumaEvent(WireEvent):
    kind: Literal["numa_event"] = "numa_event"
    node_id: Ident
    gpu_uuid: Ident
    pid: Pid
    ts_ns: TsNs
    hops: Annotated[int, Field(ge=0, le=64)]
    latency_weight: Annotated[int, Field(ge=0, lt=2**32)]


#: what an ``ebpf_trace``'s ``flops_64b`` counts: threads launched (``launch``, the kernel-launch probe) or
#: the floating-point operations of one BLAS call (``blas``, the cuBLAS uprobes); only ``blas`` enters EFU
TRACE_SOURCES = ("launch", "blas")


class EbpfTrace(WireEvent):
    """The 40-byte ``trace_event``; on the wire as ``trace_hex`` (80 hex digits) plus ``node_id``, and
    ``trace_source`` outside the struct (its layout is the seed's; absent means ``launch``)."""

    kind: Literal["ebpf_trace"] = "ebpf_trace"
    node_id: Ident
    pid: Pid
    gpu_uuid: Ident
    ts_ns: TsNs
    sm_util_pct: Annotated[int, Field(ge=0, le=100)]
    flops_64b: Annotated[int, Field(ge=0, lt=2**64)]
    trace_source: Literal["launch", "blas"] = "launch"

    @model_validator(mode="before")
    @classmethod
    def _decode(cls, data: Any) -> Any:
        if isinstance(data, dict) and "trace_hex" in data:
            raw = data["trace_hex"]
            if not isinstance(raw, str):
                raise ValueError("trace_hex must be a string of 80 hex digits")
            try:
                blob = bytes.fromhex(raw)
            except ValueError as exc:
                raise ValueError(f"trace_hex is not hex: {exc}") from None
            ev = decode_trace_event(blob)
            return {
                "kind": data.get("kind", "ebpf_trace"),
                "node_id": data.get("node_id"),
                "pid": ev.pid,
                "gpu_uuid": ev.gpu_uuid,
                "ts_ns": ev.timestamp_ns,
                "sm_util_pct": ev.sm_util_pct,
                "flops_64b": ev.flops_64b,
                **({"trace_source": data["trace_source"]} if "trace_source" in data else {}),
            }
        return data

    def to_wire(self) -> dict[str, Any]:
        blob = encode_trace_event(TraceEvent(self.pid, self.gpu_uuid, self.ts_ns, self.sm_util_pct, self.flops_64b))
        return {
            "kind": self.kind,
            "node_id": self.node_id,
            "trace_hex": blob.hex(),
            **({"trace_source": self.trace_source} if self.trace_source != "launch" else {}),
        }


TenantField = Annotated[str, Field(max_length=256)]
Sla = Literal["Gold", "Silver", "Bronze"]
SLAS: tuple[str, ...] = get_args(Sla)
#: where a binding was found (``gpucost.producers.attribution``, ``.kubernetes``, ``.dcgm``, ``.hami``); a binding
#: without one was given (a file, another system)
Origin = Literal["environ", "slurm", "kubernetes", "dcgm", "hami"]


def _no_separator(value: str | None) -> str | None:
    """A tenant field of a binding or an allocation: ``:`` would break the tenant key apart."""
    if value is not None and ":" in value:
        raise ValueError("must not contain ':' (it separates the parts of a tenant key)")
    return value


def _not_reserved(value: str) -> str:
    """A team of a binding or an allocation: never one of the pipeline's own parties, nor one that reads as one."""
    if skeleton(value) in RESERVED_SKELETONS:
        raise ValueError(
            f"team {value!r} reads as a name reserved for the pipeline's own records "
            f"({', '.join(sorted(RESERVED_TEAMS))}); choose another"
        )
    return value


class TenantBinding(WireEvent):
    kind: Literal["tenant_binding"] = "tenant_binding"
    node_id: Ident
    pid: Pid
    ts_ns: TsNs
    team: Annotated[str, Field(min_length=1, max_length=256)]
    env: TenantField
    app: TenantField
    tier: TenantField
    sla: Sla
    git_commit: TenantField | None = None
    ci_pipeline_id: TenantField | None = None
    labels: Labels = None
    origin: Origin | None = None

    _no_separator = field_validator("team", "env", "app", "tier", "git_commit", "ci_pipeline_id")(_no_separator)
    _not_reserved = field_validator("team")(_not_reserved)


#: what a binding says of a process, in order: the tenant's fields, which cost records repeat after
#: their ``tenant_key`` (the rest of a binding says which process, from when, and where it was found)
TENANT_FIELDS: tuple[str, ...] = tuple(
    f for f in TenantBinding.model_fields if f not in ("kind", "node_id", "pid", "ts_ns", "origin")
)
#: the tenant fields a binding always carries as text, ``""`` where its source has none (``env``, ``app``, ``tier``):
#: a tenant named without one (an allocation's field left out) has ``""`` there, and every other field not given is
#: None, ``""`` included (docs/definitions.md, "Tenants and prices"), so one tenant key is one tenant
BLANK_TENANT_FIELDS: tuple[str, ...] = tuple(
    f
    for f in TENANT_FIELDS
    if TenantBinding.model_fields[f].is_required()
    and TenantBinding.model_fields[f].annotation is str
    and not any(getattr(m, "min_length", None) for m in TenantBinding.model_fields[f].metadata)
)


#: a price at or past this many dollars a GPU hour is no price (a typo of units): refused wherever one is given
MAX_USD_PER_GPU_HOUR = 10**9
_MICRO = Decimal("0.000001")


def six_places(usd: Decimal) -> Decimal:
    """A price (≥ 0) as its six decimals (``3.5`` → ``3.500000``, ``-0`` → ``0.000000``), the one form every input
    encoding, Parquet and a restored state give it: equal prices then read and publish alike, whether they came as
    JSON text, as an Arrow decimal (which has no negative zero) or from a state written before this rule."""
    return usd.quantize(_MICRO).copy_abs()


class Price(WireEvent):
    kind: Literal["price"] = "price"
    gpu_model: Annotated[Ident, AfterValidator(whole_device)]  # a partition pays its share of its device's price
    ts_ns: TsNs
    usd_per_gpu_hour: Annotated[
        Decimal,
        Field(ge=0, lt=MAX_USD_PER_GPU_HOUR, decimal_places=6, strict=False, allow_inf_nan=False),
        AfterValidator(six_places),
    ]
    #: the price authority's key and HMAC (``gpucost.streams.scope.price_mac``): a worker with a keyring takes
    #: only prices signed by a key that may sign prices, whichever node's producer relays them
    key_id: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    signature: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] | None = None


#: how a device is shared (docs/definitions.md, "Allocation basis"): the whole device, a MIG instance (itself a device
#: of the fleet, held whole), a CUDA MPS active-thread percentage, a Kubernetes time-slicing replica, a HAMi vGPU
Sharing = Literal["exclusive", "mig", "mps", "time_slicing", "hami"]
SHARING_MODES: tuple[str, ...] = get_args(Sharing)
Fraction_ = Annotated[int, Field(ge=1, le=1_000_000)]


class Allocation(WireEvent):
    """A tenant's hold on a device, or on a fraction of one, from ``ts_ns`` until ``end_ts_ns`` (None: still held):
    what a scheduler granted (a pod's devices from the kubelet's pod-resources API, a Slurm ``gres``), whether or
    not anything ran. The allocation basis splits each pane's cost by these (``gpucost.streams.allocations``).

    One ``allocation_id`` per hold on a device: sent again with ``end_ts_ns`` set when it ends; anything else about
    it (start, fraction, tenant) is fixed at its first event. ``fraction_num / fraction_den`` of the device: 1 for
    a whole device or a MIG instance, an MPS percentage over 100, ``1 / replicas`` for time-slicing, HAMi's
    ``gpucores`` over 100."""

    kind: Literal["allocation"] = "allocation"
    node_id: Ident
    gpu_uuid: Ident
    allocation_id: Ident
    ts_ns: TsNs
    end_ts_ns: TsNs | None = None
    sharing: Sharing = "exclusive"
    fraction_num: Fraction_ = 1
    fraction_den: Fraction_ = 1
    team: Annotated[str, Field(min_length=1, max_length=256)]
    env: TenantField | None = None
    app: TenantField | None = None
    tier: TenantField | None = None
    sla: Sla | None = None
    git_commit: TenantField | None = None
    ci_pipeline_id: TenantField | None = None
    labels: Labels = None
    origin: Literal["kubernetes", "slurm"] | None = None

    _no_separator = field_validator("team", "env", "app", "tier", "git_commit", "ci_pipeline_id")(_no_separator)
    _not_reserved = field_validator("team")(_not_reserved)

    @model_validator(mode="after")
    def _a_hold(self) -> Allocation:
        if self.end_ts_ns is not None and self.end_ts_ns <= self.ts_ns:
            raise ValueError(f"end_ts_ns {self.end_ts_ns} must be after ts_ns {self.ts_ns} (the hold's start)")
        if self.fraction_num > self.fraction_den:
            raise ValueError(
                f"fraction {self.fraction_num}/{self.fraction_den} is more than the whole device; "
                "an allocation holds at most one device (send one allocation per device)"
            )
        if self.sharing in ("exclusive", "mig") and self.fraction_num != self.fraction_den:
            raise ValueError(
                f"sharing {self.sharing!r} holds the whole device (a MIG instance is a device of its own), not "
                f"{self.fraction_num}/{self.fraction_den}: send the fraction with mps, time_slicing or hami"
            )
        return self


Event = (
    GpuSample | ProcessSample | MemAccess | NumaEvent | EbpfTrace | TenantBinding | Price | Allocation | KernelActivity
)
EVENT_MODELS: dict[str, type[WireEvent]] = {
    m.model_fields["kind"].default: m
    for m in (
        GpuSample,
        ProcessSample,
        MemAccess,
        NumaEvent,
        EbpfTrace,
        TenantBinding,
        Price,
        Allocation,
        KernelActivity,
    )
}
#: kinds whose events advance their GPU's watermark (docs/definitions.md, "Time, panes and watermarks")
GPU_KEYED = (GpuSample, ProcessSample, NumaEvent)
#: kinds that travel under their GPU's key (the events topic's ``gpu_uuid``), each in a message of that GPU alone
ON_GPU_KEY = (*GPU_KEYED, EbpfTrace, Allocation, KernelActivity)
