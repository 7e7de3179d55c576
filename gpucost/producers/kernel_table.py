"""Kernels and host ranges as columns: what ``gpucost kernels`` needs of each event, and nothing more.

A validated ``KernelActivity`` costs about 1.5 KiB of Python objects; a row here is 8-byte integers in
``array``/numpy columns (about 75 bytes a kernel, 36 a range), with names and nodes interned, so a trace of
millions of kernels fits where its models would not (BENCHMARKS.md, "Kineto reader memory"). Rows are only
ever appended; ``-1`` stands for "not known" in the optional columns (launch thread and time, bytes), none of
which can be negative when known (their bounds are ``ge=0`` or later than 2000).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from typing import Self, get_args

import numpy as np

from gpucost.schemas.gemm import Precision
from gpucost.schemas.kernels import KERNEL_CATEGORIES, AnnotationRange, KernelActivity

__all__ = ["KernelTable", "OperatorTable", "PRECISION_CODES", "RangeTable", "as_bytes"]

_CATEGORY = {c: i for i, c in enumerate(KERNEL_CATEGORIES)}
#: an operator's precision as its column's code (-1: not known)
PRECISION_CODES = {p: i for i, p in enumerate(get_args(Precision))}


def as_bytes(values: np.ndarray) -> np.ndarray:
    """A numpy column as the bytes ``array.frombytes`` takes, without a copy where it is contiguous."""
    return np.ascontiguousarray(values).view(np.uint8)


class _Interned:
    """Strings once each, rows as their indices."""

    def __init__(self) -> None:
        self.values: list[str] = []
        self._index: dict[str, int] = {}

    def index(self, value: str) -> int:
        i = self._index.get(value)
        if i is None:
            i = self._index[value] = len(self.values)
            self.values.append(value)
        return i


class _Table:
    """Columns appended row by row; ``COLUMNS`` names them, ``name`` and ``node`` are interned."""

    COLUMNS: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.nodes, self.names = _Interned(), _Interned()

    def __len__(self) -> int:
        return len(self.column("start_ns"))

    def column(self, name: str) -> np.ndarray:
        """A column as numpy, sharing the array's memory (no copy); valid until the next append."""
        col: array = getattr(self, name)
        return np.frombuffer(col, dtype=col.typecode) if len(col) else np.zeros(0, dtype=col.typecode)

    def keep(self, mask: np.ndarray) -> None:
        """Drop the rows where ``mask`` is False, in place."""
        for name in self.COLUMNS:
            kept = array(getattr(self, name).typecode)
            kept.frombytes(as_bytes(self.column(name)[mask]))
            setattr(self, name, kept)

    def extend(self, other: _Table) -> None:
        """Append another table's rows, its names and nodes re-interned."""
        names = np.array([self.names.index(n) for n in other.names.values] or [0], dtype=np.int32)
        nodes = np.array([self.nodes.index(n) for n in other.nodes.values] or [0], dtype=np.int32)
        for name in self.COLUMNS:
            values = other.column(name)
            if name in ("name", "node"):
                values = (names if name == "name" else nodes)[values]
            getattr(self, name).frombytes(as_bytes(values.astype(getattr(self, name).typecode)))


class KernelTable(_Table):
    """One row per kernel, memcpy or memset: node, device, category, name, GPU start/end (epoch ns), the
    launching process, thread and time (``launch_*``, -1 unknown), bytes (-1 unknown), correlation id and stream
    (which ``gpucost trace-events`` writes: with the correlation id it keys a launch in the pipeline)."""

    COLUMNS = ("node", "device", "category", "name", "start_ns", "end_ns", "pid", "launch_tid", "launch_ns")
    COLUMNS += ("bytes", "correlation", "stream")

    def __init__(self) -> None:
        super().__init__()
        self.node, self.device, self.category, self.name = array("i"), array("h"), array("b"), array("i")
        self.start_ns, self.end_ns, self.pid = array("q"), array("q"), array("q")
        self.launch_tid, self.launch_ns, self.bytes, self.correlation = array("q"), array("q"), array("q"), array("q")
        self.stream = array("q")

    def append(self, k: KernelActivity, launch: bool = True) -> None:
        """One validated kernel's row (its fields are within their bounds, so each fits its column); with
        ``launch`` False its pid and launch columns are left to be set whole later (``kineto_launches``)."""
        self.node.append(self.nodes.index(k.node_id))
        self.device.append(k.device)
        self.category.append(_CATEGORY[k.category])
        self.name.append(self.names.index(k.name))
        self.start_ns.append(k.start_ns)
        self.end_ns.append(k.end_ns)
        if launch:
            self.pid.append(k.pid)
            self.launch_tid.append(-1 if k.launch_tid is None else k.launch_tid)
            self.launch_ns.append(-1 if k.launch_ns is None else k.launch_ns)
        self.bytes.append(-1 if k.bytes is None else k.bytes)
        self.correlation.append(k.correlation_id)
        self.stream.append(k.stream)

    @classmethod
    def of(cls, kernels: Iterable[KernelActivity]) -> KernelTable:
        table = cls()
        for k in kernels:
            table.append(k)
        return table


class RangeTable(_Table):
    """One row per host range: node, pid, thread, name, start/end (epoch ns)."""

    COLUMNS = ("node", "pid", "tid", "name", "start_ns", "end_ns")

    def __init__(self) -> None:
        super().__init__()
        self.node, self.name = array("i"), array("i")
        self.pid, self.tid, self.start_ns, self.end_ns = array("q"), array("q"), array("q"), array("q")

    def append(self, r: AnnotationRange) -> None:
        self.node.append(self.nodes.index(r.node_id))
        self.pid.append(r.pid)
        self.tid.append(r.tid)
        self.name.append(self.names.index(r.name))
        self.start_ns.append(r.start_ns)
        self.end_ns.append(r.end_ns)

    @classmethod
    def of(cls, ranges: Iterable[AnnotationRange]) -> Self:
        table = cls()
        for r in ranges:
            table.append(r)
        return table


class OperatorTable(RangeTable):
    """A host range table of PyTorch operators, with each call's work where its shapes give it
    (``gpucost.schemas.gemm``): FLOPs, least bytes moved, precision code (``PRECISION_CODES``); -1 not known.
    Apart from ``RangeTable`` so that ranges, which never have work, do not carry 17 bytes of -1 each."""

    COLUMNS = RangeTable.COLUMNS + ("flops", "bytes", "precision")

    def __init__(self) -> None:
        super().__init__()
        self.flops, self.bytes, self.precision = array("q"), array("q"), array("b")

    def append(self, r: AnnotationRange) -> None:
        super().append(r)
        self.flops.append(-1 if r.flops is None else r.flops)
        self.bytes.append(-1 if r.bytes is None else r.bytes)
        self.precision.append(-1 if r.precision is None else PRECISION_CODES[r.precision])
