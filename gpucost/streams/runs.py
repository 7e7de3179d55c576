"""numpy over grouped columns: runs of equal keys (where each group starts and ends, for ``reduceat``),
and times as levels, for a running maximum of every group in one accumulate."""

from __future__ import annotations

import numpy as np

__all__ = ["runs", "Levels"]


def runs(*keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each run of equal keys starts and ends, in arrays sorted by those keys."""
    n = len(keys[0])
    change = np.zeros(max(n - 1, 0), bool)
    for k in keys:
        change |= k[1:] != k[:-1]
    starts = np.flatnonzero(np.r_[True, change])[:n]
    return starts, np.r_[starts[1:], n][: len(starts)].astype(np.int64)


class Levels:
    """Times as small integers that keep their order ("levels"), so that a GPU's index times ``width`` plus a
    level is one int64 key: one ``np.maximum.accumulate`` over such keys is every GPU's running maximum, none
    crossing into the next GPU. A level is a time's distance above the earliest known, plus 1 (0: no time
    yet); where the times span so long that levels and GPUs do not fit 64 bits together, its rank."""

    def __init__(self, known: np.ndarray, groups: int) -> None:
        first, last = (int(known.min()), int(known.max())) if len(known) else (0, 0)
        self._below = first - 1
        self._distinct: np.ndarray | None = None
        self.width = last - first + 2
        if self.width * (groups + 1) >= 1 << 62:
            self._distinct = np.unique(known)
            self.width = len(self._distinct) + 1

    def of(self, t: np.ndarray) -> np.ndarray:
        """The lowest level at or above each time (``width`` above every known time)."""
        if self._distinct is None:
            clipped: np.ndarray = np.clip(t - self._below, 1, self.width)  # numpy's stubs: clip of an ndarray is Any
            return clipped
        return np.searchsorted(self._distinct, t) + 1

    def time(self, level: np.ndarray) -> np.ndarray:
        if self._distinct is None:
            return level + self._below
        times: np.ndarray = self._distinct[level - 1]  # numpy's stubs: an ndarray indexed by one is Any
        return times
