"""``gpucost collect-kernels -- ./program args…``: a job that is not a Python script, under the injection library.

CUDA loads the library named by ``CUDA_INJECTION64_PATH`` in every process of the job that initialises it
(``gpucost/producers/native/gpucost_inject.c``); each writes its activity to a file of its own in a private folder
beside ``--out``, which this command reads while the job runs and converts with the Python collector's joins
(``cupti_native``), so the lines, the range paths and the summary's counts mean what they mean there
(docs/collecting.md, "Processes that are not Python").  SIGTERM is passed to the job (SIGINT from a terminal
reaches it directly); the command exits with the job's code.  The folder is removed once read, or on an error; a
collector killed meanwhile leaves it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, TextIO

from gpucost.producers.cupti_injection import cupti_library, injection_library
from gpucost.producers.cupti_native import ActivityFolder
from gpucost.wiring import UsageError

POLL_S = 0.5  # how often the files are read while the job runs


def run_native(args: argparse.Namespace, job: list[str], gpu_uuids: dict[int, str]) -> int:
    library = args.injection_library or str(injection_library())
    if not os.path.isfile(library):
        raise UsageError(f"collect-kernels: no injection library at {library}; build one with `make injection`")
    cupti = args.cupti_library or cupti_library()
    out = Path(args.out)
    existed = out.exists()
    try:  # opened before the job starts, not yet emptied: an --out that cannot be written stops nothing running
        sink = out.open("a", encoding="utf-8")
    except OSError as exc:
        raise UsageError(
            f"collect-kernels: --out {out} cannot be written ({exc.strerror}); give another path"
        ) from None
    folder: Path | None = None
    try:
        with sink:
            try:
                folder = Path(tempfile.mkdtemp(prefix=".gpucost-activity-", dir=out.parent))
            except OSError as exc:
                raise UsageError(
                    f"collect-kernels: no folder can be made beside --out {out} ({exc.strerror})"
                ) from None
            return _collect(job, library, cupti, folder, ActivityFolder(folder, args.node_id, gpu_uuids), sink)
    except UsageError:
        if not existed:  # nothing ran: no empty output left behind
            out.unlink(missing_ok=True)
        raise
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def _collect(job: list[str], library: str, cupti: str, folder: Path, files: ActivityFolder, sink: TextIO) -> int:
    env = os.environ | {"CUDA_INJECTION64_PATH": library, "GPUCOST_CUPTI_LIBRARY": cupti}
    env |= {"GPUCOST_ACTIVITY_DIR": str(folder), "NVTX_INJECTION64_PATH": env.get("NVTX_INJECTION64_PATH") or cupti}
    # SIGINT from a terminal reaches the job itself (one process group): passed on too, a job would see a second
    # Ctrl-C (a force quit to many), so the command only outlives it. A handler, not SIG_IGN: an ignored signal
    # stays ignored across exec, and the job could not be stopped. SIGTERM is passed on (a container's PID 1).
    previous = {signal.SIGINT: signal.signal(signal.SIGINT, lambda *_: None)}
    job_process: subprocess.Popen[bytes] | None = None
    try:
        try:
            job_process = subprocess.Popen(job, env=env)
        except OSError as exc:
            raise UsageError(f"collect-kernels: {job[0]} could not start ({exc.strerror})") from None
        previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, lambda signum, _: job_process.send_signal(signum))
        sink.truncate(0)
        while True:
            try:
                code = job_process.wait(timeout=POLL_S)
                break
            except subprocess.TimeoutExpired:
                sink.writelines(files.poll())
        sink.writelines(files.finish())
    finally:
        files.close()
        for s, handler in previous.items():
            signal.signal(s, handler)
        if job_process is not None and job_process.poll() is None:  # the command failed: the job goes with it
            job_process.terminate()
            job_process.wait()
    summary: dict[str, Any] = {"out": sink.name, "nvtx_injection": env["NVTX_INJECTION64_PATH"]}
    summary |= {"injection_library": library, "processes": files.summaries()}
    if not summary["processes"]:
        summary["warnings"] = ["no process of the job loaded the injection library: it used no CUDA, or the "
                               "library could not start (its reason is on stderr above)"]  # fmt: skip
    elif not all(p["complete"] for p in summary["processes"]):
        summary["warnings"] = ["a process did not run its exit handler (killed, or a signal it does not handle): "
                               "its records in CUPTI's unfinished buffers are lost"]  # fmt: skip
    print(json.dumps({"collect_kernels": summary}), file=sys.stderr)
    return code if code >= 0 else 128 - code  # killed by signal N: 128 + N, as a shell reports it
