"""Kernel and range events: what a GPU ran (``kernel_activity``) and what the host had open when it launched
it (``annotation_range``). One wire format for every source (Kineto traces, Nsight Systems exports, a live
CUPTI collector); see docs/definitions.md, section "Kernel cost"."""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import ConfigDict, Field, ValidationError, model_validator

from gpucost.schemas.event_base import Ident, Pid, TsNs, WireEvent
from gpucost.schemas.gemm import Precision

__all__ = [
    "KERNEL_CATEGORIES",
    "MAX_KERNEL_NS",
    "MAX_RANGE_DEPTH",
    "NAME_MAX_CHARS",
    "KernelActivity",
    "AnnotationRange",
    "rejection_reason",
]

KERNEL_CATEGORIES = ("kernel", "memcpy", "memset", "communication")
NAME_MAX_CHARS = 1024  # a longer name is truncated by the reader, and counted there
Name = Annotated[str, Field(min_length=1, max_length=NAME_MAX_CHARS)]
Count = Annotated[int, Field(ge=0, lt=2**63)]
_Dim = Annotated[int, Field(ge=0, lt=2**32, strict=True)]
#: three integers; a JSON array on the wire, so a list is taken (strict mode takes only a tuple), each item strictly
Dim3 = Annotated[tuple[_Dim, _Dim, _Dim], Field(strict=False)]
Source = Literal["cupti", "kineto", "nsys"]
#: the deepest range path a kernel carries: a deeper stack is cut to its outermost levels by the reader
MAX_RANGE_DEPTH = 32
#: the names of the ranges open on the launching thread at the launch, outermost first (a JSON array on the wire)
RangePath = Annotated[tuple[Name, ...], Field(min_length=1, max_length=MAX_RANGE_DEPTH, strict=False)]


class _Timed(WireEvent):
    model_config = ConfigDict(frozen=True, strict=True, extra="forbid")
    node_id: Ident
    pid: Pid
    name: Name
    start_ns: TsNs
    end_ns: TsNs
    source: Source | None = None

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.end_ns < self.start_ns:
            raise ValueError(
                f"end_ns {self.end_ns} is before start_ns {self.start_ns}: the source's clock or "
                "its export is broken; re-export the trace"
            )
        return self

    @property
    def ts_ns(self) -> int:
        """The event time the audit keys it by (its pane, its lateness): its start."""
        return self.start_ns


#: the longest kernel, copy or set taken: one longer is a broken clock or export (a hung kernel, an hour on the GPU,
#: has stopped the job anyway), and the pipeline keeps a kernel in every pane it touches
MAX_KERNEL_NS = 3_600 * 10**9


class KernelActivity(_Timed):
    """One kernel, memcpy or memset on one stream of one GPU, in epoch ns."""

    kind: Literal["kernel_activity"] = "kernel_activity"
    gpu_uuid: Ident
    device: Annotated[int, Field(ge=0, lt=1024)]
    stream: Count
    correlation_id: Count
    category: Literal["kernel", "memcpy", "memset", "communication"]
    launch_tid: Count | None = None
    launch_ns: TsNs | None = None
    grid: Dim3 | None = None
    block: Dim3 | None = None
    registers_per_thread: Count | None = None
    shared_memory_bytes: Count | None = None
    bytes: Count | None = None
    #: the ranges (NVTX, ``record_function``) open on ``launch_tid`` at ``launch_ns``, outermost first, resolved by
    #: the source that saw them (docs/definitions.md, "Range cost in the pipeline"); None: none open, or not known
    range_path: RangePath | None = None

    @model_validator(mode="after")
    def _not_too_long(self) -> Self:
        if self.end_ns - self.start_ns > MAX_KERNEL_NS:
            raise ValueError(
                f"a kernel of {self.end_ns - self.start_ns} ns, longer than an hour ({MAX_KERNEL_NS} ns): the "
                "source's clock or its export is broken; re-export the trace"
            )
        return self


class AnnotationRange(_Timed):
    """A range open on one host thread (NVTX push/pop or start/end, torch ``record_function``); ranges of one
    (node, pid, tid) nest by time, so nesting is derived, not sent."""

    kind: Literal["annotation_range"] = "annotation_range"
    tid: Count
    domain: Ident
    #: a PyTorch GEMM operator's work from its recorded shapes (``gpucost.schemas.gemm``); None where not known
    flops: Count | None = None
    bytes: Count | None = None
    precision: Precision | None = None


def rejection_reason(exc: Exception) -> str:
    """Why a source's event was left out, in a line a person can act on (the key of a rejects counter)."""
    if isinstance(exc, KeyError):
        return f"missing field {exc.args[0]!r}"
    if isinstance(exc, ValidationError):
        return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:2])
    return str(exc) or type(exc).__name__
