"""The eBPF source with real kernel probes: a program that touches a known number of pages."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gpucost.producers.ebpf import (
    EbpfProbe,
    EbpfUnavailable,
    ensure_tracing,
    find_libcublas,
    find_libcuda,
    numa_distances,
)
from gpucost.schemas.codec import decode_line, encode_event
from tests.conftest import ROOT

PAGES = 300


@pytest.fixture(scope="module")
def toucher(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("cc") is None:
        pytest.skip("no C compiler to build the traced program")
    exe = tmp_path_factory.mktemp("ebpf") / "touch_pages"
    subprocess.run(["cc", "-O0", "-o", str(exe), str(ROOT / "tests" / "c" / "touch_pages.c")], check=True)
    return exe


def traced(exe: Path, sample_every: int, pages: int = PAGES, **options: int) -> tuple[list, EbpfProbe]:
    try:
        ensure_tracing()
    except EbpfUnavailable as exc:
        pytest.skip(f"this machine does not allow eBPF: {exc}")
    probe = EbpfProbe("node-t", sample_every=sample_every, command=[str(exe), str(pages)], **options)
    probe.start()  # from here on, a failure is a failure: our program, not the environment
    return list(probe.events()), probe


def touched(events: list, pages: int = PAGES) -> list[int]:
    base = 0x7E0000000000
    return [e.address // 4096 for e in events if base <= e.address < base + pages * 4096]


def test_page_faults_of_a_known_program(toucher: Path) -> None:
    events, probe = traced(toucher, sample_every=1)
    pages = touched(events)
    assert len(pages) == len(set(pages)) == PAGES  # every page it touched, exactly once each
    assert probe.counts["mem_access_lost"] == 0 and probe.counts["mem_access_sampled"] == len(events)
    assert len({e.pid for e in events}) == 1  # only the traced program (bpftrace's cpid filter)
    assert all(e.kind == "mem_access" and e.node_id == "node-t" for e in events)
    ts = [e.ts_ns for e in events]
    import time

    assert ts == sorted(ts) and abs(ts[-1] - time.time_ns()) < 60 * 10**9  # epoch time, in order


def test_sampling_reports_a_fraction(toucher: Path) -> None:
    events, _ = traced(toucher, sample_every=8)
    assert 0 < len(touched(events)) < PAGES / 2  # about 1 in 8 of the 300 faults


def test_many_drains_lose_and_repeat_nothing(toucher: Path) -> None:
    """Faults that keep coming while the probe switches maps every 2 ms: each page once, in order."""
    pages = 60_000
    events, probe = traced(toucher, sample_every=1, pages=pages, drain_ms=2)
    got = touched(events, pages)
    assert len(got) == len(set(got)) == pages
    assert probe.counts["mem_access_lost"] == 0 and probe.counts["mem_access_sampled"] == len(events)
    ts = [e.ts_ns for e in events]
    assert ts == sorted(ts)
    assert probe.counts["drains"] > 3  # the run spanned several map switches


def test_a_full_map_is_counted_as_lost(toucher: Path) -> None:
    events, probe = traced(toucher, sample_every=1, map_keys=50, drain_ms=60_000)
    assert len(events) == probe.counts["mem_access"] <= 50
    assert probe.counts["mem_access_lost"] == probe.counts["mem_access_sampled"] - len(events) >= PAGES - 50


def test_drained_addresses_come_out_in_time_order_and_losses_are_counted() -> None:
    probe = EbpfProbe("node-p", distances={})
    for line in ["@a0[7, 300, 0]: 4096", "@a0[7, 100, 1]: 8192", "@a0[8, 200, 0]: 12288"]:
        assert probe.parse(line) == []  # held until the drain ends
    out = probe.parse("@sampled: 4")
    assert [(e.pid, e.ts_ns - probe.epoch_offset_ns, e.address) for e in out] == [
        (7, 100, 8192),
        (8, 200, 12288),
        (7, 300, 4096),
    ]
    assert probe.counts["mem_access_lost"] == 0  # the 4th sample may still be in the other map
    assert probe.parse("@a0[7, 100, 1]: 8192") == []  # printed again (bpftrace at exit): not a new sample
    assert probe.parse("@a1[7, 400, 0]: 4096") == [] and len(probe.parse("@sampled: 5")) == 1
    assert probe.counts["reprinted"] == 1 and probe.counts["mem_access"] == 4
    assert probe.counts["mem_access_lost"] == 0  # 4 taken by the previous drain, 4 arrived
    assert probe.parse("@sampled: 5") == [] and probe.counts["mem_access_lost"] == 1
    assert probe.parse("@a0[7, x, 0]: 1") == [] and probe.counts["malformed_probe_line"] == 1
    assert (
        probe.summary() == "5 page faults sampled, 4 reported, 1 LOST (the probe's maps filled between drains: "
        "raise --ebpf-sample-every)"
    )


def test_launches_that_never_arrive_are_counted_and_told() -> None:
    probe = EbpfProbe("node-p", gpus_of=lambda pid: ["GPU-a"], distances={}, libcuda=Path("/lib/libcuda.so.1"))
    got = [
        e
        for line in [
            "@k0[7, 100, 0]: (1, 2, 1, 4294967424, 1, 3)",
            "@launched: 3",
            "@sampled: 0",
            "@launched: 3",
            "@sampled: 0",
        ]
        for e in probe.parse(line)
    ]
    assert [(e.kind, e.pid, e.flops_64b) for e in got] == [("ebpf_trace", 7, 768)]  # 32-bit blockX: 2^32 + 128
    assert probe.counts["cuda_launch_lost"] == 2
    assert (
        probe.summary() == "0 page faults sampled, 0 reported; 3 CUDA launches, 1 reported, 2 LOST (the probe's "
        "maps filled between drains)"
    )


def test_numa_distances_of_this_machine() -> None:
    d = numa_distances()
    if not d:
        pytest.skip("no NUMA topology exposed in /sys/devices/system/node")
    assert all(d[(n, n)] == 10 for n, _ in d if (n, n) in d)  # local distance is 10 by definition


def test_bad_sampling_rate() -> None:
    with pytest.raises(ValueError, match="sample_every"):
        EbpfProbe("n", sample_every=0)


@pytest.mark.slow  # seconds of a whole run: CI runs it, the inner loop does not
def test_gpucost_run_traces_page_faults(toucher: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`gpucost run --source ebpf` with the 64-bit user address range binned: real MAE windows."""
    import threading

    from gpucost.cli import main
    from gpucost.sinks.views import connect

    try:
        ensure_tracing()
    except EbpfUnavailable as exc:
        pytest.skip(f"this machine does not allow eBPF: {exc}")
    # keep faulting while the run traces: the toucher, over and over, for the run's 2 s
    stop = threading.Event()
    threading.Thread(
        target=lambda: [subprocess.run([str(toucher), "2000"], capture_output=True) for _ in iter(stop.is_set, True)],
        daemon=True,
    ).start()
    try:
        rc = main(
            [
                "run",
                "--source",
                "ebpf",
                "--ebpf-sample-every",
                "1",
                "--duration-s",
                "2",
                "--mae-hi",
                str(1 << 47),
                "--mae-window",
                "256",
                "--out",
                str(tmp_path),
            ]
        )
    finally:
        stop.set()
    err = capsys.readouterr().err
    assert rc == 0 and "tracing user page faults" in err
    assert "CUDA launches not probed" in err  # only asked for (--libcuda): a uprobe per launch is costly
    # every sample the kernel took is reported or counted as lost (the toucher loop may outrun the drains)
    summary = re.search(r"([\d,]+) page faults sampled, ([\d,]+) reported(?:, ([\d,]+) LOST)?", err)
    assert summary, err
    sampled, reported, lost = (int((n or "0").replace(",", "")) for n in summary.groups())
    assert sampled == reported + lost and reported > 0
    windows, binned, bits = connect(tmp_path).execute("SELECT count(*), sum(n), max(mae_bits) FROM mae").fetchone()
    assert windows > 0 and binned > 0 and 0 <= bits <= 8


