"""Allocation events from Slurm (gpucost/producers/slurm_allocations.py, slurm_jobs.py), against a stand-in
``scontrol`` first on PATH that answers what Slurm's own source says it prints (SchedMD/slurm):

- ``scontrol show job -d --json``: data_parser v0.0.40 (Slurm 23.11), ``{"jobs": [...]}`` with ``job_id``,
  ``account``, ``partition``, ``user_name``, ``job_state`` a list (its flags after it), ``start_time`` and
  ``end_time`` as ``{"set", "infinite", "number"}``, ``nodes`` a hostlist and ``gres_detail`` one string per node of
  it, in its order (src/plugins/data_parser/v0.0.40/parsers.c, ``JOB_INFO_GRES_DETAIL``);
- ``scontrol show job -d``: a record per job, blank lines between, a ``Nodes=<hostlist> CPU_IDs=… Mem=… GRES=…``
  line per group of nodes (src/scontrol/info_job.c), times as the ``SLURM_TIME_FORMAT`` the caller sets says;
- a GRES detail: ``gpu:a100:3(IDX:0,2-3)`` (``bit_fmt``, src/common/bitstring.c), a shared GRES as one
  ``allocated/available`` per GPU of the node, ``shard:a100:1(0/4,1/4,0/4,0/4)`` (``_build_shared_gres_details``,
  src/stepmgr/gres_stepmgr.c); an MPS percentage is count × 100 / the GPU's configured Count (doc/html/gres.shtml).

Two nodes of one cluster, polled as jobs come and go; each event checked field by field, then billed by the
auditor and checked against the split docs/definitions.md ("Allocation basis") gives, worked out here.
"""

from __future__ import annotations

import json
from collections import Counter
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpucost.cli import build_parser
from gpucost.producers.attribution import AttributionSettings, ProcessEnvironment
from gpucost.producers.slurm_allocations import SlurmAllocations, SlurmSettings, gpu_map
from gpucost.producers.slurm_jobs import gres_holds, hostnames, index_list, jobs_from_json, jobs_from_text
from gpucost.schemas.events import Allocation, Event
from gpucost.schemas.records import AllocationRecord, CostRecord, DeadLetter
from gpucost.streams.tables import Tenant
from gpucost.wiring import attributed
from tests.support.allocations import END, PANE, T0, S, audited, by_party, polled, samples
from tests.support.slurm_cluster import A, B, FakeSlurm, as_json, as_text, cluster, expect, fake_nvml, job, sources
from tests.support.split import largest_remainder


