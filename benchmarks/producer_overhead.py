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
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.common import Result

ROOT = Path(__file__).resolve().parent.parent
CAPTURE = "linux-x86_64__nvidia-h200__590.48.01.txt"
FAULTS = 64 * 256 * 40  # fault_loop 64 40: 64 MiB of 4 KiB pages, mapped 40 times
LAUNCHES = 200_000
REPEAT = 5  # runs with and without the probe, alternated


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


def _timed(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True)
    return time.perf_counter() - start


def _build(sources: list[Path], out: str, *flags: str) -> Path:
    exe = Path(tempfile.mkdtemp(prefix="gpucost-bench-ebpf-")) / out
    subprocess.run(["cc", "-O2", "-o", str(exe), *map(str, sources), *flags], check=True)
    return exe


def under_probe(argv: list[str], repeat: int = REPEAT, **options: Any) -> tuple[float, float, Counter[str]] | str:
    """(baseline s, probed s, the probe's counts over all runs) of a program run with and without
    the probe attached system-wide, alternated; or why it could not be measured."""
    from producers.ebpf import EbpfProbe, EbpfUnavailable, ensure_tracing

    try:
        ensure_tracing()
    except EbpfUnavailable as exc:
        return str(exc)
    base, probed, counts = [], [], Counter[str]()
    for _ in range(repeat):
        base.append(_timed(argv))
        probe = EbpfProbe("node-b", sample_every=16, gpus_of=lambda pid: [], **options)
        probe.start()
        attached = threading.Event()

        def drain() -> None:
            assert probe.output is not None
            for line in probe.output:
                if line.startswith("Attaching"):
                    attached.set()
                probe.parse(line)

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        if not attached.wait(60):
            probe.stop()
            return "bpftrace did not attach within 60 s"
        time.sleep(0.5)
        probed.append(_timed(argv))
        probe.stop()
        reader.join(10)
        counts.update(probe.counts)
    return statistics.median(base), statistics.median(probed), counts


def _ebpf(rows: list[tuple[str, str]], notes: list[str]) -> bool | None:
    """The probes' rows; whether the 16-pass slowdown meets the target, None if not measured."""
    if shutil.which("cc") is None:
        notes.append("eBPF: not measured here: no C compiler for the workloads")
        return None
    met = None
    fault_loop = _build([ROOT / "benchmarks" / "c" / "fault_loop.c"], "fault_loop")
    for passes, what in [(1, "nothing but page faults (worst case)"),
                         (16, "16 passes over its memory per mapping (faults about half its time)")]:
        eb = under_probe([str(fault_loop), "64", "40", str(passes)])
        if isinstance(eb, str):
            notes.append(f"eBPF: not measured here: {eb}")
            return None
        b, p, counts = eb
        slowdown = p / b - 1
        met = (slowdown < 0.02) if passes == 16 else met
        rows += [(f"fault_loop, {what}: no probe", f"{b * 1000:,.0f} ms (median)"),
                 ("… page-fault probe attached (1 in 16 reported)",
                  f"{p * 1000:,.0f} ms (median), {counts['mem_access']:,} events; slowdown {slowdown * 100:+.1f} %, "
                  f"{(p - b) / FAULTS * 1e9:,.0f} ns per fault")]
    notes.append(f"fault_loop maps 64 MiB 40 times ({FAULTS:,} page faults per run). Medians of {REPEAT} alternated "
                 "runs; the probe is system-wide, so it also saw the rest of the machine's faults. A workload's "
                 "slowdown is its page faults per second times the cost per fault.")
    # the CUDA probes, on the tests' stand-in libcuda.so.1 called by a program as CUDA programs do
    lib = _build([ROOT / "tests" / "c" / "fake_libcuda.c"], "libcuda.so.1", "-shared", "-fPIC")
    launcher = _build([ROOT / "tests" / "c" / "launch_kernels.c"], "launch_kernels", "-ldl")
    eb = under_probe([str(launcher), str(lib), str(LAUNCHES)], libcuda=lib)
    if isinstance(eb, str):
        notes.append(f"eBPF, CUDA probes: not measured here: {eb}")
        return met
    b, p, counts = eb
    rows += [(f"{LAUNCHES:,} kernel launches and allocations (stand-in libcuda): no probe", f"{b * 1000:,.0f} ms "
              "(median)"),
             ("… CUDA probes attached", f"{p * 1000:,.0f} ms (median), {counts['cuda_launch']:,} launches "
              f"reported over the {REPEAT} runs; {(p - b) / LAUNCHES * 1e6:,.2f} µs per launch and allocation")]
    return met


def run(shared_data: Path) -> Result:
    rows: list[tuple[str, str]] = []
    notes: list[str] = []
    cpu = nvml_cpu_per_round(shared_data)
    if cpu is None:
        notes.append(f"NVML: the capture {CAPTURE} is not under {shared_data}/nvidia-smi; not measured.")
    else:
        rows.append(("NVML producer, CPU per sampling round (1 GPU, fake NVML)", f"{cpu * 1e6:,.0f} µs "
                     f"= {cpu * 100:.3f} % of one core at the default 1 s period"))
    met = _ebpf(rows, notes)
    if os.environ.get("GPUCOST_BENCH_REAL_GPU"):
        notes.append("A real GPU was present: see the device run in the closing note.")
    return Result("5. Producer overhead", "< 2 % slowdown of a traced workload", met, rows, notes)
