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
import re
from collections.abc import Callable
from pathlib import Path

from gpucost.sinks.parquet import fsync_dir
from gpucost.wiring import UsageError

__all__ = ["check_writable", "destination", "made_folder", "write_whole"]


def check_writable(path: Path, flag: str) -> None:
    """A usage error unless a file can be written at ``path`` (the argument of ``flag``): a folder that exists,
    where this process may make a file; through a link, the file it leads to; a device or pipe, one it may write
    (``destination``)."""
    target = destination(path, flag)
    if target is None:
        if not os.access(path, os.W_OK):
            raise UsageError(f"{flag} {path}: this process may not write it; choose a path you may write")
        return
    path = target
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
    ``path``, replacing it whole; a usage error, and no file left beside it, when that cannot be done. Through a
    link, the file it leads to is replaced (the link kept); a device or named pipe is written into as it is
    (``destination``)."""
    target = destination(path, flag)
    if target is None:
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


#: paths that name a descriptor this process already has open (a shell's redirection): opening them again starts a
#: new file position, and renaming over what they lead to takes the file from under the shell
_DESCRIPTOR_PATH = re.compile(r"/dev/(stdout|stderr|stdin|fd/\d+)|/proc/(self|thread-self|\d+)/fd/\d+")
_MAX_LINKS = 40  # as the kernel's own limit on a chain of links


def destination(path: Path, flag: str) -> Path | None:
    """The file a write to ``path`` replaces whole: ``path``, or for a link the file at the end of its chain (made
    if missing); None for a device, named pipe or socket, written into as it is. Refused, with what to give: a
    descriptor's path (``/dev/stdout``, ``/proc/self/fd/1``: writing there lost what the shell wrote around it),
    a chain that loops, and a link in a sticky folder anyone may write owned by neither this user nor the folder's
    owner (a link planted in ``/tmp``, which the kernel's ``protected_symlinks`` would not follow either)."""
    hops = 0
    while True:
        text = os.path.abspath(path)
        if _DESCRIPTOR_PATH.fullmatch(text):
            raise UsageError(
                f"{flag} {path} is a descriptor of this process, not a file; give a file's path (or, where the "
                "command takes it, - for standard output)"
            )
        if not path.is_symlink():
            break
        _refuse_planted(path, flag)
        hops += 1
        if hops > _MAX_LINKS:
            raise UsageError(f"{flag} {path}: a chain of more than {_MAX_LINKS} links (a loop?); give a file's path")
        path = Path(os.path.join(os.path.dirname(text), os.readlink(path)))
    if path.exists() and not path.is_file() and not path.is_dir():
        return None
    return Path(os.path.abspath(path))


def _refuse_planted(link: Path, flag: str) -> None:
    folder = os.stat(link.parent)
    sticky_and_open = folder.st_mode & 0o1002 == 0o1002  # sticky, and anyone may write there
    owner = os.lstat(link).st_uid
    if sticky_and_open and owner not in (os.geteuid(), folder.st_uid):
        raise UsageError(
            f"{flag} {link} is a link of another user (uid {owner}) in a folder anyone may write; give the path it "
            "should lead to, or a path of your own"
        )


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