def scenario(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str = "json") -> tuple[list[Event], Counter[str]]:
    """Both nodes sampled every 10 s from T0 as jobs change: job 102 (chem, one shard of A1) started T0+25 s,
    listed from T0+30 s; it completes at T0+55 s, listed as COMPLETED from T0+60 s; job 103 is purged from the
    listing at T0+120 s (its end unknown: the poll's time)."""
    slurm = FakeSlurm(tmp_path / "slurm", monkeypatch, cluster())
    slurm.mode(mode)
    chem = job(102, "chem", "shared", "gpu-01", ["shard:a100:1(0/4,1/4,0/4,0/4)"], T0 // S + 25)
    changes = {
        T0 + 30 * S: lambda: slurm.change(add=(chem,)),
        T0 + 60 * S: lambda: slurm.change(j102={"state": "COMPLETED", "end": T0 // S + 55}),
        T0 + 120 * S: lambda: slurm.change(drop=(103,)),
    }
    one, two = sources(tmp_path)
    slurm.write()
    events: list[Event] = []
    every = [*samples("gpu-01", tuple(A), {}), *samples("gpu-02", tuple(B), {})]
    for t in range(T0, END, 10 * S):  # each node polled, then sampled, every 10 s, after the cluster changes
        if t in changes:
            changes[t]()
            slurm.write()
        for node, source in (("gpu-01", one), ("gpu-02", two)):
            events += [*source.poll(node, t), *(e for e in every if e.ts_ns == t and getattr(e, "node_id", "") == node)]
    assert all(c.endswith("SLURM_TIME_FORMAT=%s") for c in slurm.calls())  # times as seconds, never local time
    return events, one.counts


WANT = [
    (T0, expect(101, "gpu-01", A[0], "exclusive", 1, 1, T0)),
    (T0, expect(101, "gpu-01", A[2], "exclusive", 1, 1, T0)),
    (T0, expect(101, "gpu-01", A[3], "exclusive", 1, 1, T0)),
    (T0, expect(103, "gpu-01", A[1], "time_slicing", 2, 4, T0)),
    (T0 + 30 * S, expect(102, "gpu-01", A[1], "time_slicing", 1, 4, T0 + 25 * S)),
    (T0 + 60 * S, expect(102, "gpu-01", A[1], "time_slicing", 1, 4, T0 + 25 * S, end=T0 + 55 * S)),
    (T0 + 120 * S, expect(103, "gpu-01", A[1], "time_slicing", 2, 4, T0, end=T0 + 120 * S)),
    (T0, expect(101, "gpu-02", B[2], "exclusive", 1, 1, T0)),
    (T0, expect(101, "gpu-02", B[3], "exclusive", 1, 1, T0)),
    (T0, expect(114, "gpu-02", B[0], "exclusive", 1, 1, T0)),
    (T0, expect(104, "gpu-02", B[1], "mps", 25, 100, T0)),
    (T0, expect(112, "gpu-02", B[1], "mps", 50, 100, T0)),
]


@pytest.mark.parametrize("mode", ["json", "text"])
def test_each_hold_is_sent_once_and_ended_once_field_by_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """The JSON form (Slurm ≥ 21.08) and the text form (older: the JSON refused) give the very same events."""
    events, counts = scenario(tmp_path, monkeypatch, mode)
    assert sorted(polled(events), key=repr) == sorted(WANT, key=repr)
    assert counts["slurm_alloc_gres_invalid"] == 1  # job 116, once, not once a poll
    assert counts["slurm_alloc_ended"] == 2 and counts["slurm_alloc_exclusive"] == 6


def test_the_scenario_bills_each_pane_as_the_definition_splits_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events, _ = scenario(tmp_path, monkeypatch)
    out = audited(events)
    assert not [r for r in out if isinstance(r, DeadLetter)]
    cost = {(r.gpu_uuid, r.pane_start_ns): r.pane_cost_micro_usd for r in out if isinstance(r, CostRecord)}
    holds: dict[str, list[tuple[str, Fraction, int, int]]] = {}
    for _, a in WANT:  # each hold's (tenant key, fraction, start, end), its end from its second event
        spans = holds.setdefault(a.gpu_uuid, [])
        key = f"{a.team}::{a.app}::Bronze::{a.ci_pipeline_id}"
        spans[:] = [s for s in spans if s[0] != key]
        spans.append((key, Fraction(a.fraction_num, a.fraction_den), a.ts_ns, a.end_ts_ns or END))
    want: dict[tuple[str, int, str], int] = {}
    for (gpu, start), c in cost.items():
        covered = {k: f * max(0, min(start + PANE, e) - max(start, b)) for k, f, b, e in holds.get(gpu, [])}
        parties = sorted(k for k, w in covered.items() if w)
        held = sum((covered[k] for k in parties), Fraction(0))
        split = largest_remainder(c, [max(Fraction(PANE), held) - held, *(covered[k] for k in parties)])
        want |= dict(zip([(gpu, start, p) for p in ["unallocated", *parties]], split))
    assert by_party(out) == want
    # one pane by hand: A1's first, bio's half from T0 and chem's quarter over 30 of its 60 s (T0+25 to T0+55)
    first = {r.tenant_key: r.allocated_fraction for r in out if isinstance(r, AllocationRecord)
             and (r.gpu_uuid, r.pane_start_ns) == (A[1], T0)}  # fmt: skip
    assert first == pytest.approx({"bio::shared::Bronze::103": 0.5, "chem::shared::Bronze::102": 0.125,
                                   "unallocated": 0.375})  # fmt: skip


def test_a_restarted_source_ends_from_its_ledger_the_holds_gone_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ledger of holds sent (per node, in the state folder): a restart sends no start again for a job still
    running, and ends those gone while it was down, at the job's end time where Slurm still lists it, else at the
    first answered poll; without the ledger, a start sent again is the auditor's ``duplicate``."""
    slurm = FakeSlurm(tmp_path / "slurm", monkeypatch, cluster())
    slurm.write()
    ledger = tmp_path / "state"
    sent = sources(tmp_path, ledger)[0].poll("gpu-01", T0)
    assert sorted(a.allocation_id for a in sent) == sorted(f"slurm/{j}/{A[i]}" for j, i in
                                                           ((101, 0), (101, 2), (101, 3), (103, 1)))  # fmt: skip
    slurm.change(drop=(103,), j101={"state": "COMPLETED", "end": T0 // S + 40})  # while no source runs
    slurm.write()
    after = sources(tmp_path, ledger)[0].poll("gpu-01", T0 + 90 * S)
    ends = {a.allocation_id: a.end_ts_ns for a in after}
    assert ends == {f"slurm/101/{A[i]}": T0 + 40 * S for i in (0, 2, 3)} | {f"slurm/103/{A[1]}": T0 + 90 * S}
    assert all(a == next(s for s in sent if s.allocation_id == a.allocation_id).model_copy(
        update={"end_ts_ns": a.end_ts_ns}) for a in after)  # fmt: skip
    out = audited([*sent, *(e for e in samples("gpu-01", tuple(A), {}) if e.ts_ns < T0 + 90 * S), *after])
    assert not [r for r in out if isinstance(r, DeadLetter)]
    again = sources(tmp_path, None)[0].poll("gpu-01", T0 + 100 * S)  # no ledger: nothing ends, 102 is not there
    assert again == []
    slurm.change(j101={"state": "RUNNING", "end": None})
    slurm.write()
    resent = sources(tmp_path, None)[0].poll("gpu-01", T0 + 100 * S)
    assert [r.reason for r in audited([*sent, *resent]) if isinstance(r, DeadLetter)] == ["duplicate"] * 3


def test_no_answer_or_a_garbled_one_is_counted_and_ends_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slurm = FakeSlurm(tmp_path / "slurm", monkeypatch, cluster())
    slurm.write()
    one, _ = sources(tmp_path)
    assert len(one.poll("gpu-01", T0)) == 4
    slurm.mode("down")
    assert one.poll("gpu-01", T0 + 10 * S) == [] and one.poll("gpu-01", T0 + 20 * S) == []
    assert one.counts["slurm_unavailable"] == 2
    slurm.mode("json")
    (slurm.path / "jobs.json").write_text('{"jobs": [{"job_id": "not a number"}]}')
    (slurm.path / "jobs.txt").write_text("JobId=12 Account=x\n\nsegmentation fault\n")
    assert one.poll("gpu-01", T0 + 30 * S) == []
    assert one.counts["slurm_output_invalid"] == 1
    slurm.change(j101={"gres_detail": ["gpu:a100:3(IDX:0,2-3", "x"]})  # one job's detail cut short
    slurm.write()
    assert one.poll("gpu-01", T0 + 40 * S) == []  # its holds kept, not ended; the other job's unchanged
    assert one.counts["slurm_alloc_gres_invalid"] == 2  # 116's and 101's
    slurm.change(drop=(101,))
    slurm.write()
    assert {a.allocation_id for a in one.poll("gpu-01", T0 + 50 * S)} == {f"slurm/101/{A[i]}" for i in (0, 2, 3)}
    lost = SlurmAllocations(SlurmSettings("gpu-01", str(tmp_path / "none.txt")), AttributionSettings())
    assert lost.poll("gpu-01", T0) == [] and lost.counts["slurm_gpus_unknown"] == 1


def test_slurm_s_formats_are_read_exactly() -> None:
    assert index_list("0") == [0] and index_list("0-1") == [0, 1] and index_list("0,2-3,7") == [0, 2, 3, 7]
    for bad in ("", "1-0", "2,1", "0,,1", "0-", "a", "١"):
        with pytest.raises(ValueError):
            index_list(bad)
    holds, unbillable = gres_holds("gpu:a100:2(IDX:0,2),shard:1(0/8,1/8),mps:h100:200(200/1300),nic:1(CNT:1)")
    assert [(h.index, h.gres, h.type, h.num, h.den) for h in holds] == [
        (0, "gpu", "a100", 1, 1), (2, "gpu", "a100", 1, 1), (1, "shard", None, 1, 8), (0, "mps", "h100", 200, 1300),
    ]  # fmt: skip
    assert unbillable == []
    assert gres_holds("gpu:1g.10gb:1(IDX:4),gpu(CNT:2),mps:50(IDX:0)") == (
        [gres_holds("gpu:1g.10gb:1(IDX:4)")[0][0]],
        ["slurm_alloc_gres_without_index", "slurm_alloc_shared_without_counts"],
    )
    for bad in ("gpu:2(IDX:0-1", "shard:1(5/4)", "shard:1(1:4)", "gpu:2(0-1)"):
        with pytest.raises(ValueError):
            gres_holds(bad)
    assert hostnames("gpu-[005-006,9],cn1,r[1-2]n[01-02]") == [
        "gpu-005", "gpu-006", "gpu-9", "cn1", "r1n01", "r1n02", "r2n01", "r2n02",
    ]  # fmt: skip
    # data_parser v0.0.38 (Slurm 23.02): times as plain seconds, the state a string
    old = {"job_id": 7, "account": "", "partition": "p", "user_name": "bob", "job_state": "RUNNING",
           "start_time": 1780000000, "end_time": 1780003600, "nodes": "cn[1-2]", "gres_detail": ["gpu:1(IDX:0)",
           "gpu:1(IDX:3)"]}  # fmt: skip
    (seven,) = jobs_from_json(json.dumps({"jobs": [old]}), "cn2")
    assert (seven.gres, seven.start_s, seven.end_s, seven.holding, seven.user) == ("gpu:1(IDX:3)", 1780000000,
                                                                                   1780003600, True, "bob")  # fmt: skip
    # the text form groups the nodes whose detail is the same into one line (src/scontrol/info_job.c)
    text = ("JobId=8 JobName=x\n   UserId=bob(1) GroupId=bob(1)\n   Account=(null) QOS=normal\n"
            "   JobState=COMPLETING Reason=None\n   StartTime=2026-12-05T01:00:00 EndTime=Unknown Deadline=N/A\n"
            "   Partition=p AllocNode:Sid=l:1\n     Nodes=cn[1-3] CPU_IDs=0-3 Mem=0 GRES=gpu:2(IDX:0-1)\n")  # fmt: skip
    (eight,) = jobs_from_text(text, "cn2")
    assert (eight.gres, eight.account, eight.holding, eight.end_s) == ("gpu:2(IDX:0-1)", "", False, None)


def test_the_gpu_order_is_nvml_s_or_the_minor_numbers_or_a_file_and_mig_needs_a_file(tmp_path: Path) -> None:
    nvml = fake_nvml([("GPU-x", 1, False), ("GPU-y", 0, False)])
    assert gpu_map("nvml", nvml) == {0: "GPU-x", 1: "GPU-y"}
    assert gpu_map("minor", nvml) == {0: "GPU-y", 1: "GPU-x"}
    with pytest.raises(ValueError, match="MIG"):
        gpu_map("nvml", fake_nvml([("GPU-x", 0, True)]))
    path = tmp_path / "gpus"
    path.write_text("0 GPU-x\n1 MIG-y  # a MIG device, by hand\n")
    assert gpu_map(str(path)) == {0: "GPU-x", 1: "MIG-y"}
    for bad in ("0 GPU-x\n0 GPU-y\n", "zero GPU-x\n", "0\n"):
        path.write_text(bad)
        with pytest.raises(ValueError, match="index"):
            gpu_map(str(path))


def test_a_mig_device_named_by_the_file_is_held_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    slurm = FakeSlurm(
        tmp_path / "slurm", monkeypatch, [job(9, "ml", "mig", "gpu-01", ["gpu:3g.40gb:1(IDX:1)"], T0 // S - 5)]
    )
    slurm.write()
    (tmp_path / "gpus").write_text("0 MIG-aaaa\n1 MIG-bbbb\n")
    source = SlurmAllocations(SlurmSettings("gpu-01", str(tmp_path / "gpus")), AttributionSettings())
    (hold,) = source.poll("gpu-01", T0)
    assert (hold.gpu_uuid, hold.sharing, hold.fraction_num, hold.ts_ns) == ("MIG-bbbb", "mig", 1, T0 - 5 * S)


def test_the_produce_wiring_sends_slurm_s_allocations_beside_the_samples(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    FakeSlurm(tmp_path / "slurm", monkeypatch, cluster()).write()
    (tmp_path / "gpus").write_text("".join(f"{i} {u}\n" for i, u in enumerate(A)))
    live = SimpleNamespace(events=lambda: samples("gpu-01", tuple(A), {}), counts=Counter())
    flags = f"produce --source nvml --attribution none --slurm-node gpu-01 --slurm-gpus {tmp_path / 'gpus'}".split()
    off = list(attributed(build_parser().parse_args(flags), live))
    on = list(attributed(build_parser().parse_args([*flags, "--slurm-allocations", "on"]), live))
    assert not [e for e in off if isinstance(e, Allocation)]
    assert sorted(a.allocation_id for a in on if isinstance(a, Allocation)) == sorted(
        a.allocation_id for t, a in WANT if t == T0 and a.node_id == "gpu-01"
    )
    assert [e for e in on if not isinstance(e, Allocation)] == off
    monkeypatch.setenv("GPUCOST_SLURM_ALLOCATIONS", "on")
    monkeypatch.setenv("GPUCOST_SLURM_GPUS", "minor")
    args = build_parser().parse_args(["produce", "--source", "nvml"])
    assert (args.slurm_allocations, args.slurm_gpus) == (True, "minor")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["produce", "--source", "nvml", "--slurm-allocations", "yes"])


def test_a_job_s_holds_carry_the_labels_its_processes_bindings_carry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--label-keys`` naming Slurm's job variables: a hold's labels are what the job's process environment gives
    its bindings (docs/sources.md, "Labels as dimensions"), so both bases name one tenant; a key Slurm's listing
    does not give (the QOS) is no label of either."""
    slurm = FakeSlurm(tmp_path / "slurm", monkeypatch, cluster())
    slurm.write()
    keys = ("SLURM_JOB_PARTITION", "SLURM_JOB_USER", "SLURM_JOB_QOS")
    mapping = tmp_path / "gpus.txt"
    mapping.write_text("".join(f"{i} {u}\n" for i, u in enumerate(A)))
    settings = AttributionSettings(proc=tmp_path / "proc", label_keys=keys)
    source = SlurmAllocations(SlurmSettings("gpu-01", str(mapping), refresh_ns=10 * S), settings)
    holds = [e for e in source.poll("gpu-01", T0) if isinstance(e, Allocation)]
    assert {a.allocation_id.split("/")[1] for a in holds} == {"101", "103"}
    for a in holds:
        jid = int(a.allocation_id.split("/")[1])
        j = next(j for j in cluster() if j["job_id"] == jid)
        environ = {  # as slurmd sets them in the job's processes (the QOS is in the job's environment only)
            "SLURM_JOB_ACCOUNT": j["account"],
            "SLURM_JOB_PARTITION": j["partition"],
            "SLURM_JOB_ID": str(jid),
            "SLURM_JOB_USER": j["user_name"],
        }
        proc = tmp_path / "proc" / str(jid)
        proc.mkdir(parents=True, exist_ok=True)
        (proc / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in environ.items()))
        (proc / "stat").write_text(f"{jid} (python3) S " + " ".join(["0"] * 18) + f" {1000 + jid} 0 0\n")
        binding = ProcessEnvironment(settings).binding("gpu-01", jid, T0, a.gpu_uuid)
        assert binding is not None
        assert json.loads(a.labels or "{}") == {"SLURM_JOB_PARTITION": j["partition"], "SLURM_JOB_USER": "alice"}
        assert Tenant.of(a).key == Tenant.of(binding).key


def test_huge_ranges_are_refused_not_expanded_and_the_producer_keeps_polling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bitmap or hostlist of hundreds of millions is no node's: a ValueError that says so, counted as garbled,
    never a MemoryError out of every poll. Each call below finishes only because nothing is expanded."""
    assert index_list("0-1023") == list(range(1024)) and len(hostnames("n[0-65535]")) == 65_536  # the bounds
    for bad_index in ("1024", "0-400000000", "0,5-400000000"):
        with pytest.raises(ValueError, match="at most 1024 GPU indices"):
            index_list(bad_index)
    with pytest.raises(ValueError, match="at most 1024 GPU indices"):
        gres_holds("gpu:a100:1(IDX:0-400000000)")
    for bad_hosts in ("n[0-400000000]", "a[0-9999]b[0-9999]", "n[0-65535],x", "a[0-256]b[0-255]c"):
        with pytest.raises(ValueError, match="more than 65,536"):
            hostnames(bad_hosts)
    slurm = FakeSlurm(tmp_path / "slurm", monkeypatch, cluster())
    slurm.change(j101={"gres_detail": ["gpu:a100:1(IDX:0-400000000)", "gpu:a100:1(IDX:0)"]})
    slurm.write()
    one, _ = sources(tmp_path)
    assert {a.allocation_id for a in one.poll("gpu-01", T0)} == {f"slurm/103/{A[1]}"}  # 101 refused, 103 sent
    assert one.counts["slurm_alloc_gres_invalid"] == 2  # 101's and 116's
    huge = job(120, "ml", "a100", "n[0-400000000]", ["gpu:a100:1(IDX:0)"], T0 // S)
    (slurm.path / "jobs.json").write_text(as_json([*slurm.jobs, huge]))
    record = "JobId=120 JobName=x\n   JobState=RUNNING Reason=None\n     Nodes=n[0-400000000] CPU_IDs=0 Mem=1 GRES=x\n"
    (slurm.path / "jobs.txt").write_text(as_text(slurm.jobs) + record)
    for t in (T0 + 10 * S, T0 + 20 * S):  # polled again and again: counted each time, nothing ended
        assert one.poll("gpu-01", t) == []
    assert one.counts["slurm_output_invalid"] == 2
    slurm.write()  # the huge job gone: the node's jobs read again, 103's hold still open, nothing new
    assert one.poll("gpu-01", T0 + 30 * S) == []
    slurm.change(drop=(103,))
    slurm.write()
    assert {a.allocation_id for a in one.poll("gpu-01", T0 + 40 * S)} == {f"slurm/103/{A[1]}"}  # ended now
