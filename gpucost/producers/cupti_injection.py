"""Building the CUDA injection library (``native/gpucost_inject.c``) and finding the ``libcupti`` it opens.

The library is compiled on the machine that runs the job, against the CUDA headers of the ``native`` extra
(``nvidia-cuda-cupti``, ``nvidia-cuda-runtime``, ``nvidia-cuda-crt``: NVIDIA's wheels, under NVIDIA's licence, so
never vendored) or of a CUDA toolkit (``GPUCOST_CUDA_INCLUDE``), with the system's C compiler (``CC``, else ``cc``).
Its activity record types are the newest the headers declare (``record_types``), since CUPTI hands records over in
the layout of its own version; the build is cached under a key of the source, headers, types and compiler, so a
changed CUDA or compiler gets a library of its own.  ``make injection`` builds it where ``--injection-library`` can
name it.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from gpucost.wiring import UsageError

SOURCE = Path(__file__).with_name("native") / "gpucost_inject.c"
#: the headers the library's includes reach, each found in one of the include folders
NEEDED_HEADERS = ("cupti_activity.h", "cuda.h", "crt/host_defines.h")
#: the macros naming the record types the library reads, and the types' stems in cupti_activity.h
RECORD_STEMS = {"KERNEL_RECORD": "CUpti_ActivityKernel", "MEMCPY_RECORD": "CUpti_ActivityMemcpy",
                "MEMSET_RECORD": "CUpti_ActivityMemset", "DEVICE_RECORD": "CUpti_ActivityDevice"}  # fmt: skip
#: the headers the library's build depends on, hashed into its cache key with the compiler's version
KEY_HEADERS = ("cupti_activity.h", "cupti_callbacks.h", "cupti_runtime_cbid.h", "cupti_driver_cbid.h", "cuda.h")
INSTALL_HINT = "pip install 'gpucost[native]' (NVIDIA's CUDA headers), or set GPUCOST_CUDA_INCLUDE to a toolkit's"


def _wheel_folders(kind: str) -> list[Path]:
    """``nvidia/<package>/<kind>`` folders of NVIDIA's wheels on ``sys.path`` (cu13's one folder, cu12's several)."""
    found: list[Path] = []
    for entry in sys.path:
        root = Path(entry or ".") / "nvidia"
        if root.is_dir():
            found += sorted(p for p in root.glob(f"*/{kind}") if p.is_dir())
    return found


def include_folders() -> list[Path]:
    """The folders to compile with: ``GPUCOST_CUDA_INCLUDE`` (``:``-separated) if set, else NVIDIA's wheels'."""
    given = os.environ.get("GPUCOST_CUDA_INCLUDE")
    folders = [Path(p) for p in given.split(os.pathsep) if p] if given else _wheel_folders("include")
    missing = [h for h in NEEDED_HEADERS if not any((f / h).is_file() for f in folders)]
    if missing:
        raise UsageError(f"the injection library needs CUDA's headers ({', '.join(missing)} not found): {INSTALL_HINT}")
    return folders


def record_types(folders: list[Path]) -> dict[str, str]:
    """Each record macro's newest struct in ``cupti_activity.h``: ``CUpti_ActivityKernel13`` for CUDA 13.5."""
    header = next(f / "cupti_activity.h" for f in folders if (f / "cupti_activity.h").is_file())
    text = header.read_text(errors="replace")
    types = {}
    for macro, stem in RECORD_STEMS.items():
        versions = [int(v) for v in re.findall(rf"\}}\s*{stem}(\d+)\s*;", text)]
        if not versions:
            raise UsageError(f"{header} declares no {stem}N record: a CUPTI too old or too new for gpucost")
        types[macro] = f"{stem}{max(versions)}"
    return types


def compiler() -> list[str]:
    """The C compiler's words: ``CC`` (``ccache gcc`` is two), else ``cc`` or ``gcc`` on PATH."""
    try:
        words = shlex.split(os.environ.get("CC", "")) or [shutil.which("cc") or shutil.which("gcc") or ""]
    except ValueError as exc:
        raise UsageError(
            f"CC {os.environ['CC']!r} cannot be read as words ({exc}): quote it as a shell would"
        ) from None
    if not words[0]:
        raise UsageError("the injection library is C: install a C compiler (Debian: apt-get install gcc) or set CC")
    return words


def _run(command: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(command, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise UsageError(f"the C compiler {command[0]} could not run ({exc.strerror}): install one or set CC") from None


def compile_c(source: Path, out: Path, folders: list[Path], shared: bool = True) -> Path:
    """``source`` compiled to ``out`` (written whole, by a rename) with the record types as macros; a failure is a
    ``UsageError`` carrying the compiler's last words."""
    macros = [f"-D{k}={v}" for k, v in record_types(folders).items()]
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out.parent) as scratch:
            built = Path(scratch) / out.name
            shape = ["-fPIC", "-shared"] if shared else []
            command = [*compiler(), "-std=c11", "-O2", *shape, *(f"-I{f}" for f in folders), *macros]
            done = _run([*command, "-o", str(built), str(source), "-ldl", "-lpthread"])
            if done.returncode != 0:
                raise UsageError(f"compiling {source.name} failed: {done.stderr.strip()[-800:]}")
            if not built.is_file():
                raise UsageError(f"the C compiler {command[0]} wrote nothing: set CC to a C compiler")
            os.replace(built, out)
    except OSError as exc:
        raise UsageError(f"the injection library could not be written to {out.parent}: {exc.strerror}") from None
    return out


def injection_library(cache: Path | None = None) -> Path:
    """The library built for this machine's headers and compiler, from the cache when it was built before: the key
    holds the source, the headers' contents, the record types and the compiler's words and version."""
    folders = include_folders()
    key = hashlib.sha256(SOURCE.read_bytes())
    for folder in folders:
        for name in KEY_HEADERS:
            if (folder / name).is_file():
                key.update((folder / name).read_bytes())
    words = compiler()
    version = _run([*words, "--version"])
    for part in (*record_types(folders).values(), *words, version.stdout, version.stderr):
        key.update(part.encode() + b"\0")
    folder = cache or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpucost"
    out = folder / f"libgpucost_inject-{key.hexdigest()[:16]}.so"
    return out if out.is_file() else compile_c(SOURCE, out, folders)


def cupti_library() -> str:
    """The ``libcupti`` the library opens and NVTX is pointed at: cupti-python's (cuda-pathfinder's choice), else
    the one in NVIDIA's wheels."""
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib  # noqa: PLC0415 — cupti-python's dependency, optional

        path = load_nvidia_dynamic_lib("cupti").abs_path
        if path:
            return str(path)
    except Exception:  # noqa: BLE001 — absent or unable: NVIDIA's wheels are looked in next
        pass
    for folder in _wheel_folders("lib"):
        found = sorted(folder.glob("libcupti.so*"))
        if found:
            return str(found[-1])
    raise UsageError(f"no libcupti found: {INSTALL_HINT.split(' (')[0]}, or give --cupti-library")


def main(argv: list[str] | None = None) -> int:
    """``python -m gpucost.producers.cupti_injection OUT``: build the library at OUT (``make injection``)."""
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0] if args else "build/libgpucost_inject.so")
    try:
        print(compile_c(SOURCE, out, include_folders()))
    except UsageError as exc:
        print(f"gpucost: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
