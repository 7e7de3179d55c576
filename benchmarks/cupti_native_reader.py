"""How fast ``gpucost collect-kernels`` reads the injection library's frames (no GPU needed).

The library is built from gpucost's source and run, as CUDA would run it, against the C stand-in for libcupti
(``tests/native_standin``) over a recording of ``--kernels`` kernels, each with its launch's runtime record, in
buffers of 20,000; its file is then read in 1 MiB pieces by ``ProcessActivity`` (what the command does while the
job runs, in its own process, not the job's). Prints one JSON object: the file's bytes per kernel and the reader's
kernels a second (best of ``--repetitions``).

    PYTHONPATH=$PWD python benchmarks/cupti_native_reader.py --kernels 200000 --repetitions 3
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpucost.producers.cupti_native import READ_BYTES, ProcessActivity
from tests.support.cupti_recording import kernel, launch
from tests.support.native_cupti import build, write_recording


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kernels", type=int, default=200_000)
    parser.add_argument("--repetitions", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        tmp = Path(scratch)
        built = build(tmp)
        records = [
            r
            for i in range(args.kernels)
            for r in (
                launch(i + 1, 3, 9_990 + i * 100),
                kernel(i + 1, 10_000 + i * 100, 10_050 + i * 100, name=f"k{i % 50}"),
            )
        ]
        buffers = [records[i : i + 40_000] for i in range(0, len(records), 40_000)]
        folder = tmp / "act"
        folder.mkdir()
        env = {"CUDA_INJECTION64_PATH": str(built.library), "GPUCOST_CUPTI_LIBRARY": str(built.cupti),
               "GPUCOST_ACTIVITY_DIR": str(folder),
               "CUPTI_STANDIN_RECORDS": str(write_recording(tmp / "rec.txt", buffers))}  # fmt: skip
        subprocess.run([str(built.job)], env=os.environ | env, check=True)
        (file,) = folder.iterdir()
        data = file.read_bytes()
    best = float("inf")
    for _ in range(args.repetitions):
        reader = ProcessActivity("n1", {})
        start = time.perf_counter()
        for at in range(0, len(data), READ_BYTES):
            reader.lines(reader.feed(data[at : at + READ_BYTES]))
        reader.lines(reader.finish())
        best = min(best, time.perf_counter() - start)
        assert reader.stats.kernels == args.kernels and reader.stats.unlinked_kernels == 0
    result = {"benchmark": "cupti_native_reader", "machine": platform.processor() or platform.machine()}
    result |= {"kernels": args.kernels, "bytes_per_kernel": round(len(data) / args.kernels, 1)}
    result |= {"reader_s": round(best, 3), "kernels_per_s": round(args.kernels / best)}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
