"""One webhook POST that neither a hostile receiver nor an unlucky network can redirect, stall or bloat.

Why not urllib: its default opener follows a 301, 302 or 303 answer to a POST as a GET without
the body, to whatever host the ``Location`` names, with the request's headers; and its one
timeout bounds each socket operation, not the attempt, so a receiver that sends a byte a second
holds it for ever, and ``read()`` takes a body of any size into memory. Here an attempt is one
connection to the configured origin, bounded by a connect, a read (each wait for bytes) and a
total timeout, and the answer is read up to the end of its head (status line and headers), at
most ``max_response_bytes`` of it: the status decides, the body is never read. A redirect is an
answer like any other that is not 2xx: it is never followed, so nothing is ever sent elsewhere.
"""

from __future__ import annotations

import asyncio
import re
import ssl
import urllib.parse
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["REDIRECTS", "Answer", "WebhookSettings", "post", "url_problem"]

#: the answers that would send a client elsewhere: each a failed attempt here, never followed
REDIRECTS = frozenset({301, 302, 303, 307, 308})
_STATUS_LINE = re.compile(rb"HTTP/1\.[01] ([1-9][0-9]{2})(?: [^\r\n]*)?(?:\r\n|$)")
_LOCATION = re.compile(rb"\r\nlocation:[ \t]*([^\r\n]*)", re.IGNORECASE)
_HEADER_VALUE = re.compile(r"[\x21-\x7e]+(?:[ \t]+[\x21-\x7e]+)*")  # visible ASCII: no CR, LF or NUL to inject


@dataclass(frozen=True)
class WebhookSettings:
    """How long and how much one delivery may take: each field a ``gpucost reclaim`` flag (``--read-timeout-s``)
    that falls back to ``GPUCOST_RECLAIM_<FIELD>``; ``help`` says what it bounds."""

    connect_timeout_s: float = field(default=5.0, metadata={"help": "seconds to open a connection (TLS included)"})
    read_timeout_s: float = field(
        default=10.0, metadata={"help": "seconds an attempt waits for the answer's next bytes"}
    )
    total_timeout_s: float = field(
        default=30.0, metadata={"help": "seconds an attempt takes at most, however the answer trickles in"}
    )
    max_response_bytes: int = field(
        default=65_536,
        metadata={"help": "bytes of an answer read at most: its status line and headers must end within them"},
    )
    max_attempts: int = field(
        default=20,
        metadata={
            "help": "attempts per trigger, then it is recorded as failed (about 7 minutes with the default back-off)"
        },
    )
    backoff_s: float = field(
        default=0.5, metadata={"help": "seconds to wait after the first failed attempt, doubling after each"}
    )
    max_backoff_s: float = field(default=30.0, metadata={"help": "seconds to wait between attempts at most"})

    def __post_init__(self) -> None:
        for name in ("connect_timeout_s", "read_timeout_s", "total_timeout_s", "backoff_s", "max_backoff_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be more than 0, got {getattr(self, name)}")
        if self.max_response_bytes < 64 or self.max_attempts < 1:
            raise ValueError(
                f"max_response_bytes must be at least 64 and max_attempts at least 1, got "
                f"{self.max_response_bytes} and {self.max_attempts}"
            )


@dataclass(frozen=True)
class Answer:
    """An attempt's outcome: the status (None: no complete answer), why in words, and the bytes read of it."""

    status: int | None
    why: str
    bytes_read: int


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be a webhook (None: it can): http or https, a host, no credentials (they would be
    logged), no fragment."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"not a URL: {exc}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "expected http://HOST[:PORT]/PATH or https://…"
    if parts.username is not None or parts.password is not None:
        return "credentials in the URL are sent nowhere and would be logged: remove USER:PASSWORD@"
    if parts.fragment:
        return "a URL fragment (#…) means nothing to a receiver: remove it"
    return None if port is None or 0 < port < 65536 else f"port {port} out of range"


class _Failed(Exception):
    """An attempt that got no complete answer, and why."""


