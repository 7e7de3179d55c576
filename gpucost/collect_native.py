"""``gpucost collect-kernels -- ./program args…``: a job that is not a Python script, under the injection library.

CUDA loads the library named by ``CUDA_INJECTION64_PATH`` in every process of the job that initialises it
(``gpucost/producers/native/gpucost_inject.c``); each writes its activity to a file of its own in a private folder
beside ``--out``, which this command reads while the job runs and converts with the Python collector's joins
(``cupti_native``), so the lines, the range paths and the summary's counts mean what they mean there
(docs/collecting.md, "Processes that are not Python").  SIGTERM and SIGINT are passed to the job; the command
exits with the job's code.  The folder is removed once read; a collector killed meanwhile leaves it.
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
from types import FrameType

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
    folder = Path(tempfile.mkdtemp(prefix=".gpucost-activity-", dir=out.parent if str(out.parent) else None))
    env = os.environ | {"CUDA_INJECTION64_PATH": library, "GPUCOST_CUPTI_LIBRARY": cupti}
    env |= {"GPUCOST_ACTIVITY_DIR": str(folder), "NVTX_INJECTION64_PATH": env.get("NVTX_INJECTION64_PATH") or cupti}
    files = ActivityFolder(folder, args.node_id, gpu_uuids)
    with out.open("w", encoding="utf-8") as sink:
        try:
            job_process = subprocess.Popen(job, env=env)
        except OSError as exc:
            raise UsageError(f"collect-kernels: {job[0]} could not start ({exc.strerror})") from None

        def forward(signum: int, _: FrameType | None) -> None:
            job_process.send_signal(signum)

        previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            while True:
                try:
                    code = job_process.wait(timeout=POLL_S)
                    break
                except subprocess.TimeoutExpired:
                    sink.writelines(files.poll())
            sink.writelines(files.finish())
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
    summary = {"out": str(out), "nvtx_injection": env["NVTX_INJECTION64_PATH"], "injection_library": library}
    summary["processes"] = files.summaries()
    if not summary["processes"]:
        summary["warnings"] = ["no process of the job loaded the injection library: it used no CUDA, or the "
                               "library could not start (its reason is on stderr above)"]  # fmt: skip
    print(json.dumps({"collect_kernels": summary}), file=sys.stderr)
    shutil.rmtree(folder, ignore_errors=True)
    return code if code >= 0 else 128 - code  # killed by signal N: 128 + N, as a shell reports it