def test_numa_migrations_become_events_for_each_gpu_of_the_process() -> None:
    distances = {(0, 0): 10, (0, 1): 21, (1, 0): 21, (1, 1): 10, (0, 2): 32}
    gpus = {4242: ["GPU-a", "GPU-b"]}
    probe = EbpfProbe("node-n", gpus_of=lambda pid: gpus.get(pid, []), distances=distances)
    events = probe.parse("N 4242 1000 0 1\n")
    assert [(e.kind, e.gpu_uuid, e.pid, e.hops, e.latency_weight) for e in events] == [
        ("numa_event", "GPU-a", 4242, 1, 21),
        ("numa_event", "GPU-b", 4242, 1, 21),
    ]
    assert events[0].ts_ns == 1000 + probe.epoch_offset_ns  # monotonic → epoch
    assert [(e.hops, e.latency_weight) for e in probe.parse("N 4242 2000 0 2")] == [(2, 32), (2, 32)]
    assert probe.parse("N 4242 3000 0 0")[0].hops == 0  # a move within the node costs no hop
    assert probe.parse("N 7 4000 0 1") == [] and probe.counts["numa_move_unresolved"] == 1  # on no GPU: counted
    assert probe.parse("N 4242 5000 0 9") == [] and probe.counts["numa_move_unresolved"] == 2  # unknown node


