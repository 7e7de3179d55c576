"""Stand-ins for what the worker and the sink take from aiokafka, to drive them without a broker."""
from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from aiokafka import TopicPartition

__all__ = ["Message", "RecordingProducer", "ScriptedConsumer"]


@dataclass
class Message:
    key: bytes
    value: bytes
    offset: int
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    topic: str = "t.events"
    partition: int = 3


class RecordingProducer:
    """A transactional producer that keeps what each transaction sent with ``send`` (the state
    records) and drops the output records' batches."""

    def __init__(self) -> None:
        self.transactions: list[list[tuple[str, bytes, bytes | None]]] = []  # (topic, key, value)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        self.transactions.append([])
        yield

    async def send(self, topic: str, value: bytes | None, key: bytes, partition: int) -> None:
        self.transactions[-1].append((topic, key, value))

    async def partitions_for(self, topic: str) -> set[int]:
        return {0}

    def create_batch(self) -> Any:
        return SimpleNamespace(append=lambda **record: True)

    async def send_batch(self, batch: Any, topic: str, partition: int) -> None:
        pass

    async def send_offsets_to_transaction(self, offsets: Any, group: str) -> None:
        pass


class ScriptedConsumer:
    """A consumer that hands out ``polls`` one per ``getmany``, then nothing, and sets ``done``.
    Built by the code under test with aiokafka's signature, so a test sets the class attributes first."""

    polls: list[dict[TopicPartition, list[Message]]] = []
    done: Any = None  # the asyncio.Event the code under test stops on

    def __init__(self, *topics: str, **options: Any) -> None:
        self._polls = iter(type(self).polls)

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
        return poll

    async def commit(self) -> None:
        pass
