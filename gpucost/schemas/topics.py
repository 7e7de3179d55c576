"""The Kafka topic contract: names, keys, value encoding, cleanup, and the control header.

Inputs travel in batches, all of one message for the message's key: its value is JSON Lines, one event per
line (the same encoding as the files ``gpucost replay`` reads), or, with the header ``ENCODING_HEADER`` set to
``ARROW_IPC``, one Arrow record batch of the events' columns (``gpucost.schemas.ipc``).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "TopicSpec",
    "topic_specs",
    "CONTROL_HEADER",
    "CLOSED",
    "END_OF_INPUT",
    "SEQUENCE_HEADER",
    "ENCODING_HEADER",
    "ARROW_IPC",
    "encode_batch",
    "output_key",
]

#: a message with this header and an empty value is a control message, not data
CONTROL_HEADER = "gpucost-control"
#: "this key's finite input is complete": close every pane and window it holds
END_OF_INPUT = b"end-of-input"
#: the control value of a closed marker on the cost topic: "every record of panes ending at or before
#: ``final_through_ns`` from this input partition is published, and none will be revised"
#: (``gpucost.kafka.closing``; docs/definitions.md, "When a bill is final")
CLOSED = b"closed"
#: ``<producer session>:<n>``, n = 1, 2, … per key and session: a message the broker holds twice (a
#: re-send after an unanswered attempt, a spool sent again) is applied once
SEQUENCE_HEADER = "gpucost-seq"
#: how an input message's value is encoded: absent, JSON Lines; ``ARROW_IPC``, an Arrow IPC stream
ENCODING_HEADER = "gpucost-encoding"
ARROW_IPC = b"arrow-ipc"


@dataclass(frozen=True)
class TopicSpec:
    suffix: str
    key: str
    value: str
    compacted: bool = False
    single_partition: bool = False
    #: an output topic: kept ``output_retention_days`` (``KafkaSettings``), not the broker's default 7 days,
    #: so that a billing consumer offline for a week still finds every record
    output: bool = False


_SPECS = (
    TopicSpec(
        "events",
        "gpu_uuid",
        "JSON Lines or Arrow IPC: gpu_sample, process_sample, numa_event, ebpf_trace and allocation of that GPU, and a "
        "copy of each tenant_binding of the GPU's node and each price, in the order the producer saw them",
    ),
    TopicSpec("mem_access", "node_id/pid", "JSON Lines or Arrow IPC: mem_access of that process, in arrival order"),
    TopicSpec("bindings", "node_id/pid/ts_ns", "one tenant_binding (the durable record)", compacted=True),
    TopicSpec("prices", "gpu_model/ts_ns", "one price (the durable record)", compacted=True, single_partition=True),
    TopicSpec("idle_index", "gpu_uuid", "one IdleIndexRecord as JSON", output=True),
    TopicSpec("mae", "node_id/pid", "one MaeRecord as JSON", output=True),
    TopicSpec("cost", "gpu_uuid", "one CostRecord as JSON: what billing systems consume", output=True),
    TopicSpec(
        "allocation",
        "gpu_uuid",
        "one AllocationRecord as JSON: a party's share of a pane's cost by what it held (the allocation basis)",
        output=True,
    ),
    TopicSpec(
        "health", "gpu_uuid", "one HealthRecord as JSON: a GPU's audit window, grade and breaker state", output=True
    ),
    TopicSpec("quota", "gpu_uuid", "one QuotaRecord as JSON: a tenant's quota scale on a GPU, per pane", output=True),
    TopicSpec(
        "reclaim",
        "gpu_uuid",
        "one ReclaimRecord as JSON: an idle tenant's GPU may be reclaimed (act once per trigger_id)",
        output=True,
    ),
    TopicSpec(
        "efficiency",
        "gpu_uuid",
        "one EfficiencyRecord as JSON: a GPU's (pid 0) or a process's EFU, ΔBW and diagnosis, per pane",
        output=True,
    ),
    TopicSpec(
        "kernel_cost",
        "gpu_uuid",
        "one KernelCostRecord as JSON: a tenant's pane cost split over its kernels, and its no_kernel line",
        output=True,
    ),
    TopicSpec(
        "range_cost",
        "gpu_uuid",
        "one RangeCostRecord as JSON: a tenant's kernel cost of a pane by the range path its kernels were launched in",
        output=True,
    ),
    TopicSpec(
        "discovery",
        "node_id",
        "the node's service-discovery entry as JSON (written by gpucost discovery)",
        compacted=True,
    ),
    TopicSpec("dlq", "gpu_uuid, node_id/pid or source", "one DeadLetter as JSON", output=True),
    TopicSpec(
        "state.events", "gpu_uuid", "the worker's committed Auditor state of that GPU (null: finished)", compacted=True
    ),
    TopicSpec(
        "state.mem_access", "node_id/pid", "the worker's committed Auditor state of that process", compacted=True
    ),
)


def topic_specs() -> tuple[TopicSpec, ...]:
    return _SPECS


def encode_batch(lines: list[str]) -> bytes:
    return "\n".join(lines).encode()


def output_key(record: object) -> bytes:
    """Key of an output record: GPU-keyed records by GPU, MAE by process, dead letters by origin."""
    gpu = getattr(record, "gpu_uuid", None)
    if gpu:
        return str(gpu).encode()
    pid = getattr(record, "pid", None)
    if pid is not None:
        return f"{record.node_id}/{pid}".encode()  # type: ignore[attr-defined]
    return str(getattr(record, "source", "")).encode()
