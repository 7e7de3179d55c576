"""The pipeline's own metrics and health, served over HTTP by the long-running commands.

Why: platform teams run gpucost continuously, and a worker that only logs says nothing after its
partition assignment until it stops. ``gpucost produce``, ``worker``, ``sink`` and ``run`` take
``--metrics-address HOST:PORT`` (env ``GPUCOST_METRICS_ADDRESS``; off when unset) and serve
Prometheus text at ``/metrics`` and ``/healthz`` (200 ``ok``, or 503 with the reason).

The figures are read from the component when scraped (its counters, its outbox, its auditors),
never kept twice. The scrape runs in the server's thread while the component changes them, so each
collection is copied in one step (``dict(…)``, ``list(…)``: no other thread runs meanwhile) before
it is iterated; names follow Prometheus' conventions (``gpucost_…_total`` for counters, units
in the name). Each component's metrics are described in ``docs/operations.md``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import ThreadingWSGIServer

__all__ = [
    "OTHER",
    "BoundedSeries",
    "Health",
    "MetricsServer",
    "counter",
    "gauge",
    "labelled",
    "parse_address",
    "source_counts",
]

#: every label of a family's overflow series: the label sets past its cap, summed
OTHER = "_other"


def labelled(kind: type, name: str, doc: str, labels: Sequence[str], values: Mapping[tuple[Any, ...], float]) -> Metric:
    """A family of ``kind`` (a counter or gauge family) with one value per tuple of ``labels``' values."""
    family = kind(name, doc, labels=list(labels))
    for key, value in sorted(dict(values).items()):
        family.add_metric([str(k) for k in key], float(value))
    return family


class BoundedSeries(dict[tuple[str, ...], float]):
    """One family's values by label set, never more than ``cap`` label sets, its overflow series among them.

    Why one rule for every family whose labels come from input (team, env, app, SLA, GPU model, node,
    grade): each new label value is a series Prometheus keeps for good and this process keeps until it
    stops, so a name invented per message (a hostile binding, a forged record) would grow both without
    end. Past the cap a label set is counted in the series whose every label is ``_other``: sums over the
    family stay right, only the breakdown is lost, and ``folded`` says how often that happened.
    """

    def __init__(self, cap: int, width: int) -> None:
        super().__init__()
        self.cap, self.overflow, self.folded = cap, (OTHER,) * width, 0

    def add(self, key: tuple[str, ...], amount: float) -> tuple[str, ...]:
        """Add ``amount`` to ``key``'s series, or to the overflow series once the cap is reached; the key used."""
        if key not in self and key != self.overflow and len(self) + 1 + (self.overflow not in self) > self.cap:
            self.folded += 1
            key = self.overflow
        self[key] = self.get(key, 0) + amount
        return key


def _family(kind: type, name: str, doc: str, values: Mapping[Any, float] | float, label: str | None) -> Metric:
    if label is None:
        return labelled(kind, name, doc, (), {(): float(values)})  # type: ignore[arg-type]
    return labelled(kind, name, doc, (label,), {(k,): v for k, v in dict(values).items()})  # type: ignore[arg-type]


def counter(name: str, doc: str, values: Mapping[Any, float] | float, label: str | None = None) -> Metric:
    """A counter family: one value, or one per ``label`` value (``name`` without ``_total``)."""
    return _family(CounterMetricFamily, name, doc, values, label)


def gauge(name: str, doc: str, values: Mapping[Any, float] | float, label: str | None = None) -> Metric:
    return _family(GaugeMetricFamily, name, doc, values, label)


def source_counts(counts: Mapping[str, int]) -> Metric:
    """A live source's own counters (``produce`` and ``run`` serve them alike)."""
    return counter(
        "gpucost_source_not_taken",
        "what the live source counted and did not turn into events, by what",
        dict(counts),
        "what",
    )


class Health:
    """Alive while the component's loop keeps beating: a loop stalled past ``stall_s`` (a hung broker
    call, a dead event loop), a source ``watch``ed that has given nothing past ``stall_s`` (a live source's
    wedged driver or an exporter that never answers, which the loop outlives: it goes on, billing nothing) or a
    recorded failure makes ``/healthz`` answer 503 with the reason."""

    def __init__(self, stall_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.stall_s, self.clock = stall_s, clock
        self.last_beat = clock()
        self.failure: str | None = None
        self._watched: list[tuple[str, Callable[[], float | None]]] = []

    def beat(self) -> None:
        self.last_beat = self.clock()

    def watch(self, what: str, silent_s: Callable[[], float | None]) -> None:
        """Unwell too while ``silent_s()`` (how long ``what`` has given nothing; None: not worth saying) exceeds
        ``stall_s``."""
        self._watched.append((what, silent_s))

    def problem(self) -> str | None:
        if self.failure is not None:
            return self.failure
        for what, silent_s in self._watched:
            quiet = silent_s()
            if quiet is not None and quiet > self.stall_s:
                return (
                    f"{what} has given no events for {quiet:.0f} s (a wedged driver, an exporter that does not "
                    "answer, devices with nothing to bill: see gpucost_source_not_taken_total); nothing is billed"
                )
        idle = self.clock() - self.last_beat
        return f"the main loop has not run for {idle:.0f} s" if idle > self.stall_s else None


def parse_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (``:9464`` for every interface) as a bind address; a ValueError says what is wrong."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(
            f"metrics address {address!r} is not HOST:PORT (e.g. 0.0.0.0:9464, or 127.0.0.1:0 for any free port)"
        )
    return host.strip("[]") or "0.0.0.0", int(port)


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args: object) -> None:  # a scrape every 15 s is not news
        pass


class MetricsServer:
    """``/metrics`` from ``collect`` and ``/healthz`` from ``health``, in a daemon thread."""

    def __init__(self, address: str, collect: Callable[[], Iterable[Metric]], health: Health) -> None:
        registry = CollectorRegistry(auto_describe=False)

        class _Collector:
            def collect(self) -> Iterable[Metric]:
                return list(collect())

        registry.register(_Collector())  # type: ignore[arg-type]

        def app(environ: dict[str, Any], respond: Callable[..., Any]) -> list[bytes]:
            path = environ.get("PATH_INFO", "/")
            if path == "/healthz":
                problem = health.problem()
                respond(
                    "200 OK" if problem is None else "503 Service Unavailable",
                    [("Content-Type", "text/plain; charset=utf-8")],
                )
                return [b"ok\n" if problem is None else f"{problem}\n".encode()]
            if path != "/metrics":
                respond("404 Not Found", [("Content-Type", "text/plain")])
                return [b"/metrics or /healthz\n"]
            respond("200 OK", [("Content-Type", "text/plain; version=0.0.4; charset=utf-8")])
            return [generate_latest(registry)]

        host, port = parse_address(address)
        self._server = make_server(host, port, app, ThreadingWSGIServer, handler_class=_Quiet)
        self.port = self._server.server_port
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
