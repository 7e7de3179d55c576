"""Every decoder survives arbitrary bytes: it returns what it could read and counts or rejects the rest.

The corpus in tests/corpus/ keeps the inputs that once broke something (found by these
fuzzers or by hand), and runs them on every build.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from gpucost.producers.dcgm import DcgmScraper
from gpucost.producers.ebpf import EbpfProbe
from gpucost.schemas.codec import REASONS, Rejected, decode_line
from gpucost.schemas.ebpf import TRACE_EVENT_SIZE, decode_trace_event
from gpucost.schemas.events import EVENT_MODELS, Event
from gpucost.sinks.parquet import ParquetSink
from gpucost.streams.audit import Auditor
from gpucost.streams.settings import AuditSettings

CORPUS = Path(__file__).parent / "corpus"
NS = 1_000_000_000


def json_line(data: bytes) -> None:
    got = decode_line(data)
    assert isinstance(got, Rejected) and got.reason in REASONS and got.detail or isinstance(got, Event.__args__)


def trace_struct(data: bytes) -> None:
    try:
        ev = decode_trace_event(data)
    except ValueError as exc:
        assert len(data) != TRACE_EVENT_SIZE and str(len(data)) in str(exc)
        return
    assert len(data) == TRACE_EVENT_SIZE and 0 <= ev.pid < 2**32 and 0 <= ev.timestamp_ns < 2**64
    # as a wire event it is either valid or rejected with a reason, never an exception
    json_line(json.dumps({"kind": "ebpf_trace", "node_id": "n", "trace_hex": data.hex()}).encode())


class _Scraper(DcgmScraper):
    def __init__(self, text: str) -> None:
        super().__init__("http://fuzz.invalid/metrics", "node-f")
        self.text = text

    def fetch(self) -> str:
        return self.text


def prometheus_text(data: bytes) -> None:
    scraper = _Scraper(data.decode("utf-8", "replace"))
    events = scraper.sample(1_767_571_200 * NS, 1.0)
    assert all(isinstance(e, Event.__args__) for e in events)
    assert events or scraper.counts or not data.strip() or b"DCGM_FI_" not in data


def bpftrace_output(data: bytes) -> None:
    probe = EbpfProbe("node-f", sample_every=1, gpus_of=lambda pid: ["GPU-f"], distances={(0, 1): 21})
    for line in data.decode("utf-8", "replace").splitlines():
        events = probe.parse(line)
        assert all(isinstance(e, Event.__args__) for e in events)


def audit_stream(data: bytes) -> None:
    """Through the auditor and into Parquet: every line is counted once, as an event or a dead letter."""
    auditor = Auditor(AuditSettings(), clock=lambda: 1_767_571_200 * NS)
    lines = [line for line in data.split(b"\n") if line.strip()]
    with tempfile.TemporaryDirectory() as out:
        sink = ParquetSink(Path(out))
        for line in lines:
            for record in auditor.ingest(line, "fuzz"):
                sink.write(record)
        for record in auditor.finish():
            sink.write(record)
        sink.flush()
    accepted = sum(auditor.counts[k] for k in EVENT_MODELS)
    assert accepted + sink.rows_written["dlq"] == len(lines)


DECODERS = {
    "json": json_line,
    "trace": trace_struct,
    "prometheus": prometheus_text,
    "bpftrace": bpftrace_output,
    "audit": audit_stream,
}


@pytest.mark.parametrize("case", sorted(CORPUS.glob("*/*")), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_regression_corpus(case: Path) -> None:
    DECODERS[case.parent.name](case.read_bytes())


@given(st.binary(max_size=400))
def test_json_decoder_on_arbitrary_bytes(data: bytes) -> None:
    json_line(data)


@given(st.binary(min_size=TRACE_EVENT_SIZE - 2, max_size=TRACE_EVENT_SIZE + 2) | st.binary(max_size=80))
def test_trace_struct_on_arbitrary_bytes(data: bytes) -> None:
    trace_struct(data)


_PROM_LINE = st.builds(
    lambda name, labels, value: f"{name}{{{labels}}} {value}",
    st.sampled_from(
        [
            "DCGM_FI_DEV_GPU_UTIL",
            "DCGM_FI_DEV_FB_USED",
            "DCGM_FI_DEV_FB_FREE",
            "DCGM_FI_DEV_POWER_USAGE",
            "DCGM_FI_DEV_GPU_TEMP",
            "DCGM_FI_PROF_PCIE_TX_BYTES",
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        ]
    ),
    st.sampled_from(
        [
            'UUID="GPU-1"',
            'UUID="GPU-1",modelName="L4"',
            'UUID="GPU-2",pod="p",namespace="ns"',
            'UUID=""',
            'UUID="GPU-1",Hostname=""',
            'UUID="GPU-1",pod="a:b",namespace="idle"',
        ]
    ),
    st.one_of(st.floats(), st.integers(-(10**20), 10**20), st.sampled_from(["NaN", "+Inf", "-Inf", "1e400", "x"])),
)


@given(st.lists(_PROM_LINE | st.text(max_size=60), max_size=12).map(lambda ls: "\n".join(ls).encode()))
@example(b'DCGM_FI_DEV_GPU_UTIL{UUID="GPU-1"} 50\nDCGM_FI_DEV_FB_USED{UUID="GPU-1"} -3')
def test_prometheus_scrape_on_arbitrary_text(data: bytes) -> None:
    prometheus_text(data)


_BPF_LINE = st.builds(
    lambda tag, nums: " ".join([tag, *map(str, nums)]),
    st.sampled_from(["A", "N", "K", "M", "X", ""]),
    st.lists(st.integers(-(2**65), 2**65) | st.sampled_from([0, 1, 2**32, 2**64 - 1]), max_size=9),
)


@given(st.lists(_BPF_LINE | st.text(max_size=40), max_size=10).map(lambda ls: "\n".join(ls).encode()))
def test_bpftrace_output_on_arbitrary_text(data: bytes) -> None:
    bpftrace_output(data)


_GOOD = (
    '{"kind":"gpu_sample","node_id":"n","gpu_uuid":"G","gpu_model":"H100","ts_ns":%d,"interval_s":1,'
    '"sm_util_pct":%d,"mem_bw_util_pct":1,"mem_used_bytes":1,"mem_total_bytes":2,"power_w":1,"temp_c":30}'
)


@pytest.mark.slow
@given(
    st.lists(
        st.integers(0, 4000).map(lambda s: (_GOOD % (1_767_571_200 * NS + s * NS, s % 101)).encode())
        | st.binary(max_size=60),
        max_size=40,
    ).map(b"\n".join)
)
def test_auditor_on_arbitrary_lines(data: bytes) -> None:
    audit_stream(data)


def test_every_corpus_folder_has_a_decoder() -> None:
    folders = {p.name for p in CORPUS.iterdir() if p.is_dir()}
    assert folders and folders <= set(DECODERS)
    assert Counter(p.parent.name for p in CORPUS.glob("*/*"))
