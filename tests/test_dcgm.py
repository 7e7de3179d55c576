"""The dcgm-exporter source against real scrapes (L4, T4, L40S, vGPU A100), served on 127.0.0.1."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from gpucost.kafka.outbox import Outbox
from gpucost.producers.dcgm import DcgmScraper, scrape_to_events
from gpucost.producers.synthetic import unclaimed_pid
from gpucost.schemas.events import GpuSample, ProcessSample, TenantBinding
from gpucost.schemas.topics import CONTROL_HEADER, END_OF_INPUT
from gpucost.sinks.views import connect
from tests.conftest import ROOT
from tests.support.dcgm_exporter import SCRAPES, expected, exporter, metric_text, serving  # noqa: F401 (exporter is a fixture)

NS = 1_000_000_000
UNREADABLE_LINE = "Prometheus text: a line that is no sample, skipped"
T0 = 1_767_571_200 * NS


@pytest.mark.parametrize("name", SCRAPES)
def test_every_gpu_of_the_scrape_with_its_values(shared_data: Path, name: str) -> None:
    text = metric_text(shared_data, name)
    want = expected(text)
    events = scrape_to_events(text, T0, 1.0, "fallback-node")
    got = {e.gpu_uuid: e for e in events if isinstance(e, GpuSample)}
    assert set(got) == set(want) and got
    # a busy GPU no pod claims: a process of its own, with no binding, carries its busy time (unattributed)
    unclaimed = {e.gpu_uuid: e for e in events if isinstance(e, ProcessSample) and e.pid == unclaimed_pid(e.gpu_uuid)}
    assert set(unclaimed) == {u for u, w in want.items() if w["DCGM_FI_DEV_GPU_UTIL"] > 0 and "pod" not in w["_labels"]}
    assert all(e.sm_util_pct == got[u].sm_util_pct for u, e in unclaimed.items())
    assert not [e for e in events if isinstance(e, TenantBinding) and e.pid in {p.pid for p in unclaimed.values()}]
    for uuid, w in want.items():
        e, labels = got[uuid], w["_labels"]
        assert e.gpu_model == labels["modelName"] and e.node_id == labels.get("Hostname", labels.get("hostname"))
        assert e.sm_util_pct == w["DCGM_FI_DEV_GPU_UTIL"] and e.mem_bw_util_pct == w["DCGM_FI_DEV_MEM_COPY_UTIL"]
        assert e.mem_used_bytes == int(w["DCGM_FI_DEV_FB_USED"]) << 20
        total = sum(w.get(f, 0.0) for f in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED"))
        assert e.mem_total_bytes == int(total) << 20 > 0
        assert e.power_w == w.get("DCGM_FI_DEV_POWER_USAGE", 0.0) and e.temp_c == w.get("DCGM_FI_DEV_GPU_TEMP", 0.0)
        assert e.pcie_tx_bytes_s == (
            int(w["DCGM_FI_PROF_PCIE_TX_BYTES"]) if "DCGM_FI_PROF_PCIE_TX_BYTES" in w else None
        )
        for field, metric in (
            ("tensor_active_pct", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"),
            ("dram_active_pct", "DCGM_FI_PROF_DRAM_ACTIVE"),
        ):  # profiling ratios, as percent
            assert getattr(e, field) == (pytest.approx(min(100.0, w[metric] * 100)) if metric in w else None)


def test_blank_sentinels_count_as_missing(shared_data: Path) -> None:
    text = metric_text(shared_data, SCRAPES[0])
    want = expected(text)
    blank = lambda t, field: re.sub(rf"^({field}\{{[^}}]*\}}) \S+$", r"\1 9223372036854775794", t, flags=re.M)  # noqa: E731
    counts: Counter[str] = Counter()
    # GPU_UTIL blank: the profiling ratio GR_ENGINE_ACTIVE stands in, scaled to percent
    (e,) = scrape_to_events(blank(text, "DCGM_FI_DEV_GPU_UTIL"), T0, 1.0, "n", counts)
    assert e.sm_util_pct == pytest.approx(want[e.gpu_uuid]["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] * 100)
    assert counts["DCGM_FI_DEV_GPU_UTIL: blank (sentinel 9223372036854775794)"] >= 1
    # both blank: no utilisation at all, so nothing to bill: skipped and counted, never guessed
    both = blank(blank(text, "DCGM_FI_DEV_GPU_UTIL"), "DCGM_FI_PROF_GR_ENGINE_ACTIVE")
    assert scrape_to_events(both, T0, 1.0, "n", counts) == [] and counts["gpu_sample_skipped"] == len(want)


def test_scraper_reads_the_exporter_over_http(exporter: tuple[str, str]) -> None:
    url, text = exporter
    scraper = DcgmScraper(url, "n")
    got = scraper.sample(T0, 1.0)
    # the L4 scrape reports PCIe replays and row remapping (fault fields), nothing new at a device's first scrape
    assert {(e.fault_fatal, e.fault_warning) for e in got if isinstance(e, GpuSample)} == {(0, 0)}
    unfaulted = [
        e.model_copy(update={"fault_fatal": None, "fault_warning": None}) if isinstance(e, GpuSample) else e
        for e in got
    ]
    assert unfaulted == scrape_to_events(text, T0, 1.0, "n")
    broken = DcgmScraper(url.replace("/metrics", "/nope"), "n")
    assert broken.sample(T0, 1.0) == [] and broken.counts["scrape_failed"] == 1  # logged and counted, not fatal


def test_gpucost_run_audits_a_dcgm_exporter(
    exporter: tuple[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpucost.cli import main

    url, text = exporter
    assert (
        main(
            [
                "run",
                "--source",
                "dcgm",
                "--url",
                url,
                "--period-s",
                "0.05",
                "--duration-s",
                "0.4",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    assert "dcgm-exporter at" in capsys.readouterr().err
    con = connect(tmp_path)
    assert {u for (u,) in con.execute("SELECT DISTINCT gpu_uuid FROM idle_index").fetchall()} == set(expected(text))
    idle, covered = con.execute("SELECT sum(idle_ms), sum(covered_ms) FROM idle_index").fetchone()
    assert covered > 0 and idle == covered  # the scraped L4 sat at 0 % utilisation


def _started(proc: subprocess.Popen[str], words: str) -> str:
    """What ``proc`` printed up to the line with ``words`` (it says so once its source is open)."""
    seen = ""
    for line in proc.stdout:  # type: ignore[union-attr]
        seen += line
        if words in line:
            return seen
    raise AssertionError(f"{words!r} never printed: {seen[-2000:]}")


@pytest.mark.slow
def test_the_first_signal_ends_a_live_run_cleanly(exporter: tuple[str, str], tmp_path: Path) -> None:
    """SIGINT (Ctrl-C) ends the sampling, and what was sampled is written and summed, exit 0."""
    url, text = exporter
    run = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpucost.cli",
            "run",
            "--source",
            "dcgm",
            "--url",
            url,
            "--period-s",
            "0.1",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    _started(run, "Ctrl-C to stop")
    time.sleep(1.5)
    run.send_signal(signal.SIGINT)
    out = run.communicate(timeout=60)[0]
    assert run.returncode == 0, out
    ((gpus, covered),) = (
        connect(tmp_path).execute("SELECT count(DISTINCT gpu_uuid), sum(covered_ms) FROM idle_index").fetchall()
    )
    assert gpus == len(expected(text)) and covered >= 1000 * gpus


@pytest.mark.slow
def test_a_live_producer_ends_its_input_on_the_first_signal_and_stops_on_the_second(
    exporter: tuple[str, str], tmp_path: Path
) -> None:
    """SIGTERM once: the source ends and its end of input is queued, the producer still waits to deliver (the
    broker is away); twice: it stops, exit 130, everything, end of input included, kept in the spool."""
    url, _ = exporter
    env = {**os.environ, "GPUCOST_KAFKA_BOOTSTRAP": "127.0.0.1:1", "GPUCOST_SPOOL": str(tmp_path / "spool")}
    producer = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpucost.cli",
            "produce",
            "--source",
            "dcgm",
            "--url",
            url,
            "--period-s",
            "0.1",
            "--flush-interval-s",
            "0.2",
        ],
        cwd=ROOT,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    _started(producer, "Ctrl-C to stop")
    time.sleep(1.5)
    producer.send_signal(signal.SIGTERM)
    time.sleep(2)
    assert producer.poll() is None, "the first signal stopped the producer instead of ending its input"
    producer.send_signal(signal.SIGTERM)
    log = producer.communicate(timeout=60)[0]
    assert producer.returncode == 130 and "kept in" in log, log[-2000:]
    kept = Outbox(tmp_path / "spool", 1 << 30).head(1 << 20)
    ends = [m for m in kept if (CONTROL_HEADER, END_OF_INPUT) in m.headers]
    assert ends and kept[-len(ends) :] == ends and any(m.topic.endswith("events") and m.value for m in kept)


def test_pod_labels_make_the_container_a_tenant(shared_data: Path) -> None:
    """The same real scrape with dcgm-exporter's Kubernetes labels added, as its pod mapping does."""
    from gpucost.producers.synthetic import container_pid
    from gpucost.schemas.events import GpuSample, ProcessSample, TenantBinding

    text = metric_text(shared_data, SCRAPES[0])
    labelled = re.sub(r"(DCGM_FI_\w+\{)", r'\1namespace="ml-team",pod="trainer-0",container="torch",', text)
    events = scrape_to_events(labelled, T0, 1.0, "n", sla="Gold")
    (gpu,) = [e for e in events if isinstance(e, GpuSample)]
    (binding,) = [e for e in events if isinstance(e, TenantBinding)]
    (proc,) = [e for e in events if isinstance(e, ProcessSample)]
    pid = container_pid("ml-team", "trainer-0", "torch")
    assert pid >= 1 << 31 and binding.pid == proc.pid == pid  # synthetic: never a real Linux pid
    assert (binding.team, binding.app, binding.tier, binding.sla) == ("ml-team", "trainer-0", "torch", "Gold")
    assert (proc.gpu_uuid, proc.sm_util_pct, proc.mem_used_bytes) == (gpu.gpu_uuid, gpu.sm_util_pct, gpu.mem_used_bytes)
    assert events.index(binding) < events.index(proc)  # bound before its sample, as the as-of join needs
    assert [
        e for e in scrape_to_events(text, T0, 1.0, "n") if not isinstance(e, GpuSample)
    ] == []  # no labels: no tenant


