"""A Prometheus exporter read each tick: dcgm-exporter, HAMi's vGPU monitor.

Why one class: both sources fetch a ``/metrics`` page, turn it into events and must never stop a
live run over one bad scrape. The fetch, the counting of what failed and the tolerant reading of
the text are here once; each source says only how its scrape becomes events (``parse``).
"""

from __future__ import annotations

import http.client
import logging
import time
import urllib.parse
import urllib.request
from collections import Counter
from typing import Any
from urllib.error import URLError

from prometheus_client.parser import text_string_to_metric_families

from gpucost.schemas.events import Event, TenantBinding

__all__ = ["ScrapeUnavailable", "Scraper", "container_binding", "families", "fetch"]

log = logging.getLogger("gpucost.scrape")


class ScrapeUnavailable(Exception):
    """The exporter cannot be scraped; the message says where and why."""


#: the most a page may hold: an exporter's is a few MB; more is a misconfigured URL, never read into memory whole
MAX_PAGE_BYTES = 64 << 20


def fetch(url: str, timeout_s: float) -> str:
    """The page at ``url`` (http or https) as text, bytes that are not UTF-8 replaced, read within ``timeout_s`` in
    all (a server trickling bytes is cut off) and at most ``MAX_PAGE_BYTES``; ScrapeUnavailable saying where and why
    otherwise (an answer cut short by an exporter restarting, a malformed one, none)."""
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        raise ScrapeUnavailable(f"cannot scrape {url}: give an http:// or https:// URL")
    deadline = time.monotonic() + timeout_s
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 (a configured http(s) URL)
            body = bytearray()
            while chunk := resp.read1(1 << 16):
                body += chunk
                if len(body) > MAX_PAGE_BYTES:
                    raise ScrapeUnavailable(f"cannot scrape {url}: the page is over {MAX_PAGE_BYTES >> 20} MiB")
                if time.monotonic() > deadline:
                    raise ScrapeUnavailable(f"cannot scrape {url}: the page took over {timeout_s:g} s")
            if getattr(resp, "length", None):  # bytes its Content-Length promised and the connection never sent
                raise ScrapeUnavailable(f"cannot scrape {url}: the page was cut short ({resp.length} bytes missing)")
            return body.decode("utf-8", "replace")
    except (URLError, OSError, ValueError, http.client.HTTPException) as exc:
        raise ScrapeUnavailable(f"cannot scrape {url}: {exc}") from None


def families(text: str, counts: Counter[str]) -> list[Any]:
    """The scrape's metric families; a text one bad line spoils is read again line by line, each
    line that cannot be read counted (``line_unparseable``), so that one line never costs the scrape."""
    text = text.removeprefix("\ufeff")  # a byte-order mark would hide the first line's metric name
    try:
        return list(text_string_to_metric_families(text))
    except ValueError:
        pass
    found = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        try:
            found += text_string_to_metric_families(line + "\n")
        except ValueError:
            counts["line_unparseable"] += 1
    if not found:
        raise ValueError("no line of it is a Prometheus sample")
    return found


def container_binding(
    node_id: str, pid: int, ts_ns: int, namespace: str, pod: str, container: str, sla: str, origin: str
) -> TenantBinding:
    """The tenant of a Kubernetes container an exporter names: team = namespace, app = pod, tier = container
    (the rule of ``gpucost.producers.kubernetes.LABELS`` for a pod without gpucost labels, so that an exporter
    and the pod's allocation name one tenant); ValueError for a name no tenant field may hold (a ``:``)."""
    return TenantBinding(
        node_id=node_id,
        pid=pid,
        ts_ns=ts_ns,
        team=namespace,
        env="",
        app=pod,
        tier=container,
        sla=sla,  # type: ignore[arg-type]
        origin=origin,  # type: ignore[arg-type]
    )


class Scraper:
    """Scrapes one exporter each period; a failed scrape is logged and counted, never fatal."""

    #: the source's name in messages ("dcgm")
    name = "exporter"

    def __init__(self, url: str, default_node: str, timeout_s: float = 5.0, sla: str = "Bronze") -> None:
        self.url, self.default_node, self.timeout_s, self.sla = url, default_node, timeout_s, sla
        self.counts: Counter[str] = Counter()

    def parse(self, text: str, ts_ns: int, interval_s: float) -> list[Event]:
        """The events of one scrape (ValueError: not Prometheus text at all)."""
        raise NotImplementedError

    def fetch(self) -> str:
        return fetch(self.url, self.timeout_s)

    def sample(self, ts_ns: int, interval_s: float) -> list[Event]:
        try:
            text = self.fetch()
        except ScrapeUnavailable as exc:
            log.warning("%s", exc)
            self.counts["scrape_failed"] += 1
            return []
        try:
            return self.parse(text, ts_ns, interval_s)
        except ValueError as exc:  # not Prometheus text (a proxy's error page, a truncated body)
            log.warning("%s: %s did not return Prometheus text: %s", self.name, self.url, exc)
            self.counts["scrape_unparseable"] += 1
            return []
