"""Attribution at the source, against real processes started with known environments.

What is expected comes from the environments the test gives its children, not from the code under test:
each child's binding must carry its own variables (by the documented rule), come before its first sample,
come once per process, and never for a process a given binding already names.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pwd
import subprocess
import sys
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest

from gpucost.embedded import run_embedded
from gpucost.producers.attribution import Attribution, AttributionSettings, ProcessEnvironment, start_ticks
from gpucost.producers.live import LiveSettings, open_live
from gpucost.producers.nvml import NvmlSampler
from gpucost.producers.synthetic import SYNTHETIC_PID_BASE
from gpucost.schemas.events import TS_MIN_NS, Price, ProcessSample, TenantBinding
from gpucost.sinks.views import connect
from gpucost.streams.settings import AuditSettings
from gpucost.wiring import attributed
from tests.fake_nvml import FakeState, fake_pynvml, parse
from tests.strategies import BASE_NS

pytestmark = pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux /proc")

TAGGED = {
    "GPUCOST_TEAM": "search",
    "GPUCOST_ENV": "prod",
    "GPUCOST_APP": "ranker",
    "GPUCOST_TIER": "online",
    "GPUCOST_SLA": "Gold",
    "GIT_COMMIT": "9fbe6a5c0ffee",
    "CI_PIPELINE_ID": "88231",
}
SLURM = {"SLURM_JOB_ACCOUNT": "physics", "SLURM_JOB_PARTITION": "gpu-long", "SLURM_JOB_ID": "4711"}
COMMIT_ONLY = {"GIT_COMMIT": "abc123"}


@pytest.fixture
def children() -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    """Real processes, each started with one environment (and nothing of the test's own)."""
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    envs = {
        "tagged": TAGGED,
        "slurm": SLURM,
        "commit_only": COMMIT_ONLY,
        "untagged": {},
        "bad": {"GPUCOST_TEAM": "a:b"},
    }
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(120)"],
            env=base | env,
            stdout=subprocess.PIPE,
        )
        for name, env in envs.items()
    }
    try:
        for p in procs.values():  # each has run its own program: read between fork and exec, a child's environment
            assert p.stdout is not None and p.stdout.readline() == b"up\n"  # is still its parent's
        yield procs
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


def _sample(pid: int, t_s: int) -> ProcessSample:
    return ProcessSample(
        node_id="node-0",
        gpu_uuid="GPU-0",
        pid=pid,
        ts_ns=BASE_NS + t_s * 10**9,
        interval_s=1.0,
        sm_util_pct=50.0,
        mem_bw_util_pct=10.0,
        mem_used_bytes=1,
    )


def test_each_process_is_bound_from_its_own_environment_before_its_first_sample(
    children: dict[str, subprocess.Popen[bytes]],
) -> None:
    pids = {name: p.pid for name, p in children.items()}
    gone = max(pids.values()) + 100_000  # no such process (pid_max is at least 32768 above any of ours? checked)
    assert not Path(f"/proc/{gone}").exists()
    attribution = Attribution([ProcessEnvironment(AttributionSettings())], AttributionSettings())
    samples = [_sample(pid, t) for t in range(3) for pid in [*pids.values(), gone, SYNTHETIC_PID_BASE | 7]]
    out = list(attribution.bind(samples))
    assert [e for e in out if not isinstance(e, TenantBinding)] == samples  # every event passed on, in order
    bindings = {e.pid: e for e in out if isinstance(e, TenantBinding)}
    assert len([e for e in out if isinstance(e, TenantBinding)]) == len(bindings) == 3  # once per process
    for b in bindings.values():  # each before its process's first sample, from that sample's time
        first = next(i for i, e in enumerate(out) if isinstance(e, ProcessSample) and e.pid == b.pid)
        assert out.index(b) == first - 1 and b.ts_ns == out[first].ts_ns

    tagged = bindings[pids["tagged"]]
    assert (
        tagged.team,
        tagged.env,
        tagged.app,
        tagged.tier,
        tagged.sla,
        tagged.git_commit,
        tagged.ci_pipeline_id,
        tagged.origin,
    ) == (
        TAGGED["GPUCOST_TEAM"],
        TAGGED["GPUCOST_ENV"],
        TAGGED["GPUCOST_APP"],
        TAGGED["GPUCOST_TIER"],
        TAGGED["GPUCOST_SLA"],
        TAGGED["GIT_COMMIT"],
        TAGGED["CI_PIPELINE_ID"],
        "environ",
    )
    slurm = bindings[pids["slurm"]]
    assert (slurm.team, slurm.app, slurm.ci_pipeline_id, slurm.sla, slurm.origin) == (
        SLURM["SLURM_JOB_ACCOUNT"],
        SLURM["SLURM_JOB_PARTITION"],
        SLURM["SLURM_JOB_ID"],
        "Bronze",
        "slurm",
    )
    commit = bindings[pids["commit_only"]]
    assert (commit.team, commit.git_commit) == (pwd.getpwuid(os.getuid()).pw_name, COMMIT_ONLY["GIT_COMMIT"])
    source = attribution.sources[0]
    assert source.counts["environ_untagged"] == 1 and source.counts["environ_invalid"] == 1
    assert attribution.counts["process_gone"] == 3 and attribution.counts["bound:environ"] == 2


