"""What every benchmark reports with its numbers: the machine, and how a figure was taken."""
from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["Result", "machine", "timed", "median_time"]


@dataclass
class Result:
    name: str
    target: str
    met: bool | None  # None: not measurable here (the reason is in the notes)
    rows: list[tuple[str, str]] = field(default_factory=list)  # (what, figure)
    notes: list[str] = field(default_factory=list)

    def markdown(self) -> str:
        verdict = {True: "met", False: "**not met**", None: "not measured here"}[self.met]
        lines = [f"### {self.name}", "", f"Target: {self.target}. Result: {verdict}.", "", "| | |", "| --- | --- |"]
        lines += [f"| {what} | {figure} |" for what, figure in self.rows]
        lines += [""] + [f"- {n}" for n in self.notes]
        return "\n".join(lines) + "\n"


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem_kib = next(int(line.split()[1]) for line in open("/proc/meminfo") if line.startswith("MemTotal"))
    except OSError:
        mem_kib = 0
    return (f"{cpu}, {os.cpu_count()} cores, {mem_kib / 2**20:.0f} GiB RAM, {platform.system()} "
            f"{platform.release()}, Python {platform.python_version()}")


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def median_time(fn: Callable[[], object], repeat: int) -> float:
    return statistics.median(timed(fn)[0] for _ in range(repeat))
