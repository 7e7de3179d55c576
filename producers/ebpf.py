"""The eBPF source: user page-fault addresses per process (for MAE), NUMA migrations, and,
where the node has ``libcuda``, CUDA kernel launches and allocations (uprobes).

Real kernel probes through bpftrace (Debian's package): one short program, its output one
line per event, read here. bpftrace was chosen over bcc because it needs no compiler or
kernel headers on the node and is one package. Page faults are sampled (1 in
``sample_every``) in the kernel, so the traced workload pays for a counter increment on the
faults that are not reported.
"""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

from schemas.codec import explain
from schemas.events import EbpfTrace, Event, MemAccess, NumaEvent

__all__ = ["EbpfUnavailable", "EbpfProbe", "ensure_tracing", "find_libcuda", "numa_cost", "numa_distances"]

log = logging.getLogger("gpucost.ebpf")
TRACEFS = Path("/sys/kernel/tracing")


class EbpfUnavailable(Exception):
    """The kernel, the privileges or the tools do not allow tracing; the message says which."""


def numa_distances(root: Path = Path("/sys/devices/system/node")) -> dict[tuple[int, int], int]:
    """The kernel's NUMA distance matrix (10 = local): node pair → distance."""
    out = {}
    for node_dir in sorted(root.glob("node[0-9]*")):
        src = int(node_dir.name[4:])
        for dst, d in enumerate((node_dir / "distance").read_text().split()):
            out[(src, dst)] = int(d)
    return out


def _program(sample_every: int, command: bool, libcuda: Path | None = None) -> str:
    target = "/pid == cpid/" if command else ""
    emit = 'printf("A %d %llu %llu\\n", pid, nsecs, args->address);'
    body = f"if (rand % {sample_every} == 0) {{ {emit} }}" if sample_every > 1 else emit
    program = (
        f"tracepoint:exceptions:page_fault_user {target} {{ {body} }}\n"
        "tracepoint:sched:sched_move_numa "
        "{ printf(\"N %d %llu %d %d\\n\", args->pid, nsecs, args->src_nid, args->dst_nid); }\n"
    )
    if libcuda is not None:
        # cuLaunchKernel(f, gridX, gridY, gridZ, blockX, blockY, blockZ, …): blockZ is the 7th
        # argument, on the stack (sarg0) in the x86-64 calling convention
        program += (
            f"uprobe:{libcuda}:cuLaunchKernel {target} "
            "{ printf(\"K %d %llu %u %u %u %u %u %u\\n\", pid, nsecs, arg1, arg2, arg3, arg4, arg5, sarg0); }\n"
            f"uprobe:{libcuda}:cuMemAlloc_v2 {target} {{ printf(\"M %d %llu %llu\\n\", pid, nsecs, arg1); }}\n"
        )
    return program


def find_libcuda(listing: str | None = None) -> Path | None:
    """The node's 64-bit CUDA driver library (``libcuda.so.1``) in the dynamic linker's cache
    (``listing``: the text of ``ldconfig -p``, read here when not given)."""
    if listing is None:
        try:
            listing = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            return None
    for line in listing.splitlines():
        name, _, path = line.strip().partition(" => ")
        if name.startswith("libcuda.so.1 ") and "x86-64" in name:
            return Path(path)
    return None


def ensure_tracing() -> None:
    """Root, bpftrace and a mounted tracefs, or one clear reason why not."""
    if os.geteuid() != 0:
        raise EbpfUnavailable("eBPF tracing needs root (or CAP_BPF and CAP_PERFMON); run as root")
    if shutil.which("bpftrace") is None:
        raise EbpfUnavailable("bpftrace is not installed; install it (Debian: apt-get install bpftrace)")
    if not (TRACEFS / "events").is_dir():
        done = subprocess.run(["mount", "-t", "tracefs", "nodev", str(TRACEFS)], capture_output=True, text=True)
        if done.returncode != 0 or not (TRACEFS / "events").is_dir():
            raise EbpfUnavailable(f"tracefs is not mounted and mounting it failed: {done.stderr.strip()}")


def numa_cost(distance: int) -> tuple[int, int]:
    """(hops, latency_weight) of a NUMA distance: 10 is local (0 hops), each further 10 one hop."""
    return max(0, round(distance / 10) - 1), distance


