"""12. Soak: a continuous ``gpucost run`` over a week of a simulated fleet, killed along the way.

The simulated source is the accelerated clock: it yields a week of event time as fast as the pipeline takes
it, and the run publishes every ``delay_s`` of the real clock with a checkpoint, as a node's would every
60 s. The run is SIGKILLed once the checkpoint has passed each of ``kills`` points spread over the week, and
started again on the same ``--out`` each time. Sampled every 0.2 s: the process's resident memory against the
simulated day its checkpoint has reached, and, at the end, the files of every partition folder.

Checked at the end against ``tests/recompute.sql`` (DuckDB over the simulated events written as JSON Lines,
the as-of join done at once): every pane's idle figures, and every party's µ$ summed over its revisions, as
``tests/test_e2e.py`` holds the replay to; and no ``record_id`` twice.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from benchmarks.common import Result
from gpucost.producers.simulate import FleetSpec, simulate
from gpucost.sinks.views import connect
from gpucost.streams.settings import AuditSettings
from tests.recompute import REVISED_COST, json_source, recompute_sql

ROOT = Path(__file__).resolve().parent.parent


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as fh:
            return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmRSS"))
    except (OSError, StopIteration):
        return 0


def _checkpointed(out: Path) -> int:
    """The inputs the checkpoint counts (read from its head: the file is megabytes)."""
    try:
        with open(out / ".checkpoint.json", "rb") as fh:
            found = re.search(rb'"inputs":(\d+)', fh.read(8192))
    except FileNotFoundError:
        return 0
    return int(found.group(1)) if found else 0


def run(gpus: int = 8, days: int = 7, kills: int = 3, delay_s: float = 0.2, compact_min_files: int = 64) -> Result:
    work = Path(tempfile.mkdtemp(prefix="gpucost-soak-"))
    fleet = ["--gpus", str(gpus), "--hours", str(24 * days), "--seed", "0"]
    total = sum(1 for _ in simulate(FleetSpec(gpus=gpus, hours=24 * days, seed=0)))
    out = work / "out"
    command = [
        sys.executable,
        "-m",
        "gpucost.cli",
        "run",
        "--source",
        "simulate",
        *fleet,
        "--out",
        str(out),
        "--publish-delay-s",
        str(delay_s),
        "--compact-min-files",
        str(compact_min_files),
    ]
    rss_by_day: dict[int, int] = defaultdict(int)  # the most seen while the checkpoint was in that day
    targets = [total * (k + 1) // (kills + 1) for k in range(kills)]
    started, lives, at_exit = time.perf_counter(), 0, 0
    while True:
        proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        lives += 1
        target = targets.pop(0) if targets else None
        while proc.poll() is None:
            done, rss = _checkpointed(out), _rss_bytes(proc.pid)
            if done < total:
                rss_by_day[done * days // total] = max(rss_by_day[done * days // total], rss)
            else:  # its input all taken: closing, then the summary and report.html read the output back
                at_exit = max(at_exit, rss)
            if target is not None and done >= target:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                break
            time.sleep(0.2)
        if proc.returncode == 0:
            break
        if proc.returncode != -signal.SIGKILL:
            raise RuntimeError(f"the soak run failed with exit status {proc.returncode}: {' '.join(command)}")
    seconds = time.perf_counter() - started
    files = max(len(list(folder.glob("part-*.parquet"))) for folder in out.glob("*/date=*"))

    events = work / "events"
    subprocess.run(
        [sys.executable, "-m", "gpucost.cli", "simulate", *fleet, "--out", str(events)],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    con = connect(out)
    con.execute(recompute_sql(json_source(sorted(events.glob("*.jsonl"))), AuditSettings()))
    con.execute(REVISED_COST)
    wrong_cost = con.execute("""
        SELECT count(*) FROM want_cost w FULL JOIN revised_cost g USING (gpu_uuid, pane_start_ns, tenant_key)
        WHERE g.pane_cost_micro_usd IS DISTINCT FROM w.c OR abs(g.cost_micro_usd - w.exact_cost) >= 1 + 1e-6
           OR g.cost_micro_usd IS NULL OR w.c IS NULL""").fetchall()[0][0]
    wrong_idle = con.execute("""
        SELECT count(*) FROM want_idle w FULL JOIN idle_index_as_revised g USING (gpu_uuid, pane_start_ns)
        WHERE g.idle_ms IS DISTINCT FROM w.idle_ms OR g.covered_ms IS DISTINCT FROM w.covered_ms
           OR g.idle_ms_72h IS DISTINCT FROM w.idle_ms_72h""").fetchall()[0][0]
    records, distinct = con.execute("SELECT count(*), count(DISTINCT record_id) FROM cost").fetchall()[0]

    first, last = rss_by_day[0], rss_by_day[days - 1]
    flat = last <= 1.10 * first
    met = flat and files <= compact_min_files + 2 and wrong_cost == wrong_idle == 0 and records == distinct
    day_rss = ", ".join(f"day {d + 1}: {rss_by_day[d] / 2**20:.0f}" for d in sorted(rss_by_day))
    return Result(
        f"{12}. Soak: a week of {gpus} GPUs, killed {lives - 1} times",
        "resident memory at day 7 within 10 % of "
        "day 1; files per partition bounded; records equal to the recomputation, none twice",
        met,
        [
            ("simulated", f"{days} days, {gpus} GPUs, {total:,} events, publication every {delay_s:g} s"),
            ("wall time, all lives", f"{seconds:.0f} s ({lives} processes)"),
            ("resident memory by simulated day (MiB, the most seen)", day_rss),
            ("day 7 / day 1", f"{last / first:.3f}" if first else "n/a"),
            ("at exit, building the summary and report.html (MiB)", f"{at_exit / 2**20:.0f}"),
            ("most files in one partition folder", f"{files} (compaction at {compact_min_files})"),
            ("cost parties off the recomputation", f"{wrong_cost}"),
            ("idle panes off the recomputation", f"{wrong_idle}"),
            ("cost records / distinct record_id", f"{records:,} / {distinct:,}"),
        ],
        [
            "Each life starts with the imports (pyarrow, DuckDB, numpy): the day a kill fell in shows the larger of "
            "the two lives' memory.",
            f"Work directory: {work} (left for inspection).",
        ],
    )
