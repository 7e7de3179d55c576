"""HAMi's vGPU monitor as a source (gpucost/producers/hami.py): each container's own SM utilisation bills its
share of a shared GPU, the busy time no container claims goes to ``unattributed``, and the tenant is the one
the pod's HAMi allocation names, so that allocation and usage sit side by side (docs/sources.md, "HAMi's vGPU
monitor"). Expected values are worked out here from the scrape's own numbers, never from the code under test.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from collections import Counter
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpucost.cli import build_parser
from gpucost.producers.attribution import AttributionSettings
from gpucost.producers.hami import HamiScraper, scrape_to_events
from gpucost.producers.kubernetes import KubernetesPods, KubernetesSettings
from gpucost.producers.scrape import container_binding
from gpucost.producers.synthetic import container_pid, unclaimed_pid
from gpucost.schemas.events import Allocation, GpuSample, ProcessSample, TenantBinding
from gpucost.schemas.records import AllocationRecord, CostRecord, DeadLetter
from gpucost.sinks.views import connect
from gpucost.wiring import attributed
from tests.fake_kubernetes import FakeContainer, FakeNode, FakePod
from tests.support.allocations import END, PANE, T0, S, audited
from tests.support.dcgm_exporter import serving
from tests.support.hami_monitor import Container, Gpu, metrics_text
from tests.support.split import largest_remainder

UUIDS = [f"GPU-{n}{n}{n}{n}{n}{n}{n}{n}-5c87-89ac-b1a6-7b53aa24b0ec" for n in range(4)]
NAMES = st.sampled_from(["default", "ml", "nlp", "search"])
CENTI = st.integers(0, 10_000)  # a percentage in hundredths, written as the monitor would ("12.5", "40")


def pct(cp: int) -> str:
    return str(Fraction(cp, 100)) if cp % 100 == 0 else f"{cp / 100:g}"


@st.composite
def scrapes(draw: st.DrawFn) -> list[Gpu]:
    gpus = []
    for uuid in UUIDS[: draw(st.integers(1, 3))]:
        names = draw(st.lists(st.tuples(NAMES, st.sampled_from(["p1", "p2", "p3"])), max_size=4, unique=True))
        memory = st.none() | st.integers(0, 2**40) | st.just(2**64)  # 2^64: past any count a sample holds
        containers = tuple(
            Container(ns, pod, "main", pct(draw(st.integers(0, 15_000))), draw(memory)) for ns, pod in names
        )
        gpus.append(Gpu(uuid, pct(draw(CENTI)), draw(st.integers(0, 2**40)), containers=containers))
    return gpus


def _cp(text: str) -> int:
    value = Fraction(text) * 100
    assert value.denominator == 1
    return int(value)


@settings(max_examples=60, deadline=None)
@given(gpus=scrapes(), legacy=st.booleans())
def test_each_gpu_and_container_of_a_scrape_with_its_values(gpus: list[Gpu], legacy: bool) -> None:
    """Per GPU its sample; per container a binding (team = namespace, app = pod, tier = container) and its own
    busy (at most 100 %); the GPU's busy the containers leave, unclaimed; where they claim more than the host saw,
    the host's busy split in proportion to their claims. Either spelling of the monitor's metrics gives the same."""
    counts: Counter[str] = Counter()
    events = scrape_to_events(metrics_text(gpus, "gpu-a", legacy), T0, 1.0, "fallback", counts)
    samples = {e.gpu_uuid: e for e in events if isinstance(e, GpuSample)}
    assert set(samples) == {g.uuid for g in gpus}
    bindings = {e.pid: e for e in events if isinstance(e, TenantBinding)}
    busy = {(e.gpu_uuid, e.pid): (e.sm_util_cp, e.mem_used_bytes) for e in events if isinstance(e, ProcessSample)}
    for g in gpus:
        assert samples[g.uuid].node_id == "gpu-a" and samples[g.uuid].gpu_model == "H100"
        assert samples[g.uuid].sm_util_cp == _cp(g.util)  # type: ignore[arg-type]
        assert samples[g.uuid].mem_used_bytes == g.mem_bytes
        claims = {}
        for c in sorted(g.containers, key=lambda c: (c.namespace, c.pod)):
            pid = container_pid(c.namespace, c.pod, c.name)
            b = bindings[pid]
            assert (b.team, b.env, b.app, b.tier, b.sla, b.origin) == (c.namespace, "", c.pod, "main", "Bronze", "hami")
            assert busy[(g.uuid, pid)][1] == (c.mem_bytes if c.mem_bytes and c.mem_bytes < 2**63 else 0)
            claims[pid] = min(10_000, _cp(c.util))
        host, total = _cp(g.util), sum(claims.values())  # type: ignore[arg-type]
        if total > host:  # the host's busy, split by largest remainder in proportion to the claims
            claims = dict(zip(claims, largest_remainder(host, [Fraction(v) for v in claims.values()])))
        elif host > total:
            claims[unclaimed_pid(g.uuid)] = host - total
        assert {pid: busy[(g.uuid, pid)][0] for pid in claims} == claims
    assert len(busy) == sum(len(g.containers) for g in gpus) + sum(1 for k in busy if k[1] == unclaimed_pid(k[0]))
    assert len(bindings) == len({(c.namespace, c.pod) for g in gpus for c in g.containers})  # once a scrape


def test_where_a_scrape_has_both_spellings_the_hami_names_win() -> None:
    new = metrics_text([Gpu(UUIDS[0], "70", containers=(Container("ml", "p", "main", "20"),))], "n")
    old = metrics_text([Gpu(UUIDS[0], "90", containers=(Container("ml", "p", "main", "60"),))], "n", legacy=True)
    for text in (new + old, old + new):  # whichever comes first
        events = scrape_to_events(text, T0, 1.0, "n")
        busy = {e.pid: e.sm_util_pct for e in events if isinstance(e, ProcessSample)}
        assert [e.sm_util_pct for e in events if isinstance(e, GpuSample)] == [70.0]
        assert busy == {container_pid("ml", "p", "main"): 20.0, unclaimed_pid(UUIDS[0]): 50.0}


def test_bad_figures_are_counted_and_the_rest_billed() -> None:
    good = Gpu(UUIDS[0], "80", containers=(Container("ml", "a:b", "main", "30"), Container("nlp", "p", "main", "150")))
    lost = Gpu(UUIDS[1], None, containers=(Container("ml", "q", "main", "10"),))
    ratio = "hami_container_device_utilization_ratio"
    text = metrics_text([good, lost], "n") + "\n".join(
        [
            f'{ratio}{{device_uuid="{UUIDS[0]}",namespace="x",pod="y",container="c"}} NaN',
            f'{ratio}{{device_uuid="{UUIDS[0]}",namespace="",pod="y",container="c"}} 5',
            'hami_host_gpu_utilization_ratio{node="n"} 5',
            "hami_host_gpu_utilization_ratio{this is not prometheus",
        ]
    )
    counts: Counter[str] = Counter()
    events = scrape_to_events(text + "\n", T0, 1.0, "n", counts)
    assert counts == {
        "line_unparseable": 1,
        "unreadable:hami_container_device_utilization_ratio": 1,  # NaN
        "container_without_pod": 1,
        "sample_without_device_uuid": 1,
        "container_name_invalid": 1,  # 'a:b' cannot be a tenant field: not bound, its busy left to the rest
        "gpu_without_host_figures": 1,  # the second GPU: its container cannot be billed without it
        "clamped:hami_container_device_utilization_ratio": 1,  # nlp's 150 %: 100 %
        "containers_above_host": 1,  # 30 % (a:b's, no one's) and nlp's 100 % past the host's 80 %
    }
    busy = {e.pid: e.sm_util_cp for e in events if isinstance(e, ProcessSample)}
    nobody, nlp = largest_remainder(8000, [Fraction(3000), Fraction(10_000)])  # the host's 80 %, by the claims
    assert busy == {unclaimed_pid(UUIDS[0]): nobody, container_pid("nlp", "p", "main"): nlp}
    assert [e.gpu_uuid for e in events if isinstance(e, GpuSample)] == [UUIDS[0]]


def test_one_bad_figure_costs_that_figure_never_its_gpu_s_bill() -> None:
    """An unsigned underflow as memory (HAMi #1181), a limit, power or temperature no device has, a memory
    controller past 100 %: each figure counted and left out, the GPU and its containers billed all the same; a GPU
    no event can describe (a model name past 256 characters) is skipped, and its containers are bound on their other
    GPUs."""
    ml = Container("ml", "p1", "main", "30", mem_bytes=18446744073707737660, limit_bytes=10**30)
    a = Gpu(UUIDS[0], "50", power_w="1e30", temp_c="1e30", mem_ctrl="150", containers=(ml,))
    b = Gpu(UUIDS[1], "50", containers=(Container("ml", "p1", "main", "30"),))
    counts: Counter[str] = Counter()
    events = scrape_to_events(metrics_text([a, b], "n"), T0, 1.0, "n", counts)
    assert [e.gpu_uuid for e in events if isinstance(e, GpuSample)] == [UUIDS[0], UUIDS[1]]
    assert [e.mem_bw_util_pct for e in events if isinstance(e, GpuSample)] == [100.0, 0.0]
    pid = container_pid("ml", "p1", "main")
    assert [
        (e.gpu_uuid, e.sm_util_cp, e.mem_used_bytes) for e in events if isinstance(e, ProcessSample) and e.pid == pid
    ] == [
        (UUIDS[0], 3000, 0),
        (UUIDS[1], 3000, 0),
    ]
    assert {k for k in counts if ":" in k} == {
        "unreadable:hami_container_device_memory_bytes",
        "unreadable:hami_vgpu_memory_limit_bytes",
        "unreadable:hami_host_gpu_power_usage_watts",
        "unreadable:hami_host_gpu_temperature_celsius",
        "clamped:hami_host_gpu_memory_controller_utilization_ratio",
    }
    long = metrics_text([a, b], "n", model="NVIDIA-" + "H" * 300)
    broken = metrics_text([a], "n", model="NVIDIA-" + "H" * 300) + metrics_text([b], "n").split("\n", 1)[1]
    counts = Counter()
    events = scrape_to_events(broken, T0, 1.0, "n", counts)
    assert counts["gpu_sample_invalid"] == 1 and [e.gpu_uuid for e in events if isinstance(e, GpuSample)] == [UUIDS[1]]
    assert [e.pid for e in events if isinstance(e, TenantBinding)] == [pid]  # bound on the GPU that was kept
    assert scrape_to_events(long, T0, 1.0, "n") == []


def test_two_containers_one_synthetic_pid_bind_the_first_and_leave_the_second_unclaimed() -> None:
    first, second = Container("team-34", "job-634", "main", "20"), Container("team-47", "job-104097", "main", "30")
    assert container_pid("team-34", "job-634", "main") == container_pid("team-47", "job-104097", "main")
    counts: Counter[str] = Counter()
    events = scrape_to_events(
        metrics_text([Gpu(UUIDS[0], "60", containers=(first, second))], "n"), T0, 1.0, "n", counts
    )
    assert [(e.team, e.app) for e in events if isinstance(e, TenantBinding)] == [("team-34", "job-634")]
    busy = {e.pid: e.sm_util_cp for e in events if isinstance(e, ProcessSample)}
    assert busy == {container_pid("team-34", "job-634", "main"): 2000, unclaimed_pid(UUIDS[0]): 4000}
    assert counts["container_pid_collision"] == 1


def test_a_byte_order_mark_hides_nothing() -> None:
    text = metrics_text([Gpu(UUIDS[0], "60", containers=(Container("ml", "p", "main", "20"),))], "n")
    text = text.split("\n", 1)[1]  # the first line a sample's
    assert scrape_to_events("\ufeff" + text, T0, 1.0, "n") == scrape_to_events(text, T0, 1.0, "n") != []


def test_a_shared_gpu_bills_each_container_its_own_busy_and_its_allocation_beside_it() -> None:
    """Four panes of a GPU HAMi shares: nlp's pod holds 30 % of its cores and uses 12.5 %, search uses 40 %, and
    7.25 % is no container's. The usage bill gives each its busy share of each pane's cost, unattributed the rest
    of the busy time and idle what is left; the allocation bill (the pod's hold, as the kubelet source sends it
    for a pod without gpucost labels) names the same tenant, 30 % of each pane."""
    gpu = Gpu(
        UUIDS[1], "59.75", containers=(Container("nlp", "hami", "main", "12.5"), Container("search", "s", "main", "40"))
    )
    events: list = [
        Allocation(
            node_id="gpu-a",
            gpu_uuid=UUIDS[1],
            allocation_id="uid/main/x",
            ts_ns=T0,
            sharing="hami",
            fraction_num=30,
            fraction_den=100,
            team="nlp",
            env="",
            app="hami",
            tier="main",
            sla="Bronze",
            origin="kubernetes",
        )  # fmt: skip
    ]
    for t in range(T0, END, 10 * S):
        events += scrape_to_events(metrics_text([gpu], "gpu-a"), t, 10.0, "n")
    out = audited(events)
    assert not [r for r in out if isinstance(r, DeadLetter)]
    usage = [r for r in out if isinstance(r, CostRecord)]
    held = [r for r in out if isinstance(r, AllocationRecord)]
    nlp = {r.tenant_key for r in usage if r.team == "nlp"}
    assert nlp == {r.tenant_key for r in held if r.team == "nlp"} and len(nlp) == 1  # one tenant, both bases
    for start in range(T0, END, PANE):
        pane = sorted((r for r in usage if r.pane_start_ns == start), key=lambda r: (r.team != "idle", r.tenant_key))
        cost = pane[0].pane_cost_micro_usd
        share = {"idle": Fraction(4025, 10_000), "nlp": Fraction(1250, 10_000), "search": Fraction(4000, 10_000)}
        share["unattributed"] = Fraction(725, 10_000)
        assert [r.cost_micro_usd for r in pane] == largest_remainder(cost, [share[r.team] for r in pane])
        alloc = sorted((r for r in held if r.pane_start_ns == start), key=lambda r: r.tenant_key)
        assert {r.team: r.cost_micro_usd for r in alloc} == dict(
            zip(
                [r.team for r in alloc],
                largest_remainder(cost, [Fraction(3, 10) if r.team == "nlp" else Fraction(7, 10) for r in alloc]),
            )
        )


def test_with_pod_attribution_the_pod_s_labels_name_its_use_as_they_name_its_allocation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--attribution kubernetes --kube-allocations on`` beside a HAMi monitor: a pod labelled ``gpucost.io/team``
    is that team's on both bases (one tenant key); a container of a pod the API server does not list keeps the
    monitor's naming, counted."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    started = dt.datetime.fromtimestamp(T0 // S, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    labelled = FakePod(
        "nlp",
        "hami",
        [FakeContainer("main", {"nvidia.com/gpu": [f"{UUIDS[1]}-3"]}, limits={"nvidia.com/gpucores": "30"})],
        labels={"gpucost.io/team": "research"},
        started=started,
    )
    gpu = Gpu(
        UUIDS[1], "60", containers=(Container("nlp", "hami", "main", "20"), Container("ml", "gone", "main", "10"))
    )
    scrapes = [e for t in range(T0, END, 10 * S) for e in scrape_to_events(metrics_text([gpu], "gpu-a"), t, 10.0, "n")]
    live = SimpleNamespace(events=lambda: iter(scrapes), counts=Counter())
    kube = FakeNode(tmp_path, [labelled], node="gpu-a")
    with kube.serving() as url:
        flags = kube.run_flags(url, "--kube-allocations", "on")
        events = list(attributed(build_parser().parse_args(flags), live))  # type: ignore[arg-type]
    out = audited(events)
    used = {r.team: r.tenant_key for r in out if isinstance(r, CostRecord)}
    held = {r.team: r.tenant_key for r in out if isinstance(r, AllocationRecord)}
    assert set(used) == {"research", "ml", "unattributed", "idle"} and "nlp" not in held
    assert used["research"] == held["research"]
    assert live.counts["kube_exporter_named"] == live.counts["kube_exporter_pod_unnamed"] == len(range(T0, END, 10 * S))


def test_a_pod_made_again_under_its_name_is_named_by_its_new_labels(tmp_path: Path) -> None:
    def made(team: str) -> FakePod:
        return FakePod("ml", "db-0", [FakeContainer("main")], labels={"gpucost.io/team": team})

    kube = FakeNode(tmp_path, [made("alpha")], node="gpu-a")
    pid = container_pid("ml", "db-0", "main")
    seen = [container_binding("gpu-a", pid, T0 + k * S, "ml", "db-0", "main", "Bronze", "hami") for k in (0, 5, 20)]
    with kube.serving() as url:
        settings = KubernetesSettings(
            pods_url=url, token_file=kube.token_file, pod_resources=kube.socket, refresh_ns=10 * S
        )
        named = KubernetesPods(settings, AttributionSettings()).named(iter(seen))
        first = next(named)
        kube.pods[:] = [made("beta")]  # deleted and made again, another UID and other labels
        teams = [first.team, *(b.team for b in named)]  # type: ignore[attr-defined]
    assert teams == ["alpha", "alpha", "beta"]  # listed again once a refresh (10 s), not at every binding
    assert kube.list_calls == 2


def test_gpucost_run_audits_a_hami_monitor_and_says_what_it_needs(tmp_path: Path) -> None:
    gpu = Gpu(UUIDS[2], "50", containers=(Container("ml", "trainer", "main", "50"),))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUCOST_")}
    cli = [sys.executable, "-m", "gpucost.cli", "run", "--source", "hami", "--out", str(tmp_path / "out")]
    refused = subprocess.run(cli, capture_output=True, text=True, env=env, timeout=120)
    assert refused.returncode == 2 and "--source hami needs --url (or GPUCOST_HAMI_URL)" in refused.stderr
    assert "Traceback" not in refused.stderr
    prices = tmp_path / "prices.jsonl"
    prices.write_text('{"kind":"price","gpu_model":"default","ts_ns":1000000000000000000,"usd_per_gpu_hour":"3.6"}\n')
    with serving(metrics_text([gpu], "gpu-a")) as url:
        done = subprocess.run(
            [*cli, "--period-s", "0.05", "--duration-s", "0.5", "--prices", str(prices)],
            capture_output=True, text=True, env=env | {"GPUCOST_HAMI_URL": url}, timeout=120,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "HAMi's vGPU monitor at" in done.stderr
    panes = (
        connect(tmp_path / "out")
        .execute(
            "SELECT pane_start_ns, any_value(pane_cost_micro_usd), list(team ORDER BY team), "
            "list(cost_micro_usd ORDER BY team) FROM cost GROUP BY pane_start_ns"
        )
        .fetchall()
    )
    assert panes and sum(c for _, c, _, _ in panes) > 0
    for _, cost, teams, split in panes:  # the container busy half of every sample: half of each pane, idle the rest
        assert teams == ["idle", "ml"] and split == [cost - cost // 2, cost // 2]


def test_the_scraper_reads_the_monitor_over_http() -> None:
    text = metrics_text([Gpu(UUIDS[0], "10")], "n")
    with serving(text) as url:
        assert HamiScraper(url, "n").sample(T0, 1.0) == scrape_to_events(text, T0, 1.0, "n")
        broken = HamiScraper(url.replace("/metrics", "/nope"), "n")
        assert broken.sample(T0, 1.0) == [] and broken.counts["scrape_failed"] == 1


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(list('hami_container_device_utilization_ratio{}="=, 0123456789.\n#'))))
def test_any_text_is_events_or_counted_never_an_exception(text: str) -> None:
    counts: Counter[str] = Counter()
    try:
        events = scrape_to_events(text, T0, 1.0, "n", counts)
    except ValueError:
        return  # not Prometheus text at all: the scraper counts it (scrape_unparseable), as the test above shows
    assert all(isinstance(e, (GpuSample, ProcessSample, TenantBinding)) for e in events)