class EbpfProbe:
    """Runs the probe; ``events()`` yields MemAccess, NumaEvent and EbpfTrace events until it ends.

    ``gpus_of(pid)`` names the GPUs a process uses (from NVML's process lists). Without it,
    or for a process on no GPU, a NUMA migration cannot become a ``numa_event`` (which is
    keyed by GPU) and is only counted; so is a kernel launch.

    With ``libcuda``, each ``cuLaunchKernel`` becomes the seed's 40-byte ``trace_event``, one
    per GPU of the process: ``flops_64b`` carries the threads launched (grid × block), the
    only measure of work a launch shows (FLOPs are not observable from it), and
    ``sm_util_pct`` is 0 (a launch carries no utilisation; NVML reports that). Allocations
    (``cuMemAlloc_v2``) have no field in the struct: they are counted, with their bytes.
    """

    def __init__(self, node_id: str, sample_every: int = 16, command: list[str] | None = None,
                 gpus_of: Callable[[int], list[str]] | None = None,
                 distances: dict[tuple[int, int], int] | None = None, libcuda: Path | None = None) -> None:
        if sample_every < 1:
            raise ValueError(f"sample_every must be ≥ 1, got {sample_every}")
        self.node_id, self.sample_every, self.command = node_id, sample_every, command
        self.gpus_of = gpus_of
        self.distances = distances if distances is not None else numa_distances()
        self.libcuda = libcuda
        self.counts: Counter[str] = Counter()
        self.proc: subprocess.Popen[str] | None = None
        self._epoch_offset_ns = time.time_ns() - time.monotonic_ns()

    def parse(self, line: str) -> list[Event]:
        """The events of one line of the probe's output; a line that makes no event is counted."""
        try:
            return self._parse(line)
        except ValueError as exc:  # not numbers, or numbers no process can have
            self.counts["malformed_probe_line"] += 1
            log.warning("bpftrace line %r skipped: %s", line[:120], explain(exc))
            return []

    def _parse(self, line: str) -> list[Event]:
        parts = line.split()
        if len(parts) == 4 and parts[0] == "A":
            self.counts["mem_access"] += 1
            return [MemAccess(node_id=self.node_id, pid=int(parts[1]), ts_ns=int(parts[2]) + self._epoch_offset_ns,
                              address=int(parts[3]))]
        if len(parts) == 9 and parts[0] == "K":
            pid, ts_ns = int(parts[1]), int(parts[2]) + self._epoch_offset_ns
            threads = 1
            for dim in parts[3:]:
                threads *= int(dim)
            gpus = self.gpus_of(pid) if self.gpus_of is not None else []
            if not gpus:
                self.counts["cuda_launch_unresolved"] += 1
                return []
            self.counts["ebpf_trace"] += len(gpus)
            return [EbpfTrace(node_id=self.node_id, pid=pid, gpu_uuid=g, ts_ns=ts_ns, sm_util_pct=0, flops_64b=threads)
                    for g in gpus]
        if len(parts) == 4 and parts[0] == "M":
            self.counts["cuda_alloc"] += 1
            self.counts["cuda_alloc_bytes"] += int(parts[3])
            return []
        if len(parts) == 5 and parts[0] == "N":
            pid, ts_ns, src, dst = int(parts[1]), int(parts[2]) + self._epoch_offset_ns, int(parts[3]), int(parts[4])
            gpus = self.gpus_of(pid) if self.gpus_of is not None else []
            distance = self.distances.get((src, dst))
            if not gpus or distance is None:
                self.counts["numa_move_unresolved"] += 1
                return []
            hops, weight = numa_cost(distance)
            self.counts["numa_event"] += len(gpus)
            return [NumaEvent(node_id=self.node_id, gpu_uuid=g, pid=pid, ts_ns=ts_ns, hops=hops, latency_weight=weight)
                    for g in gpus]
        if line.strip() and not line.startswith("Attaching"):
            self.counts["other_output"] += 1
            log.info("bpftrace: %s", line.strip())
        return []

    def start(self) -> None:
        ensure_tracing()
        argv = ["bpftrace", "-B", "line", "-e", _program(self.sample_every, self.command is not None, self.libcuda)]
        if self.command:
            argv += ["-c", " ".join(self.command)]
        # bpftrace's nsecs is CLOCK_MONOTONIC, as is time.monotonic_ns(): one offset to the epoch
        self._epoch_offset_ns = time.time_ns() - time.monotonic_ns()
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)

    def events(self) -> Iterator[Event]:
        assert self.proc is not None and self.proc.stdout is not None, "start() first"
        for line in self.proc.stdout:
            yield from self.parse(line)
        rc = self.proc.wait()
        if rc != 0 and self.counts["mem_access"] == 0:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise EbpfUnavailable(f"bpftrace exited with {rc}: {err.strip()[-500:]}")
