"""The dcgm-exporter source bills the neutral reading of its scrape (docs/sources.md, "dcgm-exporter source").

The scrape is read once, and what the bill takes from it (busy time, memory, power, temperature) is what
``gpucost devices`` prints for the same scrape. The values expected here are read from the capture's own lines
(``tests.support.dcgm_exporter.expected``, a plain regex) or written into the test, with the line they come from.
"""

from __future__ import annotations

import re
from collections import Counter
from decimal import Decimal
from pathlib import Path

import pytest

from gpucost.producers.accelerators import dcgm_exporter, prometheus
from gpucost.producers.dcgm import DcgmScraper, scrape_to_events
from gpucost.schemas.events import GpuSample
from tests.support.dcgm_exporter import SCRAPES, metric_text

NS = 1_000_000_000
T0 = 1_767_571_200 * NS
T4 = "t4-ericsson-ccd.md"
T4_UUID = "GPU-6d5c0ac5-74d7-3130-46f1-e93ed57f469a"  # t4-ericsson-ccd.md, every DCGM_FI_ line's UUID label


def _set(text: str, metric: str, value: str) -> str:
    """``text`` with every sample of ``metric`` written as ``value``."""
    changed = re.sub(rf"^({metric}\{{[^}}]*\}}) \S+$", rf"\g<1> {value}", text, flags=re.M)
    assert changed != text, metric
    return changed


def _gpus(text: str, counts: Counter[str] | None = None) -> dict[str, GpuSample]:
    return {e.gpu_uuid: e for e in scrape_to_events(text, T0, 1.0, "n", counts) if isinstance(e, GpuSample)}


@pytest.mark.parametrize("name", SCRAPES)
def test_the_bill_reads_what_gpucost_devices_prints(shared_data: Path, name: str) -> None:
    """Busy, memory, power and temperature of each billed GPU are the neutral sample's, exactly."""
    text = metric_text(shared_data, name)
    neutral = {s.device_id: s for s in dcgm_exporter.parse(text).samples}
    billed = _gpus(text)
    assert billed and set(billed) == set(neutral)
    for uuid, gpu in billed.items():
        s = neutral[uuid]
        assert s.busy_pct is not None and s.mem_used_bytes is not None and s.mem_total_bytes is not None
        assert (gpu.sm_util_pct, gpu.mem_used_bytes, gpu.mem_total_bytes) == (
            float(s.busy_pct),
            s.mem_used_bytes,
            s.mem_total_bytes,
        )
        assert (gpu.power_w, gpu.temp_c, gpu.gpu_model) == (float(s.power_w or 0), float(s.temperature_c or 0), s.model)


