"""The files a command writes (a settings snippet, a report, a snapshot, a file_sd list): whole or not at all.

Each is written to a temporary file beside it (the same folder, so that the rename never crosses file
systems), flushed to disk and renamed over the target: a reader, or a command stopped half-way, sees the
old file or the new one, never a part of one, and a failure removes the temporary file. What a user can
put right (a folder that does not exist, a directory where the file should be, no permission, a full
disk) is one ``UsageError`` naming the flag, the path, the problem and what to do, checked before a
command's work where it can be (``check_writable``), so that a long fit does not end in it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path

from gpucost.sinks.parquet import fsync_dir
from gpucost.wiring import UsageError

__all__ = ["check_writable", "made_folder", "write_whole"]


def check_writable(path: Path, flag: str) -> None:
    """A usage error unless a file can be written at ``path`` (the argument of ``flag``): a folder that exists,
    where this process may make a file."""
    where = path.parent
    if path.is_dir():
        raise UsageError(f"{flag} {path} is a directory; give the path of a file to write, such as {path / 'out'}")
    if not where.exists():
        raise UsageError(
            f"{flag} {path}: the folder {where} does not exist; create it (mkdir -p {where}) or choose another path"
        )
    if not where.is_dir():
        raise UsageError(f"{flag} {path}: {where} is a file, not a folder; choose a path in a folder")
    tmp = _beside(path)
    try:  # the one sure test of a folder's permissions, read-only mounts and the like: making a file there
        tmp.open("w").close()
    except OSError as exc:
        raise UsageError(_cannot(path, flag, exc)) from None
    tmp.unlink()


def made_folder(path: Path, flag: str) -> None:
    """``path`` as a folder to write files in, made if missing, or a usage error saying why it cannot be."""
    if path.exists() and not path.is_dir():
        raise UsageError(f"{flag} {path} is a file, not a folder; choose a folder for the files")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(
            f"{flag} {path}: cannot make this folder ({exc.strerror}); choose a folder you may write in"
        ) from None


def write_whole(path: Path, content: str | bytes | Callable[[Path], None], flag: str) -> None:
    """``content`` (text as UTF-8, bytes, or a function that writes the file at the path it is given) into
    ``path``, replacing it whole; a usage error, and no file left beside it, when that cannot be done. A link to a
    file replaces the file it points to, the link kept; a path that is neither a file nor a link to one (a device
    such as ``/dev/stdout``, a named pipe) is written through, as it is: renaming a file over it would replace the
    device or the link with a plain file."""
    if not path.is_dir() and (path.is_symlink() or (path.exists() and not path.is_file())):
        target = path.resolve()
        if not target.is_file():
            _write_through(path, content, flag)
            return
        path = target
    check_writable(path, flag)
    tmp = _beside(path)
    try:
        if callable(content):
            content(tmp)
        else:
            tmp.write_bytes(content.encode() if isinstance(content, str) else content)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except OSError as exc:
        raise UsageError(_cannot(path, flag, exc)) from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()  # nothing left of a failed write (after the rename there is nothing to remove)


def _write_through(path: Path, content: str | bytes | Callable[[Path], None], flag: str) -> None:
    try:
        if callable(content):
            content(path)
        else:
            with path.open("wb") as fh:
                fh.write(content.encode() if isinstance(content, str) else content)
    except OSError as exc:
        raise UsageError(_cannot(path, flag, exc)) from None


def _beside(path: Path) -> Path:
    """The temporary file ``path`` is written to: hidden, in its folder, of this process."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def _cannot(path: Path, flag: str, exc: OSError) -> str:
    return f"{flag} {path}: cannot write it ({exc.strerror or exc}); choose a path you may write, on a disk with room"