def _t4(shared_data: Path) -> str:
    return metric_text(shared_data, "t4-ericsson-ccd.md")  # GPU_UTIL 91, no pod labels


def _two_gpus(text: str) -> str:
    """The scrape with a second GPU: each sample line again, under another UUID."""
    second = re.sub(
        r'UUID="[^"]*"', 'UUID="GPU-second"', "\n".join(ln for ln in text.splitlines() if ln.startswith("DCGM_FI_"))
    )
    return text + second + "\n"


def _billed(events_at: list[list[object]], price_model: str = "default") -> dict[str, int]:
    """µ$ per team of these scrapes (one a second) at $3.60 an hour, through the row path."""
    from gpucost.schemas.events import Price
    from gpucost.schemas.records import CostRecord, DeadLetter
    from gpucost.streams.audit import Auditor
    from gpucost.streams.settings import AuditSettings

    auditor = Auditor(AuditSettings())
    out = auditor.update(Price(gpu_model=price_model, ts_ns=T0 - NS, usd_per_gpu_hour="3.6"))
    for events in events_at:
        for e in events:
            out += auditor.update(e)  # type: ignore[arg-type]
    out += auditor.finish()
    assert not [o for o in out if isinstance(o, DeadLetter)], [o for o in out if isinstance(o, DeadLetter)][:3]
    teams: Counter[str] = Counter()
    for r in out:
        if isinstance(r, CostRecord):
            teams[r.team] += r.cost_micro_usd
    return dict(teams)


