"""An input key's batch of events as the values of the messages that carry it, in the encoding the producer
is set to (``KafkaSettings.event_encoding``): JSON Lines, or Arrow IPC (``gpucost.schemas.ipc``).

Each value is at most ``max_message_bytes``: the batch is cut, in order, where it would pass it. An event that
no message can hold comes back as its JSON line, for the producer to dead-letter (``oversized``) instead of
sending a message the broker refuses.

A batch of fewer than ``ARROW_MIN_EVENTS`` events goes as JSON Lines even where the producer is set to Arrow:
a live producer's message of a GPU's second is an event or two, and a worker spends about 40 µs more on such a
message as Arrow (reading its schema, then its rows one by one) than as two lines; from about 32 events up,
Arrow costs it less, and from 128, a third less a batch (``benchmarks/kafka_vs_raw.py`` and a one-off timing
of 2 to 128 events, 2026-12-06). Each message says its own encoding, so a worker reads the mix.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from gpucost.schemas.codec import encode_event
from gpucost.schemas.events import Event
from gpucost.schemas.ipc import encode_ipc
from gpucost.schemas.topics import ARROW_IPC, ENCODING_HEADER, encode_batch

__all__ = ["ARROW_HEADERS", "ARROW_MIN_EVENTS", "Oversized", "message_values", "split_batch"]

#: the header an Arrow IPC message carries (a JSON Lines message carries none)
ARROW_HEADERS = ((ENCODING_HEADER, ARROW_IPC),)
#: a smaller batch goes as JSON Lines, which a worker reads faster at that size
ARROW_MIN_EVENTS = 32
#: a message's value and its encoding's headers
Value = tuple[bytes, tuple[tuple[str, bytes], ...]]


class Oversized(str):
    """The JSON line of an event larger than one message may be."""


def message_values(events: Sequence[Event], encoding: str, max_bytes: int) -> Iterator[Value | Oversized]:
    """The values of the messages that carry ``events``, with their headers, in order, each at most ``max_bytes``;
    an event no message can hold as its ``Oversized`` line, in its place.

    An Arrow batch over ``max_bytes`` is halved, each half taken again by this rule (so a half under
    ``ARROW_MIN_EVENTS`` goes as JSON Lines), down to a single event, which goes as its JSON line: an Arrow
    message carries its schema beside its one row, so an event that fits a message as JSON may not as Arrow."""
    if encoding == "json" or len(events) < ARROW_MIN_EVENTS:
        for run in split_batch([encode_event(e) for e in events], max_bytes):
            if len(run) == 1 and len(run[0].encode()) > max_bytes:
                yield Oversized(run[0])
            else:
                yield encode_batch(run), ()
        return
    value = encode_ipc(events)
    if len(value) <= max_bytes:
        yield value, ARROW_HEADERS
        return
    half = len(events) // 2
    yield from message_values(events[:half], encoding, max_bytes)
    yield from message_values(events[half:], encoding, max_bytes)


def split_batch(lines: list[str], max_bytes: int) -> list[list[str]]:
    """``lines`` cut, in order, into runs whose JSON Lines text fits ``max_bytes`` (a line alone over
    it is a run of its own, for the caller to refuse)."""
    runs: list[list[str]] = []
    size = 0
    for line in lines:
        n = len(line.encode()) + 1
        if not runs or size + n > max_bytes + 1:
            runs.append([])
            size = 0
        runs[-1].append(line)
        size += n
    return runs
