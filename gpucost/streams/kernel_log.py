"""The kernels of each GPU's open and recently closed panes (docs/definitions.md, "Kernel cost in the pipeline"): an
event operator over ``kernel_activity`` (``gpucost.streams.operator.EventOperator``), read by the kernel cost split
(``gpucost.streams.kernel_cost``) when a pane closes and again when a revision recomputes it.

Why whole kernels, kept in every pane they touch, rather than sums: overlapping kernels share their overlap
(``gpucost.streams.kernel_split.busy_shares``), which needs every interval of the pane at once, and a late binding
moves a process's kernels from one tenant to another, which only the kernels say. A kernel is judged (late,
duplicate) by its start, like an event at ``ts_ns``, and counted as a call in the pane it starts in. Panes are kept
as long as the revision log keeps its rows (``Revisions``: the horizon past the GPU's watermark), then dropped.

A closed pane that late kernels joined is *pending* until the auditor republishes it (``LateData.settle_kernels``):
the log keeps how many of its kernels it had when last published, so that a run of late kernels (a trace's buffer
replayed after its samples) is one revision of the pane, not one per kernel. A pane's kernels are only ever
appended, so that count marks exactly the kernels published.
"""

from __future__ import annotations

import json
from collections.abc import Container, Iterable
from functools import lru_cache
from heapq import heappop, heappush
from typing import Any, NamedTuple, cast

from gpucost.schemas.kernels import KERNEL_CATEGORIES, KernelActivity
from gpucost.streams.pane_rules import last_pane_ns, pane_start_ns
from gpucost.streams.settings import AuditSettings

__all__ = ["Kernel", "KernelLog", "MAX_PANE_KERNELS", "range_text"]

#: the most kernels a pane keeps of one GPU (about 33,000 a second for a minute's pane): past it a kernel is
#: ``out_of_range``, so that a producer's flood bounds the state rather than the memory
MAX_PANE_KERNELS = 2_000_000


@lru_cache(maxsize=4096)
def range_text(path: tuple[str, ...]) -> str:
    """A range path as the log keeps it and a record carries it: its names as a JSON array, outermost first.
    Remembered for the latest paths: a trace's kernels launch under few paths, each kernel taken and each range
    record asks for its path's text (68,000 JSON encodings in a 72 h replay of the simulated fleet)."""
    return json.dumps(path, ensure_ascii=False)


class Kernel(NamedTuple):
    """One kernel as the log keeps it: names as indices into its GPU's names; ``first``: 1 in the pane it starts in."""

    start_ns: int
    end_ns: int
    pid: int
    node: int
    name: int
    category: int
    stream: int
    correlation_id: int
    first: int
    #: its range path as the code of the path's JSON text among its GPU's paths (``_Codes.code``); -1: none
    path: int = -1


class _Codes:
    """Texts by code, each code counted by the kernel rows kept that use it and free again once none does, so that
    texts that keep coming new (PyTorch's ``ProfilerStep#N`` paths, names of kernels compiled at run time, nodes gone
    from the fleet) do not grow the state with the run's length. The lowest free code is handed out first, so the
    table is as long as the most codes in use at once (a snapshot renumbers them: ``_saved``). ``texts[code]`` is None
    for a free code."""

    __slots__ = ("texts", "index", "uses", "free")

    def __init__(self, texts: Iterable[str | None] = ()) -> None:
        self.texts: list[str | None] = list(texts)
        self.index = {text: at for at, text in enumerate(self.texts) if text is not None}
        self.uses = [0] * len(self.texts)
        self.free = [at for at, text in enumerate(self.texts) if text is None]  # ascending: a heap

    def code(self, text: str) -> int:
        """A text's code: its own, a free one, or a new one."""
        at = self.index.get(text)
        if at is None:
            if not self.free:
                heappush(self.free, len(self.texts))
                self.texts.append(None)
                self.uses.append(0)
            at = heappop(self.free)
            self.texts[at] = text
            self.index[text] = at
        return at

    def drop_unused(self) -> None:
        """Free the codes no kept row uses (a snapshot from before names were freed kept every name ever met)."""
        for at, text in enumerate(self.texts):
            if text is not None and not self.uses[at]:
                del self.index[text]
                self.texts[at] = None
                heappush(self.free, at)

    def release(self, code: int) -> None:
        """A kept row that used ``code`` leaves; the code is free once none uses it."""
        self.uses[code] -= 1
        if not self.uses[code]:
            text = self.texts[code]
            assert text is not None  # a code in use has its text
            del self.index[text]
            self.texts[code] = None
            heappush(self.free, code)


