"""A Slurm cluster as ``scontrol`` shows it, for tests/test_slurm_allocations.py: a stand-in ``scontrol`` first on
PATH serving jobs as Slurm's own source prints them (the formats and where they come from: that test's docstring),
two nodes' sources, and the allocation a job's hold is by docs/sources.md."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpucost.producers.attribution import AttributionSettings
from gpucost.producers.slurm_allocations import SlurmAllocations, SlurmSettings, gpu_map
from gpucost.producers.slurm_jobs import hostnames
from gpucost.schemas.events import Allocation
from tests.support.allocations import T0, S

J = dict[str, Any]  # a job as the stand-in scontrol serves it
A = [f"GPU-a{n}000000-0000-4000-8000-00000000000{n}" for n in range(4)]  # gpu-01, by a --slurm-gpus file
B = [f"GPU-b{n}000000-0000-4000-8000-00000000000{n}" for n in range(4)]  # gpu-02, by NVML's order
SCONTROL = """#!{python}
import os, sys
d = os.environ["FAKE_SLURM"]
with open(os.path.join(d, "calls"), "a") as calls:
    calls.write(" ".join(sys.argv[1:]) + " SLURM_TIME_FORMAT=" + os.environ.get("SLURM_TIME_FORMAT", "") + "\\n")
mode = open(os.path.join(d, "mode")).read()
if mode == "down":
    sys.exit("slurm_load_jobs error: Unable to contact slurm controller (connect failure)")
if "--json" in sys.argv and mode == "text":
    sys.exit("scontrol: unrecognized option '--json'")
sys.stdout.write(open(os.path.join(d, "jobs.json" if "--json" in sys.argv else "jobs.txt")).read())
"""


def job(jid: int, account: str, part: str, nodes: str, gres: list[str], start: int | None, **kw: Any) -> J:
    return {"job_id": jid, "account": account, "partition": part, "user_name": "alice", "nodes": nodes,
            "gres_detail": gres, "start": start, "end": kw.get("end"), "state": kw.get("state", "RUNNING")}  # fmt: skip


def as_time(seconds: int | None) -> J:
    return {"set": seconds is not None, "infinite": False, "number": seconds or 0}


def as_json(jobs: list[J]) -> str:
    """data_parser v0.0.40's ``scontrol show job -d --json``, trimmed to the fields read (and a few not)."""
    out = [
        {k: v for k, v in j.items() if k not in ("start", "end", "state")}
        | {"job_state": [j["state"]], "start_time": as_time(j["start"]), "end_time": as_time(j["end"])}
        | {"cpus": as_time(8), "qos": "normal", "tres_per_node": "gres/gpu"}
        for j in jobs
    ]
    return json.dumps({"jobs": out, "meta": {"plugin": {"data_parser": "data_parser/v0.0.40"}}, "errors": []})


def as_text(jobs: list[J]) -> str:
    """``scontrol show job -d`` with ``SLURM_TIME_FORMAT=%s``, as src/scontrol/info_job.c lays it out."""
    records = []
    for j in jobs:
        hosts = hostnames(j["nodes"]) if j["nodes"] else []
        lines = [
            f"JobId={j['job_id']} JobName=train",
            "   UserId=alice(1001) GroupId=alice(1001) MCS_label=N/A",
            f"   Priority=4294901759 Nice=0 Account={j['account']} QOS=normal",
            f"   JobState={j['state']} Reason=None Dependency=(null)",
            f"   StartTime={j['start'] or 'Unknown'} EndTime={j['end'] or 'Unknown'} Deadline=N/A",
            f"   Partition={j['partition']} AllocNode:Sid=login1:4242",
            f"   NodeList={j['nodes'] or '(null)'}",
            "   JOB_GRES=gpu:a100:4",
        ]
        lines += [f"     Nodes={h} CPU_IDs=0-7 Mem=32768 GRES={g}" for h, g in zip(hosts, j["gres_detail"])]
        records.append("\n".join([*lines, "   MinCPUsNode=8 MinMemoryNode=32G MinTmpDiskNode=0"]))
    return "\n\n".join(records) + "\n\n" if records else "No jobs in the system\n"


