"""Hostile answers to the live accelerator sources (an exporter's page, a vendor library, neuron-monitor): each is
counted and never ends, hangs or bloats the run, and never costs a device its bill (a hostile review's findings,
each reproduced here as it was found)."""

from __future__ import annotations

import socket
import sys
import threading
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest

from gpucost.cli import main
from gpucost.producers import scrape
from gpucost.producers.accelerators.events import Placement, to_events
from gpucost.producers.accelerators.libraries import AmdSmi
from gpucost.producers.accelerators.live import ToolSampler
from gpucost.producers.accelerators.neuron import parse_scrape
from gpucost.producers.live import LiveSettings, open_live
from gpucost.producers.scrape import ScrapeUnavailable, fetch
from gpucost.schemas.devices import MAX_REASONS, DeviceSample, Parsed
from tests.support.dcgm_exporter import serving
from tests.support.vendor_libraries import AmdGpu, amdsmi_module

S = 10**9
T0 = 1_780_000_000 * S
NEURON = "aws-neuron/aws_neuron_metrics.txt"


def _raw_server(answer: bytes, trickle_s: float = 0.0) -> Iterator[str]:
    """A server that answers every connection with ``answer`` as is (a cut-short body, a bad status line), byte by
    byte ``trickle_s`` apart if given; yields its URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                try:
                    if trickle_s:
                        for b in answer:
                            if done.is_set():
                                break
                            conn.sendall(bytes([b]))
                            time.sleep(trickle_s)
                    else:
                        conn.sendall(answer)
                except OSError:
                    pass

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/metrics"
    finally:
        done.set()
        sock.close()


def test_a_cut_short_or_malformed_answer_is_counted_never_raised() -> None:
    cut = b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\nhello"
    for answer in (cut, b"HELLO WORLD\r\n\r\n", b"HTTP/1.1 200 OK\r\n" + b"X-A: b\r\n" * 101 + b"\r\n"):
        server = _raw_server(answer)
        url = next(server)
        sampler = ToolSampler("amd-exporter", "n", model="MI300X", url=url)
        assert sampler.sample(T0, 1.0) == []
        assert any(r.startswith("amd-exporter: cannot scrape") for r in sampler.counts), sampler.counts
        server.close()


def test_a_page_is_read_within_its_timeout_and_size_or_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    body = b"x" * 400
    server = _raw_server(b"HTTP/1.1 200 OK\r\nContent-Length: 400\r\n\r\n" + body, trickle_s=0.01)
    url = next(server)
    started = time.monotonic()
    with pytest.raises(ScrapeUnavailable, match="took over 0.5 s"):
        fetch(url, 0.5)
    assert time.monotonic() - started < 2.5  # a page trickling for 4 s: cut off, not read to its end
    server.close()
    monkeypatch.setattr(scrape, "MAX_PAGE_BYTES", 1000)
    with serving("y" * 5000) as big, pytest.raises(ScrapeUnavailable, match="over 0 MiB"):
        fetch(big, 5.0)
    with serving("ok") as small:
        assert fetch(small, 5.0) == "ok"
    for other in ("file:///etc/hostname", "data:text/plain,hello", "ftp://example.org/metrics"):
        with pytest.raises(ScrapeUnavailable, match="give an http:// or https:// URL"):
            fetch(other, 1.0)


def test_gpus_whose_bus_address_the_library_refuses_are_not_billed_as_one() -> None:
    gpus = [AmdGpu("0000:05:00.0", serial="0xA"), AmdGpu("0000:06:00.0", serial="0xB")]
    for gpu in gpus:
        gpu.unsupported = {"bdf"}
    parsed = AmdSmi(amdsmi_module(gpus)).read()
    assert parsed.samples == []  # no device named "None", billed for both
    assert parsed.dead_letters == {"amdsmi: amdsmi_get_gpu_device_bdf failed (AmdSmiLibraryException)": 2}


def test_a_misread_temperature_or_memory_costs_the_figure_not_the_devices_bill() -> None:
    for temp in (300, float("inf")):
        gpus = [AmdGpu("0000:05:00.0", serial="0xA", temp_c=temp), AmdGpu("0000:06:00.0", serial="0xB")]
        parsed = AmdSmi(amdsmi_module(gpus)).read()
        assert [s.temperature_c for s in parsed.samples] == [None, Decimal(40)]
        assert any(r.startswith("amdsmi temperature") for r in parsed.dead_letters)
    used_over = DeviceSample("V", "MI300X", "g", busy_pct=Decimal(50), mem_total_bytes=10, mem_used_bytes=11)
    out = Parsed()
    (gpu,) = [e for e in to_events([used_over], Placement("n", Decimal(1), T0), out) if e["kind"] == "gpu_sample"]
    assert (gpu["mem_used_bytes"], gpu["mem_total_bytes"], "mem_used_bytes" in gpu["not_reported"]) == (0, 10, True)
    assert list(out.dead_letters) == ["g: memory used over its total (or with none), not reported"]
    hot = DeviceSample("V", "MI300X", "g", busy_pct=Decimal(50), temperature_c=Decimal(1000))
    (gpu,) = [e for e in to_events([hot], Placement("n", Decimal(1), T0), Parsed()) if e["kind"] == "gpu_sample"]
    assert gpu["temp_c"] == 0.0 and "temp_c" in gpu["not_reported"] and gpu["sm_util_pct"] == 50.0


def test_reasons_stay_bounded_on_a_long_run(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = AmdGpu("0000:05:00.0", serial="0xA")
    monkeypatch.setitem(sys.modules, "amdsmi", amdsmi_module([gpu]))
    sampler = ToolSampler("amdsmi", "n")
    sampler.first()
    for k in range(3 * MAX_REASONS):
        gpu.power = {"current_socket_power": 200_000 + k}  # over 100 kW: a reason naming each value
        sampler.sample(T0 + k * S, 1.0)
    assert len(sampler.counts) <= MAX_REASONS + 1
    assert sampler.counts["other_reasons"] > 0
    assert sum(n for r, n in sampler.counts.items() if r.startswith("amdsmi power") or r == "other_reasons") == 300


def test_a_page_that_names_no_device_is_counted() -> None:
    with serving("node_load1 0.5\n") as url:
        sampler = ToolSampler("amd-exporter", "n", model="MI300X", url=url)
        assert sampler.sample(T0, 1.0) == []
    assert sampler.counts["no_devices: the answer names no device"] == 1


def test_neuron_monitor_pages_stay_within_a_hosts_devices(shared_data: Path) -> None:
    text = (shared_data / "accelerators" / NEURON).read_text(encoding="utf-8")
    many_cores = text.replace('neuroncore_per_device_count="4"', 'neuroncore_per_device_count="1024"')
    parsed = parse_scrape(many_cores)
    assert parsed.samples == [] and any("no host has more than" in r for r in parsed.dead_letters)
    far = text.replace('neuroncore="3"', 'neuroncore="1000000"')
    parsed = parse_scrape(far)
    assert any(r.startswith("neuroncore 1000000: beyond") for r in parsed.dead_letters)
    assert len(parsed.samples) == 1 + 4
    sixteen = text.replace('neuron_device_count="1"', 'neuron_device_count="16"')
    devices = [s.device_id for s in parse_scrape(sixteen).samples if s.parent_id is None]
    assert devices == [f"nd{d}" for d in range(16)]  # the idle devices too
    superscript = text.replace('neuroncore="3"', 'neuroncore="²"')
    assert parse_scrape(superscript).samples  # one odd label costs its line, not the page


def test_a_library_opened_then_refused_is_closed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    lib = amdsmi_module([AmdGpu("0000:05:00.0", market_name="N/A")])  # names no model
    monkeypatch.setitem(sys.modules, "amdsmi", lib)
    out = ["--out", str(tmp_path / "out"), "--duration-s", "0.2"]
    assert main(["run", "--source", "devices", "--device-tool", "amdsmi", *out]) == 2
    assert lib.calls[0] == "amdsmi_init" and lib.calls[-1] == "amdsmi_shut_down"


def test_a_stop_is_heard_while_no_period_gives_events(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = AmdGpu("0000:05:00.0")
    lib = amdsmi_module([gpu])
    monkeypatch.setitem(sys.modules, "amdsmi", lib)
    live = open_live("devices", LiveSettings(node_id="n", period_s=0.05, device_tool="amdsmi"), say=lambda _: None)
    gpu.unsupported = {"bdf"}  # from now on, every period fails
    events = live.events()
    threading.Timer(0.3, live.stop).start()
    started = time.monotonic()
    assert list(events) == []
    assert time.monotonic() - started < 2 and lib.calls[-1] == "amdsmi_shut_down"
