"""Progress of a long command: a bar on a terminal, a line a minute anywhere else.

Why both: off a terminal (systemd, a container's log) a run printed nothing at all for as long as it ran, so
nobody could tell a quiet node from a dead pipeline. There it writes one line every ``every_s`` (and one at
the end): plain ``key=value`` words by default, one JSON object a line with ``--log-format json`` (env
``GPUCOST_LOG_FORMAT``), for log pipelines that parse it.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

__all__ = ["LOG_FORMATS", "Progress"]

LOG_FORMATS = ("text", "json")


class Progress:
    """``update(n)`` as work is done; ``facts()`` says what to report beside the count (records written, dead
    letters…). A context manager: leaving it closes the bar, or writes the last line."""

    def __init__(
        self,
        command: str,
        unit: str,
        total: int | None = None,
        facts: Callable[[], dict[str, Any]] = dict,
        log_format: str = "text",
        every_s: float = 60.0,
        stream: TextIO | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.command, self.unit, self.total, self.facts = command, unit.strip(), total, facts
        self.log_format, self.every_s = log_format, every_s
        self.stream = stream if stream is not None else sys.stderr
        self.monotonic, self.clock = monotonic, clock
        self.done = 0
        self.started = self.last = monotonic()
        self.bar: Any = None
        if self.stream.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit=f" {self.unit}", unit_scale=True, desc=command, file=self.stream)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        if self.bar is not None:
            self.bar.close()
        elif exc_type is None:  # a command that failed says why instead
            self.line(final=True)

    def update(self, n: int) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
        elif self.monotonic() - self.last >= self.every_s:
            self.line()

    def line(self, final: bool = False) -> None:
        """One progress line: when, what, how far, how fast, and the facts."""
        now = self.monotonic()
        self.last = now
        elapsed = now - self.started
        fields: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.clock())),
            "command": self.command,
            "state": "done" if final else "running",
            self.unit: self.done,
            **({"of": self.total} if self.total is not None else {}),
            "per_s": round(self.done / elapsed, 1) if elapsed > 0 else 0.0,
            "elapsed_s": round(elapsed, 1),
            **self.facts(),
        }
        if self.log_format == "json":
            text = json.dumps(fields, separators=(",", ":"))
        else:
            text = "gpucost: " + " ".join(f"{k}={v}" for k, v in fields.items())
        print(text, file=self.stream, flush=True)
