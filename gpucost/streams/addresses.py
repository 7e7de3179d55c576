"""Each process's addresses taken lately, which an address sent again is checked against (re-sent input).

MAE windows count a process's addresses in arrival order, with no pane to close and no watermark, so nothing
else says that an address came before: without this, the same input sent twice filled every window twice.
Per process ``(node_id, pid)`` it keeps the latest ``ts_ns`` taken and every ``(ts_ns, address)`` taken within
``keep_ns`` of it: the allowed lateness, not the revision horizon, because MAE windows are never revised (like
an ``ebpf_trace``, an address later than the lateness has nothing to revise), and because keeping the horizon's
6 h of addresses made a busy process's state megabytes, rewritten at every Kafka poll. An address identical to
one kept is a ``duplicate``; one further back than ``keep_ns`` cannot be told from input sent again and is
``late``; any other is taken, whatever order it came in (a tick delayed by the network is not refused). State
per process: the addresses of ``keep_ns`` of its time (at 50 addresses/s and 120 s, 6,000 pairs, ~0.2 MiB of
JSON).
"""

from __future__ import annotations

from collections.abc import Container
from typing import Any

import numpy as np

__all__ = ["DUPLICATE", "LATE", "TakenAddresses"]

#: ``TakenAddresses.verdicts_many``'s codes (0: taken)
DUPLICATE, LATE = 1, 2


class _Process:
    __slots__ = ("latest", "taken", "kept_at_prune")

    def __init__(self, latest: int) -> None:
        self.latest = latest
        self.taken: set[tuple[int, int]] = set()
        self.kept_at_prune = 0


class TakenAddresses:
    """A row entry (``verdict``, ``take``) and a batch entry (``verdicts_many``) over one state."""

    def __init__(self, keep_ns: int) -> None:
        self.keep_ns = keep_ns
        self._by_proc: dict[tuple[str, int], _Process] = {}

    def latest(self, key: tuple[str, int]) -> int | None:
        """The latest ``ts_ns`` taken of the process (what a ``late`` address's dead letter names)."""
        proc = self._by_proc.get(key)
        return None if proc is None else proc.latest

    def verdict(self, key: tuple[str, int], ts_ns: int, address: int) -> str | None:
        """``duplicate``, ``late`` or None (taken: call ``take``)."""
        proc = self._by_proc.get(key)
        if proc is None:
            return None
        if ts_ns < proc.latest - self.keep_ns:
            return "late"
        return "duplicate" if (ts_ns, address) in proc.taken else None

    def take(self, key: tuple[str, int], ts_ns: int, address: int) -> None:
        proc = self._by_proc.get(key)
        if proc is None:
            proc = self._by_proc[key] = _Process(ts_ns)
        proc.taken.add((ts_ns, address))
        if ts_ns > proc.latest:
            proc.latest = ts_ns
        self._prune(proc)

    def verdicts_many(
        self, key: tuple[str, int], ts_ns: np.ndarray, address: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """The batch entry: one process's addresses in arrival order, each judged and the taken ones taken, as
        ``verdict`` then ``take`` of each would. Returns each one's code (0 taken, ``DUPLICATE``, ``LATE``) and
        the latest time taken before it (for a ``late`` one's dead letter). The usual batch, its times rising
        past the process's latest, is taken at once."""
        proc = self._by_proc.get(key)
        codes = np.zeros(len(ts_ns), np.int8)
        latest = np.zeros(len(ts_ns), np.int64)
        if not len(ts_ns):
            return codes, latest
        times, addresses = ts_ns.tolist(), address.tolist()
        if (proc is None or times[0] > proc.latest) and bool(np.all(ts_ns[1:] > ts_ns[:-1])):
            if proc is None:
                proc = self._by_proc[key] = _Process(times[0])
            proc.taken.update(zip(times, addresses))
            proc.latest = times[-1]
            self._prune(proc)
            return codes, latest
        for i, (ts, addr) in enumerate(zip(times, addresses)):
            latest[i] = -1 if proc is None else proc.latest
            why = self.verdict(key, ts, addr)
            if why is None:
                self.take(key, ts, addr)
                proc = self._by_proc[key]
            else:
                codes[i] = DUPLICATE if why == "duplicate" else LATE
        return codes, latest

    def _prune(self, proc: _Process) -> None:
        """Drop what lies further back than ``keep_ns``, once the set has doubled since it was last pruned (so
        pruning costs O(1) per address taken)."""
        if len(proc.taken) < 2 * proc.kept_at_prune + 64:
            return
        floor = proc.latest - self.keep_ns
        proc.taken = {t for t in proc.taken if t[0] >= floor}
        proc.kept_at_prune = len(proc.taken)

    def forget(
        self, floor_ns: int, keep: Container[tuple[str, int]], only: Container[str | tuple[str, int]] | None = None
    ) -> None:
        """Drop the processes (of those in ``only``, if given; never those in ``keep``, with an open window) whose
        latest address is before ``floor_ns``: the state keeps no process it will not hear from again."""
        gone = [
            key
            for key, proc in self._by_proc.items()
            if proc.latest < floor_ns and key not in keep and (only is None or key in only)
        ]
        for key in gone:
            del self._by_proc[key]

    def to_state(self) -> list[Any]:
        out = []
        for (node, pid), proc in self._by_proc.items():
            floor = proc.latest - self.keep_ns
            out.append([node, pid, proc.latest, sorted([ts, a] for ts, a in proc.taken if ts >= floor)])
        return out

    @classmethod
    def from_state(cls, state: list[Any], keep_ns: int) -> TakenAddresses:
        table = cls(keep_ns)
        for node, pid, latest, taken in state:
            proc = table._by_proc[(node, pid)] = _Process(latest)
            proc.taken = {(ts, a) for ts, a in taken}
            proc.kept_at_prune = len(proc.taken)
        return table