async def post(url: str, body: bytes, headers: Mapping[str, str], settings: WebhookSettings) -> Answer:
    """POST ``body`` to ``url`` (which ``url_problem`` accepts) once, within ``settings``' bounds. Raises
    ``ValueError`` for a header value that could not be sent as one line (a retry would not help)."""
    if bad := [name for name, value in headers.items() if not _HEADER_VALUE.fullmatch(value)]:
        raise ValueError(f"the {bad[0]} header's value is not visible ASCII on one line")
    exchange = _Exchange(url, settings)
    try:
        async with asyncio.timeout(settings.total_timeout_s):
            status, why = await exchange.run(body, headers)
    except TimeoutError:
        return Answer(
            None, f"no complete answer within the total timeout ({settings.total_timeout_s:g} s)", exchange.read
        )
    except _Failed as exc:
        return Answer(None, str(exc), exchange.read)
    return Answer(status, why, exchange.read)


class _Exchange:
    """One connection's request and answer head, counting the bytes read (``read``)."""

    def __init__(self, url: str, settings: WebhookSettings) -> None:
        self.parts = urllib.parse.urlsplit(url)
        self.settings = settings
        self.read = 0

    async def run(self, body: bytes, headers: Mapping[str, str]) -> tuple[int, str]:
        parts, s = self.parts, self.settings
        tls = ssl.create_default_context() if parts.scheme == "https" else None
        try:
            async with asyncio.timeout(s.connect_timeout_s) as connecting:
                reader, writer = await asyncio.open_connection(
                    parts.hostname, parts.port or (443 if tls else 80), ssl=tls, limit=s.max_response_bytes
                )
        except TimeoutError:
            if not connecting.expired():
                raise  # the total timeout's
            raise _Failed(f"no connection within the connect timeout ({s.connect_timeout_s:g} s)") from None
        except OSError as exc:
            raise _Failed(f"no connection: {exc}") from None
        try:
            target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            lines = [
                f"POST {target} HTTP/1.1",
                f"Host: {parts.netloc}",
                f"Content-Length: {len(body)}",
                "Connection: close",
                "User-Agent: gpucost",
                *(f"{k}: {v}" for k, v in headers.items()),
            ]
            writer.write("\r\n".join(lines).encode("ascii") + b"\r\n\r\n" + body)
            await self._within_read_timeout(writer.drain())
            return await self._head(reader)
        except OSError as exc:
            raise _Failed(f"the connection failed: {exc}") from None
        finally:
            writer.transport.abort()  # what is left of the answer is dropped unread

    async def _head(self, reader: asyncio.StreamReader) -> tuple[int, str]:
        """The final answer's status and a line saying it, past any interim (1xx) answers."""
        cap, buf, searched = self.settings.max_response_bytes, bytearray(), 0
        while True:
            end = buf.find(b"\r\n\r\n", max(0, searched - 3))
            if end < 0:
                searched = len(buf)
                if self.read >= cap:
                    raise _Failed(f"no complete answer head within the response cap ({cap:,} bytes); stopped reading")
                chunk = await self._within_read_timeout(reader.read(cap - self.read))
                if not chunk:
                    raise _Failed("the connection closed before a complete answer")
                self.read += len(chunk)
                buf += chunk
                continue
            head = bytes(buf[: end + 2])
            match = _STATUS_LINE.match(head)
            if match is None:
                raise _Failed(f"not an HTTP/1.x answer: {head[:80]!r}")
            status = int(match[1])
            if status >= 200:
                return status, self._said(status, head)
            del buf[: end + 4]  # an interim answer (100 Continue, 103 Early Hints): the final one follows
            searched = 0

    @staticmethod
    def _said(status: int, head: bytes) -> str:
        line = head.split(b"\r\n", 1)[0].decode("ascii", "backslashreplace")
        location = _LOCATION.search(head)
        if status in REDIRECTS and location is not None:
            return f"{line}, a redirect to {location[1][:200].decode('ascii', 'backslashreplace')!r}: not followed"
        return line

    async def _within_read_timeout(self, waiting: Awaitable[Any]) -> Any:
        """``waiting``'s result, or ``_Failed`` after the read timeout. Not ``asyncio.wait_for``: on Python 3.11
        it can swallow the total timeout's cancellation when bytes arrive at that moment, and read on."""
        try:
            async with asyncio.timeout(self.settings.read_timeout_s) as reading:
                return await waiting
        except TimeoutError:
            if not reading.expired():
                raise  # the total timeout's
            raise _Failed(f"nothing moved within the read timeout ({self.settings.read_timeout_s:g} s)") from None