class _GpuKernels:
    __slots__ = ("names", "paths", "panes", "keys", "oldest", "pending", "latest", "billed")

    def __init__(self, names: Iterable[str | None] = (), paths: Iterable[str | None] = ()) -> None:
        #: node ids and kernel names (``Kernel.node``, ``Kernel.name``); range paths' JSON texts (``Kernel.path``)
        self.names, self.paths = _Codes(names), _Codes(paths)
        self.panes: dict[int, list[Kernel]] = {}
        #: (pid, stream, correlation id, start) of every kernel kept: what a kernel sent again is refused by
        self.keys: set[tuple[int, int, int, int]] = set()
        self.oldest: int | None = None  # the earliest pane kept: pruning does nothing until it is passed
        #: closed pane start → how many of its kernels it had when last published (late kernels joined it since)
        self.pending: dict[int, int] = {}
        #: (node code, pid) → pane start → the latest start of the process's kernels kept there: the panes a binding
        #: of the process reaches (``touched_by``), found without a pass over every kernel kept
        self.latest: dict[tuple[int, int], dict[int, int]] = {}
        #: the panes whose kernel lines were published (or whose kernels were counted unbilled at an end of input):
        #: a kernel leaving the log in any other pane it starts in was billed to no one, and is counted so
        self.billed: set[int] = set()

    def add(self, pane: int, kernel: Kernel) -> None:
        self.panes.setdefault(pane, []).append(kernel)
        self.names.uses[kernel.node] += 1
        self.names.uses[kernel.name] += 1
        if kernel.path >= 0:
            self.paths.uses[kernel.path] += 1
        starts = self.latest.setdefault((kernel.node, kernel.pid), {})
        starts[pane] = max(starts.get(pane, kernel.start_ns), kernel.start_ns)

    def release(self, kernel: Kernel) -> None:
        """A kernel row leaves a pane: its codes are free once no kernel kept uses them (``latest``'s node codes
        are of processes with a kernel kept, so in use)."""
        self.names.release(kernel.node)
        self.names.release(kernel.name)
        if kernel.path >= 0:
            self.paths.release(kernel.path)


def _saved(log: _GpuKernels) -> dict[str, Any]:
    """A GPU's log with its codes renumbered in the order the kept kernels first use them: a snapshot holds only the
    texts in use, and the same kernels kept give the same snapshot whatever order codes were freed and handed out in
    (the batch path takes a batch's kernels before its samples prune, the row path in turn)."""
    names: dict[int, int] = {}
    paths: dict[int, int] = {}
    panes = []
    for pane, ks in sorted(log.panes.items()):
        rows = []
        for k in ks:
            node, name = names.setdefault(k.node, len(names)), names.setdefault(k.name, len(names))
            path = -1 if k.path < 0 else paths.setdefault(k.path, len(paths))
            rows.append(list(k._replace(node=node, name=name, path=path)))
        panes.append([pane, rows])
    return {
        "names": [log.names.texts[code] for code in names],
        "paths": [log.paths.texts[code] for code in paths],
        "panes": panes,
        "pending": sorted(log.pending.items()),
        "billed": sorted(log.billed),
    }


