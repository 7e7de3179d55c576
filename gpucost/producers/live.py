"""Live sources behind one small interface: ``events()`` until ``stop()``.

Why: so that no caller opens NVML, dcgm-exporter or bpftrace itself, nor tells a source to stop
through a signal handler: each source is opened in one place (``open_live``), says what it samples,
yields events until it is stopped or its duration ends, and releases what it opened. Whoever runs it
only decides when to call ``stop()`` (the CLI: on the first SIGINT or SIGTERM).
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from gpucost.producers.nvml import NvmlSampler, NvmlUnavailable
from gpucost.producers.periodic import Deadlined, Sampler, sample_forever
from gpucost.schemas.events import Event

__all__ = [
    "LIVE_SOURCES",
    "LiveSettings",
    "LiveSource",
    "SourceUnavailable",
    "TraceProbe",
    "TracedSource",
    "open_live",
    "open_nvml",
]

LIVE_SOURCES = ("nvml", "dcgm", "hami", "devices", "ebpf")


class SourceUnavailable(Exception):
    """A live source that cannot run here; the message says why and what to do."""


@dataclass(frozen=True)
class LiveSettings:
    """What the live sources need (the CLI's ``--node-id``, ``--period-s``, ``--duration-s``, ``--url``…)."""

    node_id: str
    period_s: float = 1.0
    duration_s: float | None = None  # None: until stop()
    #: the exporter's /metrics (dcgm-exporter's, HAMi's vGPU monitor's) and the SLA of the tenants its pods make
    url: str | None = None
    pod_sla: str = "Bronze"
    #: with ``devices``: the vendor tool's format run each period (``gpucost.producers.accelerators.live.COMMANDS``),
    #: and the model of devices its output names none of
    device_tool: str | None = None
    device_model: str | None = None
    #: how long one run of a vendor tool may take, and one sample of any sampled source (NVML, a library, an
    #: exporter: ``periodic.Deadlined``)
    device_timeout_s: float = 10.0
    ebpf_sample_every: int = 16
    #: the libraries probed: "auto", where the loader finds them (if anywhere); None, not probed. Kernel launches
    #: are not probed unless asked for: a uprobe per launch can double a launch-bound program's time, for traces
    #: that enter no figure, while a GEMM call's FLOPs are EFU's input
    libcuda: Path | Literal["auto"] | None = None
    libcublas: Path | Literal["auto"] | None = "auto"


class LiveSource(Protocol):
    #: what it does, for a person ("sampling 2 GPU(s) via NVML every 1 s")
    what: str
    #: the source's own counters (NVML readings not supported, failed scrapes, unreadable lines, lost
    #: page faults…): what it could not turn into events, for the run's summary
    counts: Counter[str]

    def events(self) -> Iterator[Event]:
        """Events as they are sampled, until ``stop()`` or the duration; then what it opened is released."""
        ...

    def stop(self) -> None:
        """End the input soon (safe from a signal handler or another thread); what was sampled is kept."""
        ...

    def silent_s(self) -> float | None:
        """How long it has given no events, where that is longer than its calls may take (a wedged driver, an
        exporter that does not answer); None: not so long, or a source that may rightly be quiet
        (``metrics.Health.watch`` reads it for ``/healthz``)."""
        ...


class _Sampled:
    """A sampler read on a drift-free grid of ``period_s`` (NVML, an exporter's scrape)."""

    def __init__(self, sampler: Sampler, what: str, s: LiveSettings, close: Callable[[], None]) -> None:
        self.sampler, self.what, self.settings, self._close = sampler, what, s, close
        self.counts: Counter[str] = getattr(sampler, "counts", Counter())
        self._stop = threading.Event()
        self._deadlined: Deadlined | None = None
        self._ended = False

    def silent_s(self) -> float | None:
        return None if self._deadlined is None or self._ended else self._deadlined.silent_s()

    def events(self) -> Iterator[Event]:
        s = self.settings
        ticks = None if s.duration_s is None else max(1, int(s.duration_s / s.period_s))
        # a second's grace past the deadline, so that a vendor tool's own timeout (the same flag) answers first
        sampler = self._deadlined = Deadlined(self.sampler, s.device_timeout_s + 1.0, self.counts, self._stop.is_set)
        try:
            for ev in sample_forever(sampler, s.period_s, ticks, stopped=self._stop.is_set):
                yield ev
                if self._stop.is_set():
                    return
        finally:
            self._ended = True
            if sampler.settle():
                self._close()
            else:  # closing a driver under a call it never returned from could hang the run's end
                self.counts["close_skipped_sample_hung"] += 1

    def stop(self) -> None:
        self._stop.set()


class TraceProbe(Protocol):
    """What ``TracedSource`` runs: ``gpucost.producers.ebpf.EbpfProbe`` (bpftrace), started."""

    counts: Counter[str]

    def events(self) -> Iterator[Event]:
        """Events until ``stop()``."""
        ...

    def stop(self) -> None: ...

    def summary(self) -> str:
        """What it saw and lost, for a person, once its events end."""
        ...


class TracedSource:
    """bpftrace's page faults (and CUDA launches), attributed to GPUs through NVML where it works.

    Public, beside ``open_live`` (which starts bpftrace, checks it and builds one), so that a probe started
    otherwise, or one standing in for bpftrace where it cannot run (a test), gets the same rules: events end
    at ``stop()`` or the duration, whichever comes first, and nothing (no timer) is left running after."""

    def __init__(
        self, probe: TraceProbe, what: str, s: LiveSettings, nvml: NvmlSampler | None, say: Callable[[str], None]
    ) -> None:
        self.probe, self.what, self.settings, self.nvml, self.say = probe, what, s, nvml, say
        self.counts = probe.counts

    def events(self) -> Iterator[Event]:
        timer = None
        if self.settings.duration_s is not None:
            timer = threading.Timer(self.settings.duration_s, self.probe.stop)
            timer.daemon = True
            timer.start()
        try:
            yield from self.probe.events()
        finally:
            if timer is not None:
                timer.cancel()
            if self.nvml is not None:
                self.nvml.close()
            self.say(self.probe.summary())

    def stop(self) -> None:
        self.probe.stop()

    def silent_s(self) -> None:
        """None: page faults come only while a process touches GPU memory, so an idle node is rightly quiet."""
        return None


def open_nvml(node_id: str) -> NvmlSampler:
    """This node's GPUs through NVML, opened; raises NvmlUnavailable saying why not."""
    sampler = NvmlSampler(node_id)
    sampler.open()
    return sampler


def open_live(
    name: str, s: LiveSettings, nvml: NvmlSampler | None = None, say: Callable[[str], None] = print
) -> LiveSource:
    """The live source ``name`` (one of ``LIVE_SOURCES``), opened and checked now, so that a source that
    cannot run is one clear ``SourceUnavailable`` before anything starts. ``nvml``: a sampler already
    opened (by ``--source auto``), used instead of opening another. ``say`` tells a person what happens."""
    if name == "nvml":
        if nvml is None:
            try:
                nvml = open_nvml(s.node_id)
            except NvmlUnavailable as exc:
                raise SourceUnavailable(str(exc)) from None
        return _Sampled(nvml, f"sampling {len(nvml.devices)} GPU(s) via NVML every {s.period_s:g} s", s, nvml.close)
    if name in _SCRAPED:
        return _open_scraped(name, s)
    if name == "devices":
        return _open_tool(s, say)
    if name == "ebpf":
        return _open_ebpf(s, nvml, say)
    raise ValueError(f"unknown live source {name!r}; the live sources are {', '.join(LIVE_SOURCES)}")


#: the scraped sources: what each is called, its URL's variable and an example URL
_SCRAPED = {
    "dcgm": ("dcgm-exporter", "GPUCOST_DCGM_URL", "http://host:9400/metrics"),
    "hami": ("HAMi's vGPU monitor", "GPUCOST_HAMI_URL", "http://<this node's monitor pod>:9394/metrics"),
}


def _open_scraped(name: str, s: LiveSettings) -> LiveSource:
    from gpucost.producers.dcgm import DcgmScraper
    from gpucost.producers.hami import HamiScraper
    from gpucost.producers.scrape import ScrapeUnavailable

    what, variable, example = _SCRAPED[name]
    url = s.url or os.environ.get(variable)
    if not url:
        raise SourceUnavailable(f"--source {name} needs --url (or {variable}), e.g. {example}")
    scraper = (DcgmScraper if name == "dcgm" else HamiScraper)(url, s.node_id, sla=s.pod_sla)
    try:
        scraper.fetch()  # reachable now, or one clear error
    except ScrapeUnavailable as exc:
        raise SourceUnavailable(str(exc)) from None
    return _Sampled(scraper, f"sampling {what} at {url} every {s.period_s:g} s", s, lambda: None)


def _open_tool(s: LiveSettings, say: Callable[[str], None]) -> LiveSource:
    from gpucost.producers.accelerators.libraries import LIBRARIES, LibraryUnavailable
    from gpucost.producers.accelerators.live import COMMANDS, SERVED, ToolSampler
    from gpucost.schemas.devices import platform_for

    tools = sorted({*COMMANDS, *SERVED, *LIBRARIES})
    if s.device_tool not in tools:
        raise SourceUnavailable(
            f"--source devices needs --device-tool NAME (or GPUCOST_DEVICE_TOOL), one of {', '.join(tools)}"
        )
    url = (s.url or os.environ.get("GPUCOST_DEVICES_URL")) if s.device_tool in SERVED else None
    if s.device_tool in SERVED and not url:
        raise SourceUnavailable(
            f"--device-tool {s.device_tool} reads an exporter: give --url (or GPUCOST_DEVICES_URL), "
            f"e.g. {SERVED[s.device_tool]}"
        )
    sampler = ToolSampler(s.device_tool, s.node_id, s.device_model, s.device_timeout_s, url)
    try:
        now, answer = sampler.first()  # runs here now, or one clear error
    except LibraryUnavailable as exc:
        raise SourceUnavailable(str(exc)) from None
    refused = None
    if not now:
        why = "; ".join(sorted(answer.dead_letters)) or "its answer names no device"
        refused = f"--device-tool {s.device_tool}: no device samples ({why})"
    elif s.device_model is None and any(x.model is None for x in now):
        refused = (
            f"--device-tool {s.device_tool} names no model of its devices: give --device-model NAME "
            "(a row or alias of gpucost/schemas/platforms.toml, e.g. MI300X), which prices and peaks go by"
        )
    if refused is not None:
        sampler.close()  # a library opened by first()
        raise SourceUnavailable(refused)
    if s.device_model is not None and platform_for(s.device_model) is None:
        say(
            f"--device-model {s.device_model!r} is no row or alias of gpucost/schemas/platforms.toml: its devices are "
            "priced by that name (else the default price) and judged against the default peak"
        )
    if url:
        how = f"reading {s.device_tool} at {url}"
    elif s.device_tool in LIBRARIES:
        how = f"reading the {s.device_tool} library"
    else:
        how = f"running {COMMANDS[s.device_tool][0]} ({s.device_tool})"
    return _Sampled(sampler, f"{how} every {s.period_s:g} s: {len(now)} device(s) and partition(s)", s, sampler.close)


def _open_ebpf(s: LiveSettings, nvml: NvmlSampler | None, say: Callable[[str], None]) -> LiveSource:
    from gpucost.producers.ebpf import EbpfProbe, EbpfUnavailable, find_libcublas, find_libcuda

    if nvml is None:
        try:
            nvml = open_nvml(s.node_id)  # to name the GPUs a migrating process uses
        except NvmlUnavailable:
            say("no NVML here: NUMA migrations and CUDA launches are counted, not attributed to GPUs")
    libcuda = find_libcuda() if s.libcuda == "auto" else s.libcuda
    libcublas = find_libcublas() if s.libcublas == "auto" else s.libcublas
    for flag, lib in (("--libcuda", libcuda), ("--libcublas", libcublas)):
        if lib is not None and not lib.is_file():
            raise SourceUnavailable(f"{flag} {lib} is not a file")
    probe = EbpfProbe(
        s.node_id,
        sample_every=s.ebpf_sample_every,
        gpus_of=None if nvml is None else nvml.gpus_of,
        libcuda=libcuda,
        libcublas=libcublas,
    )
    try:
        probe.start()
    except EbpfUnavailable as exc:
        raise SourceUnavailable(str(exc)) from None
    what = (
        f"tracing user page faults (1 in {s.ebpf_sample_every})"
        + (
            f" and CUDA launches in {libcuda}"
            if libcuda
            else " (CUDA launches not probed: --libcuda auto or PATH)"
            if s.libcuda is None
            else " (no libcuda here: no CUDA launches)"
        )
        + (
            f" and GEMM FLOPs in {libcublas}"
            if libcublas
            else " (GEMM calls not probed: no FLOPs)"
            if s.libcublas is None
            else " (no libcublas here: no FLOPs)"
        )
        + " with bpftrace"
    )
    return TracedSource(probe, what, s, nvml, say)