class FakeSlurm:
    """A cluster's jobs as the stand-in ``scontrol`` serves them; ``mode``: json (Slurm ≥ 21.08), text (older: the
    JSON form refused), down (slurmctld not answering)."""

    def __init__(self, path: Path, monkeypatch: pytest.MonkeyPatch, jobs: list[J]) -> None:
        self.path, self.jobs = path, jobs
        (path / "bin").mkdir(parents=True)
        scontrol = path / "bin" / "scontrol"
        scontrol.write_text(SCONTROL.format(python=sys.executable))
        scontrol.chmod(0o755)
        monkeypatch.setenv("PATH", f"{path / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}")
        monkeypatch.setenv("FAKE_SLURM", str(path))
        self.mode("json")

    def mode(self, mode: str) -> None:
        (self.path / "mode").write_text(mode)

    def change(self, *, drop: tuple[int, ...] = (), add: tuple[J, ...] = (), **update: J) -> None:
        self.jobs[:] = [j | update.get(f"j{j['job_id']}", {}) for j in self.jobs if j["job_id"] not in drop]
        self.jobs += add

    def write(self) -> None:
        (self.path / "jobs.json").write_text(as_json(self.jobs))
        (self.path / "jobs.txt").write_text(as_text(self.jobs))

    def calls(self) -> list[str]:
        return (self.path / "calls").read_text().splitlines()


def fake_nvml(devices: list[tuple[str, int, bool]]) -> Any:
    """An NVML of ``(uuid, minor number, MIG enabled)`` in its enumeration (PCI bus id) order."""

    class NVMLError(Exception):
        pass

    return SimpleNamespace(
        NVMLError=NVMLError,
        NVML_DEVICE_MIG_ENABLE=1,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: len(devices),
        nvmlDeviceGetHandleByIndex=lambda i: devices[i],
        nvmlDeviceGetUUID=lambda d: d[0].encode(),
        nvmlDeviceGetMinorNumber=lambda d: d[1],
        nvmlDeviceGetMigMode=lambda d: (int(d[2]), int(d[2])),
    )


def sources(tmp_path: Path, ledger: Path | None = None) -> tuple[SlurmAllocations, SlurmAllocations]:
    """gpu-01's source, its GPUs from a file; gpu-02's, from NVML's order (minor numbers reversed: not that)."""
    mapping = tmp_path / "gpus.txt"
    mapping.write_text("# index uuid\n" + "".join(f"{i} {u}\n" for i, u in enumerate(A)))
    nvml = fake_nvml([(u, 3 - i, False) for i, u in enumerate(B)])
    one = SlurmAllocations(SlurmSettings("gpu-01", str(mapping), refresh_ns=10 * S), AttributionSettings(),
                           ledger_dir=ledger)  # fmt: skip
    two = SlurmAllocations(SlurmSettings("gpu-02", refresh_ns=10 * S), AttributionSettings(), one.counts, ledger,
                           gpus=lambda: gpu_map("nvml", nvml))  # fmt: skip
    return one, two


def cluster() -> list[J]:
    """gpu-01: four GPUs, gres gpu and shard (4 a GPU); gpu-02: four, gpu and mps (100 a GPU)."""
    return [
        job(101, "physics", "a100", "gpu-[01-02]", ["gpu:a100:3(IDX:0,2-3)", "gpu:a100:2(IDX:2-3)"], T0 // S),
        job(103, "bio", "shared", "gpu-01", ["shard:a100:2(0/4,2/4,0/4,0/4)"], T0 // S),
        job(114, "ads", "a100", "gpu-[00,02]", ["gpu:a100:4(IDX:0-3)", "gpu:a100:1(IDX:0)"], T0 // S),
        job(104, "ml", "mps", "gpu-02", ["mps:a100:25(0/100,25/100,0/100,0/100)"], T0 // S),
        job(112, "nlp", "mps", "gpu-02", ["mps:a100:50(0/100,50/100,0/100,0/100)"], T0 // S),
        job(105, "ml", "a100", "", [], None, state="PENDING"),
        job(106, "ml", "a100", "gpu-01", ["gpu:a100:1(IDX:1)"], T0 // S - 900, end=T0 // S - 60, state="COMPLETED"),
        job(107, "ml", "a100", "gpu-03", ["gpu:a100:4(IDX:0-3)"], T0 // S),
        job(116, "ml", "a100", "gpu-01", ["gpu:a100:1(IDX:x)"], T0 // S),  # garbled: counted once, never sent
    ]


def expect(jid: int, node: str, gpu: str, sharing: Any, num: int, den: int, start: int, **kw: Any) -> Allocation:
    """The allocation docs/sources.md says a job's hold is: account → team, partition → app, job id → pipeline."""
    team, app = {101: ("physics", "a100"), 102: ("chem", "shared"), 103: ("bio", "shared"), 104: ("ml", "mps"),
                 112: ("nlp", "mps"), 114: ("ads", "a100")}[jid]  # fmt: skip
    return Allocation(node_id=node, gpu_uuid=gpu, allocation_id=f"slurm/{jid}/{gpu}", ts_ns=start,
                      end_ts_ns=kw.get("end"), sharing=sharing, fraction_num=num, fraction_den=den, team=team,
                      env="", app=app, tier="", sla="Bronze", ci_pipeline_id=str(jid), origin="slurm")  # fmt: skip
