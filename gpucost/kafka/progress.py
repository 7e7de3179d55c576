"""``gpucost produce``'s progress: a bar on a terminal, a line every ``interval_s`` elsewhere.

A replay of a month of events takes minutes, and a node's producer runs for ever: under systemd or in a
container log nothing said whether it was reading, sending, or waiting for an unreachable broker. The line
says all three (events read, messages acknowledged, messages waiting in the outbox); the last one is written
when the input ends, so even a short run says what it sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from typing import Any, TextIO

from gpucost.kafka.publish import ProducerStats

__all__ = ["ProduceProgress"]


class ProduceProgress:
    def __init__(self, stats: ProducerStats, interval_s: float, stream: TextIO | None = None) -> None:
        self.stats, self.interval_s = stats, interval_s
        self.stream = stream if stream is not None else sys.stderr
        self.started = time.monotonic()
        self._bar: Any = None
        if self.stream.isatty():
            from tqdm import tqdm

            self._bar = tqdm(unit=" events", unit_scale=True, file=self.stream, desc="produce", mininterval=0.5)
        self._shown = 0

    def line(self) -> str:
        stats, elapsed = self.stats, max(time.monotonic() - self.started, 1e-9)
        waiting = 0 if stats.outbox is None else len(stats.outbox)
        return (
            f"gpucost produce: {stats.events_read:,} events read ({stats.events_read / elapsed:,.0f}/s), "
            f"{sum(stats.sent.values()):,} messages acknowledged, {waiting:,} waiting"
            + ("; broker unreachable" if stats.outage_since is not None else "")
            + ("; input ended" if stats.input_ended else "")
        )

    def show(self) -> None:
        if self._bar is not None:
            self._bar.update(self.stats.events_read - self._shown)
            self._shown = self.stats.events_read
            waiting = 0 if self.stats.outbox is None else len(self.stats.outbox)
            self._bar.set_postfix(acked=sum(self.stats.sent.values()), waiting=waiting, refresh=False)
        else:
            print(self.line(), file=self.stream, flush=True)

    async def run(self, done: asyncio.Event) -> None:
        """Show every ``interval_s`` until ``done``; then once more, the final figures."""
        while not done.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), self.interval_s)
            if not done.is_set():
                self.show()
        self.show()
        if self._bar is not None:
            self._bar.close()
