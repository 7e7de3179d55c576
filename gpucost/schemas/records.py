"""Output records of docs/definitions.md, field for field, plus the dead-letter record."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from decimal import Decimal
from hashlib import blake2b
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from gpucost.schemas.computed import computed, computed_from

__all__ = [
    "IdleIndexRecord",
    "MaeRecord",
    "CostRecord",
    "HealthRecord",
    "QuotaRecord",
    "ReclaimRecord",
    "trigger_id",
    "EfficiencyRecord",
    "DIAGNOSES",
    "GRADES",
    "FAIL_REASONS",
    "UNHASHED",
    "UNHASHED_IF_NONE",
    "DeadLetter",
    "OUTPUT_KINDS",
    "Output",
    "kind_of",
    "record_id",
    "record_ids",
    "IDLE_TENANT",
    "UNALLOCATED_TENANT",
    "AllocationRecord",
    "KernelCostRecord",
    "RangeCostRecord",
    "Wide",
    "Duration",
    "computed",
    "computed_from",
]

IDLE_TENANT = "idle"
#: the allocation basis's party for the capacity no allocation held (docs/definitions.md, "Allocation basis")
UNALLOCATED_TENANT = "unallocated"
#: every integer column is a Parquet int64: a record from an output topic with a larger one (2^70 µ$, say)
#: is not a record of its kind, and the sink dead-letters it rather than dying on it at every restart
Int64 = Annotated[int, Field(ge=-(1 << 63), lt=1 << 63)]


class Wide:
    """Marks an integer field that may pass 64 bits (a sum of products over a pane): stored as a
    DECIMAL(38, 0) column (``gpucost.schemas.arrow``), exact to 10^38."""


#: an exact non-negative integer of up to 38 digits
WideInt = Annotated[int, Field(ge=0, lt=10**38), Wide]


class Duration:
    """Marks a ``…_ns`` field that is a length of time, not an event time (which every other ``…_ns`` field is)."""


#: a length of time in integer ns (a kernel line's busy time)
DurationNs = Annotated[int, Field(ge=0, lt=1 << 63), Duration]


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True)


class IdleIndexRecord(_Record):
    gpu_uuid: str
    node_id: str
    gpu_model: str
    pane_start_ns: Int64
    pane_end_ns: Int64
    idle_ms: Int64
    covered_ms: Int64
    idle_ms_72h: Int64
    covered_ms_72h: Int64
    idle_index_72h: float
    #: 0 when first published; a late event within the revision horizon re-publishes the pane with its
    #: revision number (docs/definitions.md, "Late data become revisions")
    revision: Int64


class MaeRecord(_Record):
    node_id: str
    pid: Int64
    first_ts_ns: Int64
    last_ts_ns: Int64
    n: Int64
    out_of_range: Int64
    mae_bits: float
    l2_evictions_per_1k_est: float


class _PaneParty(_Record):
    """The fields a party's record of a pane begins with, on either basis: which pane, which party (its tenant's
    fields, in ``TENANT_FIELDS``' order), and the record's id."""

    record_id: str
    gpu_uuid: str
    node_id: str
    gpu_model: str
    pane_start_ns: Int64
    pane_end_ns: Int64
    tenant_key: str
    team: str
    env: str | None
    app: str | None
    tier: str | None
    sla: str | None
    git_commit: str | None
    ci_pipeline_id: str | None
    #: the tenant's labels as canonical JSON text (an object of strings; docs/definitions.md, "Labels"), None
    #: where it carries none: ``json_each(labels)`` in DuckDB, the view ``cost_by_label``
    labels: str | None = None


class CostRecord(_PaneParty):
    t_share: float
    b_share: float
    l_share: float
    weight: float
    busy_fraction: float
    usd_per_gpu_hour: Decimal | None
    pane_cost_micro_usd: Int64
    cost_micro_usd: Int64
    unpriced: bool
    revision: Int64
    #: the exact integers the split was made of (docs/definitions.md, "What-if bills"): the tenant's
    #: Σ sm_util_cp · interval_ms, Σ mem_bw_util_cp · interval_ms and Σ hops · latency_weight (0 for idle), the
    #: pane's Σ sm_util_cp · interval_ms over all its process samples, and its covered time: a bill under other
    #: prices, weights or idle policy is recomputed from these alone, to the µ$
    t_num: WideInt
    b_num: WideInt
    l_num: WideInt
    busy_num: WideInt
    covered_ms: Int64


class AllocationRecord(_PaneParty):
    """One party's share of a pane's cost on the allocation basis (docs/definitions.md, "Allocation basis"): the
    same pane cost as its usage records, split by what each tenant held of the device instead of what it used.
    A table of its own, never mixed into ``cost``: a sum over either table is one bill, counted once.

    ``allocated_num / capacity_num`` is the party's mean fraction of the device over the pane (exact integers:
    Σ fraction × held ns, over the allocations' common denominator; the ``unallocated`` party holds the rest);
    ``allocated_share`` its share of the pane's cost, ``allocated_num`` over the larger of ``capacity_num`` and Σ held
    (an oversubscribed device splits by what is held)."""

    sharing: str | None
    allocations: Int64
    allocated_share: float
    allocated_fraction: float
    usd_per_gpu_hour: Decimal | None
    pane_cost_micro_usd: Int64
    cost_micro_usd: Int64
    unpriced: bool
    revision: Int64
    cost_basis: str
    allocated_num: WideInt
    capacity_num: WideInt
    covered_ms: Int64


class KernelCostRecord(_PaneParty):
    """One line of a tenant's pane cost split over its kernels (docs/definitions.md, "Kernel cost in the pipeline"):
    a kernel name of one category, or the ``no_kernel`` line (``category`` and ``kernel`` both ``no_kernel``: the
    covered time none of its kernels ran in). A tenant's lines of a pane sum to ``tenant_cost_micro_usd``, its usage
    record's µ$, in every revision; ``busy_ns`` is its exact share of the time (overlap split equally), dealt in ns."""

    kernel: str
    category: str
    calls: Int64
    busy_ns: DurationNs
    covered_ns: DurationNs
    usd_per_gpu_hour: Decimal | None
    tenant_cost_micro_usd: Int64
    cost_micro_usd: Int64
    unpriced: bool
    revision: Int64