class KernelLog:
    """Every GPU's kept kernels, by pane start (``admit``, ``take``, ``to_state``; ``prune`` and ``drop`` as
    ``Revisions``')."""

    def __init__(self, settings: AuditSettings) -> None:
        self.pane_ns = settings.pane_ns
        self.horizon_ns = settings.revision_horizon_ns
        self._gpus: dict[str, _GpuKernels] = {}
        #: the GPUs with a pending pane: what a sample asks of the log, so kept rather than found
        self._pending_gpus: set[str] = set()

    def admit(self, k: KernelActivity) -> str | None:
        """Why a kernel is refused, changing nothing: ``duplicate`` (the same process, stream, correlation id and
        start kept already) or ``out_of_range`` (a pane it touches is full); None: take it. (One longer than an hour
        is not a kernel: ``KernelActivity`` refuses it, so a kernel touches at most 61 panes of a minute.)"""
        log = self._gpus.get(k.gpu_uuid)
        if log is None:
            return None
        if (k.pid, k.stream, k.correlation_id, k.start_ns) in log.keys:
            return "duplicate"
        if any(len(log.panes.get(pane, ())) >= MAX_PANE_KERNELS for pane in self.panes_of(k)):
            return "out_of_range"
        return None

    def panes_of(self, k: KernelActivity) -> range:
        """The starts of the panes a kernel touches: each its interval reaches, or its start's for one of length 0."""
        first = pane_start_ns(k.start_ns, self.pane_ns)
        return range(first, last_pane_ns(k.start_ns, k.end_ns, self.pane_ns) + 1, self.pane_ns)

    def take(self, k: KernelActivity) -> list[int]:
        """Take a kernel ``admit`` let in, into every pane it touches; the starts of those panes, ascending."""
        log = self._gpus.setdefault(k.gpu_uuid, _GpuKernels())
        touched = list(self.panes_of(k))
        start = touched[0]
        node, name, category = log.names.code(k.node_id), log.names.code(k.name), KERNEL_CATEGORIES.index(k.category)
        path = -1 if k.range_path is None else log.paths.code(range_text(k.range_path))
        for pane in touched:
            first = int(pane == start)
            log.add(
                pane, Kernel(k.start_ns, k.end_ns, k.pid, node, name, category, k.stream, k.correlation_id, first, path)
            )
        log.keys.add((k.pid, k.stream, k.correlation_id, k.start_ns))
        log.oldest = start if log.oldest is None else min(log.oldest, start)
        return touched

    def kernels(
        self, gpu_uuid: str, pane_start: int, published: bool = False
    ) -> tuple[list[Kernel], list[str], list[str | None]]:
        """The kernels kept in one pane of a GPU, in arrival order, and the names and range paths their codes index;
        ``published``: only those the pane had when last published (all, unless late kernels joined it since:
        ``hold_back``)."""
        log = self._gpus.get(gpu_uuid)
        if log is None:
            return [], [], []
        kernels = log.panes.get(pane_start, [])
        if published and pane_start in log.pending:
            kernels = kernels[: log.pending[pane_start]]
        return kernels, cast(list[str], log.names.texts), log.paths.texts  # a kept kernel's codes are in use: no None

    def hold_back(self, gpu_uuid: str, pane_start: int) -> None:
        """Mark a closed pane pending before a late kernel joins it: its kernels as they are now are the ones
        published (a pane already pending keeps its mark)."""
        log = self._gpus.setdefault(gpu_uuid, _GpuKernels())
        log.pending.setdefault(pane_start, len(log.panes.get(pane_start, ())))
        self._pending_gpus.add(gpu_uuid)

    def pending(self) -> dict[str, list[int]]:
        """The pending panes' starts of each GPU that has any, ascending: by GPU."""
        return {gpu: sorted(self._gpus[gpu].pending) for gpu in sorted(self._pending_gpus)}

    def is_pending(self, gpu_uuid: str) -> bool:
        return gpu_uuid in self._pending_gpus

    def pending_gpus(self) -> frozenset[str]:
        return frozenset(self._pending_gpus)

    def settle(self, gpu_uuid: str, pane_start: int) -> None:
        """The pane is published with every kernel it keeps: no longer pending."""
        log = self._gpus.get(gpu_uuid)
        if log is not None:
            log.pending.pop(pane_start, None)
            if not log.pending:
                self._pending_gpus.discard(gpu_uuid)

    def touched_by(self, node_id: str, pid: int, ts_ns: int) -> list[tuple[str, int]]:
        """(GPU, pane start) of every kept pane with a kernel of process ``(node_id, pid)`` starting at or after
        ``ts_ns``: the panes whose lines a binding of that time may move, by GPU then pane."""
        out = []
        for gpu, log in sorted(self._gpus.items()):
            node = log.names.index.get(node_id)
            starts = {} if node is None else log.latest.get((node, pid), {})
            out += [(gpu, pane) for pane, latest in sorted(starts.items()) if latest >= ts_ns]
        return out

    def unsampled(
        self, sampled: Container[str], floor_ns: int | None = None, only: Container[str | tuple[str, int]] | None = None
    ) -> int:
        """Drop the kernels of every GPU not in ``sampled`` (one that never sent a sample: with no covered time,
        nothing of it is billed), of those in ``only`` if given, in panes starting before ``floor_ns`` (all: None);
        how many of them were unbilled."""
        gone = 0
        for gpu in [gpu for gpu in sorted(self._gpus) if gpu not in sampled and (only is None or gpu in only)]:
            log = self._gpus[gpu]
            gone += self._cut(log, floor_ns)
            if not log.panes:
                del self._gpus[gpu]
                self._pending_gpus.discard(gpu)
        return gone

    def name_slots(self, gpu_uuid: str) -> int:
        """How long a GPU's table of node ids and kernel names is, free codes included: what its names cost in
        memory, which freeing them bounds by the most in use at once (not by the run's length)."""
        log = self._gpus.get(gpu_uuid)
        return 0 if log is None else len(log.names.texts)

    def gpus(self) -> list[str]:
        """The GPUs with kernels kept."""
        return sorted(self._gpus)

    def latest_starts(self, gpus: Iterable[str]) -> dict[str, int]:
        """The latest start of the kernels kept of each of ``gpus`` that has any."""
        out = {}
        for gpu in gpus:
            log = self._gpus.get(gpu)
            if log is not None and log.latest:
                out[gpu] = max(t for starts in log.latest.values() for t in starts.values())
        return out

    def has(self, gpu_uuid: str, pane_start: int) -> bool:
        log = self._gpus.get(gpu_uuid)
        return log is not None and pane_start in log.panes

    def prune(self, gpu_uuid: str, watermark_ns: int | None) -> int:
        """Forget the GPU's panes that ended more than the horizon before its watermark (``Revisions.prune``); how
        many kernels starting in them were billed to no one (``unbilled``)."""
        log = self._gpus.get(gpu_uuid)
        if log is None or watermark_ns is None:
            return 0
        floor = watermark_ns - self.horizon_ns - self.pane_ns
        if log.oldest is None or log.oldest >= floor:
            return 0
        unbilled = self._cut(log, floor)
        if not log.pending:
            self._pending_gpus.discard(gpu_uuid)
        return unbilled

    @staticmethod
    def _cut(log: _GpuKernels, floor: int | None) -> int:
        """Drop a GPU's panes starting before ``floor`` (all: None); how many kernels starting in them were billed to
        no one (their pane's lines never published)."""
        unbilled = 0
        for pane in [p for p in log.panes if floor is None or p < floor]:
            log.pending.pop(pane, None)  # pending ⊆ kept (the auditor settles a GPU's panes before pruning them)
            billed = pane in log.billed
            log.billed.discard(pane)
            for k in log.panes.pop(pane):
                log.release(k)
                if k.first:
                    unbilled += not billed
                    log.keys.discard((k.pid, k.stream, k.correlation_id, k.start_ns))
        for process in list(log.latest):
            starts = log.latest[process] = {
                p: t for p, t in log.latest[process].items() if floor is not None and p >= floor
            }
            if not starts:
                del log.latest[process]
        log.oldest = min(log.panes, default=None)
        return unbilled

    def mark_billed(self, gpu_uuid: str, pane_start: int) -> None:
        """The pane's kernel lines are published: its kernels are billed (``unbilled``)."""
        log = self._gpus.get(gpu_uuid)
        if log is not None and pane_start in log.panes:
            log.billed.add(pane_start)

    def unbilled(self) -> int:
        """How many kernels kept start in a pane whose lines were never published, each counted once: they are
        marked as counted (an end of input: nothing may bill them now but the same input sent again)."""
        unbilled = 0
        for log in self._gpus.values():
            for pane in log.panes.keys() - log.billed:
                unbilled += sum(k.first for k in log.panes[pane])
                log.billed.add(pane)
        return unbilled

    def drop(self, gpu_uuid: str) -> int:
        """Forget a GPU gone from the fleet (``GpuPanes.forget``); how many of its kernels were billed to no one."""
        log = self._gpus.pop(gpu_uuid, None)
        self._pending_gpus.discard(gpu_uuid)
        return 0 if log is None else self._cut(log, None)

    def to_state(self) -> dict[str, Any]:
        return {gpu: _saved(log) for gpu, log in sorted(self._gpus.items())}

    @classmethod
    def from_state(cls, state: dict[str, Any], settings: AuditSettings) -> KernelLog:
        kernels = cls(settings)
        for gpu, saved in state.items():
            # a version 3 snapshot has no paths; one before version 5 no free name codes
            log = kernels._gpus[gpu] = _GpuKernels(saved["names"], saved.get("paths", []))
            for pane, rows in saved["panes"]:
                for k in (Kernel(*row) for row in rows):  # a version 3 row has no path
                    log.add(pane, k)
                    if k.first:
                        log.keys.add((k.pid, k.stream, k.correlation_id, k.start_ns))
            log.names.drop_unused()
            log.oldest = min(log.panes, default=None)
            log.pending = {pane: n for pane, n in saved.get("pending", [])}  # an older snapshot has none
            log.billed = set(saved.get("billed", log.panes))  # and, unknown, counts none of its kernels unbilled
            if log.pending:
                kernels._pending_gpus.add(gpu)
        return kernels
