"""Allocation events from the kubelet (gpucost/producers/kubernetes_allocations.py), against the fake kubelet and
API server of tests/fake_kubernetes.py: issue 40's held-out scenario (a time-sliced GPU of 4 replicas held by 3
pods, an MPS pair, a MIG 3g+4g split, a HAMi pod) polled as pods come and go, each event checked field by field,
then billed by the auditor and checked against the split docs/definitions.md ("Allocation basis") gives, worked
out here from the scenario's own timeline, never from the code under test.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpucost.cli import build_parser
from gpucost.producers.attribution import AttributionSettings
from gpucost.producers.kubernetes import KubernetesSettings
from gpucost.producers.kubernetes_allocations import KubernetesAllocations, SharingSettings
from gpucost.schemas.events import Allocation, Event
from gpucost.schemas.records import AllocationRecord, CostRecord, DeadLetter
from gpucost.wiring import attributed
from tests.fake_kubernetes import FakeContainer, FakeNode, FakePod
from tests.support.allocations import END, PANE, T0, S, audited, by_party, polled, samples
from tests.support.split import largest_remainder

GPU, SHARED = "nvidia.com/gpu", "nvidia.com/gpu.shared"
TS, MPS, HAMI = (f"GPU-{n}{n}{n}{n}{n}{n}{n}{n}-0000-4000-8000-00000000000{n}" for n in (1, 2, 3))
MIG3, MIG4 = "MIG-3g-0000-4000-8000-000000000003", "MIG-4g-0000-4000-8000-000000000004"


def at(ns: int) -> str:
    """A time as the kubelet writes ``status.startTime``."""
    return dt.datetime.fromtimestamp(ns // S, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod(team: str, name: str, device: str, started: int, **container: dict[str, str]) -> FakePod:
    resource = SHARED if "::" in device else GPU
    return FakePod(team, name, [FakeContainer("main", {resource: [device]}, **container)], started=at(started))


def source(kube: FakeNode, url: str, sharing: SharingSettings, ledger: Path | None = None) -> KubernetesAllocations:
    settings = KubernetesSettings(
        pods_url=url, token_file=kube.token_file, pod_resources=kube.socket, refresh_ns=10 * S
    )
    return KubernetesAllocations(settings, sharing, AttributionSettings(), ledger_dir=ledger)


def samples_until(node: str, end_ns: int) -> list[Event]:
    """The GPU samples of the shared GPU and the 3g MIG device from ``T0`` to ``end_ns``."""
    return [e for e in samples(node, (TS, MIG3), {}) if e.ts_ns < end_ns]


def expect(
    node: str, p: FakePod, gpu: str, sharing: str, num: int, den: int, ts: int, end: int | None = None
) -> Allocation:
    """The allocation docs/sources.md says a pod's one hold is: its tenant by attribution's rule (no labels: the
    namespace, the pod's name, the container's), its id the pod's UID, container and device id as listed."""
    device = next(iter(p.containers[0].devices.values()))[0]
    return Allocation(
        node_id=node,
        gpu_uuid=gpu,
        allocation_id=f"{p.uid}/main/{device}",
        ts_ns=ts,
        end_ts_ns=end,
        sharing=sharing,  # type: ignore[arg-type]
        fraction_num=num,
        fraction_den=den,
        team=p.namespace,
        env="",
        app=p.name,
        tier="main",
        sla="Bronze",
        origin="kubernetes",
    )


