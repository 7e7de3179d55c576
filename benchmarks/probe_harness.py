"""How benchmark 5 measures a probe: a program run with and without one attached, alternated so that both see the
same machine, and the probes it attaches (the eBPF producer as a node runs it, and bpftrace with empty programs as
the floor). Kept apart from the benchmark's rows so that the tests can build its C programs with ``build``, and so
that the measuring can be read without the report it feeds.
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["CLI", "REPEAT", "Floor", "Probed", "Producer", "build", "cpu_s", "timed", "under_probe"]

REPEAT = 9  # runs with and without the probe, alternated: one run's spread here is about 3.5 %


def timed(argv: list[str]) -> tuple[float, int]:
    """(wall seconds, page faults) of one run of a program."""
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True)
    seconds, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    return seconds, (after.ru_minflt + after.ru_majflt) - (before.ru_minflt + before.ru_majflt)


#: the command line run in a process of its own (``python -c CLI args…``), as a node runs it
CLI = "import sys; from gpucost.cli import main; sys.exit(main(sys.argv[1:]))"


def cpu_s(pid: int) -> float:
    """CPU seconds a running process and its running children have used so far."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:  # it has ended
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK") + sum(cpu_s(int(c)) for c in children)


class Producer:
    """``gpucost run --source ebpf`` in a process of its own, as a node runs it: bpftrace, and the
    reading and auditing of what it reports, all on the machine's cores."""

    def __init__(self, libcuda: Path | None = None) -> None:
        self.out = Path(tempfile.mkdtemp(prefix="gpucost-bench-ebpf-out-"))
        argv = [
            sys.executable,
            "-c",
            CLI,
            "run",
            "--source",
            "ebpf",
            "--ebpf-sample-every",
            "16",
            "--out",
            str(self.out),
            "--overwrite",
        ] + ([] if libcuda is None else ["--libcuda", str(libcuda)])
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.output = self.proc.stderr
        self.counts: Counter[str] = Counter()

    def parse(self, line: str) -> list[object]:
        """Its closing summary: ``… page faults sampled, M reported`` and ``… CUDA launches, M reported``."""
        for name, what in (("mem_access", "page faults sampled"), ("cuda_launch", "CUDA launches")):
            found = re.search(rf"{what}, ([\d,]+) reported", line)
            if found:
                self.counts[name] = int(found.group(1).replace(",", ""))
        return []

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)  # ends bpftrace, then the run writes its results
        self.proc.wait(timeout=60)
        shutil.rmtree(self.out, ignore_errors=True)


class Floor:
    """bpftrace with a program of empty probes: what the kernel's events cost before any program of
    ours runs. The page-fault counter's program never runs (one fault in 2^31); a uprobe's runs and
    does nothing."""

    def __init__(self, program: str = f"software:page-faults:{2**31 - 1} {{ }}") -> None:
        self.counts: Counter[str] = Counter()
        self.proc = subprocess.Popen(
            ["bpftrace", "-e", program], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        self.output = self.proc.stdout

    def parse(self, line: str) -> list[object]:
        return []

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def build(sources: list[Path], out: str, *flags: str) -> Path:
    """A C workload (``-O2``, with ``flags``) in a temporary folder of its own, so that runs never share one."""
    exe = Path(tempfile.mkdtemp(prefix="gpucost-bench-ebpf-")) / out
    subprocess.run(["cc", "-O2", "-o", str(exe), *map(str, sources), *flags], check=True)
    return exe


@dataclass
class Probed:
    base_s: float  # medians of the alternated runs
    probed_s: float
    faults: int  # page faults of one run without the probe (median)
    counts: Counter[str]  # the probe's, over all runs
    base_runs: list[float]
    probed_runs: list[float]
    probe_cpu_s: float  # what the probe's processes used while the program ran, over all runs

    @property
    def probe_cores(self) -> float:
        """The probe's CPU while the program ran, in cores."""
        return self.probe_cpu_s / sum(self.probed_runs)

    @property
    def slowdown(self) -> float:
        """The median of each probed run against the run without the probe just before it: the
        machine's slow drifts cancel in a pair, and one odd run moves a median of pairs less."""
        return statistics.median(p / b for p, b in zip(self.probed_runs, self.base_runs)) - 1

    @property
    def ns_per_fault(self) -> float:
        return self.slowdown * self.base_s / self.faults * 1e9


def under_probe(argv: list[str], repeat: int = REPEAT, attach: Callable[[], Any] = Producer) -> Probed | str:
    """A program run with and without a probe (``attach()`` starts one) attached system-wide,
    alternated; or why it could not be measured."""
    from gpucost.producers.ebpf import EbpfUnavailable, ensure_tracing

    try:
        ensure_tracing()
    except EbpfUnavailable as exc:
        return str(exc)
    base, faults, probed, counts, probe_cpu = [], [], [], Counter[str](), 0.0
    for _ in range(repeat):
        seconds, n = timed(argv)
        base.append(seconds)
        faults.append(n)
        probe = attach()
        attached = threading.Event()

        def drain(probe: Any, attached: threading.Event) -> None:
            assert probe.output is not None
            for line in probe.output:
                if line.startswith(("Attaching", "gpucost: tracing")):
                    attached.set()
                probe.parse(line)

        reader = threading.Thread(target=drain, args=(probe, attached), daemon=True)
        reader.start()
        if not attached.wait(60):
            probe.stop()
            return "bpftrace did not attach within 60 s"
        time.sleep(1.0)  # bpftrace attaches about 0.1 s after it starts
        cpu_before = cpu_s(probe.proc.pid)
        probed.append(timed(argv)[0])
        probe_cpu += cpu_s(probe.proc.pid) - cpu_before
        probe.stop()
        reader.join(10)
        counts.update(probe.counts)
    return Probed(
        statistics.median(base),
        statistics.median(probed),
        int(statistics.median(faults)),
        counts,
        base,
        probed,
        probe_cpu,
    )
