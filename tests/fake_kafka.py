"""Stand-ins for what the worker takes from aiokafka, to drive ``Worker._process`` without a broker."""
from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

__all__ = ["Message", "RecordingProducer"]


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
