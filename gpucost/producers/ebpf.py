"""The eBPF source: user page-fault addresses per process (for MAE), NUMA migrations, and,
where the node has ``libcuda``, CUDA kernel launches and allocations (uprobes), and where it has
``libcublas``, each GEMM call's FLOPs (uprobes on the cuBLAS entry points, ``BLAS_CALLS``).

Real kernel probes through bpftrace (Debian's package): one short program whose output is
read here. bpftrace was chosen over bcc because it needs no compiler or kernel headers on the
node and is one package.

Page faults and CUDA launches are what a traced machine does most, so their probes are built
for cost:

- the kernel's perf software event samples faults (1 in ``sample_every`` per CPU), so the BPF
  program runs on the sampled faults only and the others cost a counter increment;
- a sampled address or a launch goes into one of two BPF maps, not out through ``printf``:
  each ``printf`` wakes the reader from inside the traced program (an irq_work and an IPI,
  20–30 µs a fault sample and 17 µs a launch on these VMs), while a map update costs a hash
  insert. Every ``drain_ms`` the program switches maps and prints the full ones, which are
  read here, sorted by time. Allocations are only counted, so the kernel counts them;
- the kernel counts what it took (``@sampled``, ``@launched``), so what never arrives (a
  map that filled before its drain) is counted as ``mem_access_lost`` and
  ``cuda_launch_lost``, not lost silently.

NUMA migrations, which are rare, keep one ``printf`` line each.
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

from gpucost.producers.bpftrace_program import BLAS_CALLS, MAP_KEYS, bpftrace_program
from gpucost.schemas.codec import explain
from gpucost.schemas.events import EbpfTrace, Event, MemAccess, NumaEvent

__all__ = [
    "BLAS_CALLS",
    "EbpfUnavailable",
    "EbpfProbe",
    "MAP_KEYS",
    "ensure_tracing",
    "find_libcuda",
    "find_libcublas",
    "numa_cost",
    "numa_distances",
]

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


def find_libcublas(listing: str | None = None) -> Path | None:
    """The node's 64-bit cuBLAS (``libcublas.so.N``, the newest N; not cublasLt) in the dynamic linker's cache."""
    if listing is None:
        try:
            listing = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            return None
    found = []
    for line in listing.splitlines():
        name, _, path = line.strip().partition(" => ")
        soname = name.split(" ")[0]
        if soname.startswith("libcublas.so.") and soname[13:].isdigit() and "x86-64" in name:
            found.append((int(soname[13:]), Path(path)))
    return max(found)[1] if found else None


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

    With ``libcublas``, each GEMM call (``BLAS_CALLS``) becomes a ``trace_source = blas`` trace whose
    ``flops_64b`` is the call's FLOPs, 2·m·n·k·batch. A call runs on one GPU, the one its handle was made
    on, which the probe cannot see: a process on exactly one GPU gets the trace; on several, the call is
    counted (``cublas_call_ambiguous``) rather than its FLOPs billed to each GPU, or guessed.
    """

    def __init__(
        self,
        node_id: str,
        sample_every: int = 16,
        command: list[str] | None = None,
        gpus_of: Callable[[int], list[str]] | None = None,
        distances: dict[tuple[int, int], int] | None = None,
        libcuda: Path | None = None,
        drain_ms: int = 100,
        map_keys: int = MAP_KEYS,
        libcublas: Path | None = None,
    ) -> None:
        if sample_every < 1:
            raise ValueError(f"sample_every must be ≥ 1, got {sample_every}")
        if drain_ms < 1 or map_keys < 1:
            raise ValueError(f"drain_ms and map_keys must be ≥ 1, got {drain_ms} and {map_keys}")
        self.node_id, self.sample_every, self.command = node_id, sample_every, command
        self.drain_ms, self.map_keys = drain_ms, map_keys
        # the addresses of the map being printed, and of the one printed before, by their map key
        # ("pid, nsecs, cpu"): at exit bpftrace may print a map again before its clear
        self._drained: dict[tuple[str, str], list[Event]] = {}
        self._previous: dict[tuple[str, str], list[Event]] = {}
        self._totals: dict[str, int] = {}  # the kernel's running counts, as last printed
        self._totals_before: dict[str, int] = {}  # … as of the previous drain
        self.gpus_of = gpus_of
        self.distances = distances if distances is not None else numa_distances()
        self.libcuda, self.libcublas = libcuda, libcublas
        self.counts: Counter[str] = Counter()
        self.proc: subprocess.Popen[str] | None = None
        self.output: IO[str] | None = None  # what the probe prints
        #: bpftrace's ``nsecs`` (CLOCK_MONOTONIC) plus this is an event's ``ts_ns`` (epoch): set again by ``start()``,
        #: public so that a reader of the probe's raw lines can tell the two clocks apart
        self.epoch_offset_ns = time.time_ns() - time.monotonic_ns()

    def parse(self, line: str) -> list[Event]:
        """The events of one line of the probe's output; a line that makes no event is counted."""
        try:
            return self._parse(line)
        except ValueError as exc:  # not numbers, or numbers no process can have
            self.counts["malformed_probe_line"] += 1
            log.warning("bpftrace line %r skipped: %s", line[:120], explain(exc))
            return []

    def _parse(self, line: str) -> list[Event]:
        # "@a0[pid, nsecs, cpu]: address" (a sampled fault), "@k1[pid, nsecs, cpu]: (gridX, …, blockZ)" (a launch),
        # "@g0[pid, nsecs, cpu]: (m, n, k, batch)" (a GEMM call)
        if line[:1] == "@" and line[1:2] in ("a", "k", "g") and line[2:4] in ("0[", "1["):
            key, sep, value = line[4:].partition("]: ")
            if not sep:
                raise ValueError("no ']: ' after the key")
            entry = (line[1], key)
            if entry in self._drained or entry in self._previous:
                self.counts["reprinted"] += 1
                return []
            pid_text, ts_text, _cpu = key.split(", ")
            pid, ts_ns = int(pid_text), int(ts_text) + self.epoch_offset_ns
            values = value.strip().strip("()").split(", ")
            self._drained[entry] = (
                self._access(pid, ts_ns, int(value))
                if line[1] == "a"
                else self._launch(pid, ts_ns, values)
                if line[1] == "k"
                else self._gemm(pid, ts_ns, values)
            )
            return []
        if line.startswith(("@launched: ", "@allocs: ", "@alloc_bytes: ", "@gemms: ")):  # the kernel's running counts
            name, _, value = line.partition(": ")
            self._totals[name[1:]] = int(value)
            return []
        if line.startswith("@sampled: "):  # the end of a drain
            self._totals["sampled"] = int(line[10:])
            drained = sorted((e for events in self._drained.values() for e in events), key=lambda e: e.ts_ns)
            self._previous, self._drained = self._drained, {}
            self.counts["drains"] += 1
            self._settle(self._totals_before)
            self._totals_before = dict(self._totals)
            for name, total in (
                ("mem_access_sampled", "sampled"),
                ("cuda_launch_seen", "launched"),
                ("cuda_alloc", "allocs"),
                ("cuda_alloc_bytes", "alloc_bytes"),
                ("cublas_call_seen", "gemms"),
            ):
                self.counts[name] = self._totals.get(total, 0)  # running totals: set, not added
            return drained
        if line.startswith(("@epoch: ", "@draining: ")):
            return []
        parts = line.split()
        if len(parts) == 5 and parts[0] == "N":
            pid, ts_ns, src, dst = int(parts[1]), int(parts[2]) + self.epoch_offset_ns, int(parts[3]), int(parts[4])
            gpus = self.gpus_of(pid) if self.gpus_of is not None else []
            distance = self.distances.get((src, dst))
            if not gpus or distance is None:
                self.counts["numa_move_unresolved"] += 1
                return []
            hops, weight = numa_cost(distance)
            self.counts["numa_event"] += len(gpus)
            return [
                NumaEvent(node_id=self.node_id, gpu_uuid=g, pid=pid, ts_ns=ts_ns, hops=hops, latency_weight=weight)
                for g in gpus
            ]
        if line.strip() and not line.startswith("Attaching"):
            self.counts["other_output"] += 1
            log.info("bpftrace: %s", line.strip())
        return []

    def _access(self, pid: int, ts_ns: int, address: int) -> list[Event]:
        event = MemAccess(node_id=self.node_id, pid=pid, ts_ns=ts_ns, address=address)
        self.counts["mem_access"] += 1
        return [event]

    def _launch(self, pid: int, ts_ns: int, dims: list[str]) -> list[Event]:
        if len(dims) != 6:
            raise ValueError(f"a launch has 6 dimensions, got {len(dims)}")
        threads = 1
        for dim in dims:
            threads *= int(dim) & 0xFFFFFFFF  # 32-bit arguments: the upper half of the register is not theirs
        gpus = self.gpus_of(pid) if self.gpus_of is not None else []
        events: list[Event] = [
            EbpfTrace(node_id=self.node_id, pid=pid, gpu_uuid=g, ts_ns=ts_ns, sm_util_pct=0, flops_64b=threads)
            for g in gpus
        ]
        self.counts["cuda_launch"] += 1
        self.counts["ebpf_trace"] += len(events)
        self.counts["cuda_launch_unresolved"] += not events
        return events

    def _gemm(self, pid: int, ts_ns: int, shape: list[str]) -> list[Event]:
        """One GEMM call: (m, n, k, batch), each a C ``int`` the register or stack slot holds in its low 32 bits."""
        if len(shape) != 4:
            raise ValueError(f"a GEMM call has 4 dimensions, got {len(shape)}")
        m, n, k, batch = (int(v) & 0xFFFFFFFF for v in shape)
        self.counts["cublas_call"] += 1
        flops = 2 * m * n * k * batch
        if max(m, n, k, batch) >= 1 << 31 or flops >= 1 << 64:  # a negative int: the call itself fails
            self.counts["cublas_call_invalid"] += 1
            return []
        gpus = self.gpus_of(pid) if self.gpus_of is not None else []
        if len(gpus) != 1:
            self.counts["cublas_call_unresolved" if not gpus else "cublas_call_ambiguous"] += 1
            return []
        self.counts["ebpf_trace"] += 1
        return [
            EbpfTrace(
                node_id=self.node_id,
                pid=pid,
                gpu_uuid=gpus[0],
                ts_ns=ts_ns,
                sm_util_pct=0,
                flops_64b=flops,
                trace_source="blas",
            )
        ]

    def _settle(self, before: dict[str, int]) -> None:
        """What the kernel took (``before``: its counts as of a drain now printed) that never arrived."""
        self.counts["mem_access_lost"] = max(0, before.get("sampled", 0) - self.counts["mem_access"])
        self.counts["cuda_launch_lost"] = max(0, before.get("launched", 0) - self.counts["cuda_launch"])
        self.counts["cublas_call_lost"] = max(0, before.get("gemms", 0) - self.counts["cublas_call"])

    def summary(self) -> str:
        """What the kernel took and what arrived, for the end of a run; a loss says what to do."""
        c, advice = self.counts, "the probe's maps filled between drains"
        text = f"{c['mem_access_sampled']:,} page faults sampled, {c['mem_access']:,} reported"
        if c["mem_access_lost"]:
            text += f", {c['mem_access_lost']:,} LOST ({advice}: raise --ebpf-sample-every)"
        if self.libcuda is not None:
            text += f"; {c['cuda_launch_seen']:,} CUDA launches, {c['cuda_launch']:,} reported"
            if c["cuda_launch_lost"]:
                text += f", {c['cuda_launch_lost']:,} LOST ({advice})"
        if self.libcublas is not None:
            text += f"; {c['cublas_call_seen']:,} cuBLAS GEMM calls, {c['cublas_call']:,} reported"
            if c["cublas_call_lost"]:
                text += f", {c['cublas_call_lost']:,} LOST ({advice})"
            if c["cublas_call_ambiguous"]:
                text += f", {c['cublas_call_ambiguous']:,} of processes on several GPUs (FLOPs not attributed)"
        return text

    def start(self) -> None:
        ensure_tracing()
        program = bpftrace_program(
            self.sample_every, self.command is not None, self.libcuda, self.drain_ms, self.libcublas
        )
        argv = ["bpftrace", "-B", "line", "-e", program]
        # bpftrace's nsecs is CLOCK_MONOTONIC, as is time.monotonic_ns(): one offset to the epoch
        self.epoch_offset_ns = time.time_ns() - time.monotonic_ns()
        env = {**os.environ, "BPFTRACE_MAP_KEYS_MAX": str(self.map_keys)}
        if not self.command:
            self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            self.output = self.proc.stdout
            return
        # the traced command inherits bpftrace's stdout, and its lines would break the probe's:
        # the probe writes to a pipe of its own (block-buffered, which a command's run allows)
        read_fd, write_fd = os.pipe()
        argv += ["-o", f"/dev/fd/{write_fd}", "-c", " ".join(self.command)]
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, pass_fds=(write_fd,)
        )
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
        self._settle(self._totals)
        rc = self.proc.wait()
        if rc != 0 and self.counts["mem_access"] == 0:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise EbpfUnavailable(f"bpftrace exited with {rc}: {err.strip()[-500:]}")
