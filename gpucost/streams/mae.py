"""Memory-access entropy per process over tumbling windows of W addresses.

State per process is the histogram of the current window only (its non-empty bins), so
memory is bounded by min(W, B) counts per live process, and the addresses it took lately, which
re-sent input is checked against (``gpucost.streams.addresses``).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Container, Iterable, Sequence
from typing import Any

import numpy as np

from gpucost.schemas.events import MemAccess
from gpucost.schemas.records import MaeRecord, computed
from gpucost.streams.addresses import TakenAddresses
from gpucost.streams.settings import AuditSettings

__all__ = ["entropy_bits", "l2_estimate", "Mae"]


def entropy_bits(counts: Iterable[int]) -> float:
    """Shannon entropy in bits of a histogram; 0 for an empty one."""
    cs = [c for c in counts if c]
    n = sum(cs)
    if n == 0:
        return 0.0
    return max(0.0, -math.fsum(c / n * math.log2(c / n) for c in cs))


def l2_estimate(mae_bits: float, table: Sequence[tuple[float, float]]) -> float:
    """Piecewise-linear interpolation of the calibration table, clamped at both ends."""
    xs = [x for x, _ in table]
    if mae_bits <= xs[0]:
        return table[0][1]
    if mae_bits >= xs[-1]:
        return table[-1][1]
    i = bisect_right(xs, mae_bits)
    (x0, y0), (x1, y1) = table[i - 1], table[i]
    return y0 + (y1 - y0) * (mae_bits - x0) / (x1 - x0)


class _Window:
    __slots__ = ("counts", "taken", "out_of_range", "first_ts_ns", "last_ts_ns")

    def __init__(self, first_ts_ns: int) -> None:
        self.counts: dict[int, int] = {}
        self.taken = 0
        self.out_of_range = 0
        self.first_ts_ns = first_ts_ns
        self.last_ts_ns = first_ts_ns


class Mae:
    """Addresses of each ``(node_id, pid)`` in arrival order, cut every W addresses.

    An address sent again is refused (``admit``, ``gpucost.streams.addresses``) before it reaches a window: two
    sends of an input give the windows of one."""

    def __init__(self, settings: AuditSettings) -> None:
        self.window = settings.mae_window
        self.bins = settings.mae_bins
        self.lo = settings.mae_lo
        self.span = settings.mae_hi - settings.mae_lo
        self.table = settings.l2_calibration
        self._open: dict[tuple[str, int], _Window] = {}
        self.taken = TakenAddresses(settings.lateness_ns)

    def _window_of(self, key: tuple[str, int], first_ts_ns: int) -> _Window:
        """The process's open window, opened at ``first_ts_ns`` if it has none."""
        win = self._open.get(key)
        if win is None:
            win = self._open[key] = _Window(first_ts_ns)
        return win

    def _complete(self, key: tuple[str, int]) -> MaeRecord:
        """Close the process's full window."""
        return self._record(key, self._open.pop(key))

    def admit(self, ev: MemAccess) -> str | None:
        """Why the address may not be counted (``duplicate``, ``late``: ``TakenAddresses.verdict``), or None."""
        return self.taken.verdict((ev.node_id, ev.pid), ev.ts_ns, ev.address)

    def take(self, ev: MemAccess) -> MaeRecord | None:
        """The row entry: one address that ``admit`` let in; the window's record if it completed it."""
        key = (ev.node_id, ev.pid)
        self.taken.take(key, ev.ts_ns, ev.address)
        win = self._window_of(key, ev.ts_ns)
        offset = ev.address - self.lo
        if 0 <= offset < self.span:
            b = offset * self.bins // self.span
            win.counts[b] = win.counts.get(b, 0) + 1
        else:
            win.out_of_range += 1
        win.taken += 1
        win.last_ts_ns = ev.ts_ns
        return self._complete(key) if win.taken == self.window else None

    def bins_of(self, address: np.ndarray) -> np.ndarray:
        """The bin of each address (uint64), -1 out of range: ``take``'s binning, over a column."""
        lo, span = self.lo, self.span
        inside = (
            address >= np.uint64(lo)
            if lo + span >= 1 << 64
            else ((address >= np.uint64(lo)) & (address < np.uint64(lo + span)))
        )
        bins = np.full(len(address), -1, np.int64)
        if span * self.bins < 1 << 64:
            offset = address[inside] - np.uint64(lo)
            bins[inside] = (offset * np.uint64(self.bins) // np.uint64(span)).astype(np.int64)
        else:  # the product would wrap in 64 bits
            bins[inside] = [(int(a) - lo) * self.bins // span for a in address[inside].tolist()]
        return bins

    def take_many(self, key: tuple[str, int], ts_ns: np.ndarray, bins: np.ndarray) -> list[tuple[int, MaeRecord]]:
        """The batch entry: one process's addresses in arrival order that ``TakenAddresses.verdicts_many`` took,
        as their times and ``bins_of``. Returns each completed window's record with the position of the address
        that completed it: the records ``take`` would return, address by address."""
        out, pos = [], 0
        while pos < len(bins):
            window = self._window_of(key, int(ts_ns[pos]))
            take = min(len(bins) - pos, self.window - window.taken)
            part = bins[pos : pos + take]
            values, counts = np.unique(part[part >= 0], return_counts=True)
            for b, c in zip(values.tolist(), counts.tolist()):
                window.counts[b] = window.counts.get(b, 0) + c
            window.out_of_range += int(np.count_nonzero(part < 0))
            window.taken += take
            window.last_ts_ns = int(ts_ns[pos + take - 1])
            pos += take
            if window.taken == self.window:
                out.append((pos - 1, self._complete(key)))
        return out

    def finish(self) -> list[MaeRecord]:
        """End of a finite input: one record for each partial window."""
        out = [self._record(k, self._open[k]) for k in sorted(self._open)]
        self._open.clear()
        return out

    def latest_ns(self) -> dict[tuple[str, int], int]:
        """Each process with an open window, and the time of its last address."""
        return {key: win.last_ts_ns for key, win in self._open.items()}

    def close_silent(
        self, watermark_ns: int, idle_timeout_ns: int, only: Container[str | tuple[str, int]] | None = None
    ) -> list[MaeRecord]:
        """The partial windows of processes gone silent (of those in ``only``, if given): whose last address
        lies ``idle_timeout_ns`` or more behind ``watermark_ns``, as at the end of their input. A live run has
        no end of input, and a process that exits sends none: without this its last window would never be
        published, and its pid, reused by a later process, would carry the window on into that one's."""
        gone = [
            key
            for key in sorted(self._open)
            if self._open[key].last_ts_ns + idle_timeout_ns <= watermark_ns and (only is None or key in only)
        ]
        return [self._complete(key) for key in gone]

    def resume_after(self, finished: Mae) -> None:
        """After an end of input: keep the addresses taken, so the same ones sent again are refused."""
        self.taken = finished.taken

    def forget(self, floor_ns: int, only: Container[str | tuple[str, int]] | None = None) -> None:
        """Forget the addresses taken of processes (of those in ``only``) with no open window, silent since
        before ``floor_ns`` (``Auditor.close_silent`` forgets a GPU's panes at the same age)."""
        self.taken.forget(floor_ns, self._open, only)

    def _record(self, key: tuple[str, int], win: _Window) -> MaeRecord:
        bits = entropy_bits(win.counts.values())
        return computed(
            MaeRecord,
            node_id=key[0],
            pid=key[1],
            first_ts_ns=win.first_ts_ns,
            last_ts_ns=win.last_ts_ns,
            n=sum(win.counts.values()),
            out_of_range=win.out_of_range,
            mae_bits=bits,
            l2_evictions_per_1k_est=l2_estimate(bits, self.table),
        )

    def to_state(self) -> dict[str, list[Any]]:
        return {
            "open": [
                [n, p, list(w.counts.items()), w.taken, w.out_of_range, w.first_ts_ns, w.last_ts_ns]
                for (n, p), w in self._open.items()
            ],
            "taken": self.taken.to_state(),
        }

    @classmethod
    def from_state(cls, state: dict[str, list[Any]] | list[Any], settings: AuditSettings) -> Mae:
        """``state`` as ``to_state`` writes it, or a list of open windows (a state written before the addresses
        taken were kept: its processes start with none)."""
        mae = cls(settings)
        if isinstance(state, dict):
            mae.taken = TakenAddresses.from_state(state["taken"], mae.taken.keep_ns)
            state = state["open"]
        for n, p, counts, taken, oor, first, last in state:
            w = _Window(first)
            w.counts = {int(b): c for b, c in counts}
            w.taken, w.out_of_range, w.last_ts_ns = taken, oor, last
            mae._open[(n, p)] = w
        return mae
