"""``gpucost collect-kernels -- python script.py args…``: run a Python job in-process under the CUPTI collector;
``gpucost collect-kernels -- ./program args…``: any other job under the injection library (``collect_native``).

A Python script runs through ``runpy`` in this process, since ``cupti-python`` observes only the process it is
imported into; kernels and NVTX ranges go to ``--out`` as JSON Lines (docs/collecting.md).  The collector
stops at the job's end, at exit and on SIGTERM, so a killed job still leaves its records; a summary with
CUPTI's dropped-record count and the clock drift goes to stderr.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import runpy
import shutil
import signal
import socket
import sys
from typing import Any

from gpucost.collect_native import run_native
from gpucost.command import Command
from gpucost.producers.cupti import Collector, Identity
from gpucost.producers.cupti_injection import cupti_library
from gpucost.wiring import UsageError


def _arguments(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument(
        "--out",
        default=os.environ.get("GPUCOST_KERNELS_OUT", "kernels.jsonl"),
        help="JSON Lines file to write (env GPUCOST_KERNELS_OUT; default kernels.jsonl)",
    )
    cmd.add_argument(
        "--node-id",
        default=os.environ.get("GPUCOST_NODE_ID", socket.gethostname()),
        help="node id on each record (env GPUCOST_NODE_ID; default the host name)",
    )
    cmd.add_argument(
        "--injection-library",
        default=os.environ.get("GPUCOST_INJECTION_LIBRARY"),
        help="for a job that is not a Python script: the injection library to load (env GPUCOST_INJECTION_LIBRARY; "
        "default: built once from gpucost's source with the native extra's headers, and cached)",
    )
    cmd.add_argument(
        "--cupti-library",
        default=os.environ.get("GPUCOST_CUPTI_LIBRARY"),
        help="for a job that is not a Python script: the libcupti to use (env GPUCOST_CUPTI_LIBRARY; default "
        "cupti-python's, else the one in NVIDIA's wheels)",
    )
    cmd.add_argument("job", nargs=argparse.REMAINDER, help="-- python script.py args…, or -- program args…")


def _job(words: list[str]) -> tuple[list[str], bool]:
    """The job's words, and whether it is a Python script (run in this process) rather than a program."""
    if words and words[0] == "--":
        words = words[1:]
    if not words:
        raise UsageError(
            "collect-kernels runs a job: gpucost collect-kernels --out k.jsonl -- python script.py args… "
            "(or any program: -- ./train args…)"
        )
    script = words[1:] if os.path.basename(words[0]).startswith("python") else words
    if script and script[0].endswith(".py"):
        if not os.path.isfile(script[0]):
            raise UsageError(f"collect-kernels: no script at {script[0]}; give the path of the job's Python file")
        return script, True
    if shutil.which(words[0]) is None:
        raise UsageError(f"collect-kernels: no program {words[0]} to run; give its path or a name on PATH")
    return words, False


def _gpu_uuids() -> dict[int, str]:
    try:
        import pynvml  # noqa: PLC0415 — optional; without it the UUID is <node_id>/<index>

        pynvml.nvmlInit()
        return {
            i: pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))
            for i in range(pynvml.nvmlDeviceGetCount())
        }
    except Exception:  # noqa: BLE001 — no NVML is a normal case, the fallback id is documented
        return {}


def _nvtx_injection() -> str | None:
    """NVTX calls reach CUPTI only through NVTX's injection hook, read at the job's first NVTX call."""
    if os.environ.get("NVTX_INJECTION64_PATH"):
        return os.environ["NVTX_INJECTION64_PATH"]
    try:
        path = cupti_library()  # the one cupti-python loads (cuda-pathfinder's choice), as the injection library's
    except UsageError:  # without it kernels are still collected; the summary says ranges are off
        return None
    os.environ["NVTX_INJECTION64_PATH"] = path
    return path


def cmd_collect_kernels(args: argparse.Namespace, cupti: Any = None) -> int:
    job, python = _job(list(args.job))
    if not python:
        return run_native(args, job, _gpu_uuids())
    nvtx = None  # a given module (the tests' stand-in) needs no NVTX hook
    if cupti is None:
        try:
            # the package's __init__ imports nothing: the API is its submodule (NVIDIA's samples import it so)
            from cupti import cupti as cupti_module  # noqa: PLC0415 — optional extra under NVIDIA's licence
        except ImportError:
            raise UsageError("collect-kernels needs NVIDIA's cupti-python: pip install 'gpucost[cupti]'") from None
        cupti = cupti_module
        nvtx = _nvtx_injection()
    identity = Identity(args.node_id, os.getpid(), _gpu_uuids())
    with open(args.out, "w", encoding="utf-8") as out:
        try:
            collector = Collector(cupti, identity, out.write, text=True)  # JSON Lines rendered once per buffer
            collector.start()
        except Exception as exc:  # noqa: BLE001 — cupti raises NotSupportedError and others without a GPU
            raise UsageError(
                f"collect-kernels: CUPTI could not start ({type(exc).__name__}: {exc}); it needs an "
                "NVIDIA GPU, its driver and a cupti-python matching the CUDA version"
            ) from None

        def stop() -> None:
            stats = collector.stop()
            out.flush()
            print(
                json.dumps({"collect_kernels": vars(stats) | {"out": args.out, "nvtx_injection": nvtx}}),
                file=sys.stderr,
            )

        atexit.register(stop)
        previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        sys.argv = job
        sys.path.insert(0, os.path.dirname(os.path.abspath(job[0])))  # as `python script.py` would
        code = 0
        try:
            runpy.run_path(job[0], run_name="__main__")
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        finally:
            stop()
            atexit.unregister(stop)
            signal.signal(signal.SIGTERM, previous)
    return code


COLLECT_KERNELS = Command(
    "collect-kernels",
    "run a job under CUPTI and write its kernels and NVTX ranges as JSON Lines "
    "(a Python script in-process with the `cupti` extra; any other program through the injection library, "
    "with the `native` extra; a GPU)",
    _arguments,
    cmd_collect_kernels,
)
