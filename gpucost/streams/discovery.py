"""Service discovery from the health audit: which nodes are in service, from each GPU's latest record.

docs/definitions.md, "Health audit" (service discovery): a node is listed while none of its GPUs' latest breaker
state is ``removed`` or
``probation``; it leaves the list with the first record that puts one of its GPUs there, and
returns with the record that brings the last of them out. Pure: records in, entries out; the
``gpucost discovery`` command writes them as a Prometheus ``file_sd`` file and a compacted topic.

A node's name becomes the address Prometheus scrapes, and whoever can write a health record
names it: a target is written only if it is ``host:port`` with host a DNS name (RFC 1123 labels)
or an IP literal that is neither unspecified nor link-local (169.254.0.0/16 holds the cloud
metadata service) nor a known metadata address. Anything else is refused by reason
(``target_problem``) and left out of the file, never passed on for Prometheus to resolve.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any

from gpucost.schemas.records import HealthRecord

__all__ = ["OUT_OF_SERVICE", "LABEL_NAME", "MAX_HOST_CHARS", "TARGET_PORT", "ServiceDiscovery", "target_problem"]

#: the breaker states that take a GPU's node out of service discovery
OUT_OF_SERVICE = frozenset({"removed", "probation"})
#: a Prometheus label name (its data model); ``__`` names are Prometheus's own
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
#: the port scraped on each node unless told: the DCGM exporter's (a node name alone would mean port 80)
TARGET_PORT = 9400
#: a DNS name's length at most (RFC 1035), and one label of it (RFC 1123: letters, digits, inner hyphens)
MAX_HOST_CHARS = 253
_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
#: what inet_aton (and so many resolvers) reads as an IPv4 address though it is no dotted quad: 2852039166,
#: 169.254.43518, 0xa9fea9fe, 0251.0376.0251.0376 all name 169.254.169.254
_NUMERIC = re.compile(r"(?:0[xX][0-9A-Fa-f]*|[0-9]+)(?:\.(?:0[xX][0-9A-Fa-f]*|[0-9]+)){0,3}\.?")
#: metadata services outside link-local space (AWS's over IPv6, Alibaba Cloud's)
_METADATA = frozenset(map(ipaddress.ip_address, ("fd00:ec2::254", "100.100.100.200")))
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def _address_problem(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """Why an IP literal is no scrape target: ``unspecified``, ``link_local`` or ``metadata`` (an IPv6 address
    that carries an IPv4 one, mapped or NAT64, is judged by that one)."""
    if isinstance(ip, ipaddress.IPv6Address):
        inner = ip.ipv4_mapped or (ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF) if ip in _NAT64 else None)
        if inner is not None:
            return _address_problem(inner)
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_link_local:
        return "link_local"
    return "metadata" if ip in _METADATA else None


def target_problem(host: str) -> str | None:
    """Why ``host`` may not be a scrape target's host (None: it may): ``empty``, ``too_long``, ``not_a_host``
    (whitespace, control characters, ``/``, ``@``, a port or any other character a DNS label cannot hold),
    ``numeric`` (a number a resolver would read as an IPv4 address), or an address's ``_address_problem``."""
    if not host:
        return "empty"
    if len(host) > MAX_HOST_CHARS:
        return "too_long"
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    if ip is not None:  # a zone (fe80::1%eth0) names an interface of the scraper's host, not a target's
        return "not_a_host" if getattr(ip, "scope_id", None) else _address_problem(ip)
    if _NUMERIC.fullmatch(host):
        return "numeric"
    labels = host.removesuffix(".").split(".")
    return None if all(_LABEL.fullmatch(label) for label in labels) else "not_a_host"


def _target(host: str, port: int) -> str:
    """``host:port``, an IPv6 literal in brackets (Prometheus's address form)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True)
class _Latest:
    window_start_ns: int
    node_id: str
    breaker_state: str


class ServiceDiscovery:
    """Each GPU's latest health record (by window), and the nodes they make in or out of service."""

    def __init__(self) -> None:
        self._gpus: dict[str, _Latest] = {}

    def update(self, record: HealthRecord) -> set[str]:
        """Take a record; the nodes whose entry it changed (an older window than the GPU's latest changes
        nothing: records of one GPU may be read again, or out of order across sources)."""
        held = self._gpus.get(record.gpu_uuid)
        if held is not None and held.window_start_ns >= record.window_start_ns:
            return set()
        self._gpus[record.gpu_uuid] = _Latest(record.window_start_ns, record.node_id, record.breaker_state)
        touched = {record.node_id} | ({held.node_id} if held is not None else set())
        if held is not None and held.node_id == record.node_id and held.breaker_state == record.breaker_state:
            return set()
        return touched

    def entry(self, node_id: str) -> dict[str, Any]:
        """What the compacted topic holds for a node: whether it is in service, and why not."""
        gpus = {g: s.breaker_state for g, s in sorted(self._gpus.items()) if s.node_id == node_id}
        blocking = sorted(g for g, state in gpus.items() if state in OUT_OF_SERVICE)
        return {
            "node_id": node_id,
            "in_service": bool(gpus) and not blocking,
            "gpus": gpus,
            "blocking_gpus": blocking,
            "as_of_window_start_ns": max(
                (s.window_start_ns for s in self._gpus.values() if s.node_id == node_id), default=None
            ),
        }

    def nodes(self) -> list[str]:
        return sorted({s.node_id for s in self._gpus.values()})

    def in_service(self) -> list[str]:
        out_nodes = {s.node_id for s in self._gpus.values() if s.breaker_state in OUT_OF_SERVICE}
        return [n for n in self.nodes() if n not in out_nodes]

    def refused_targets(self) -> dict[str, str]:
        """The nodes in service whose name is no scrape target's host, each with ``target_problem``'s reason."""
        return {node: why for node in self.in_service() if (why := target_problem(node)) is not None}

    def file_sd(self, port: int, labels: dict[str, str] | None = None) -> list[dict[str, Any]]:
        """The nodes in service as Prometheus ``file_sd`` target groups: one per node, its target ``node:port``,
        labelled with the node and its GPU count, and ``labels``; a node ``refused_targets`` names is left out."""
        if not 0 < port < 65536:
            raise ValueError(f"the target port must be 1 to 65535, got {port}")
        extra = dict(labels or {})
        for name in extra:
            if not LABEL_NAME.fullmatch(name) or name.startswith("__"):
                raise ValueError(
                    f"{name!r} is not a Prometheus label name one may set: use letters, digits and "
                    "underscores, not starting with a digit or '__'"
                )
        refused = self.refused_targets()
        groups = []
        for node in self.in_service():
            if node in refused:
                continue
            gpus = sum(1 for s in self._gpus.values() if s.node_id == node)
            groups.append(
                {"targets": [_target(node, port)], "labels": {**extra, "gpucost_node": node, "gpucost_gpus": str(gpus)}}
            )
        return groups