def scenario(
    tmp_path: Path,
) -> tuple[list[Event], list[tuple[int, Allocation]], dict[str, list[tuple]], Counter[str], list[FakePod]]:
    """Node a (time-slicing, 4 replicas): vision and speech on replicas 0 and 1 from T0, search on replica 2 from
    T0+55 s (listed at the T0+60 s poll), vision gone at T0+120 s; batch on a 3g MIG device from T0, ads on the 4g
    from T0+25 s; nlp on a HAMi slot with gpucores 30 from T0; a pod on a GPU by index and a pod whose gpucores is
    not a number. Node b (MPS, 2 replicas): speech with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=40 and vision without,
    from T0, vision gone at T0+150 s. The events of both nodes, the allocations each poll sent, each device's holds
    as (tenant, fraction, start, end), the counts, and node a's pods at the end."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    ts1, ts2 = pod("vision", "ts-1", f"{TS}::0", T0), pod("speech", "ts-2", f"{TS}::1", T0)
    ts3, mig3 = pod("search", "ts-3", f"{TS}::2", T0 + 55 * S), pod("batch", "mig-3", MIG3, T0)
    mig4 = pod("ads", "mig-4", MIG4, T0 + 25 * S)
    hami = pod("nlp", "hami", f"{HAMI}-3", T0, limits={"nvidia.com/gpucores": "30", "nvidia.com/gpumem": "8000"})
    by_index = pod("legacy", "by-index", "3", T0)
    garbled = pod("nlp", "garbled", f"{HAMI}-4", T0, limits={"nvidia.com/gpucores": "thirty"})
    mps1 = pod("speech", "mps-1", f"{MPS}::0", T0, env={"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "40"})
    mps2 = pod("vision", "mps-2", f"{MPS}::1", T0)
    a = FakeNode(tmp_path / "a", [ts1, ts2, mig3, hami, by_index, garbled], node="gpu-a")
    b = FakeNode(tmp_path / "b", [mps1, mps2], node="gpu-b")
    changes_a = {
        T0 + 30 * S: lambda: a.pods.append(mig4),
        T0 + 60 * S: lambda: a.pods.append(ts3),
        T0 + 120 * S: lambda: a.pods.remove(ts1),
    }
    with a.serving() as url_a, b.serving() as url_b:
        on_a = source(a, url_a, SharingSettings(replicas=4, mode="time_slicing"))
        on_b = source(b, url_b, SharingSettings(replicas=2, mode="mps"))
        on_b.counts = on_a.counts
        events = [
            *on_a.interleave(samples("gpu-a", (TS, MIG3, MIG4, HAMI), changes_a)),
            *on_b.interleave(samples("gpu-b", (MPS,), {T0 + 150 * S: lambda: b.pods.remove(mps2)})),
        ]
    want = [
        (T0, expect("gpu-a", mig3, MIG3, "mig", 1, 1, T0)),
        (T0, expect("gpu-a", hami, HAMI, "hami", 30, 100, T0)),
        (T0, expect("gpu-a", ts2, TS, "time_slicing", 1, 4, T0)),
        (T0, expect("gpu-a", ts1, TS, "time_slicing", 1, 4, T0)),
        (T0 + 30 * S, expect("gpu-a", mig4, MIG4, "mig", 1, 1, T0 + 25 * S)),
        (T0 + 60 * S, expect("gpu-a", ts3, TS, "time_slicing", 1, 4, T0 + 55 * S)),
        (T0 + 120 * S, expect("gpu-a", ts1, TS, "time_slicing", 1, 4, T0, end=T0 + 120 * S)),
        (T0, expect("gpu-b", mps1, MPS, "mps", 40, 100, T0)),
        (T0, expect("gpu-b", mps2, MPS, "mps", 1, 2, T0)),
        (T0 + 150 * S, expect("gpu-b", mps2, MPS, "mps", 1, 2, T0, end=T0 + 150 * S)),
    ]
    got = polled(events)
    assert sorted(got, key=repr) == sorted(want, key=repr)
    key = "{}::{}:main:Bronze::".format
    holds = {
        TS: [
            (key("vision", "ts-1"), Fraction(1, 4), T0, T0 + 120 * S),
            (key("speech", "ts-2"), Fraction(1, 4), T0, None),
            (key("search", "ts-3"), Fraction(1, 4), T0 + 55 * S, None),
        ],
        MIG3: [(key("batch", "mig-3"), Fraction(1), T0, None)],
        MIG4: [(key("ads", "mig-4"), Fraction(1), T0 + 25 * S, None)],
        HAMI: [(key("nlp", "hami"), Fraction(30, 100), T0, None)],
        MPS: [
            (key("speech", "mps-1"), Fraction(40, 100), T0, None),
            (key("vision", "mps-2"), Fraction(1, 2), T0, T0 + 150 * S),
        ],
    }
    return events, got, holds, on_a.counts, a.pods


def test_the_held_out_scenario_bills_each_pane_as_the_definition_splits_it(tmp_path: Path) -> None:
    events, _, holds, counts, _ = scenario(tmp_path)
    assert counts["kube_alloc_device_not_gpu"] == 1 and counts["kube_alloc_gpucores_invalid"] == 1  # once, not a poll
    out = audited(events)
    assert not [r for r in out if isinstance(r, DeadLetter)]
    cost = {(r.gpu_uuid, r.pane_start_ns): r.pane_cost_micro_usd for r in out if isinstance(r, CostRecord)}
    want = {}
    for gpu, held in holds.items():
        for start in range(T0, END, PANE):
            # a tenant's weight is Σ fraction × the time its holds cover of the pane; unallocated the rest of it
            weights = {
                tenant: f * max(0, min(start + PANE, end or END) - max(start, since)) for tenant, f, since, end in held
            }
            weights = {t: w for t, w in weights.items() if w}
            parties = ["unallocated", *sorted(weights)]
            free = max(Fraction(PANE), sum(weights.values())) - sum(weights.values())
            split = largest_remainder(cost[(gpu, start)], [free, *(weights[t] for t in parties[1:])])
            want |= {(gpu, start, p): v for p, v in zip(parties, split)}
    assert by_party(out) == want
    for gpu, start in cost:  # Σ parties = the pane's cost, on the allocation basis as on the usage one
        assert sum(v for (g, s, _), v in want.items() if (g, s) == (gpu, start)) == cost[(gpu, start)]
    # the worked example of one pane, the time-sliced GPU's first: 3 quarters over 60 + 60 + 5 s of its 60 s
    first = [r for r in out if isinstance(r, AllocationRecord) and r.gpu_uuid == TS and r.pane_start_ns == T0]
    assert sorted(r.allocated_fraction for r in first) == pytest.approx([5 / 240, 1 / 4, 1 / 4, 115 / 240])


def test_a_restarted_source_resends_the_same_starts_and_the_auditor_drops_them_as_duplicates(tmp_path: Path) -> None:
    """The start of a hold is the pod's admission time, the same after a restart: what a fresh source sends of
    the holds still listed is the very events sent before, each a ``duplicate``, and no µ$ moves."""
    events, got, _, _, pods = scenario(tmp_path)
    (tmp_path / "r").mkdir()
    kube = FakeNode(tmp_path / "r", pods, node="gpu-a")
    with kube.serving() as url:
        restarted = source(kube, url, SharingSettings(replicas=4)).poll("gpu-a", END)
    still = [a for _, a in got if a.node_id == "gpu-a" and a.end_ts_ns is None]
    ended = {a.allocation_id for _, a in got if a.end_ts_ns is not None}
    assert sorted(restarted, key=repr) == sorted((a for a in still if a.allocation_id not in ended), key=repr)
    out = audited([*events, *restarted])
    assert [r.reason for r in out if isinstance(r, DeadLetter)] == ["duplicate"] * len(restarted)
    assert by_party(out) == by_party(audited(events))


def test_bad_kubelet_answers_are_counted_with_their_reason_and_no_hold_ends_for_want_of_an_answer(
    tmp_path: Path,
) -> None:
    held = pod("vision", "held", f"{TS}::0", T0)
    bad_mps = pod("speech", "bad-mps", f"{MPS}::0", T0, env={"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "140"})
    late = pod("search", "late", MIG3, T0)
    odd = pod("nlp", "odd", f"{HAMI}-5", T0, limits={"nvidia.com/gpucores": "³0"})  # a digit int() refuses
    late.listed = False  # the kubelet lists it before the API server does
    kube = FakeNode(tmp_path, [held, bad_mps, late, odd], node="gpu-a")
    with kube.serving() as url:
        unset = source(kube, url, SharingSettings())  # no replicas: a replica's share is unknown, not guessed
        assert unset.poll("gpu-a", T0) == []
        assert unset.counts == Counter(
            kube_alloc_replicas_unset=1,
            kube_alloc_mps_percentage_invalid=1,
            kube_alloc_pod_unlisted=1,
            kube_alloc_gpucores_invalid=1,
        )
        told = source(kube, url, SharingSettings(replicas=4))
        assert [a.app for a in told.poll("gpu-a", T0)] == ["held"]
        kube.pods.remove(held)
        kube.api_up = False  # the pods' listing fails: nothing ends, nothing starts
        assert told.poll("gpu-a", T0 + 10 * S) == []
        assert told.counts["kube_pods_unavailable"] == 1
        kube.api_up, late.listed = True, True
        after = told.poll("gpu-a", T0 + 20 * S)
    assert [(a.app, a.ts_ns, a.end_ts_ns) for a in after] == [("late", T0, None), ("held", T0, T0 + 20 * S)]
    kube.socket.unlink(missing_ok=True)  # the kubelet gone: counted, never raised
    assert told.poll("gpu-a", T0 + 30 * S) == []
    assert told.counts["kube_pod_resources_unavailable"] == 1


def test_a_hold_ended_while_the_source_was_down_is_ended_by_the_next_one(tmp_path: Path) -> None:
    """The ledger of holds sent (per node, in the state folder): a restarted source sends no start again for a hold
    still listed, and ends, at its first answered poll, the hold whose pod went away while it was down; an
    unreadable ledger is counted and the source goes on without it."""
    kept, gone = pod("vision", "kept", f"{TS}::0", T0), pod("search", "gone", MIG3, T0)
    kube = FakeNode(tmp_path, [kept, gone], node="gpu-a")
    ledger = tmp_path / "state"
    with kube.serving() as url:
        first = source(kube, url, SharingSettings(replicas=4), ledger)
        sent = first.poll("gpu-a", T0)
        assert sorted(a.app for a in sent) == ["gone", "kept"]
        kube.pods.remove(gone)  # while no source runs
        second = source(kube, url, SharingSettings(replicas=4), ledger)
        after = second.poll("gpu-a", T0 + 60 * S)
        other_node = source(kube, url, SharingSettings(replicas=4), ledger).poll("gpu-b", T0 + 60 * S)
    ended = next(a for a in sent if a.app == "gone").model_copy(update={"end_ts_ns": T0 + 60 * S})
    assert after == [ended]  # the end, and no start sent again
    # another node's ledger is its own: nothing of gpu-a's ended there
    assert other_node and all(a.node_id == "gpu-b" and a.end_ts_ns is None for a in other_node)
    out = audited([*sent, *samples_until("gpu-a", T0 + 60 * S), *after])
    assert not [r for r in out if isinstance(r, DeadLetter)]
    (path,) = ledger.glob("kube-allocations.gpu-a-*.json")
    path.write_text("{not json")
    with kube.serving() as url:
        broken = source(kube, url, SharingSettings(replicas=4), ledger)
        assert [a.app for a in broken.poll("gpu-a", T0 + 70 * S)] == ["kept"]  # sent again: the auditor's duplicate
    assert broken.counts["kube_alloc_ledger_unreadable"] == 1


def test_gpucost_run_s_wiring_sends_allocations_beside_the_samples(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--attribution kubernetes --kube-allocations on``: a live source's events, the kubelet's allocations polled
    among them; off by default, so a node that attributes by pod sends no allocation it was not asked for."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))  # the ledger of holds sent: this test's own
    kube = FakeNode(tmp_path, [pod("vision", "ts-1", f"{TS}::0", T0), pod("batch", "mig-3", MIG3, T0)], node="gpu-a")
    live = SimpleNamespace(events=lambda: samples("gpu-a", (TS, MIG3), {}), counts=Counter())
    with kube.serving() as url:
        flags = kube.run_flags(url, "--kube-replicas", "4")
        off = list(attributed(build_parser().parse_args(flags), live))  # type: ignore[arg-type]
        on = list(attributed(build_parser().parse_args([*flags, "--kube-allocations", "on"]), live))  # type: ignore[arg-type]
    assert not [e for e in off if isinstance(e, Allocation)]
    assert [(a.app, a.sharing, a.fraction_den) for a in on if isinstance(a, Allocation)] == [
        ("mig-3", "mig", 1),
        ("ts-1", "time_slicing", 4),
    ]
    assert [e for e in on if not isinstance(e, Allocation)] == off


def test_the_sharing_settings_come_from_flags_or_their_variables_and_a_wrong_one_is_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GPUCOST_KUBE_REPLICAS", "4")
    monkeypatch.setenv("GPUCOST_KUBE_SHARING", "mps")
    args = build_parser().parse_args(["run"])
    assert (args.kube_allocations, args.kube_replicas, args.kube_sharing) == (False, 4, "mps")
    args = build_parser().parse_args(["run", "--kube-replicas", "8", "--kube-sharing", "time_slicing"])
    assert (args.kube_replicas, args.kube_sharing) == (8, "time_slicing")
    for wrong in (
        ["--kube-replicas", "1"],
        ["--kube-replicas", "²"],
        ["--kube-sharing", "hami"],
        ["--kube-allocations", "yes"],
    ):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["run", *wrong])
        assert "write" in capsys.readouterr().err  # says what to write