def test_nvml_names_the_gpus_of_a_process(shared_data: Path) -> None:
    from gpucost.producers.nvml import NvmlSampler
    from tests.fake_nvml import FakeState, fake_pynvml, parse

    path = shared_data / "nvidia-smi" / "linux-x86_64__nvidia-h200__590.48.01.txt"
    if not path.exists():
        pytest.skip(f"{path} is absent")
    cap = parse(path, "load")
    sampler = NvmlSampler("n", fake_pynvml(FakeState(cap)))
    sampler.open()
    assert {pid: sampler.gpus_of(pid) for pid in cap.apps} == {pid: [cap.gpu_uuid] for pid in cap.apps}
    assert sampler.gpus_of(1) == []


def stand_in(folder: Path, library: str, source: str, program: str) -> tuple[Path, Path]:
    """A stand-in library ``library`` built from ``tests/c/<source>.c`` and ``tests/c/<program>.c``, a program that
    loads it with dlopen and calls it (skipped without a C compiler)."""
    if shutil.which("cc") is None:
        pytest.skip(f"no C compiler to build the stand-in {library}")
    lib, exe = folder / library, folder / program
    subprocess.run(
        ["cc", "-shared", "-fPIC", "-O0", "-o", str(lib), str(ROOT / "tests" / "c" / f"{source}.c")], check=True
    )
    subprocess.run(["cc", "-O0", "-o", str(exe), str(ROOT / "tests" / "c" / f"{program}.c"), "-ldl"], check=True)
    return lib, exe


