"""Service discovery from the health audit: which nodes are in service, from each GPU's latest record.

METRICS.md: a node is listed while none of its GPUs' latest breaker state is ``removed`` or
``probation``; it leaves the list with the first record that puts one of its GPUs there, and
returns with the record that brings the last of them out. Pure: records in, entries out; the
``gpucost discovery`` command writes them as a Prometheus ``file_sd`` file and a compacted topic.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from gpucost.schemas.records import HealthRecord

__all__ = ["OUT_OF_SERVICE", "LABEL_NAME", "ServiceDiscovery"]

#: the breaker states that take a GPU's node out of service discovery
OUT_OF_SERVICE = frozenset({"removed", "probation"})
#: a Prometheus label name (its data model); ``__`` names are Prometheus's own
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


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
        return {"node_id": node_id, "in_service": bool(gpus) and not blocking, "gpus": gpus,
                "blocking_gpus": blocking,
                "as_of_window_start_ns": max((s.window_start_ns for s in self._gpus.values() if s.node_id == node_id),
                                           default=None)}

    def nodes(self) -> list[str]:
        return sorted({s.node_id for s in self._gpus.values()})

    def in_service(self) -> list[str]:
        out_nodes = {s.node_id for s in self._gpus.values() if s.breaker_state in OUT_OF_SERVICE}
        return [n for n in self.nodes() if n not in out_nodes]

    def file_sd(self, port: int | None, labels: dict[str, str] | None = None) -> list[dict[str, Any]]:
        """The nodes in service as Prometheus ``file_sd`` target groups: one per node, its target the node
        (``node:port`` with a port), labelled with the node and its GPU count, and ``labels``."""
        extra = dict(labels or {})
        for name in extra:
            if not LABEL_NAME.fullmatch(name) or name.startswith("__"):
                raise ValueError(f"{name!r} is not a Prometheus label name one may set: use letters, digits and "
                                 "underscores, not starting with a digit or '__'")
        groups = []
        for node in self.in_service():
            gpus = sum(1 for s in self._gpus.values() if s.node_id == node)
            groups.append({"targets": [node if port is None else f"{node}:{port}"],
                           "labels": {**extra, "gpucost_node": node, "gpucost_gpus": str(gpus)}})
        return groups
