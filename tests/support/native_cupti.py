"""The injection library built here, run against a C stand-in for libcupti (tests/native_standin), and the
recordings of tests/support/cupti_recording written in the stand-in's text form: what tests/test_cupti_native.py
runs ``gpucost collect-kernels -- program`` with, no GPU needed."""

from __future__ import annotations

import contextlib
import io
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpucost.cli import main
from gpucost.producers.cupti_injection import SOURCE, compile_c, include_folders
from tests.support.cupti_recording import K

STANDIN = Path(__file__).parent.parent / "native_standin"


@dataclass(frozen=True)
class Built:
    library: Path  # the injection library, from gpucost's own source
    cupti: Path  # the stand-in libcupti
    job: Path  # a program that loads the library as CUDA would


def build(folder: Path) -> Built:
    folders = include_folders()
    return Built(
        compile_c(SOURCE, folder / "libgpucost_inject.so", folders),
        compile_c(STANDIN / "libcupti_standin.c", folder / "libcupti_standin.so", folders),
        compile_c(STANDIN / "job.c", folder / "job", folders, shared=False),
    )


def _text(value: str | bytes | None) -> str:
    return (value if isinstance(value, bytes) else value.encode()).hex() if value else "-"


def standin_line(r: Any) -> str:
    """A record in the stand-in's text form (tests/native_standin/libcupti_standin.c says which)."""
    if r.kind in (K.CONCURRENT_KERNEL, K.KERNEL):
        numbers = (r.kind, r.correlation_id, r.start, r.end, r.device_id, r.stream_id, r.grid_x, r.grid_y, r.grid_z)
        numbers += (r.block_x, r.block_y, r.block_z, r.registers_per_thread, r.static_shared_memory)
        return f"K {' '.join(map(str, numbers))} {r.dynamic_shared_memory} {_text(r.name)}"
    if r.kind in (K.MEMCPY, K.MEMSET):
        return f"C {r.kind} {r.correlation_id} {r.start} {r.end} {r.device_id} {r.stream_id} {r.bytes}"
    if r.kind == K.DEVICE:
        return f"V {r.id} {r.is_mig_enabled} {r.uuid.hex()} {r.mig_uuid.hex()}"
    if r.kind in (K.RUNTIME, K.DRIVER):
        return f"R {r.kind} {r.correlation_id} {r.thread_id} {r.start}"
    tid = r.object_id.pt.thread_id if hasattr(r, "object_id") else 0
    return f"M {r.flags_} {r.id} {r.timestamp} {tid} {_text(r.domain)} {_text(r.name)}"


def write_recording(
    path: Path,
    buffers: list[list[Any]],
    dropped: int = 0,
    clock: tuple[int, ...] = (5_000, 5_400),
    names: dict[tuple[int, int], str] | None = None,
    devices: dict[int, tuple[bool, bytes]] | None = None,
) -> Path:
    """The stand-in's recording; ``devices``: DEVICE records (id → MIG or not, UUID), first in the first buffer."""
    lines = [f"T {' '.join(map(str, clock))}", f"D {dropped}"]
    lines += [f"N {domain} {cbid} {name}" for (domain, cbid), name in (names or {}).items()]
    for i, buffer in enumerate(buffers or ([[]] if devices else [])):
        lines.append("B")
        if i == 0:
            lines += [f"V {d} {int(mig)} {uuid.hex()} {uuid[::-1].hex()}" for d, (mig, uuid) in (devices or {}).items()]
        lines += map(standin_line, buffer)
    path.write_text("\n".join(lines) + "\n")
    return path


@contextlib.contextmanager
def environment(**values: str) -> Iterator[None]:
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def collect(built: Built, recording: Path, out: Path, *job: str, node: str = "n1") -> tuple[int, list[str], dict]:
    """``gpucost collect-kernels`` over the stand-in: its exit code, its output's lines and its summary."""
    err = io.StringIO()
    with environment(CUPTI_STANDIN_RECORDS=str(recording)), contextlib.redirect_stderr(err):
        code = main(
            ["collect-kernels", "--out", str(out), "--node-id", node, "--injection-library", str(built.library),
             "--cupti-library", str(built.cupti), "--", str(built.job), *job]
        )  # fmt: skip
    summary = json.loads(err.getvalue().strip().splitlines()[-1])["collect_kernels"]
    return code, out.read_text().splitlines(keepends=True), summary
