"""The bpftrace program the eBPF source runs (``EbpfProbe`` reads its output): the text of the probes, apart from
the reading of what they print, so that each of the two can be read whole. Why the probes are built as they are
(sampled faults, double-buffered maps, the kernel's own counts) is in ``gpucost.producers.ebpf``'s docstring.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["BLAS_CALLS", "MAP_KEYS", "bpftrace_program"]

#: the cuBLAS entry points probed, each with the stack slot of its batch count: ``m, n, k`` are arguments 3 to 5 of
#: every one (registers); an argument past the sixth is on the stack, argument 6 + N in 8-byte slot N above the
#: return address (x86-64 calling convention). bpftrace names only slots 0 to 9 (``sarg0``…``sarg9``), so the slot
#: is read from the stack pointer. None: one matrix product per call. FLOPs = 2·m·n·k·batch.
#: cuDNN and cublasLt describe their shapes in opaque descriptors (cudnnTensorDescriptor_t, cublasLtMatrixLayout_t),
#: which a probe would have to follow into the library's private structs: left out.
BLAS_CALLS: dict[str, int | None] = {
    "cublasSgemm_v2": None,
    "cublasDgemm_v2": None,
    "cublasHgemm": None,
    "cublasGemmEx": None,
    "cublasGemmStridedBatchedEx": 14,  # (…, strideC, int batchCount, computeType, algo): argument 20
    "cublasSgemmStridedBatched": 11,  # (…, ldc, long long strideC, int batchCount): argument 17
}

MAP_KEYS = 65_536  # per map: at the default 100 ms drain, 655,360 samples/s before any is lost


def bpftrace_program(
    sample_every: int, command: bool, libcuda: Path | None = None, drain_ms: int = 100, libcublas: Path | None = None
) -> str:
    """The bpftrace program of an ``EbpfProbe``: its probes, the double-buffered maps they fill and the drain that
    prints them (the output ``EbpfProbe.parse`` reads). ``command``: probe only the process bpftrace starts."""
    target = "/pid == cpid/" if command else ""
    address = "((struct bpf_perf_event_data *)ctx)->addr"
    # the double-buffered maps: addresses, launches, GEMM calls
    drained = ["a"] + (["k"] if libcuda is not None else []) + (["g"] if libcublas is not None else [])

    def switch(n: int) -> str:
        return " ".join(f"print(@{m}{n}); clear(@{m}{n});" for m in drained)

    # the kernel's running counts, printed after the maps; @sampled last, as the end of a drain
    totals = (
        ("print(@launched); print(@allocs); print(@alloc_bytes); " if libcuda is not None else "")
        + ("print(@gemms); " if libcublas is not None else "")
        + "print(@sampled);"
    )
    program = (
        f"software:page-faults:{sample_every} {target} {{\n"
        f"  if (@epoch == 0) {{ @a0[pid, nsecs, cpu] = {address}; }} else {{ @a1[pid, nsecs, cpu] = {address}; }}\n"
        "  @sampled = count();\n}\n"
        # print(), clear() and zero() run later, in order, in bpftrace's user space. The map
        # printed is the one no probe writes to any more, and @draining holds the next switch
        # back until the clear is done: a slow reader stretches the drains, never clears
        # samples of the map in use.
        f"interval:ms:{drain_ms} /@draining == 0/ {{\n"
        "  @draining = 1;\n"
        "  @epoch = 1 - @epoch;\n"
        f"  if (@epoch == 1) {{ {switch(0)} }} else {{ {switch(1)} }}\n"
        f"  {totals}\n"
        "  zero(@draining);\n}\n"
        f"END {{ {switch(0)} {switch(1)} {totals} }}\n"
        "tracepoint:sched:sched_move_numa "
        '{ printf("N %d %llu %d %d\\n", args->pid, nsecs, args->src_nid, args->dst_nid); }\n'
    )
    if libcuda is not None:
        # cuLaunchKernel(f, gridX, gridY, gridZ, blockX, blockY, blockZ, …): blockZ is the 7th
        # argument, on the stack (sarg0) in the x86-64 calling convention. A launch goes into the
        # maps like a fault (a printf per launch cost a launch 17 µs here); an allocation is only
        # counted, so the kernel counts it.
        dims = "(arg1, arg2, arg3, arg4, arg5, sarg0)"
        program += (
            f"uprobe:{libcuda}:cuLaunchKernel {target} {{\n"
            f"  if (@epoch == 0) {{ @k0[pid, nsecs, cpu] = {dims}; }} else {{ @k1[pid, nsecs, cpu] = {dims}; }}\n"
            "  @launched = count();\n}\n"
            f"uprobe:{libcuda}:cuMemAlloc_v2 {target} {{ @allocs = count(); @alloc_bytes = sum(arg1); }}\n"
        )
    if libcublas is not None:  # a GEMM call's shape into the maps, as a launch's
        for name, batch in BLAS_CALLS.items():
            # a stack argument is a C int: its slot's low half
            count = "1" if batch is None else f'*(int32 *)(reg("sp") + {8 * (batch + 1)})'
            shape = f"(arg3, arg4, arg5, (uint64){count})"  # one tuple type for every probe
            program += (
                f"uprobe:{libcublas}:{name} {target} {{\n"
                f"  if (@epoch == 0) {{ @g0[pid, nsecs, cpu] = {shape}; }} else {{ @g1[pid, nsecs, cpu] = {shape}; }}\n"
                "  @gemms = count();\n}\n"
            )
    return program