class RangeCostRecord(_PaneParty):
    """One range path's part of a tenant's kernel cost of a pane (docs/definitions.md, "Range cost in the pipeline"):
    the tenant's kernels launched inside the range (inside ranges nested in it too), by the path each kernel carries.
    ``range_path`` is the path as a JSON array of names, outermost first; a path's figures include its children's,
    which sum to no more than it (the rest is its own kernels'), and the outermost ranges to no more than
    ``tenant_kernel_cost_micro_usd``, the tenant's kernel lines' µ$ (all but ``no_kernel``), in every revision."""

    range_path: str
    range_name: str
    depth: Int64
    calls: Int64
    busy_ns: DurationNs
    covered_ns: DurationNs
    usd_per_gpu_hour: Decimal | None
    tenant_kernel_cost_micro_usd: Int64
    cost_micro_usd: Int64
    unpriced: bool
    revision: Int64


class HealthRecord(_Record):
    """One GPU's health audit window (docs/definitions.md, "Health audit"): its figures, grade, audit verdict and
    breaker state after it, with a hash of all that and, with an audit key, the hash's signature."""

    gpu_uuid: str
    node_id: str
    gpu_model: str
    window_start_ns: Int64
    window_end_ns: Int64
    covered_ms: Int64
    idle_ms: Int64
    energy_uj: Int64
    mean_power_w: float
    effective_tops: float
    kw_per_tops: float | None  # None: no busy time, nothing to grade on efficiency
    sched_deviation: float
    idle_index_72h: float
    coverage: float
    grade: str  # one of GRADES
    entitlement: float
    passed: bool
    fail_reasons: list[str]  # of FAIL_REASONS, in that order
    #: device faults new in the window's GPU samples (docs/definitions.md, "Health audit"): fatal ones fail it
    #: (``device_fault``), warnings are counted; None: no sample of the window reported fault fields. None by
    #: default, and then out of the seal (``UNHASHED_IF_NONE``): a record or message written before them still reads
    #: and verifies
    faults_fatal: Int64 | None = None
    faults_warning: Int64 | None = None
    #: the covered ms of the window whose power is the platform table's TDP, not a reading (the GPU samples'
    #: ``power_estimated``): that much of ``energy_uj``, ``mean_power_w`` and ``kw_per_tops`` is an estimate.
    #: None: every sample's power was read (and out of the seal, as the fault fields)
    power_estimated_ms: Int64 | None = None
    windows_skipped: Int64
    breaker_state: str  # probation, in_service, observation or removed
    snapshot_sha256: str
    signature: str | None


class EfficiencyRecord(_Record):
    """Operator-level efficiency of one GPU pane (``pid`` 0) or of one process with BLAS traces on it
    (docs/definitions.md, "Efficiency: EFU, ΔBW, diagnosis"). ``flops`` is the exact sum rounded once to a
    float (it can pass 2^63); ``covered_ms`` and ``peak_tops`` are what ``efu`` was taken against, so that a
    view can turn it into effective TFLOP-hours (``unit_cost``)."""

    gpu_uuid: str
    node_id: str
    gpu_model: str
    pane_start_ns: Int64
    pid: Int64
    flops: float
    efu: float | None
    efu_source: str | None  # flops, tensor_active, or None
    bw_util: float
    delta_bw: float
    bw_source: str  # dram_active or mem_bw_util
    diagnosis: str  # one of DIAGNOSES
    covered_ms: Int64
    peak_tops: float


class QuotaRecord(_Record):
    """A tenant's quota scale on a GPU for one pane (docs/definitions.md, "SLA tiers")."""

    gpu_uuid: str
    pane_start_ns: Int64
    tenant_key: str
    team: str
    sla: str
    util_pct: float
    idle_run_ms: Int64
    quota_scale: float


