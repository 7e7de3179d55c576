"""The live dcgm-exporter source carries device faults to the health audit (docs/sources.md, "Device faults").

Each scrape is the real L4 scrape with fault lines written out in the test (``l4_with``: the capture's own line
72 relabelled). The expected counts follow from the contract by hand: a scrape's faults are those new since the
device's previous scrape, a device's first scrape being its baseline; an uncorrectable ECC rise and a fatal XID
are fatal, a corrected rise and a slowdown warnings. The bill never reads them.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpucost.cli import main
from gpucost.producers.dcgm import DcgmScraper, scrape_to_events
from gpucost.schemas.events import Event, GpuSample
from gpucost.sinks.views import connect
from gpucost.streams.settings import AuditSettings
from tests.support.bills import bills, run
from tests.support.dcgm_exporter import l4_with, metric_text, serving

NS = 1_000_000_000
T0 = 1_767_571_200 * NS
L4 = "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c"  # l4-kops-output.md line 72, label UUID

#: (the fault lines of one scrape, the (fatal, warning) its GPU sample must carry)
SCRAPES = [
    (
        ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL 2", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL 0", "DCGM_FI_DEV_XID_ERRORS 48"),
        (0, 0),
    ),  # before
    (
        ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL 3", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL 0", "DCGM_FI_DEV_XID_ERRORS 48"),
        (1, 0),
    ),  # +1 DBE
    (("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL 3", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL 7"), (0, 1)),  # XID line missing; corrected
    (("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL 3", "DCGM_FI_DEV_XID_ERRORS 48"), (0, 0)),  # the XID line back: no new XID
    (("DCGM_FI_DEV_XID_ERRORS 79", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS 64"), (1, 1)),  # fell off the bus; hot
    (("DCGM_FI_DEV_XID_ERRORS 13", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS 64"), (0, 2)),  # a warning XID; still hot
    (("DCGM_FI_DEV_XID_ERRORS 13", "DCGM_FI_DEV_RETIRED_DBE 4"), (0, 0)),  # a counter first read: its baseline
    (("DCGM_FI_DEV_XID_ERRORS 13", "DCGM_FI_DEV_RETIRED_DBE 5"), (0, 1)),  # one more page retired
]


def _scrapes(shared_data: Path) -> list[str]:
    return [l4_with(shared_data, *lines) for lines, _ in SCRAPES]


def _gpu(events: list[Event]) -> GpuSample:
    (gpu,) = [e for e in events if isinstance(e, GpuSample)]
    return gpu


def test_each_scrape_carries_the_faults_new_since_the_last(shared_data: Path) -> None:
    scraper = DcgmScraper("http://unused", "n")
    got = [_gpu(scraper.parse(text, T0 + k * NS, 1.0)) for k, text in enumerate(_scrapes(shared_data))]
    assert [g.gpu_uuid for g in got] == [L4] * len(SCRAPES)
    assert [(g.fault_fatal, g.fault_warning) for g in got] == [want for _, want in SCRAPES]


def test_a_restarted_source_does_not_count_the_devices_past_again(shared_data: Path) -> None:
    texts = _scrapes(shared_data)
    first = DcgmScraper("http://unused", "n")
    for k, text in enumerate(texts[:3]):
        first.parse(text, T0 + k * NS, 1.0)
    again = DcgmScraper("http://unused", "n")  # a new process: its first scrape is its baseline
    assert (
        _gpu(again.parse(texts[3], T0, 1.0)).fault_fatal,
        _gpu(again.parse(texts[4], T0 + NS, 1.0)).fault_fatal,
    ) == (
        0,
        1,
    )


def test_a_scrape_without_fault_lines_reports_none(shared_data: Path) -> None:
    text = metric_text(shared_data, "l4-kops-output.md")
    plain = "".join(
        ln + "\n" for ln in text.splitlines() if not re.match(r"DCGM_FI_DEV_(PCIE_REPLAY|ROW_REMAP|CORR|UNCORR)", ln)
    )
    gpu = _gpu(DcgmScraper("http://unused", "n").parse(plain, T0, 1.0))
    assert (gpu.fault_fatal, gpu.fault_warning) == (None, None)  # not reported, which is not "none"


@pytest.mark.parametrize(
    "repeated",
    [r"$^", r"DCGM_FI_DEV_", r"DCGM_FI_DEV_XID"],
    ids=["on-the-gpu", "repeated-per-instance", "xid-per-instance"],
)
def test_mig_instances_take_their_gpus_faults(shared_data: Path, repeated: str) -> None:
    """Fault lines on the GPU's own series only, repeated on each instance's series (the GPU's values), or some
    of them repeated: each instance's sample carries the GPU's faults, field by field."""
    faulty = re.compile(r"DCGM_FI_DEV_(ECC|XID|PCIE_REPLAY|ROW_REMAP|CORRECTABLE|UNCORRECTABLE)")
    scraper = DcgmScraper("http://unused", "n")
    for k, (lines, want) in enumerate(SCRAPES[:2]):
        base = [ln for ln in l4_with(shared_data, *lines).splitlines() if ln.startswith("DCGM_FI_")]
        migs = [
            re.sub(r"(DCGM_FI_\w+\{)", rf'\1GPU_I_ID="{gi}",GPU_I_PROFILE="1g.6gb",', ln)
            for gi in ("1", "2")
            for ln in base
            if re.match(repeated, ln) or not faulty.match(ln)
        ]
        gpus = [e for e in scraper.parse("\n".join(base + migs) + "\n", T0 + k * NS, 1.0) if isinstance(e, GpuSample)]
        assert sorted(g.gpu_uuid for g in gpus) == [f"{L4}/GI-1", f"{L4}/GI-2"]
        assert {(g.fault_fatal, g.fault_warning) for g in gpus} == {want}


def test_the_faults_of_a_skipped_scrape_come_with_the_next_sample(shared_data: Path) -> None:
    """A GPU fallen off the bus: its utilisation and memory lines blank (the exporter's sentinel), so that scrape
    bills nothing; its XID comes with its next sample, never lost."""
    scraper = DcgmScraper("http://unused", "n")
    blank = re.compile(r"^(DCGM_FI_(DEV_GPU_UTIL|PROF_GR_ENGINE_ACTIVE|DEV_FB_USED)\{[^}]*\}) \S+$", re.M)
    texts = [
        l4_with(shared_data, "DCGM_FI_DEV_XID_ERRORS 0"),
        blank.sub(r"\1 9223372036854775794", l4_with(shared_data, "DCGM_FI_DEV_XID_ERRORS 79")),
        l4_with(shared_data, "DCGM_FI_DEV_XID_ERRORS 79"),
    ]
    got = [
        [(e.fault_fatal, e.fault_warning) for e in scraper.parse(t, T0 + k * NS, 1.0) if isinstance(e, GpuSample)]
        for k, t in enumerate(texts)
    ]
    assert got == [[(0, 0)], [], [(1, 0)]]


def test_a_blank_volatile_count_leaves_the_field_unread_not_the_lifetime_count(shared_data: Path) -> None:
    """DCGM's volatile ECC count (since the driver loaded) is read, the lifetime one only where the scrape has no
    volatile series: a volatile value the exporter blanks for one scrape is no jump to the lifetime count."""
    scraper = DcgmScraper("http://unused", "n")
    got = []
    for k, vol in enumerate(("0", "9223372036854775794", "0", "1")):
        text = l4_with(shared_data, f"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL {vol}", "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL 40")
        got.append(_gpu(scraper.parse(text, T0 + k * NS, 1.0)).fault_fatal)
    assert got == [0, 0, 0, 1]


def test_a_scrape_with_a_bad_line_or_a_byte_order_mark_keeps_its_faults(shared_data: Path) -> None:
    scraper = DcgmScraper("http://unused", "n")
    first = l4_with(shared_data, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL 0")
    spoilt = "this is { no sample\n" + l4_with(shared_data, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL 1")
    marked = "\ufeff" + l4_with(shared_data, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL 2")
    got = [_gpu(scraper.parse(t, T0 + k * NS, 1.0)).fault_fatal for k, t in enumerate((first, spoilt, marked))]
    assert got == [0, 1, 1] and scraper.counts["Prometheus text: a line that is no sample, skipped"] == 1


def test_faults_leave_the_bill_unchanged(shared_data: Path) -> None:
    scraper = DcgmScraper("http://unused", "n")
    texts = _scrapes(shared_data)
    events = [e for k in range(120) for e in scraper.parse(texts[min(k // 15, len(texts) - 1)], T0 + k * NS, 1.0)]
    plain = [
        e for k in range(120) for e in scrape_to_events(texts[min(k // 15, len(texts) - 1)], T0 + k * NS, 1.0, "n")
    ]
    assert any(isinstance(e, GpuSample) and e.fault_fatal for e in events)
    assert bills(run(AuditSettings(), events)) == bills(run(AuditSettings(), plain)) != {}


def test_a_live_run_fails_the_window_of_a_fatal_fault(shared_data: Path, tmp_path: Path) -> None:
    """``gpucost run --source dcgm`` in its default settings: the exporter serves a healthy GPU, then one more
    uncorrectable ECC error; the health record of the window that saw it fails on ``device_fault``."""
    healthy, failed = (l4_with(shared_data, f"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL {n}") for n in (0, 1))
    pages = iter([healthy] * 3)
    with serving(healthy, lambda: next(pages, failed)) as url:
        args = ["run", "--source", "dcgm", "--url", url, "--period-s", "0.05", "--duration-s", "0.6"]
        assert main([*args, "--out", str(tmp_path)]) == 0
    rows = (
        connect(tmp_path).execute("SELECT faults_fatal, fail_reasons FROM health ORDER BY window_start_ns").fetchall()
    )
    assert sum(f or 0 for f, _ in rows) == 1  # the one new uncorrectable error, in one window
    assert [("device_fault" in r) for f, r in rows] == [bool(f) for f, _ in rows]