def test_a_busy_gpu_no_pod_claims_is_billed_as_busy_not_idle(shared_data: Path) -> None:
    """The T4 at 91 % with no pod labels was billed wholly to idle."""
    text = _t4(shared_data)
    teams = _billed([scrape_to_events(text, T0 + k * NS, 1.0, "n") for k in range(120)])
    total = sum(teams.values())
    assert total == 120 * 1000  # 120 s at $3.60/h: 1,000 µ$ a second
    assert set(teams) == {"idle", "unattributed"} and teams["unattributed"] == round(total * 0.91)


def test_a_pod_on_several_gpus_is_bound_once_a_scrape(shared_data: Path) -> None:
    """One binding per GPU, same node, pid and time: all but one dead-lettered duplicate at every scrape."""
    text = re.sub(
        r"(DCGM_FI_\w+\{)", r'\1namespace="ml",pod="trainer-0",container="torch",', _two_gpus(_t4(shared_data))
    )
    scrapes = [scrape_to_events(text, T0 + k * NS, 1.0, "n") for k in range(120)]
    assert all(sum(isinstance(e, TenantBinding) for e in s) == 1 for s in scrapes)
    assert sum(isinstance(e, ProcessSample) for e in scrapes[0]) == 2
    teams = _billed(scrapes)  # and no dead letter at all
    assert teams["ml"] == round(2 * 120 * 1000 * 0.91)