class ReclaimRecord(_Record):
    """A tenant idle on a GPU for its tier's duration: the GPU may be reclaimed by ``deadline_ns``.
    ``trigger_id`` (a hash of GPU, tenant key and run start) names the trigger for whoever acts on it,
    so that acting twice on one trigger can be refused. ``held``: whether the tenant held an allocation on the
    GPU in the trigger pane (a scheduler's hold: reserved idle, what a reclaim frees; false: it was judged on its
    processes alone); None only in a record written before the field."""

    trigger_id: str
    gpu_uuid: str
    node_id: str
    gpu_model: str
    tenant_key: str
    team: str
    env: str | None
    app: str | None
    tier: str | None
    sla: str
    run_start_ns: Int64
    trigger_ns: Int64
    idle_run_ms: Int64
    deadline_ns: Int64
    usd_per_gpu_hour: Decimal | None
    held: bool | None = None  # last, and None by default: a reclaim message or file written before it still reads
    #: the tenant's labels (docs/definitions.md, "Labels"), so that whoever acts on a trigger finds the namespace or
    #: pod without parsing the tenant key; None without labels, and in a record written before the field
    labels: str | None = None


GRADES = ("excellent", "good", "needs_optimisation", "idle")
DIAGNOSES = ("idle", "compute_bound", "memory_bound", "latency_bound")
FAIL_REASONS = ("grade", "sched_deviation", "coverage", "device_fault")
#: what the snapshot hash leaves out: itself, and the signature of it
UNHASHED = ("snapshot_sha256", "signature")
#: fields added to the health record after its first version, which the snapshot hash leaves out while they are
#: None: a record written before them (which has none) hashes as it did then, and so does a new one that reports
#: nothing in them; set, they are hashed like any figure. A field added later that may be None joins this list.
UNHASHED_IF_NONE = ("faults_fatal", "faults_warning", "power_estimated_ms")


class DeadLetter(_Record):
    """An input the pipeline could not use: why, and the raw text to fix and replay it."""

    reason: str  # one of gpucost.schemas.codec.REASONS
    detail: str
    kind: str | None
    source: str
    raw: str
    ts_ns: Int64 | None
    gpu_uuid: str | None


#: output kind (= folder under the output directory and DuckDB view) → record model
OUTPUT_KINDS: dict[str, type[_Record]] = {
    "idle_index": IdleIndexRecord,
    "mae": MaeRecord,
    "cost": CostRecord,
    "allocation": AllocationRecord,
    "health": HealthRecord,
    "quota": QuotaRecord,
    "reclaim": ReclaimRecord,
    "efficiency": EfficiencyRecord,
    "kernel_cost": KernelCostRecord,
    "range_cost": RangeCostRecord,
    "dlq": DeadLetter,
}
_KIND_BY_TYPE: dict[type[BaseModel], str] = {m: k for k, m in OUTPUT_KINDS.items()}
#: one record the pipeline publishes
Output = (
    IdleIndexRecord
    | MaeRecord
    | CostRecord
    | AllocationRecord
    | HealthRecord
    | QuotaRecord
    | ReclaimRecord
    | EfficiencyRecord
    | KernelCostRecord
    | RangeCostRecord
    | DeadLetter
)


def kind_of(record: BaseModel) -> str:
    """The output kind of a record: its topic suffix, folder and view."""
    return _KIND_BY_TYPE[type(record)]


def record_id(gpu_uuid: str, pane_start_ns: int, tenant_key: str, revision: int, basis: str = "usage") -> str:
    """Deterministic id, so a consumer recognises a record it has already seen."""
    return record_ids([(gpu_uuid, pane_start_ns)], [0], [tenant_key], revision, basis)[0]


def record_ids(
    panes: Sequence[tuple[str, int]],
    pane_of: Iterable[int],
    tenant_keys: Sequence[str],
    revision: int,
    basis: str = "usage",
) -> list[str]:
    """``record_id`` of each (GPU and pane start ``panes[pane_of[i]]``, ``tenant_keys[i]``): the text
    hashed is built once per pane and once per key, not per record. A basis other than ``usage`` is hashed too
    (a tenant's allocation record of a pane is not its usage record); usage ids are as they always were."""
    heads = [f"{gpu_uuid}\x1f{pane_start_ns}\x1f".encode() for gpu_uuid, pane_start_ns in panes]
    suffix = "" if basis == "usage" else f"\x1f{basis}"
    tails = {key: f"{key}\x1f{revision}{suffix}".encode() for key in set(tenant_keys)}
    return [blake2b(heads[j] + tails[key], digest_size=16).hexdigest() for j, key in zip(pane_of, tenant_keys)]


def trigger_id(gpu_uuid: str, tenant_key: str, run_start_ns: int) -> str:
    """A reclaim trigger's id: the same idle run gives the same id on every path and every replay."""
    return blake2b(f"{gpu_uuid}\x1f{tenant_key}\x1f{run_start_ns}".encode(), digest_size=16).hexdigest()