def test_a_scrape_is_read_once(shared_data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bill and the faults of a scrape come from one reading of its text."""
    reads = 0
    series = prometheus.series

    def counted(*args: object, **kwargs: object) -> object:
        nonlocal reads
        reads += 1
        return series(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(dcgm_exporter, "series", counted)
    scraper = DcgmScraper("http://unused", "n")
    got = scraper.parse(metric_text(shared_data, T4), T0, 1.0)
    assert reads == 1 and [e.fault_fatal for e in got if isinstance(e, GpuSample)] == [0]


def test_the_profiling_busy_ratio_is_read_exactly(shared_data: Path) -> None:
    """With GPU_UTIL blank, GR_ENGINE_ACTIVE 0.156205 (t4-ericsson-ccd.md line 31) is 15.6205 % busy: the decimal
    written times 100, for ``gpucost devices`` and the bill alike (a float product gives 15.620500000000002)."""
    text = _set(metric_text(shared_data, T4), "DCGM_FI_DEV_GPU_UTIL", "9223372036854775794")
    (s,) = dcgm_exporter.parse(text).samples
    assert s.busy_pct == Decimal("15.6205")
    assert _gpus(text)[T4_UUID].sm_util_pct == 15.6205


def test_a_blank_counter_has_no_stand_in_but_a_blank_gauge_has(shared_data: Path) -> None:
    """A blank volatile ECC count is not replaced by the lifetime one (another origin: a false burst of errors);
    a blank GPU_UTIL is replaced by GR_ENGINE_ACTIVE (both say how busy the GPU is now)."""
    text = metric_text(shared_data, T4) + "".join(
        f'{name}{{UUID="{T4_UUID}",modelName="Tesla T4"}} {value}\n'
        for name, value in (
            ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "9223372036854775794"),
            ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "7"),
        )
    )
    (s,) = dcgm_exporter.parse(_set(text, "DCGM_FI_DEV_GPU_UTIL", "9223372036854775794")).samples
    assert s.ecc_uncorrected is None and s.busy_pct == Decimal("15.6205")


@pytest.mark.parametrize(
    ("metric", "value", "field", "read_as"),
    [
        ("DCGM_FI_DEV_POWER_USAGE", "-1", "power_w", 0.0),  # not reported: 0 W, as when the exporter omits it
        ("DCGM_FI_DEV_GPU_UTIL", "101", "sm_util_pct", 15.6205),  # GR_ENGINE_ACTIVE (line 31) stands in
        ("DCGM_FI_DEV_GPU_TEMP", "NaN", "temp_c", 0.0),
    ],
)
def test_a_value_no_gpu_can_have_is_counted_and_read_as_missing(
    shared_data: Path, metric: str, value: str, field: str, read_as: float
) -> None:
    """One impossible value costs that field, never the GPU's bill: the rest of the sample is billed as read."""
    text = metric_text(shared_data, T4)
    counts: Counter[str] = Counter()
    spoilt = _gpus(_set(text, metric, value), counts)[T4_UUID]
    assert getattr(spoilt, field) == read_as
    assert spoilt.model_copy(update={field: None}) == _gpus(text)[T4_UUID].model_copy(update={field: None})
    assert [reason for reason in counts if reason.startswith(f"{metric}: ")] and not counts["gpu_sample_invalid"]


def test_a_mig_instance_takes_what_dcgm_keeps_per_gpu_from_its_gpu(shared_data: Path) -> None:
    """Instances without power and temperature series of their own take the GPU's (68.244 W, t4-ericsson-ccd.md line
    20; 74 °C, line 19); the GPU itself is not billed beside them."""
    gpu_lines = [ln for ln in metric_text(shared_data, T4).splitlines() if ln.startswith("DCGM_FI_")]
    instance_lines = [
        re.sub(r"(DCGM_FI_\w+\{)", rf'\1GPU_I_ID="{gi}",GPU_I_PROFILE="1g.5gb",', ln)
        for gi in ("1", "2")
        for ln in gpu_lines
        if not ln.startswith(("DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_TEMP"))
    ]
    counts: Counter[str] = Counter()
    billed = _gpus("\n".join(gpu_lines + instance_lines) + "\n", counts)
    assert sorted(billed) == [f"{T4_UUID}/GI-1", f"{T4_UUID}/GI-2"] and counts["mig_parent_not_billed"] == 1
    assert {(g.power_w, g.temp_c) for g in billed.values()} == {(68.244, 74.0)}


def _with_pod(text: str, namespace: str) -> str:
    return re.sub(r"(DCGM_FI_\w+\{)", rf'\1namespace="{namespace}",pod="p",container="c",', text)


def test_a_sample_not_sent_moves_no_fault_baseline(shared_data: Path) -> None:
    """A scrape whose sample is refused (its pod's namespace is ``idle``, a name no team may have) is counted; the
    uncorrectable ECC error it shows fails the device's next sample sent instead of being lost."""
    t4 = metric_text(shared_data, T4)
    ecc = f'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{UUID="{T4_UUID}",modelName="Tesla T4"}}'
    scraper = DcgmScraper("http://unused", "n")
    seen = []
    for k, (namespace, errors) in enumerate((("team-a", 0), ("idle", 1), ("team-a", 1))):
        got = scraper.parse(_with_pod(t4 + f"{ecc} {errors}\n", namespace), T0 + k * NS, 1.0)
        seen.append([e.fault_fatal for e in got if isinstance(e, GpuSample)])
    assert seen == [[0], [], [1]] and scraper.counts["gpu_sample_invalid"] == 1


def test_a_mig_gpu_whose_instances_read_nothing_is_still_not_billed(shared_data: Path) -> None:
    """An instance whose every series is blank (just created, or a counters file the reader does not map) still
    makes its GPU a MIG GPU: the GPU is not billed whole beside it, and nothing is billed until the instance reads."""
    gpu_lines = [ln for ln in metric_text(shared_data, T4).splitlines() if ln.startswith("DCGM_FI_")]
    blank = [
        re.sub(r"^(DCGM_FI_\w+\{)([^}]*\}) \S+$", r'\1GPU_I_ID="1",GPU_I_PROFILE="1g.5gb",\2 9223372036854775794', ln)
        for ln in gpu_lines
    ]
    counts: Counter[str] = Counter()
    assert _gpus("\n".join(gpu_lines + blank) + "\n", counts) == {}
    assert counts["mig_parent_not_billed"] == 1 and counts["gpu_sample_skipped"] == 1


def test_a_page_that_is_no_prometheus_text_is_said_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    """A proxy's error page at the exporter's URL is a warning and ``scrape_unparseable``, never a silent gap."""
    scraper = DcgmScraper("http://unused", "n")
    scraper.fetch = lambda: "<html><body>502 Bad Gateway</body></html>"  # type: ignore[method-assign]
    assert scraper.sample(T0, 1.0) == [] and scraper.counts["scrape_unparseable"] == 1
    assert "did not return Prometheus text" in caplog.text


def test_an_instance_without_a_model_name_keeps_its_profile(shared_data: Path) -> None:
    gpu_lines = [ln for ln in metric_text(shared_data, T4).splitlines() if ln.startswith("DCGM_FI_")]
    nameless = [re.sub(r'modelName="[^"]*",', 'GPU_I_ID="1",GPU_I_PROFILE="1g.5gb",', ln) for ln in gpu_lines]
    assert [g.gpu_model for g in _gpus("\n".join(gpu_lines + nameless) + "\n").values()] == ["unknown MIG 1g.5gb"]


def test_an_unreadable_volatile_ecc_count_has_no_lifetime_stand_in(shared_data: Path) -> None:
    """A volatile count written as no count (0.5) is as good as blank: the lifetime count (7) never stands in, which
    would read as 7 new uncorrectable errors."""
    ecc = f'{{UUID="{T4_UUID}",modelName="Tesla T4"}}'
    text = metric_text(shared_data, T4)
    scrapes = [text + f"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{ecc} {v}\nDCGM_FI_DEV_ECC_DBE_AGG_TOTAL{ecc} 7\n" for v in "0X0"]
    scraper = DcgmScraper("http://unused", "n")
    got = [scraper.parse(t.replace(" X\n", " 0.5\n"), T0 + k * NS, 1.0) for k, t in enumerate(scrapes)]
    assert [[e.fault_fatal for e in events if isinstance(e, GpuSample)] for events in got] == [[0], [0], [0]]


def test_a_sum_with_a_blank_or_unreadable_part_is_unread(shared_data: Path) -> None:
    """Retired pages are RETIRED_SBE + RETIRED_DBE: with one part blank (or NaN) the sum is unread, never the other
    part alone, which would read as a reset of the counter and its return as new pages retired."""
    labels = f'{{UUID="{T4_UUID}",modelName="Tesla T4"}}'
    t4 = metric_text(shared_data, T4)
    scraper = DcgmScraper("http://unused", "n")
    seen = []
    for k, sbe in enumerate(("5", "9223372036854775794", "5", "NaN", "5", "6")):
        text = t4 + f"DCGM_FI_DEV_RETIRED_SBE{labels} {sbe}\nDCGM_FI_DEV_RETIRED_DBE{labels} 3\n"
        seen += [e.fault_warning for e in scraper.parse(text, T0 + k * NS, 1.0) if isinstance(e, GpuSample)]
    assert seen == [0, 0, 0, 0, 0, 1]  # only the last scrape retires a page


@pytest.mark.parametrize(
    ("metric", "blank", "field", "read_as"),
    [
        ("DCGM_FI_DEV_GPU_TEMP", "2147483632", "temp_c", 0.0),  # DCGM_INT32_BLANK (0x7ffffff0): not 2,147,483,632 °C
        ("DCGM_FI_DEV_POWER_USAGE", "140737488355328", "power_w", 0.0),  # DCGM_FP64_BLANK (2^47)
        ("DCGM_FI_DEV_GPU_UTIL", "2147483634", "sm_util_pct", 15.6205),  # INT32 NOT_SUPPORTED: GR_ENGINE stands in
        ("DCGM_FI_DEV_FB_FREE", "9223372036854775794", "mem_total_bytes", 5368709120),  # INT64: total is what is used
    ],
)
def test_each_of_dcgm_s_blank_values_is_missing(
    shared_data: Path, metric: str, blank: str, field: str, read_as: float
) -> None:
    """DCGM's blanks of every field type (dcgm_structs.h ``DCGM_*_BLANK``) are counted as blank and read as missing:
    never a reading, and never the loss of the GPU's bill (a 2,147,483,632 °C temperature made the sample invalid)."""
    counts: Counter[str] = Counter()
    gpu = _gpus(_set(metric_text(shared_data, T4), metric, blank), counts)[T4_UUID]
    assert getattr(gpu, field) == read_as
    assert counts[f"{metric}: blank (sentinel {blank})"] == 1 and not counts["gpu_sample_invalid"]
