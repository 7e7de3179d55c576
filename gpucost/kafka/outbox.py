"""A producer's outbox: messages wait here, in order, until the broker has acknowledged them.

Memory holds up to ``max_bytes`` of messages; past that, new messages are appended to a
spool file (with a warning), and once anything is spooled every later message is too, so
the order per key never changes. A spool left by a producer that died is sent first when
the next one starts, and a producer stopped with messages still waiting writes them all to
the spool (``close``). A message re-sent after an unanswered attempt may reach the broker
twice; the workers dead-letter the second copy as a duplicate, so nothing is billed twice.
"""

from __future__ import annotations

import base64
import json
import logging
import os
from collections import deque
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Message", "Outbox"]

log = logging.getLogger("gpucost.kafka.outbox")


@dataclass(frozen=True)
class Message:
    topic: str
    key: bytes
    value: bytes
    headers: tuple[tuple[str, bytes], ...] = ()

    @property
    def size(self) -> int:
        return len(self.key) + len(self.value) + sum(len(n) + len(v) for n, v in self.headers) + 64

    def to_line(self) -> bytes:
        b64 = lambda b: base64.b64encode(b).decode()  # noqa: E731
        return (
            json.dumps(
                {"t": self.topic, "k": b64(self.key), "v": b64(self.value), "h": [[n, b64(v)] for n, v in self.headers]}
            ).encode()
            + b"\n"
        )

    @classmethod
    def from_line(cls, line: bytes) -> Message:
        obj = json.loads(line)
        return cls(
            obj["t"],
            base64.b64decode(obj["k"]),
            base64.b64decode(obj["v"]),
            tuple((n, base64.b64decode(v)) for n, v in obj["h"]),
        )


class Outbox:
    """FIFO of unacknowledged messages: memory first, then the spool file."""

    def __init__(self, spool: Path, max_bytes: int) -> None:
        self.spool, self.max_bytes = spool, max_bytes
        self._memory: deque[tuple[Message, bool]] = deque()  # (message, read from the spool)
        self._memory_bytes = 0
        self._spooled = 0  # messages in the spool file not yet moved to memory
        self._read_at = 0  # byte offset of the first of them
        self._spool_unacked = 0  # messages read from the spool, in memory, not yet acknowledged
        self.spilled_total = 0
        self._warned = False
        if spool.exists() and spool.stat().st_size:
            self._spooled = sum(1 for line in spool.open("rb") if line.strip())
            log.warning(
                "resuming %d message(s) spooled in %s by an earlier run; they are sent first", self._spooled, spool
            )

    def __len__(self) -> int:
        return len(self._memory) + self._spooled

    @property
    def memory_bytes(self) -> int:
        return self._memory_bytes

    def memory_only(self) -> list[Message]:
        """The waiting messages held only in this process, oldest first: appended while memory had room, so never
        written to the spool, and lost if the process dies now (those read back from the spool are still in it
        until acknowledged; a producer stopped in order spools them all, ``close``). Public because that is the
        outbox's promise to a caller: what a crash costs at this moment, and no more."""
        return [message for message, from_spool in self._memory if not from_spool]

    def append(self, message: Message) -> None:
        if self._spooled == 0 and self._memory_bytes + message.size <= self.max_bytes:
            self._memory.append((message, False))
            self._memory_bytes += message.size
            return
        if not self._warned:
            log.warning(
                "broker not keeping up: %d bytes buffered in memory (bound %d); spilling to %s until it catches up",
                self._memory_bytes,
                self.max_bytes,
                self.spool,
            )
            self._warned = True
        with self.spool.open("ab") as fh:
            fh.write(message.to_line())
            fh.flush()
            os.fsync(fh.fileno())
        self._spooled += 1
        self.spilled_total += 1

    def head(self, n: int) -> list[Message]:
        """The oldest ``n`` messages (fewer if there are not as many), without removing them."""
        self._refill()
        return [self._memory[i][0] for i in range(min(n, len(self._memory)))]

    def pop(self, n: int) -> None:
        """Remove the ``n`` oldest messages: the broker has acknowledged them."""
        for _ in range(n):
            message, from_spool = self._memory.popleft()
            self._memory_bytes -= message.size
            self._spool_unacked -= from_spool
        self._refill()
        if self._spooled == 0 and self._spool_unacked == 0 and self._read_at:
            # only now: until every spooled message is acknowledged, a crash must find them on disk
            self.spool.unlink(missing_ok=True)
            self._read_at, self._warned = 0, False
            log.warning("spool %s drained: the broker has caught up", self.spool)

    def _refill(self) -> None:
        """Move spooled messages into memory, oldest first, while there is room."""
        if self._spooled == 0 or (self._memory and self._memory_bytes >= self.max_bytes // 2):
            return
        with self.spool.open("rb") as fh:
            fh.seek(self._read_at)
            while self._spooled and (not self._memory or self._memory_bytes < self.max_bytes):
                line = fh.readline()
                if not line:
                    break
                self._read_at += len(line)
                if line.strip():
                    message = Message.from_line(line)
                    self._memory.append((message, True))
                    self._memory_bytes += message.size
                    self._spooled -= 1
                    self._spool_unacked += 1

    def close(self) -> int:
        """Keep every unacknowledged message in the spool, oldest first, for the next run; returns how many."""
        if not len(self):
            return 0
        tmp = self.spool.with_name(self.spool.name + ".tmp")
        with tmp.open("wb") as out:
            for message, _ in self._memory:
                out.write(message.to_line())
            if self._spooled and self.spool.exists():
                with self.spool.open("rb") as rest:
                    rest.seek(self._read_at)
                    out.write(rest.read())
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self.spool)
        return len(self)
