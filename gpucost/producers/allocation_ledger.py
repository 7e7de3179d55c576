"""What an allocation source (the kubelet's, Slurm's) has sent of a node's holds and not yet ended, and the diff of
a poll against it: a hold first listed starts, a hold sent and no longer listed ends (docs/sources.md).

Why a ledger of the holds sent (``ledger_dir``, the state folder by default): a hold that ends while the producer
is down is listed neither before nor after the restart, so without a record of what was sent its end would never be
sent and the allocation basis would bill it on and on. The open holds are written after every poll that changes
them, per node; a restarted source reads them back and ends, at its first answered poll, those no longer listed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Generic, TypeVar

from gpucost.schemas.events import GPU_KEYED, Allocation, Event

__all__ = ["Holds", "polled_among"]

log = logging.getLogger("gpucost.allocations")

K = TypeVar("K", bound=tuple[str, ...])


class Holds(Generic[K]):
    """The holds a source sent and did not end (``open``), those it counted once as not billable (``refused``, not
    counted again at every poll), and their ledger: ``<name>.<node>-<hash>.json`` in ``ledger_dir``, its counts
    ``<count>_ledger_unreadable`` and ``<count>_ledger_unwritable``, an end ``<count>_ended``. ``key`` makes a hold's
    key back from the list the ledger holds it as (a ``NamedTuple``'s fields, in order)."""

    def __init__(
        self, name: str, count: str, key: Callable[..., K], counts: Counter[str], ledger_dir: Path | None
    ) -> None:
        self.name, self.count, self.key, self.counts = name, count, key, counts
        self.ledger_dir = ledger_dir  # None: nothing outlives this source (a restart cannot end a hold gone meanwhile)
        self.open: dict[K, Allocation] = {}
        self.refused: set[K] = set()
        self._loaded: set[str] = set()  # the nodes whose ledger was read

    def poll(
        self,
        node_id: str,
        ts_ns: int,
        held: set[K],
        start: Callable[[K], Allocation | None],
        ended_at: Callable[[K], int | None] = lambda _: None,
    ) -> list[Allocation]:
        """The holds in ``held`` first listed now, as ``start`` makes them (None: not now, or refused: ``start`` adds
        it to ``refused`` itself), then those sent and no longer listed, ended at ``ended_at`` (None: ``ts_ns``, the
        poll's time); the ledger written if any changed. A source that got no answer does not call this."""
        self.load(node_id)
        out = []
        for k in sorted(held - self.open.keys() - self.refused):
            started = start(k)
            if started is not None:
                self.open[k] = started
                out.append(started)
        for k in sorted(self.open.keys() - held):
            begun = self.open.pop(k)
            end = ended_at(k)
            end = ts_ns if end is None else end
            out.append(begun.model_copy(update={"end_ts_ns": max(end, begun.ts_ns + 1)}))
            self.counts[f"{self.count}_ended"] += 1
        self.refused &= held
        if out:
            self.save(node_id)
        return out

    def _ledger(self, node_id: str) -> Path | None:
        if self.ledger_dir is None:
            return None
        name = re.sub(r"[^A-Za-z0-9._-]", "_", node_id)[:64] + "-" + hashlib.sha256(node_id.encode()).hexdigest()[:8]
        return self.ledger_dir / f"{self.name}.{name}.json"

    def load(self, node_id: str) -> None:
        """The node's holds a run before this one sent and did not end, once: they end at the first answered poll
        that no longer lists them. An unreadable ledger is counted and said, and the source starts without it."""
        path = self._ledger(node_id)
        if path is None or node_id in self._loaded:
            return
        self._loaded.add(node_id)
        try:
            entries = json.loads(path.read_text()) if path.exists() else []
            loaded = {
                self.key(*e["held"]): Allocation.model_validate_json(json.dumps(e["allocation"])) for e in entries
            }
        except (OSError, ValueError, TypeError, KeyError) as exc:
            self.counts[f"{self.count}_ledger_unreadable"] += 1
            log.warning("cannot read the holds sent before (%s: %s); holds ended meanwhile stay open", path, exc)
            return
        self.open.update(loaded)

    def save(self, node_id: str) -> None:
        """The node's open holds, written whole (a temporary file renamed over the last)."""
        path = self._ledger(node_id)
        if path is None:
            return
        entries = [{"held": list(k), "allocation": a.to_wire()} for k, a in sorted(self.open.items())]
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(entries))
            os.replace(tmp, path)
        except OSError as exc:
            if not self.counts[f"{self.count}_ledger_unwritable"]:
                log.warning(
                    "cannot write the holds sent (%s: %s); a restart will not end those gone meanwhile", path, exc
                )
            self.counts[f"{self.count}_ledger_unwritable"] += 1


def polled_among(
    events: Iterable[Event], refresh_ns: int, poll: Callable[[str, int], list[Allocation]]
) -> Iterator[Event]:
    """``events``, with the allocations of a ``poll`` ahead of the first GPU event at least ``refresh_ns`` after the
    last poll (event time: the live source's clock), its node the event's."""
    polled_at: int | None = None
    for event in events:
        if isinstance(event, GPU_KEYED) and (polled_at is None or event.ts_ns - polled_at >= refresh_ns):
            polled_at = event.ts_ns
            yield from poll(event.node_id, event.ts_ns)
        yield event
