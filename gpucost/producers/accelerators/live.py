"""Live mode: run the vendor's own tool, when installed, or read its exporter's page, and parse the answer.

Each format names the command that prints it (``COMMANDS``), or is served by an exporter over HTTP
(``SERVED``: read from its URL each period, as a tool's output is). A tool that is missing, fails, or
outlives its timeout, or a page that cannot be read, gives no samples and one counted reason; nothing
here raises to the caller.
"""

from __future__ import annotations

import shutil
import subprocess
from collections import Counter
from dataclasses import replace
from decimal import Decimal
from typing import Any

from gpucost.producers.accelerators.detect import FORMATS
from gpucost.producers.accelerators.events import FaultBaseline, Placement, to_events, with_faults
from gpucost.producers.accelerators.libraries import LIBRARIES
from gpucost.producers.scrape import ScrapeUnavailable, fetch
from gpucost.schemas.devices import DeviceSample, Parsed
from gpucost.schemas.events import Event, GpuSample, ProcessSample

__all__ = ["COMMANDS", "SERVED", "ToolSampler", "run_tool"]

COMMANDS: dict[str, list[str]] = {
    "amd-smi-text": ["amd-smi", "monitor", "-ptumv"],
    "amd-smi-json": ["amd-smi", "metric", "--power", "--usage", "--mem-usage", "--json"],
    "rocm-smi": ["rocm-smi", "--showallinfo", "--json"],
    "neuron-ls": ["neuron-ls", "--show-all-procs"],
    "tpu-info": ["tpu-info"],
    "hl-smi": ["hl-smi"],
    "hl-smi-csv": [
        "hl-smi",
        "-Q",
        "timestamp,name,bus_id,utilization.aip,power.draw,memory.used,memory.total,temperature.aip",
        "-f",
        "csv",
    ],
    "xbutil": [
        "xbutil",
        "examine",
        "-r",
        "electrical",
        "thermal",
        "platform",
        "-f",
        "JSON",
        "-o",
        "/dev/stdout",
        "--force",
    ],
}

#: the formats an exporter serves as Prometheus text, each with an example of its URL (the exporter's default port)
SERVED: dict[str, str] = {
    "amd-exporter": "http://<this node>:5000/metrics",  # AMD's device-metrics-exporter
    "neuron-monitor": "http://<this node>:8000/metrics",  # neuron-monitor | neuron-monitor-prometheus.py
}