@pytest.fixture(scope="module")
def cuda_program(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A stand-in libcuda.so.1 (the two entry points the probe hooks) and a program that calls it."""
    return stand_in(tmp_path_factory.mktemp("cuda"), "libcuda.so.1", "fake_libcuda", "launch_kernels")


@pytest.mark.parametrize("launches, drain_ms", [(7, 100), (20_000, 2)])
def test_cuda_launches_become_trace_events(cuda_program: tuple[Path, Path], launches: int, drain_ms: int) -> None:
    """Real uprobes on the library's cuLaunchKernel and cuMemAlloc_v2, called by a real program; the
    second run launches across many map switches."""
    lib, exe = cuda_program
    try:
        ensure_tracing()
    except EbpfUnavailable as exc:
        pytest.skip(f"this machine does not allow eBPF: {exc}")
    gpus = ["GPU-00010203-0405-0607-0809-0a0b0c0d0e0f", "GPU-10111213-1415-1617-1819-1a1b1c1d1e1f"]
    probe = EbpfProbe(
        "node-c",
        sample_every=1 << 20,
        command=[str(exe), str(lib), str(launches)],
        gpus_of=lambda pid: gpus,
        distances={},
        libcuda=lib,
        drain_ms=drain_ms,
    )
    probe.start()
    traces = [e for e in probe.events() if e.kind == "ebpf_trace"]
    # one record per launch per GPU of the process; grid (i+1, 2, 1) x block (128, 1, 3) threads
    assert sorted(e.flops_64b for e in traces) == sorted(768 * (i + 1) for i in range(launches) for _ in gpus)
    assert {e.gpu_uuid for e in traces} == set(gpus) and len({e.pid for e in traces}) == 1
    assert [e.ts_ns for e in traces] == sorted(e.ts_ns for e in traces)
    assert probe.counts["cuda_launch"] == probe.counts["cuda_launch_seen"] == launches
    assert probe.counts["cuda_launch_lost"] == 0
    assert drain_ms == 100 or probe.counts["drains"] > 2  # the launches spanned map switches
    assert probe.counts["cuda_alloc"] == launches
    assert probe.counts["cuda_alloc_bytes"] == sum((i + 1) << 20 for i in range(launches))
    # and each is the seed's 40-byte struct on the wire, decoding back to the same event
    for e in traces:
        assert len(bytes.fromhex(e.to_wire()["trace_hex"])) == 40
        assert decode_line(encode_event(e)) == e


def test_launches_are_probed_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """A uprobe on every launch doubled a launch-bound program's time (BENCHMARKS.md, benchmark 5), for traces
    that enter no figure: unset, ``--libcuda`` probes nothing, even on a node whose linker cache has the driver;
    ``auto`` looks there, a path names the library, and so does the environment variable. cuBLAS, whose calls
    feed EFU, is looked for unless ``none``."""
    from gpucost.cli import build_parser

    def libraries(*flags: str) -> tuple[object, object]:
        args = build_parser().parse_args(["run", "--source", "ebpf", *flags])
        return args.libcuda, args.libcublas

    for name in ("GPUCOST_LIBCUDA", "GPUCOST_LIBCUBLAS"):
        monkeypatch.delenv(name, raising=False)
    assert libraries() == (None, "auto")  # GEMM calls feed EFU: probed where the node has cuBLAS
    assert libraries("--libcuda", "auto", "--libcublas", "none") == ("auto", None)
    assert libraries("--libcuda", "/opt/cuda/libcuda.so.1")[0] == Path("/opt/cuda/libcuda.so.1")
    monkeypatch.setenv("GPUCOST_LIBCUDA", "auto")
    monkeypatch.setenv("GPUCOST_LIBCUBLAS", "none")
    assert libraries() == ("auto", None)


def test_find_libcuda_takes_the_64_bit_driver_from_the_linker_cache() -> None:
    listing = """1520 libs found in cache `/etc/ld.so.cache'
	libcudart.so.12 (libc6,x86-64) => /usr/local/cuda/lib64/libcudart.so.12
	libcuda.so.1 (libc6) => /usr/lib/i386-linux-gnu/libcuda.so.1
	libcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1
	libcuda.so (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so
"""
    assert find_libcuda(listing) == Path("/usr/lib/x86_64-linux-gnu/libcuda.so.1")
    assert find_libcuda("\tlibc.so.6 (libc6,x86-64) => /lib/x86_64-linux-gnu/libc.so.6\n") is None


@pytest.fixture(scope="module")
def blas_program(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A stand-in libcublas.so (the GEMM entry points the probe hooks, with cuBLAS's signatures) and a program
    that calls it through dlopen."""
    return stand_in(tmp_path_factory.mktemp("cublas"), "libcublas.so.12", "fake_libcublas", "call_blas")


def gemm_flops(i: int) -> list[int]:
    """Call i's FLOPs, 2·m·n·k·batch, of each entry point in the order call_blas.c calls them."""
    shapes = [
        (i + 1, 2, 3, 1),
        (4, i + 1, 5, 1),
        (6, 7, i + 1, 1),
        (i + 2, 3, 4, 1),
        (2, 3, 4, i + 1),
        (5, 6, 7, i + 2),
    ]
    return [2 * m * n * k * b for m, n, k, b in shapes]


@pytest.mark.slow
@pytest.mark.parametrize("calls, drain_ms", [(5, 100), (4_000, 2)])
def test_cublas_gemm_calls_become_flops_traces(blas_program: tuple[Path, Path], calls: int, drain_ms: int) -> None:
    """Real uprobes on the six GEMM entry points, called by a real program: every call's FLOPs, in call order,
    batch counts read from the stack (arguments 17 and 20)."""
    lib, exe = blas_program
    try:
        ensure_tracing()
    except EbpfUnavailable as exc:
        pytest.skip(f"this machine does not allow eBPF: {exc}")
    gpu = "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"
    probe = EbpfProbe(
        "node-b",
        sample_every=1 << 20,
        command=[str(exe), str(lib), str(calls)],
        gpus_of=lambda pid: [gpu],
        distances={},
        libcublas=lib,
        drain_ms=drain_ms,
    )
    probe.start()
    traces = [e for e in probe.events() if e.kind == "ebpf_trace"]
    assert [e.flops_64b for e in traces] == [f for i in range(calls) for f in gemm_flops(i)]
    assert {(e.trace_source, e.gpu_uuid) for e in traces} == {("blas", gpu)}
    assert probe.counts["cublas_call"] == probe.counts["cublas_call_seen"] == 6 * calls
    assert probe.counts["cublas_call_lost"] == 0
    assert drain_ms == 100 or probe.counts["drains"] > 2
    assert "cuBLAS GEMM calls" in probe.summary()
    for e in traces:  # the seed's 40-byte struct, and the source beside it
        assert decode_line(encode_event(e)) == e and json.loads(encode_event(e))["trace_source"] == "blas"


def test_a_gemm_of_a_process_on_several_gpus_is_counted_not_guessed() -> None:
    probe = EbpfProbe(
        "node-b",
        gpus_of=lambda pid: ["GPU-a", "GPU-b"] if pid == 7 else [],
        distances={},
        libcublas=Path("/lib/libcublas.so.12"),
    )
    for line in (
        "@g0[7, 100, 0]: (2, 3, 4, 1)",
        "@g0[8, 101, 0]: (2, 3, 4, 1)",
        "@g0[7, 102, 1]: (-1, 3, 4, 1)",
        "@gemms: 3",
        "@sampled: 0",
    ):
        assert probe.parse(line) == []
    assert (
        probe.counts["cublas_call_ambiguous"],
        probe.counts["cublas_call_unresolved"],
        probe.counts["cublas_call_invalid"],
    ) == (1, 1, 1)


def test_find_libcublas_takes_the_newest_64_bit_cublas_not_cublaslt() -> None:
    listing = """\tlibcublasLt.so.12 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcublasLt.so.12
\tlibcublas.so.11 (libc6,x86-64) => /usr/local/cuda-11/lib64/libcublas.so.11
\tlibcublas.so.12 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcublas.so.12
\tlibcublas.so.12 (libc6) => /usr/lib/i386-linux-gnu/libcublas.so.12
\tlibcublas.so (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcublas.so
"""
    assert find_libcublas(listing) == Path("/usr/lib/x86_64-linux-gnu/libcublas.so.12")
    assert find_libcublas("\tlibc.so.6 (libc6,x86-64) => /lib/x86_64-linux-gnu/libc.so.6\n") is None
