"""One writer per output directory.

Two sinks on one directory would pick the same next file name and replace each other's files,
and a compaction must not swap a folder a sink is writing into. Each holds an exclusive
``flock`` on ``OUT/.lock`` while it runs; the kernel drops it when the process dies, so a
killed writer never leaves the directory locked.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from types import TracebackType

from gpucost.sinks.parquet import SinkWriteError

__all__ = ["LOCK", "OutputBusyError", "OutputLock"]

LOCK = ".lock"  # under the output directory


class OutputBusyError(RuntimeError):
    """Another process writes to the output directory."""


class OutputLock:
    def __init__(self, out_dir: Path, holder: str) -> None:
        self.path = out_dir / LOCK
        self.holder = holder  # what the lock file says while held, for the error another writer sees
        self._fd: int | None = None

    def __enter__(self) -> OutputLock:
        """Creates the output directory if need be (``SinkWriteError`` if it cannot), then takes the lock."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise SinkWriteError(f"cannot create the output directory {self.path.parent}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = os.read(fd, 200).decode("utf-8", "replace").strip() or "another process"
            os.close(fd)
            raise OutputBusyError(
                f"{self.path.parent} is being written by {other}; stop it first, or choose "
                "another output directory (one sink per directory: it compacts its own files)"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{self.holder} (pid {os.getpid()})".encode())
        self._fd = fd
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the lock
            self._fd = None
