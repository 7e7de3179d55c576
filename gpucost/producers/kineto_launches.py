"""The launches of a Kineto trace (``cuda_runtime`` / ``cuda_driver`` events) by correlation id, as columns.

A kernel names its launch by ``args.correlation``. Launches may come before or after their kernels in the file,
one launch may start many kernels (a CUDA graph), and where a correlation id is written twice the last launch
wins, so they are tied only once the file has ended: 32 bytes a launch while reading (correlation, pid, thread,
time as int64), then one stable sort. A launch whose figures do not fit int64 (never within the model's bounds)
is kept aside, whole.
"""

from __future__ import annotations

from array import array
from collections import Counter
from functools import lru_cache

import numpy as np
from pydantic import ValidationError

from gpucost.producers.kernel_table import KernelTable, as_bytes
from gpucost.schemas.bounds import field_bounds
from gpucost.schemas.events import TS_MIN_NS
from gpucost.schemas.kernels import KERNEL_CATEGORIES, KernelActivity, rejection_reason

__all__ = ["Launches"]

_I64 = (-(2**63), 2**63 - 1)
# the trace's category of each KERNEL_CATEGORIES entry, for the reason a kernel is left out
_TRACE_CATEGORY = {"kernel": "kernel", "communication": "kernel", "memcpy": "gpu_memcpy", "memset": "gpu_memset"}

Launch = tuple[int, int, int]  # (pid, thread, launch ns)


def _fits(*values: int) -> bool:
    return all(_I64[0] <= v <= _I64[1] for v in values)


