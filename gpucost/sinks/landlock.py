"""A thread on which the kernel refuses every file write: where ``gpucost query`` runs an analyst's SQL.

DuckDB's own sandbox (``allowed_directories`` = the output directory, a locked configuration) keeps a
query's reads inside the output, but a write inside an allowed directory is allowed: a ``COPY … TO`` the
statement check (``statements``) failed to see would overwrite the Parquet and change every bill. So the
query also runs where no write can happen, whatever DuckDB is asked to do: a thread of its own,
restricted with Landlock (Linux 5.13 and later, unprivileged) to no file creation, write, truncation,
removal, rename or link, anywhere. The connection is opened on that thread, so the worker threads
DuckDB starts for it inherit the restriction; the rest of the process is not restricted, and the
thread ends with the query.

Chosen over the alternatives the issue names: a read-only copy of the output costs time and disk in
proportion to the output on every query (an output of months is gigabytes), and a read-only mount
needs privileges (or user namespaces, which many distributions turn off). Landlock costs a few system
calls per query and changes nothing DuckDB reads, so the views, ``read_parquet``/``glob`` inside the
output and the retry across a compaction's swap work as before.

Where the kernel has no Landlock (another OS, an older kernel, a seccomp profile that refuses it),
``without_writes`` raises ``WritesNotRefused`` rather than run unguarded: the output is then queried
with ``--unsafe`` or from a DuckDB of one's own over ``gpucost views``.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from collections.abc import Callable
from typing import TypeVar

__all__ = ["CREATE_RULESET", "WritesNotRefused", "landlock_abi", "without_writes"]

T = TypeVar("T")

# the system calls (one number on every Linux architecture but alpha) and access rights of linux/landlock.h
#: landlock_create_ruleset's number, read at each call: public so that a test can set it to one no kernel has
#: (-1: ENOSYS) and see a kernel without Landlock refuse the query, on a kernel that has it
CREATE_RULESET = 444
_RESTRICT_SELF = 446
_CREATE_RULESET_VERSION = 1
_PR_SET_NO_NEW_PRIVS = 38
_WRITE_FILE = 1 << 1
_REMOVE_AND_MAKE = sum(1 << bit for bit in range(4, 13))  # remove dir/file, make char/dir/reg/sock/fifo/block/sym
_REFER = 1 << 13  # ABI 2: rename and link across directories
_TRUNCATE = 1 << 14  # ABI 3: truncate(2) by path


class WritesNotRefused(OSError):
    """The kernel cannot be asked to refuse this thread's file writes."""


def landlock_abi() -> int:
    """The Landlock ABI version the kernel offers; ``WritesNotRefused`` where it offers none."""
    if not sys.platform.startswith("linux"):
        raise WritesNotRefused(
            f"this system ({sys.platform}) cannot refuse the query's file writes: that needs "
            "Landlock (Linux 5.13+); pass --unsafe to run it without that guard"
        )
    libc = ctypes.CDLL(None, use_errno=True)
    abi = libc.syscall(
        ctypes.c_long(CREATE_RULESET), None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION)
    )
    if abi < 1:
        raise WritesNotRefused(
            f"this kernel cannot refuse the query's file writes (Landlock: "
            f"{os.strerror(ctypes.get_errno())}); pass --unsafe to run it without that guard"
        )
    return int(abi)


def _refuse_writes(abi: int) -> None:
    """From now on, this thread and the threads it starts may not write, create, remove or rename a file."""
    libc = ctypes.CDLL(None, use_errno=True)
    handled = _WRITE_FILE | _REMOVE_AND_MAKE | (_REFER if abi >= 2 else 0) | (_TRUNCATE if abi >= 3 else 0)
    attr = ctypes.c_uint64(handled)  # struct landlock_ruleset_attr's first field, the one every ABI has
    fd = libc.syscall(ctypes.c_long(CREATE_RULESET), ctypes.byref(attr), ctypes.c_size_t(8), ctypes.c_uint32(0))
    if fd < 0:
        raise WritesNotRefused(f"Landlock refused a ruleset: {os.strerror(ctypes.get_errno())}")
    try:  # no rule is added: each right handled is refused beneath every path
        if (
            libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
            or libc.syscall(ctypes.c_long(_RESTRICT_SELF), fd, ctypes.c_uint32(0)) != 0
        ):
            raise WritesNotRefused(f"Landlock refused to restrict the query: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)


def without_writes(work: Callable[[], T]) -> T:
    """``work()``, run on a new thread whose file writes the kernel refuses (and those of the threads it
    starts: open DuckDB's connection inside ``work``). Its exception, if any, is raised here."""
    abi = landlock_abi()
    outcome: list[tuple[bool, object]] = []

    def run() -> None:
        try:
            _refuse_writes(abi)
            outcome.append((True, work()))
        except BaseException as exc:  # handed to the caller's thread, which raises it
            outcome.append((False, exc))

    thread = threading.Thread(target=run, name="gpucost-query-without-writes", daemon=True)
    thread.start()
    thread.join()
    done, value = outcome[0]
    if not done:
        raise value  # type: ignore[misc]
    return value  # type: ignore[return-value]
