"""Closed markers: the workers tell billing consumers up to when a bill is final.

A late event revises a pane whose end is at most the revision horizon ``R`` before its GPU's watermark
(docs/definitions.md, "Late data become revisions"); further back it is a dead letter. So once every GPU
of an input partition has a watermark ``W`` with ``pane_end ≤ W − R − 1``, every record of that pane
(cost, idle_index, quota, reclaim, efficiency, and the health window it ends) is published and nothing
can revise it. With each transaction that moves that point past an hour boundary, the partition's worker
writes one marker to every partition of the cost topic, in the same transaction and after the
transaction's records: a ``read_committed`` consumer that reads a marker on a cost partition has read
every record before it there. Markers are messages with the header ``gpucost-control: closed`` and a JSON
value (``Marker``); a consumer takes, per cost partition, the latest marker of each input partition, and
the smallest ``final_through_ns`` over all of them is the time up to which its bill is final.

Hours, not panes: a marker per pane would be 60 an hour per partition pair, for a figure a month's close
needs to the day. Markers are not kept in the state: an owner new to a partition writes one at its first
transaction, saying again what is true.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from typing import Any

from aiokafka import AIOKafkaProducer

from gpucost.kafka.signing import Signer
from gpucost.schemas.topics import CLOSED, CONTROL_HEADER
from gpucost.streams.audit import Auditor

__all__ = ["CLOSED_PERIOD_NS", "final_through_ns", "is_control", "marker_value", "moved_on", "send_markers"]

#: markers name whole hours of event time (UTC): a month, a day end on one
CLOSED_PERIOD_NS = 3_600_000_000_000


def final_through_ns(auditors: Iterable[Auditor], horizon_ns: int) -> int | None:
    """The last hour boundary ``T`` such that every pane ending at or before ``T`` of these keys' GPUs is final:
    ``T ≤ W − R − 1`` for the smallest GPU watermark ``W`` (None: no GPU yet). A GPU gone silent holds it back
    at its last pane's end until it is forgotten, since it could still come back with late data."""
    marks = [w for a in auditors if (w := a.smallest_watermark()) is not None]
    if not marks:
        return None
    return (min(marks) - horizon_ns - 1) // CLOSED_PERIOD_NS * CLOSED_PERIOD_NS


def moved_on(auditors: Iterable[Auditor], horizon_ns: int, last: int | None) -> int | None:
    """The ``final_through_ns`` a marker should now say, if it moved on from ``last`` (the last one committed:
    None at an owner's first transaction); otherwise None."""
    final = final_through_ns(auditors, horizon_ns)
    return final if final is not None and (last is None or final > last) else None


def marker_value(input_topic: str, input_partition: int, final_ns: int, horizon_ns: int) -> bytes:
    """A marker's JSON: which input partition speaks, and up to when its records are final."""
    return json.dumps(
        {
            "kind": "closed",
            "input_topic": input_topic,
            "input_partition": input_partition,
            "final_through_ns": final_ns,
            "revision_horizon_s": horizon_ns // 1_000_000_000,
        },
        separators=(",", ":"),
    ).encode()


def is_control(headers: Iterable[tuple[str, bytes | None]] | None) -> bool:
    """Whether a message of an output topic is a control message (a closed marker), not a record."""
    return any(name == CONTROL_HEADER for name, _ in headers or ())


async def send_markers(
    producer: AIOKafkaProducer,
    cost_topic: str,
    input_topic: str,
    input_partition: int,
    final_ns: int,
    horizon_ns: int,
    signer: Signer | None,
) -> list[asyncio.Future[Any]]:
    """The marker to every partition of the cost topic, inside the caller's transaction; signed like records,
    the control header covered, so that no record can be made into a marker."""
    key = f"closed/{input_topic}/{input_partition}".encode()
    value = marker_value(input_topic, input_partition, final_ns, horizon_ns)
    headers = [(CONTROL_HEADER, CLOSED)]
    if signer is not None:
        headers += signer.headers(key, value, {CONTROL_HEADER: CLOSED})
    sent = []
    for partition in sorted(await producer.partitions_for(cost_topic)):
        batch = producer.create_batch()  # as the records go: one marker, alone in its batch
        batch.append(key=key, value=value, timestamp=None, headers=headers)
        sent.append(await producer.send_batch(batch, cost_topic, partition=partition))
    return sent