class Launches:
    """Launches by correlation id, the last of an id winning; ``get`` as a dict's, ``tie`` for a whole table."""

    def __init__(self) -> None:
        self.corr, self.pid, self.tid, self.ns = array("q"), array("q"), array("q"), array("q")
        #: correlation ids launched more than once, and of those the ids launched by more than one process: each
        #: kernel of such an id takes the last launch's process, thread and time (a Kineto kernel names no other)
        self.repeated = self.across_processes = 0
        self._wide: dict[int, Launch] = {}  # correlation ids outside int64: no valid kernel names one
        self._odd: dict[int, Launch] = {}  # row → figures outside int64 (its columns hold -1)
        self._keys: np.ndarray | None = None  # distinct correlation ids, ascending
        self._rows: np.ndarray | None = None  # the row of each one's last launch

    def add(self, corr: int, pid: int, tid: int, ns: int) -> None:
        if not _fits(corr):
            self._wide[corr] = (pid, tid, ns)
            return
        self._keys = None
        if not _fits(pid, tid, ns):
            self._odd[len(self.corr)] = (pid, tid, ns)
            pid = tid = ns = -1
        self.corr.append(corr)
        self.pid.append(pid)
        self.tid.append(tid)
        self.ns.append(ns)

    def _rows_of(self, corrs: np.ndarray) -> np.ndarray:
        """The row of each correlation id's last launch, -1 where it has none."""
        if self._keys is None or self._rows is None:
            corr = np.frombuffer(self.corr, dtype=np.int64) if self.corr else np.zeros(0, dtype=np.int64)
            order = np.argsort(corr, kind="stable")
            ordered = corr[order]
            last = np.ones(len(ordered), dtype=bool)
            last[:-1] = ordered[1:] != ordered[:-1]
            self._keys, self._rows = ordered[last], order[last]
            self._count_repeats(order, ordered, last)
            del corr, order, ordered, last
            self.corr = array("q")  # no more launches come: the ids are in _keys
        if not len(self._keys):
            return np.full(len(corrs), -1, dtype=np.int64)
        at = np.searchsorted(self._keys, corrs)
        np.minimum(at, len(self._keys) - 1, out=at)
        return np.where(self._keys[at] == corrs, self._rows[at], -1)

    def _count_repeats(self, order: np.ndarray, ordered: np.ndarray, last: np.ndarray) -> None:
        """``repeated`` and ``across_processes`` from the launches sorted by id: each pair of launches of one id next
        to each other, their pids compared (as the launches hold them where a figure was past int64)."""
        i = np.flatnonzero(~last[:-1])  # ordered[i] == ordered[i + 1]
        a, b = order[i], order[i + 1]
        pids = np.frombuffer(self.pid, dtype=np.int64)
        differ = pids[a] != pids[b]
        if self._odd:
            odd = np.array(list(self._odd), dtype=np.int64)
            for k in np.flatnonzero(np.isin(a, odd) | np.isin(b, odd)).tolist():
                differ[k] = self._launch(int(a[k]))[0] != self._launch(int(b[k]))[0]
        self.repeated = len(np.unique(ordered[i]))
        self.across_processes = len(np.unique(ordered[i][differ]))

    def _launch(self, row: int) -> Launch:
        return self._odd.get(row) or (int(self.pid[row]), int(self.tid[row]), int(self.ns[row]))

    def get(self, corr: int, default: tuple) -> tuple:
        """As ``dict.get``: the last launch of ``corr`` as (pid, thread, ns), or ``default``."""
        if not _fits(corr):
            return self._wide.get(corr, default)
        row = int(self._rows_of(np.array([corr], dtype=np.int64))[0])
        return default if row < 0 else self._launch(row)

    def note_repeats(self, rejected: Counter) -> None:
        """Count, as notes (the kernels are kept), the correlation ids launched more than once and those launched by
        more than one process: a kernel of such an id takes the last launch's process, thread and time."""
        self._rows_of(np.zeros(0, dtype=np.int64))
        if self.repeated:
            rejected["cuda_runtime: correlation ids launched more than once (a kernel takes the last launch)"] += (
                self.repeated
            )
        if self.across_processes:
            rejected["cuda_runtime: correlation ids launched by more than one process (a kernel takes the last's)"] += (
                self.across_processes
            )

    def tie(self, kernels: KernelTable, rejected: Counter) -> None:
        """Set the pid and launch columns of kernels appended without them: each kernel's launch (pid, thread,
        time; pid 0 and -1 without one). Then take out, counted by the model's reason, the kernels whose launch
        fails the model's bounds."""
        if not len(kernels):
            return
        rows = self._rows_of(kernels.column("correlation"))
        found = rows >= 0
        at = np.where(found, rows, 0)
        columns = {}
        for name, launch_col, missing in (
            ("pid", self.pid, 0),
            ("launch_tid", self.tid, -1),
            ("launch_ns", self.ns, -1),
        ):
            values = np.frombuffer(launch_col, dtype=np.int64) if launch_col else np.zeros(1, dtype=np.int64)
            columns[name] = np.where(found, values[at], missing)
        del at
        ok = np.ones(len(rows), dtype=bool)
        for name, values in columns.items():
            ok &= field_bounds(KernelActivity, name).holds(values)
        ok |= ~found
        for name in list(columns):
            kernels_col = array("q")
            kernels_col.frombytes(as_bytes(columns.pop(name)))
            setattr(kernels, name, kernels_col)
        if ok.all():
            return
        category = kernels.column("category")
        for i in np.flatnonzero(~ok).tolist():
            reason = _reason(self._launch(int(rows[i])))
            rejected[f"{_TRACE_CATEGORY[KERNEL_CATEGORIES[category[i]]]}: {reason}"] += 1
        del category
        kernels.keep(ok)


@lru_cache(maxsize=1024)
def _reason(launch: Launch) -> str:
    """Why a kernel with this launch fails, as the model says: its own fields passed, so only the launch's can
    fail, and a kernel of valid fields with this launch fails the same way."""
    pid, tid, ns = launch
    try:
        KernelActivity(
            node_id="n",
            pid=pid,
            gpu_uuid="n/0",
            device=0,
            stream=0,
            correlation_id=0,
            category="kernel",
            name="k",
            start_ns=TS_MIN_NS,
            end_ns=TS_MIN_NS,
            launch_tid=tid,
            launch_ns=ns,
            source="kineto",
        )
    except ValidationError as exc:
        return rejection_reason(exc)
    raise AssertionError(f"launch {launch} is within the model's bounds")  # the bounds of ``tie`` disagree
