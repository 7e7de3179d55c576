"""Stand-ins for what the worker and the sink take from aiokafka, to drive them without a broker."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from aiokafka import TopicPartition
from aiokafka.errors import MessageSizeTooLargeError

__all__ = ["Message", "RecordingProducer", "ScriptedConsumer"]


@dataclass
class Message:
    key: bytes
    value: bytes
    offset: int
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    topic: str = "t.events"
    partition: int = 3


def _delivered(error: BaseException | None = None, offset: int = 0) -> asyncio.Future[Any]:
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    if error is None:
        future.set_result(SimpleNamespace(offset=offset))  # the record's metadata, as aiokafka's
    else:
        future.set_exception(error)
    return future


class RecordingProducer:
    """A transactional producer that keeps what each committed transaction sent with ``send`` (the
    state records) and drops the output records' batches. Like a broker, it refuses a record over
    ``max_message_bytes``: the delivery's future fails, as aiokafka's does."""

    def __init__(self, max_message_bytes: int = 1 << 20) -> None:
        self.transactions: list[list[tuple[str, bytes, bytes | None]]] = []  # (topic, key, value)
        #: what each batch of output records held, as the messages a consumer of its topic reads
        self.published: list[Message] = []
        self.aborted = 0
        self.max_message_bytes = max_message_bytes
        self.offset = -1  # of the last record sent with ``send``, as the broker numbers a partition's records

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        self.transactions.append([])
        try:
            yield
        except BaseException:
            self.transactions.pop()
            self.aborted += 1
            raise

    async def send(self, topic: str, value: bytes | None, key: bytes, partition: int) -> asyncio.Future[Any]:
        if value is not None and len(value) + len(key) > self.max_message_bytes:
            return _delivered(MessageSizeTooLargeError(f"{len(value):,} bytes"))
        self.transactions[-1].append((topic, key, value))
        self.offset += 1
        return _delivered(offset=self.offset)

    async def partitions_for(self, topic: str) -> set[int]:
        return {0}

    def create_batch(self) -> Any:
        records: list[dict[str, Any]] = []
        return SimpleNamespace(records=records, append=lambda **record: records.append(record) or True)

    async def send_batch(self, batch: Any, topic: str, partition: int) -> asyncio.Future[Any]:
        for r in batch.records:
            self.published.append(
                Message(r["key"], r["value"], len(self.published), list(r.get("headers", ())), topic, partition)
            )
        return _delivered()

    async def send_offsets_to_transaction(self, offsets: Any, group: str) -> None:
        pass


class ScriptedConsumer:
    """A consumer that hands out ``polls`` one per ``getmany``, then nothing, and sets ``done``.
    Built by the code under test with aiokafka's signature, so a test sets the class attributes first."""

    polls: list[dict[TopicPartition, list[Message]]] = []
    done: Any = None  # the asyncio.Event the code under test stops on

    def __init__(self, *topics: str, **options: Any) -> None:
        self._polls = iter(type(self).polls)
        self._next: dict[TopicPartition, int] = {}  # what ``position`` answers: after the last message handed out

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    def assignment(self) -> set[TopicPartition]:
        return {tp for poll in type(self).polls for tp in poll}

    async def getmany(self, timeout_ms: int = 0, max_records: int | None = None) -> dict[TopicPartition, list[Message]]:
        poll = next(self._polls, None)
        if poll is None:
            type(self).done.set()
            return {}
        for tp, messages in poll.items():
            if messages:
                self._next[tp] = messages[-1].offset + 1
        return poll

    async def position(self, tp: TopicPartition) -> int:
        return self._next.get(tp, 0)

    async def commit(self) -> None:
        pass
