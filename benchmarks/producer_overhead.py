"""5. What the producers cost the node.

NVML: CPU time per sampling round of the NVML producer against the fake NVML of the tests
(serving a real H200 capture). eBPF: wall time of a page-fault-heavy program (benchmarks/c/
fault_loop.c) with the page-fault probe attached system-wide (1 fault in 16 reported), against
the same program without it, alternated so that both see the same machine. The verdict is
taken on the program that does some work between faults; the all-faults case is the bound.
"""
from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.common import Result

ROOT = Path(__file__).resolve().parent.parent
CAPTURE = "linux-x86_64__nvidia-h200__590.48.01.txt"
FAULTS = 64 * 256 * 40  # fault_loop 64 40: 64 MiB of 4 KiB pages, mapped 40 times


def nvml_cpu_per_round(shared_data: Path, rounds: int = 2000) -> float | None:
    from producers.nvml import NvmlSampler
    from tests.fake_nvml import FakeState, fake_pynvml, parse

    path = shared_data / "nvidia-smi" / CAPTURE
    if not path.exists():
        return None
    state = FakeState(parse(path, "load"))
    sampler = NvmlSampler("node-b", fake_pynvml(state))
    sampler.open()
    start = time.process_time()
    for i in range(rounds):
        state.now_us += 1_000_000
        state.tick += 1
        sampler.sample(1_736_121_600_000_000_000 + i * 1_000_000_000, 1.0)
    return (time.process_time() - start) / rounds


def _workload(exe: Path, passes: int) -> float:
    start = time.perf_counter()
    subprocess.run([str(exe), "64", "40", str(passes)], check=True, capture_output=True)
    return time.perf_counter() - start


def ebpf_slowdown(passes: int, repeat: int = 5) -> tuple[float, float, int] | str:
    """(baseline s, probed s, events seen), or why it could not be measured."""
    from producers.ebpf import EbpfProbe, EbpfUnavailable, ensure_tracing

    if shutil.which("cc") is None:
        return "no C compiler for the workload"
    try:
        ensure_tracing()
    except EbpfUnavailable as exc:
        return str(exc)
    exe = Path(tempfile.mkdtemp(prefix="gpucost-bench-ebpf-")) / "fault_loop"
    subprocess.run(["cc", "-O2", "-o", str(exe), str(ROOT / "benchmarks" / "c" / "fault_loop.c")], check=True)
    base, probed, seen = [], [], 0
    for _ in range(repeat):
        base.append(_workload(exe, passes))
        probe = EbpfProbe("node-b", sample_every=16, gpus_of=lambda pid: [])
        probe.start()
        attached = threading.Event()
        counted = [0]

        def drain() -> None:
            assert probe.output is not None
            for line in probe.output:
                if line.startswith("Attaching"):
                    attached.set()
                counted[0] += len(probe.parse(line))

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        if not attached.wait(60):
            probe.stop()
            return "bpftrace did not attach within 60 s"
        time.sleep(0.5)
        probed.append(_workload(exe, passes))
        probe.stop()
        reader.join(10)
        seen += counted[0]
    return statistics.median(base), statistics.median(probed), seen


def run(shared_data: Path) -> Result:
    rows, notes, met = [], [], None
    cpu = nvml_cpu_per_round(shared_data)
    if cpu is None:
        notes.append(f"NVML: the capture {CAPTURE} is not under {shared_data}/nvidia-smi; not measured.")
    else:
        rows.append(("NVML producer, CPU per sampling round (1 GPU, fake NVML)", f"{cpu * 1e6:,.0f} µs "
                     f"= {cpu * 100:.3f} % of one core at the default 1 s period"))
    for passes, what in [(1, "nothing but page faults (worst case)"),
                         (16, "16 passes over its memory per mapping (faults about half its time)")]:
        eb = ebpf_slowdown(passes)
        if isinstance(eb, str):
            notes.append(f"eBPF: not measured here: {eb}")
            break
        b, p, seen = eb
        slowdown = p / b - 1
        met = (slowdown < 0.02) if passes == 16 else met
        rows += [(f"fault_loop, {what}: no probe", f"{b * 1000:,.0f} ms (median)"),
                 ("… page-fault probe attached (1 in 16 reported)", f"{p * 1000:,.0f} ms (median), {seen:,} events; "
                                                                   f"slowdown {slowdown * 100:+.1f} %, "
                                                                   f"{(p - b) / FAULTS * 1e9:,.0f} ns per fault")]
    notes.append(f"fault_loop maps 64 MiB 40 times ({FAULTS:,} page faults per run). Medians of 5 alternated runs; "
                 "the probe is system-wide, so it also saw the rest of the machine's faults. A workload's slowdown is "
                 "its page faults per second times the cost per fault.")
    if os.environ.get("GPUCOST_BENCH_REAL_GPU"):
        notes.append("A real GPU was present: see the device run in the closing note.")
    return Result("5. Producer overhead", "< 2 % slowdown of a traced workload", met, rows, notes)