def test_one_bad_line_costs_that_line_only(shared_data: Path) -> None:
    """A scrape plus one garbage line gave no event and no dead letter, only a warning."""
    text = _t4(shared_data)
    counts: Counter[str] = Counter()
    spoiled = text.replace("\nDCGM_FI_DEV_GPU_TEMP", "\nthis is { not prometheus\nDCGM_FI_DEV_GPU_TEMP", 1)
    assert spoiled != text
    assert scrape_to_events(spoiled, T0, 1.0, "n", counts) == scrape_to_events(text, T0, 1.0, "n")
    assert counts[UNREADABLE_LINE] == 1


def test_mig_instances_are_billed_devices_each_with_its_pod(shared_data: Path) -> None:
    """Grouped by UUID alone, two MIG instances gave one sample and only the second pod's binding."""
    base = [ln for ln in _t4(shared_data).splitlines() if ln.startswith("DCGM_FI_")]
    lines = list(base)  # the parent GPU's own lines (power, temperature…), as the exporter writes them
    for gi, pod in (("1", "a"), ("2", "b")):
        lines += [
            re.sub(
                r"(DCGM_FI_\w+\{)",
                rf'\1GPU_I_ID="{gi}",GPU_I_PROFILE="1g.5gb",namespace="ns-{pod}",'
                rf'pod="{pod}",container="c",',
                ln,
            )
            for ln in base
        ]
    events = scrape_to_events("\n".join(lines) + "\n", T0, 1.0, "n")
    gpus = [e for e in events if isinstance(e, GpuSample)]
    uuid = re.search(r'UUID="([^"]*)"', base[0])[1]  # type: ignore[index]
    assert sorted(g.gpu_uuid for g in gpus) == [f"{uuid}/GI-1", f"{uuid}/GI-2"]  # the parent is not billed too
    assert {g.gpu_model for g in gpus} == {"Tesla T4 MIG 1g.5gb"} and all(g.power_w > 0 for g in gpus)
    assert sorted(b.team for b in events if isinstance(b, TenantBinding)) == ["ns-a", "ns-b"]
    teams = _billed(
        [scrape_to_events("\n".join(lines) + "\n", T0 + k * NS, 1.0, "n") for k in range(120)], price_model="default"
    )
    assert teams["ns-a"] == teams["ns-b"] > 0


def test_a_run_says_what_its_source_counted(
    shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A scrape's unreadable line and its unclaimed busy GPU reach the run's summary, not only a log line."""
    from gpucost.cli import main

    spoiled = _t4(shared_data).replace("\nDCGM_FI_DEV_GPU_TEMP", "\nthis is { not prometheus\nDCGM_FI_DEV_GPU_TEMP", 1)
    with serving(spoiled) as url:
        assert (
            main(
                [
                    "run",
                    "--source",
                    "dcgm",
                    "--url",
                    url,
                    "--period-s",
                    "0.05",
                    "--duration-s",
                    "0.3",
                    "--out",
                    str(tmp_path),
                ]
            )
            == 0
        )
    counted = re.search(r"the source counted (.*)", capsys.readouterr().err)
    assert counted and "busy_unclaimed" in counted[1] and re.search(rf"{UNREADABLE_LINE} \d", counted[1])
