"""The work of a PyTorch GEMM operator call from its recorded shapes: FLOPs, the fewest bytes it must move, and
its precision (docs/definitions.md, "Kernel cost", "Work and EFU per operator").

Read from the ``Input Dims`` and ``Input type`` a Kineto trace writes for a ``cpu_op`` when the profiler ran with
``record_shapes=True``. Only the four operators that are one GEMM (``aten::mm``, ``aten::addmm``, ``aten::bmm``,
``aten::baddbmm``) are counted: ``aten::linear`` and ``aten::matmul`` call one of them, so counting them too would
count one product twice; a convolution's work depends on its algorithm and is not guessed. FLOPs are ``2·m·n·k``
(times the batch), the rule the cuBLAS probe's ``flops_64b`` follows (docs/definitions.md, "Efficiency"): the
bias's additions of ``addmm`` are not counted. Bytes are the operands read and the result written once each
(``m·k + k·n + m·n``, the bias as given, times the element size): the least any kernel moves, so the arithmetic
intensity is the most the call can have.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Literal

__all__ = ["GEMM_OPS", "PRECISIONS", "Precision", "Work", "gemm_work"]

Precision = Literal["fp64", "fp32", "fp16", "bf16"]
#: Kineto's ``Input type`` of a tensor → the platform table's precision key and the element's bytes
PRECISIONS: dict[str, tuple[Precision, int]] = {
    "double": ("fp64", 8),
    "float": ("fp32", 4),
    "c10::Half": ("fp16", 2),
    "c10::BFloat16": ("bf16", 2),
}
#: the operators counted, each with the place of its first matrix among its inputs (after the bias, if any)
GEMM_OPS = {"aten::mm": 0, "aten::bmm": 0, "aten::addmm": 1, "aten::baddbmm": 1}
_MAX = 2**63  # a figure past int64 is no shape a GPU ran: the call is not counted


@dataclass(frozen=True)
class Work:
    """One operator call's FLOPs, least bytes moved, and precision."""

    flops: int
    bytes: int
    precision: Precision


def gemm_work(op: str, dims: object, types: object) -> Work | None:
    """The work of one call of ``op`` from its ``Input Dims`` and ``Input type``; None where ``op`` is no GEMM
    counted here or its shapes are not a product's (another number of inputs, a wrong rank, inner sizes that
    differ, operand and bias types that differ or are no float type listed in ``PRECISIONS``), never a guess."""
    at = GEMM_OPS.get(op)
    # mm and bmm take two tensors; addmm and baddbmm a bias and two, then beta and alpha where recorded
    if at is None or not isinstance(dims, list) or not isinstance(types, list) or len(types) != len(dims):
        return None
    if len(dims) not in ((3, 5) if at else (2,)):
        return None
    a, b = dims[at], dims[at + 1]
    batched = op.endswith("bmm")
    rank = 3 if batched else 2
    if not (_shape(a, rank) and _shape(b, rank) and types[at] == types[at + 1] == types[0]):
        return None
    if at and not _shape(dims[0], len(dims[0]) if isinstance(dims[0], list) else -1):
        return None
    kind = PRECISIONS.get(types[at]) if isinstance(types[at], str) else None
    if kind is None:
        return None
    batch, (m, k), (k2, n) = (a[0] if batched else 1), a[-2:], b[-2:]
    if k != k2 or (batched and b[0] != batch):
        return None
    bias = prod(dims[0]) if at else 0
    flops = 2 * batch * m * n * k
    moved = (batch * (m * k + k * n + m * n) + bias) * kind[1]
    if flops >= _MAX or moved >= _MAX:
        return None
    return Work(flops, moved, kind[0])


def _shape(dims: object, rank: int) -> bool:
    """Whether ``dims`` is a list of ``rank`` sizes (non-negative integers, no bool)."""
    return (
        isinstance(dims, list)
        and len(dims) == rank
        and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in dims)
    )
