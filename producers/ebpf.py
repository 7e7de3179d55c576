"""The eBPF source: user page-fault addresses per process (for MAE), NUMA migrations, and,
where the node has ``libcuda``, CUDA kernel launches and allocations (uprobes).

Real kernel probes through bpftrace (Debian's package): one short program whose output is
read here. bpftrace was chosen over bcc because it needs no compiler or kernel headers on the
node and is one package.

Page faults are what a traced machine does most, so their probe is built for cost:

- the kernel's perf software event samples them (1 in ``sample_every`` per CPU), so the BPF
  program runs on the sampled faults only and the others cost a counter increment;
- a sampled address goes into one of two BPF maps, not out through ``printf``: each
  ``printf`` wakes the reader from inside the fault (an irq_work and an IPI, 20–30 µs a
  sample on these VMs), while a map update costs a hash insert. Every ``drain_ms`` the
  program switches maps and prints the full one, which is read here, sorted by time.
- the kernel counts what it sampled (``@sampled``), so samples that never arrive (a map
  that filled before its drain) are counted as ``mem_access_lost``, not lost silently.

Rare events (NUMA migrations, CUDA launches and allocations) keep one line each.
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
from typing import IO

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


MAP_KEYS = 65_536  # per map: at the default 100 ms drain, 655,360 samples/s before any is lost


def _program(sample_every: int, command: bool, libcuda: Path | None = None, drain_ms: int = 100) -> str:
    target = "/pid == cpid/" if command else ""
    address = "((struct bpf_perf_event_data *)ctx)->addr"
    program = (
        f"software:page-faults:{sample_every} {target} {{\n"
        f"  if (@epoch == 0) {{ @a0[pid, nsecs, cpu] = {address}; }} else {{ @a1[pid, nsecs, cpu] = {address}; }}\n"
        "  @sampled = count();\n}\n"
        # print(), clear() and zero() run later, in order, in bpftrace's user space. The map
        # printed is the one no fault writes to any more, and @draining holds the next switch
        # back until the clear is done: a slow reader stretches the drains, never clears
        # samples of the map in use.
        f"interval:ms:{drain_ms} /@draining == 0/ {{\n"
        "  @draining = 1;\n"
        "  @epoch = 1 - @epoch;\n"
        "  if (@epoch == 1) { print(@a0); clear(@a0); } else { print(@a1); clear(@a1); }\n"
        "  print(@sampled);\n"
        "  zero(@draining);\n}\n"
        "END { print(@a0); print(@a1); clear(@a0); clear(@a1); print(@sampled); }\n"
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
                 distances: dict[tuple[int, int], int] | None = None, libcuda: Path | None = None,
                 drain_ms: int = 100, map_keys: int = MAP_KEYS) -> None:
        if sample_every < 1:
            raise ValueError(f"sample_every must be ≥ 1, got {sample_every}")
        if drain_ms < 1 or map_keys < 1:
            raise ValueError(f"drain_ms and map_keys must be ≥ 1, got {drain_ms} and {map_keys}")
        self.node_id, self.sample_every, self.command = node_id, sample_every, command
        self.drain_ms, self.map_keys = drain_ms, map_keys
        # the addresses of the map being printed, and of the one printed before, by their map key
        # ("pid, nsecs, cpu"): at exit bpftrace may print a map again before its clear
        self._drained: dict[str, MemAccess] = {}
        self._previous: dict[str, MemAccess] = {}
        self._sampled_before = 0  # the kernel's sample count at the previous drain
        self.gpus_of = gpus_of
        self.distances = distances if distances is not None else numa_distances()
        self.libcuda = libcuda
        self.counts: Counter[str] = Counter()
        self.proc: subprocess.Popen[str] | None = None
        self.output: IO[str] | None = None  # what the probe prints
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
        if line.startswith(("@a0[", "@a1[")):  # "@a0[pid, nsecs, cpu]: address", one per sampled fault
            key, sep, address = line[4:].partition("]: ")
            if not sep:
                raise ValueError("no ']: ' after the key")
            if key in self._drained or key in self._previous:
                self.counts["reprinted"] += 1
                return []
            pid, ts_ns, _cpu = key.split(", ")
            self._drained[key] = MemAccess(node_id=self.node_id, pid=int(pid), ts_ns=int(ts_ns) + self._epoch_offset_ns,
                                           address=int(address))
            return []
        if line.startswith("@sampled: "):  # the end of a drain
            sampled = int(line[10:])
            drained = sorted(self._drained.values(), key=lambda e: e.ts_ns)
            self._previous, self._drained = self._drained, {}
            self.counts["mem_access"] += len(drained)
            self.counts["drains"] += 1
            self._settle(self._sampled_before)
            self._sampled_before = self.counts["mem_access_sampled"] = sampled
            return drained
        if line.startswith(("@epoch: ", "@draining: ")):
            return []
        parts = line.split()
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

    def _settle(self, sampled: int) -> None:
        """Samples the kernel took (``sampled``, as of a drain now printed) that never arrived."""
        self.counts["mem_access_lost"] = max(0, sampled - self.counts["mem_access"])

    def start(self) -> None:
        ensure_tracing()
        program = _program(self.sample_every, self.command is not None, self.libcuda, self.drain_ms)
        argv = ["bpftrace", "-B", "line", "-e", program]
        # bpftrace's nsecs is CLOCK_MONOTONIC, as is time.monotonic_ns(): one offset to the epoch
        self._epoch_offset_ns = time.time_ns() - time.monotonic_ns()
        env = {**os.environ, "BPFTRACE_MAP_KEYS_MAX": str(self.map_keys)}
        if not self.command:
            self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            self.output = self.proc.stdout
            return
        # the traced command inherits bpftrace's stdout, and its lines would break the probe's:
        # the probe writes to a pipe of its own (block-buffered, which a command's run allows)
        read_fd, write_fd = os.pipe()
        argv += ["-o", f"/dev/fd/{write_fd}", "-c", " ".join(self.command)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                                     pass_fds=(write_fd,))
        os.close(write_fd)
        self.output = os.fdopen(read_fd)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)

    def events(self) -> Iterator[Event]:
        assert self.proc is not None and self.output is not None, "start() first"
        for line in self.output:
            yield from self.parse(line)
        self._settle(self.counts["mem_access_sampled"])
        rc = self.proc.wait()
        if rc != 0 and self.counts["mem_access"] == 0:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise EbpfUnavailable(f"bpftrace exited with {rc}: {err.strip()[-500:]}")
