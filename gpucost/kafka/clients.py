"""Starting and stopping aiokafka's clients (consumers, producers, the admin client) so that none is left open.

A client whose ``start()`` raised (no broker at the address, a refused TLS handshake) still holds what it opened
and warns "Unclosed AIOKafkaConsumer" at exit unless it is stopped: every command that met no broker printed that
after its own clean error. ``start`` stops (or, for the admin client, closes) such a client before the error goes
on; ``stop_quietly`` stops one where the broker may be away, bounded in time.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from aiokafka.errors import KafkaError

__all__ = ["start", "stop_quietly"]


async def start(client: Any) -> None:
    """``client.start()``; if it raises, the client is stopped first, then the error goes on."""
    try:
        await client.start()
    except BaseException:
        await stop_quietly(client)
        raise


async def stop_quietly(client: Any) -> None:
    """Stop (the admin client: close) ``client``, within 5 s, whatever the broker answers: where it may be away,
    what a producer had not sent is still in its outbox, and an error here would hide the one that led here."""
    end = client.close if hasattr(client, "close") and not hasattr(client, "stop") else client.stop
    with contextlib.suppress(KafkaError, TimeoutError, OSError):
        await asyncio.wait_for(end(), timeout=5)
