"""A continuous ``gpucost run``: it publishes as it goes, and a run SIGKILLed at any moment and started again on
the same ``--out`` ends with exactly the records of a run never killed (none lost, none twice), in the default
configuration (revision horizon 6 h) and with revisions off.

Independent checks: the killed run's Parquet against an uninterrupted run's, row for row, and (default horizon)
its µ$ summed over revisions per GPU, pane and tenant in SQL against ``tests.reference``, the brute-force
recomputation over the simulated events.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path

import duckdb
import pytest

from gpucost.producers.simulate import FleetSpec, simulate
from gpucost.streams.settings import AuditSettings
from tests.conftest import ROOT, free_ports
from tests.reference import reference
from tests.support.outputs import HORIZONS, KINDS, rows

FLEET = ["--source", "simulate", "--gpus", "3", "--hours", "30", "--seed", "7"]


def start(out: Path, horizon_s: int, *extra: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "GPUCOST_REVISION_HORIZON_S": str(horizon_s)}
    return subprocess.Popen(
        [sys.executable, "-m", "gpucost.cli", "run", *FLEET, "--out", str(out), "--publish-delay-s", "0.02", *extra],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def billed_per_party(out: Path) -> dict[tuple[str, int, str], int]:
    """µ$ per GPU, pane and tenant summed over every revision, in SQL over the Parquet."""
    sql = (
        f"SELECT gpu_uuid, pane_start_ns, tenant_key, sum(cost_micro_usd)::BIGINT FROM "
        f"read_parquet('{out}/cost/date=*/part-*.parquet') GROUP BY ALL"
    )
    return {(g, p, t): c for g, p, t, c in duckdb.sql(sql).fetchall()}


def inputs_checkpointed(out: Path) -> tuple[int, bool]:
    """The inputs the checkpoint counts, and whether its run finished (read from its head: it is megabytes)."""
    try:
        with open(out / ".checkpoint.json", "rb") as fh:
            head = fh.read(8192).decode("utf-8", "replace")
    except FileNotFoundError:
        return 0, False
    found = re.search(r'"inputs":(\d+),"finished":(true|false)', head)
    return (int(found.group(1)), found.group(2) == "true") if found else (0, False)


@pytest.mark.slow  # seconds of a whole run: CI runs it, the inner loop does not
@HORIZONS
def test_a_run_killed_at_random_moments_ends_with_the_records_of_one_never_killed(
    tmp_path: Path, horizon_s: int
) -> None:
    """Each kill waits for the checkpoint to pass a random number of inputs, then a random few milliseconds more
    (mid-publication, between publications), and restarts the run on the same directory."""
    whole = tmp_path / "whole"
    assert start(whole, horizon_s).wait(timeout=300) == 0
    total = sum(1 for _ in simulate(FleetSpec(gpus=3, hours=30, seed=7)))
    killed, rng, kills = tmp_path / "killed", random.Random(horizon_s), []
    for target in sorted(rng.sample(range(total // 10, total * 9 // 10), 4)):
        run, before = start(killed, horizon_s), inputs_checkpointed(killed)[0]
        while run.poll() is None and inputs_checkpointed(killed)[0] < max(target, before + 1):  # one more, at least
            time.sleep(0.002)
        time.sleep(rng.uniform(0, 0.05))
        run.send_signal(signal.SIGKILL)
        assert run.wait() == -signal.SIGKILL, run.stderr.read() if run.stderr else ""
        kills.append(inputs_checkpointed(killed))
    last = start(killed, horizon_s)
    assert last.wait(timeout=300) == 0, last.stderr.read() if last.stderr else ""
    assert len({n for n, _ in kills}) == 4 and not any(done for _, done in kills), kills  # four points, mid-run
    got, want = rows(killed), rows(whole)
    for kind in KINDS:
        assert got[kind] == want[kind], f"{kind}: killed at inputs {kills}"
    ids = duckdb.sql(
        f"SELECT count(*), count(DISTINCT record_id) FROM read_parquet('{killed}/cost/date=*/part-*.parquet')"
    ).fetchall()[0]
    assert ids[0] == ids[1] > 0
    if horizon_s:  # revisions sum to what every event on time bills (definitions.md, "Late data become revisions")
        events = list(simulate(FleetSpec(gpus=3, hours=30, seed=7)))
        oracle = reference(events, AuditSettings(revision_horizon_s=horizon_s))["cost"]
        want_cost = {k[:3]: v[0] for k, v in oracle.items()}  # type: ignore[union-attr]
        billed = billed_per_party(killed)  # a party a revision left with nothing sums to 0, and the oracle has none
        assert {k: v for k, v in billed.items() if v} == {k: v for k, v in want_cost.items() if v} and billed


def scrape(port: int) -> dict[str, float]:
    """Each family's sum over its series, from a scrape of ``/metrics``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    sums: Counter[str] = Counter()
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.split("{")[0].split(" ")[0], line.rsplit(" ", 1)[1]
            sums[name] += float(value)  # type: ignore[assignment]
    return dict(sums)


@pytest.mark.slow
def test_a_running_run_serves_cost_that_rises(tmp_path: Path) -> None:
    """Scraped while it runs (once only at exit): cost, idle cost and GPUs by grade are there, and cost rises."""
    port = free_ports(1)
    run = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpucost.cli",
            "run",
            "--source",
            "simulate",
            "--gpus",
            "2",
            "--hours",
            "400",
            "--out",
            str(tmp_path),
            "--publish-delay-s",
            "0.2",
            "--metrics-address",
            f"127.0.0.1:{port}",
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        seen: list[dict[str, float]] = []
        deadline = time.monotonic() + 60
        while (
            run.poll() is None
            and time.monotonic() < deadline
            and (
                len(seen) < 2
                or seen[-1].get("gpucost_cost_micro_usd_total", 0) <= seen[0].get("gpucost_cost_micro_usd_total", 0)
            )
        ):
            try:
                got = scrape(port)
            except OSError:  # not serving yet
                time.sleep(0.2)
                continue
            if got.get("gpucost_cost_micro_usd_total"):
                seen.append(got)
            time.sleep(0.5)
        assert run.poll() is None, "the run ended before its cost rose between two scrapes"
        assert len(seen) >= 2 and seen[-1]["gpucost_cost_micro_usd_total"] > seen[0]["gpucost_cost_micro_usd_total"]
        assert seen[-1].get("gpucost_idle_cost_micro_usd_total", 0) > 0 and seen[-1].get("gpucost_gpus", 0) > 0
    finally:
        run.kill()
        run.wait()