def run_tool(fmt: str, timeout_s: float = 10.0, url: str | None = None) -> Parsed:
    """The samples the tool of ``fmt`` prints now, or (a ``SERVED`` format) its exporter serves at ``url``."""
    out = Parsed()
    if fmt in SERVED:
        return _served(fmt, url, timeout_s, out)
    argv = COMMANDS.get(fmt)
    if argv is None:
        out.reject(f"{fmt}: no live command (live: {', '.join(sorted({*COMMANDS, *SERVED}))})")
        return out
    exe = shutil.which(argv[0])
    if exe is None:
        out.reject(f"{argv[0]}: not installed (not on PATH)")
        return out
    try:
        done = subprocess.run(
            [exe, *argv[1:]], capture_output=True, text=True, errors="replace", timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        out.reject(f"{argv[0]}: no answer within {timeout_s:g} s")
        return out
    except OSError as exc:
        out.reject(f"{argv[0]}: cannot run ({exc.strerror})")
        return out
    if done.returncode != 0:
        out.reject(f"{argv[0]}: exit status {done.returncode}: {done.stderr.strip()[:200]}")
        return out
    return _parsed(fmt, argv[0], done.stdout, out)


def _served(fmt: str, url: str | None, timeout_s: float, out: Parsed) -> Parsed:
    if not url:
        out.reject(f"{fmt}: no URL to read (give --url, e.g. {SERVED[fmt]})")
        return out
    try:
        text = fetch(url, timeout_s)
    except ScrapeUnavailable as exc:
        out.reject(f"{fmt}: {exc}")
        return out
    return _parsed(fmt, url, text, out)


def _parsed(fmt: str, source: str, text: str, out: Parsed) -> Parsed:
    """``text`` read as ``fmt``, or ``out`` with the reason a parser refused the whole answer (a time it cannot
    read, nesting past the recursion limit, a page that is no Prometheus text)."""
    try:
        return FORMATS[fmt](text)
    except (ValueError, RecursionError) as exc:
        out.reject(f"{source}: its output could not be read ({type(exc).__name__}: {str(exc)[:200]})")
        return out


class ToolSampler:
    """A vendor's tool run, or its exporter's page read from ``url``, once each period (``gpucost run --source
    devices --device-tool NAME``): its devices' and partitions' samples as the pipeline's events, by the rules a
    capture replayed through ``gpucost devices --events`` is billed by (``events.to_events``), the faults of each
    sample counted against the device's previous one sent, the previous run's included (``events.with_faults``). A
    run that fails gives no events and its reason counted."""

    def __init__(
        self, fmt: str, node_id: str, model: str | None = None, timeout_s: float = 10.0, url: str | None = None
    ) -> None:
        self.fmt, self.node_id, self.model, self.timeout_s, self.url = fmt, node_id, model, timeout_s, url
        #: a vendor library (``libraries.LIBRARIES``) opened by ``first`` and read each period, instead of a tool
        self._library = LIBRARIES[fmt]() if fmt in LIBRARIES else None
        self.counts: Counter[str] = Counter()
        #: what the faults of each device's next reading are new since, across an answer it was missing from or a
        #: failed run
        self._before = FaultBaseline()

    def first(self) -> tuple[list[DeviceSample], Parsed]:
        """The tool's answer now (each device's latest reading, and the whole answer), to check before a run starts;
        it is the baseline of the faults counted: the lifetime counters a device had before the run (since its
        driver loaded) are not the run's, nor counted again at each restart."""
        if self._library is not None:
            self._library.open()  # LibraryUnavailable: not installed, or cannot start
        parsed = self._answer()
        latest = self._latest(parsed)
        self._before.remember(latest)
        return latest, parsed

    def _latest(self, parsed: Parsed) -> list[DeviceSample]:
        """Each device's (or partition's) latest reading of one answer: a tool that prints several (hl-smi's log
        form) is sampled once a period, as every other, the rest counted ``readings_superseded``."""
        latest = {s.device_id: s for s in sorted(parsed.samples, key=lambda s: s.ts_ns or 0)}
        self.counts["readings_superseded"] += len(parsed.samples) - len(latest)
        return list(latest.values())

    def _answer(self) -> Parsed:
        return self._library.read() if self._library is not None else run_tool(self.fmt, self.timeout_s, self.url)

    def close(self) -> None:
        if self._library is not None:
            self._library.close()

    def sample(self, ts_ns: int, interval_s: float) -> list[Event]:
        parsed = self._answer()
        now = [replace(s, ts_ns=ts_ns) for s in self._latest(parsed)]  # the sampling grid's time, not the tool's
        place = Placement(self.node_id, Decimal(repr(interval_s)), ts_ns, self.model)
        wire = with_faults(to_events(now, place, parsed), now, place, self._before)
        self._before.remember(s for s in now if s.device_id in _sent(wire, self.node_id))
        if not parsed.samples and not parsed.dead_letters:  # an answer of no device at all: a silent gap, else
            parsed.reject("no_devices: the answer names no device")
        parsed.count_into(self.counts)
        return [(GpuSample if w["kind"] == "gpu_sample" else ProcessSample).model_validate(w) for w in wire]


def _sent(wire: list[dict[str, Any]], node_id: str) -> set[str]:
    """The devices whose faults the GPU samples of ``wire`` carry: each sample's device and a partition's whole device
    (its faults are the partition's where it reports none). Only their readings move the baseline on, so the faults
    of a reading whose event was refused come with the device's next sample sent."""
    prefix = len(node_id) + 1  # gpu_uuid and partition_of are NODE/DEVICE_ID
    return {w[k][prefix:] for w in wire if w["kind"] == "gpu_sample" for k in ("gpu_uuid", "partition_of") if k in w}
