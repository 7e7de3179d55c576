"""The profiler trace files a command reads (``gpucost kernels``, ``gpucost trace-events``): each file's kind from
its first bytes, its tables, and a file that cannot be read turned into a usage error that says why."""

from __future__ import annotations

from collections import Counter
from decimal import DecimalException
from pathlib import Path
from typing import Literal

from gpucost.producers.kernel_table import KernelTable, OperatorTable, RangeTable
from gpucost.producers.kineto import read_kineto
from gpucost.producers.nsys import read_nsys
from gpucost.wiring import UsageError

__all__ = ["Tables", "read_readable", "read_trace", "read_traces", "trace_labels", "trace_source"]

#: one file's kernels, ranges, operators, GPU models by (node, device) and rejects by reason
Tables = tuple[KernelTable, RangeTable, OperatorTable, dict, Counter]


def trace_source(path: Path) -> Literal["kineto", "nsys"]:
    """A file's kind from its first bytes: an SQLite database is an Nsight Systems export, anything else is read as
    a Kineto trace (whose reader refuses JSON that is no trace)."""
    with path.open("rb") as f:
        magic = f.read(16)
    return "nsys" if magic.startswith(b"SQLite format 3") else "kineto"


def read_trace(path: Path, node: str | None = None) -> Tables:
    """One file's tables; the node is ``node`` or the file's name. Nsight Systems exports have no PyTorch
    operators: their table is empty."""
    node = node or path.name
    if trace_source(path) == "nsys":
        t = read_nsys(path, node)
        models = {(node, d): m for d, m in t.gpu_models.items()}
        return t.kernels, t.ranges, OperatorTable(), models, t.rejected
    k = read_kineto(path, node)
    return k.kernels, k.ranges, k.operators, {(node, d): m for d, m in k.gpu_models.items()}, k.rejected


def read_readable(path: Path, node: str) -> Tables:
    """``read_trace``, a file that is neither format (or one no reader can hold) being a usage error that says why
    in one line, with no traceback."""
    try:
        return read_trace(path, node)
    except Exception as exc:  # noqa: BLE001 — whatever a reader raised, the user is told what and where
        why = " ".join(str(exc).split()).removesuffix(" (right here) ------^")  # one line: ijson draws a caret
        if isinstance(exc, DecimalException):  # its text is a list of decimal's internal classes
            why = "a number too large for any reader (an exponent past what a decimal holds)"
        raise UsageError(
            f"{path}: cannot be read as a Kineto trace or nsys SQLite export ({type(exc).__name__}: {why})"
        ) from None


def read_traces(paths: list[Path]) -> Tables:
    """Each file's tables as one set (the first file's taken as they are, not copied), each file's node its label
    (``trace_labels``), and its rejects prefixed with it."""
    kernels, ranges, operators, models, rejected = KernelTable(), RangeTable(), OperatorTable(), {}, Counter()
    for path, label in zip(paths, trace_labels(paths)):
        k, r, o, m, bad = read_readable(path, label)
        if len(kernels) or len(ranges) or len(operators):
            kernels.extend(k)
            ranges.extend(r)
            operators.extend(o)
        else:
            kernels, ranges, operators = k, r, o
        del k, r, o
        models |= m
        rejected.update({f"{label}: {reason}": n for reason, n in bad.items()})
    return kernels, ranges, operators, models, rejected


def trace_labels(paths: list[Path]) -> list[str]:
    """Each file's label: its name, or the path as given where two files share a name (in ``gpucost kernels`` the
    label is the file's node, and two runs' ``trace.json`` would otherwise be one device). A folder, a missing
    file and the same file twice (its kernels would count twice) are refused."""
    seen: dict[Path, Path] = {}
    for path in paths:
        if path.is_dir():
            raise UsageError(f"{path} is a folder: give the trace files in it, such as {path}/*.json.gz")
        if not path.is_file():
            raise UsageError(f"{path}: no such file; give Kineto JSON traces or nsys SQLite exports")
        if (same := seen.get(path.resolve())) is not None:
            raise UsageError(f"{path} is {same} given again: each file once, or its kernels count twice")
        seen[path.resolve()] = path
    names = Counter(p.name for p in paths)
    return [p.name if names[p.name] == 1 else str(p) for p in paths]