def test_a_process_given_a_binding_is_never_bound_from_its_environment(
    children: dict[str, subprocess.Popen[bytes]],
) -> None:
    pid = children["tagged"].pid
    given = TenantBinding(node_id="node-0", pid=pid, ts_ns=BASE_NS, team="given", env="", app="", tier="", sla="Silver")
    for attribution, stream in (
        (
            Attribution([ProcessEnvironment(AttributionSettings())], AttributionSettings(), given=[given]),
            [_sample(pid, 1)],
        ),
        (Attribution([ProcessEnvironment(AttributionSettings())], AttributionSettings()), [given, _sample(pid, 1)]),
    ):  # a file's, or one the source itself emits
        out = list(attribution.bind(stream))
        assert [e for e in out if isinstance(e, TenantBinding)] == ([given] if given in stream else [])


def _fake_proc(root: Path, pid: int, start: int, environ: dict[str, str] | None) -> None:
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "stat").write_text(f"{pid} (python3 -c x) S " + " ".join(["0"] * 18) + f" {start} 0 0\n")
    if environ is None:
        (d / "environ").mkdir(exist_ok=True)  # unreadable as a file
    else:
        (d / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in environ.items()))


def test_a_reused_pid_is_bound_again_and_an_unreadable_environment_is_counted(tmp_path: Path) -> None:
    """A fake /proc: a process, then a new one behind the same pid (a later start time), then one whose
    environment cannot be read."""
    settings = AttributionSettings(proc=tmp_path)
    attribution = Attribution([ProcessEnvironment(settings)], settings)
    _fake_proc(tmp_path, 42, 1000, {"GPUCOST_TEAM": "first"})
    assert start_ticks(tmp_path, 42) == 1000
    out = list(attribution.bind([_sample(42, 0), _sample(42, 0)]))
    _fake_proc(tmp_path, 42, 5000, {"GPUCOST_TEAM": "second"})
    out += attribution.bind([_sample(42, 0)])  # within the recheck interval: not looked at yet
    out += attribution.bind([_sample(42, 2)])
    _fake_proc(tmp_path, 43, 7000, None)
    out += attribution.bind([_sample(43, 3)])
    assert [(b.team, b.ts_ns) for b in out if isinstance(b, TenantBinding)] == [
        ("first", BASE_NS),
        ("second", BASE_NS + 2 * 10**9),
    ]
    assert attribution.sources[0].counts["environ_unreadable"] == 1


def test_a_live_nvml_run_bills_real_processes_to_the_commits_they_were_started_with(
    children: dict[str, subprocess.Popen[bytes]], shared_data: Path, tmp_path: Path
) -> None:
    """The fake NVML serving a real H100 capture under load, its processes swapped for the children, through
    the wiring ``gpucost run`` uses and the embedded run, with no bindings file: each child's busy cost is
    billed to the commit and pipeline it was started with; a process without variables stays unattributed."""
    path = shared_data / "nvidia-smi" / "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"
    if not path.exists():
        pytest.skip(f"{path} is absent")
    cap = parse(path, "load")
    busy = sorted({pid for pid, sm, _ in cap.pmon if sm})
    idle = sorted(({pid for pid, _, _ in cap.pmon} | set(cap.apps)) - set(busy))
    assert len(busy) == 1 and len(idle) == 2  # what the capture shows: one process at work, two holding memory
    swap = dict(zip(busy + idle, [children[name].pid for name in ("tagged", "untagged", "slurm")]))
    cap = dataclasses.replace(
        cap, pmon=[(swap[p], sm, mem) for p, sm, mem in cap.pmon], apps={swap[p]: mib for p, mib in cap.apps.items()}
    )
    sampler = NvmlSampler("node-0", fake_pynvml(FakeState(cap)))
    sampler.open()
    live = open_live("nvml", LiveSettings(node_id="node-0", period_s=0.05, duration_s=1.0), nvml=sampler)
    events = attributed(argparse.Namespace(attribution=("environ",), attribution_sla="Bronze", label_keys=()), live)
    price = Price(gpu_model="default", ts_ns=TS_MIN_NS, usd_per_gpu_hour=Decimal("4"))
    run_embedded(
        [(price, "prices")] + [(e, "nvml") for e in events], AuditSettings(pane_s=1, lateness_s=0), tmp_path / "out"
    )
    billed = dict(
        connect(tmp_path / "out")
        .execute("SELECT coalesce(git_commit, team), sum(cost_micro_usd) FROM cost WHERE team <> 'idle' GROUP BY ALL")
        .fetchall()
    )
    # each process billed under its own environment's tenant; the busy one's time to its commit
    assert set(billed) == {TAGGED["GIT_COMMIT"], "unattributed", SLURM["SLURM_JOB_ACCOUNT"]}, billed
    assert billed[TAGGED["GIT_COMMIT"]] > 0
    assert live.counts["bound:environ"] == 1 == live.counts["bound:slurm"]
