"""A live run's checkpoint beside its output: what lets ``gpucost run``, killed at any moment, start again on
the same ``--out`` and go on as if it had not stopped.

Why the operators' state and not a rebuild from the Parquet: the records hold neither the open panes, nor the
72 h idle windows, nor the revision log, nor the bindings and prices in force. So at each publication (every
``--publish-delay-s``, and whenever a buffer fills a file) a run:

1. writes every record it has buffered, fsynced, under hidden temporary names (``ParquetSink.stage_all``);
2. writes this checkpoint whole (a temporary file, fsync, rename, fsync of the folder): the auditor's state
   after the last input taken, how many inputs that was, and the staged files' temporary and final names;
3. renames the staged files into place.

A kill before step 2 completes leaves the previous checkpoint, and temporaries that no checkpoint names: they
are removed at the next start (``resume``), and their records are produced again from the previous state. A
kill after it leaves a checkpoint whose files ``resume`` renames into place. Either way the Parquet holds
exactly the records of the state the checkpoint holds: none lost, none twice. What a kill loses is the input
taken since the last checkpoint: a live source's events sampled in at most ``--publish-delay-s`` (nobody samples
them again); a source that can be read again (``--source simulate``) is read on from the input counted.

The file is as trusted as the Parquet beside it (whoever can write one can write the other).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpucost.sinks.parquet import PART_RE, Staged, fsync_dir, remove_stale_temporaries

__all__ = ["CHECKPOINT", "VERSION", "Checkpoint", "CheckpointError", "load", "resume", "save"]

#: under the output directory; no view globs it
CHECKPOINT = ".checkpoint.json"
#: the layout written as ``"v"``; another one is refused (``CheckpointError``)
VERSION = 1


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be resumed from; the message says why and what to do."""


@dataclass
class Checkpoint:
    """What a run had done when it published: enough to go on from there."""

    settings: dict[str, Any]  # the audit settings (a resume must bill as the run did)
    source: dict[str, Any]  # what it read (a resume must read the same)
    inputs: int  # inputs taken: a source read again skips them
    finished: bool  # its input ended: nothing to resume
    state: dict[str, Any]  # ``Auditor.to_state()``
    prices_sha256: str | None = None  # of the ``--prices`` file read first: not read again while unchanged
    #: (temporary, final) of each file published with this checkpoint, relative to the output directory
    publishing: list[tuple[str, str]] = field(default_factory=list)
    publication: int = 0  # how many publications the run has made, this one included: its temporaries' tag

    def staging(self, out_dir: Path, staged: list[Staged]) -> Checkpoint:
        self.publishing = [
            (s.tmp.relative_to(out_dir).as_posix(), s.final.relative_to(out_dir).as_posix()) for s in staged
        ]
        return self


def save(out_dir: Path, checkpoint: Checkpoint) -> None:
    """Written whole or not at all: a reader finds the previous checkpoint or this one."""
    path, tmp = out_dir / CHECKPOINT, out_dir / f"{CHECKPOINT}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump({"v": VERSION, **asdict(checkpoint)}, fh, separators=(",", ":"))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(out_dir)


#: each field's type, checked before anything is done with a checkpoint (a wrong one is refused in one line)
_FIELDS: dict[str, type | tuple[type, ...]] = {
    "settings": dict,
    "source": dict,
    "inputs": int,
    "finished": bool,
    "state": dict,
    "prices_sha256": (str, type(None)),
    "publishing": list,
    "publication": int,
}


def load(out_dir: Path) -> Checkpoint | None:
    """The output directory's checkpoint, None if it has none; ``CheckpointError`` if it is not one this
    gpucost wrote, whole and of the right types."""
    path = out_dir / CHECKPOINT
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise CheckpointError(
            f"cannot read the checkpoint {path}: {exc}; pass --overwrite to start the run "
            "afresh (the output is then replaced)"
        ) from None
    if not isinstance(data, dict) or type(data.get("v")) is not int or data["v"] != VERSION:  # True is no 1
        raise CheckpointError(
            f"the checkpoint {path} has layout {data.get('v') if isinstance(data, dict) else '?'}"
            f"; this gpucost reads {VERSION}: run the gpucost that wrote it, or pass --overwrite"
        )
    del data["v"]
    wrong = sorted(set(_FIELDS) ^ set(data)) + sorted(
        k
        for k, kind in _FIELDS.items()
        if k in data and (not isinstance(data[k], kind) or (kind is int and (isinstance(data[k], bool) or data[k] < 0)))
    )
    pairs = data.get("publishing")
    if isinstance(pairs, list) and not all(
        isinstance(p, list) and len(p) == 2 and all(isinstance(n, str) for n in p) for p in pairs
    ):
        wrong.append("publishing")
    if wrong:
        raise CheckpointError(
            f"the checkpoint {path} is not one gpucost wrote ({', '.join(wrong)} missing, "
            "unknown or of the wrong type); pass --overwrite to start the run afresh"
        )
    checkpoint = Checkpoint(**data)
    checkpoint.publishing = [(tmp, final) for tmp, final in data["publishing"]]
    return checkpoint


def resume(out_dir: Path, checkpoint: Checkpoint) -> int:
    """Finish the publication the checkpoint names (a kill came between it and the renames) and remove every
    other temporary (a publication whose checkpoint was never written); returns the files renamed. Every name
    is checked before anything is renamed."""
    pairs = [(out_dir / tmp, out_dir / final) for tmp, final in checkpoint.publishing]
    for (source, target), (_, final) in zip(pairs, checkpoint.publishing):
        if (
            ".." in Path(final).parts
            or Path(final).is_absolute()
            or not PART_RE.search(final)
            or source != target.parent / f".{target.name}.{checkpoint.publication}.tmp"
        ):
            raise CheckpointError(
                f"the checkpoint {out_dir / CHECKPOINT} names {final!r}, not a file of this "
                "output; pass --overwrite to start the run afresh"
            )
    renamed = 0
    for source, target in pairs:
        if source.is_file() and not target.exists():
            os.replace(source, target)
            fsync_dir(target.parent)
            renamed += 1
    remove_stale_temporaries(out_dir)
    return renamed
