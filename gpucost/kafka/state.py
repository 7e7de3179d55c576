"""The worker's state records: how each key's operators are written to a partition's compacted state
topic, in the same transaction as the outputs and offsets, and read back on restore. Versioned: a
record carries ``"v"``; a later version than this gpucost reads is refused (``StateError``)."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any

from gpucost.kafka.sequences import SeenSequences
from gpucost.streams.audit import Auditor
from gpucost.streams.settings import AuditSettings

__all__ = [
    "PROGRESS_KEY",
    "IDLE_PREFIX",
    "STATE_VERSION",
    "StateError",
    "state_records",
    "progress_record",
    "Restored",
    "restored",
]

#: key of the record, beside the per-key states, holding the partition's next input offset: it is
#: committed in the same transaction as the states, so the two never disagree
PROGRESS_KEY = b"\x00next_offset"
#: prefix of the key of a key's idle windows, which are written apart from the rest of its state
IDLE_PREFIX = b"\x00idle\x00"
#: prefix of the parts of a state record split to stay well under the broker's 1 MiB message limit
PART_PREFIX = b"\x00part\x00"
STATE_CHUNK_BYTES = 256 << 10
#: the layout of the state records, written in each as ``"v"``. Version 0 (no ``"v"``; the idle windows
#: a bare map, the progress a bare number) is the same layout unmarked, and is read. A record of a
#: later version is refused: a newer gpucost wrote it, and this one would restore it wrongly. Version 2 adds each
#: process's addresses taken (``Mae.to_state``) and the log of open panes with revisions off; versions 0 and 1 are
#: read, their processes starting with no addresses taken. Version 3 adds each GPU's pending kernel panes (late kernels
#: not yet republished, ``KernelLog``): a worker of version 2 would restore it without them and never publish that
#: revision, so it refuses it; version 2 is read, with none pending. Version 4 adds each kept kernel's range path (a
#: tenth item of its row: ``KernelLog``), which a worker of version 3 cannot restore; version 3's rows are read, their
#: kernels carrying no path.
STATE_VERSION = 4


class StateError(RuntimeError):
    """A state topic this worker cannot restore from. It stops, naming the record, rather than apply
    input to a state it cannot read and bill from that."""


def _read_version(key: bytes, record: Any) -> Any:
    """``record`` without its version, checked: a record of a later version raises ``StateError``."""
    if not isinstance(record, dict) or "v" not in record:
        return record  # version 0
    v = record.pop("v")
    if type(v) is not int or not 0 <= v <= STATE_VERSION:
        raise StateError(
            f"the state record {key[:80]!r} has state version {v!r}; this worker reads versions 0 to "
            f"{STATE_VERSION}. A newer gpucost wrote it: run workers of that version (or newer) for "
            "this group; never an older one"
        )
    return record


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def progress_record(next_offset: int) -> bytes:
    """The record under ``PROGRESS_KEY``: the partition's next input offset."""
    return _json({"v": STATE_VERSION, "next_offset": next_offset})


def _chunked(key: bytes, value: bytes) -> list[tuple[bytes, bytes | None]]:
    """A state record as it is written: whole, or, past ``STATE_CHUNK_BYTES``, as parts under
    ``PART_PREFIX`` and a head naming them. A state over the broker's message limit used to be
    refused by the broker while the transaction committed without it."""
    if len(value) <= STATE_CHUNK_BYTES:
        return [(key, value)]
    parts = [value[i : i + STATE_CHUNK_BYTES] for i in range(0, len(value), STATE_CHUNK_BYTES)]
    head = _json({"parts": len(parts), "sha256": hashlib.sha256(value).hexdigest()})
    return [*((_part_key(key, i), part) for i, part in enumerate(parts)), (key, head)]


def _part_key(key: bytes, i: int) -> bytes:
    return PART_PREFIX + key + b"\x00%d" % i


def _joined(latest: dict[bytes, bytes | None]) -> dict[bytes, bytes | None]:
    """The state records with each head replaced by the parts it names, parts left out."""
    out = {}
    for key, value in latest.items():
        if key.startswith(PART_PREFIX):
            continue
        if value is not None and value.startswith(b'{"parts":'):
            head = json.loads(value)
            parts = [latest.get(_part_key(key, i)) for i in range(head["parts"])]
            value = b"".join(p for p in parts if p is not None)
            if None in parts or hashlib.sha256(value).hexdigest() != head["sha256"]:
                raise StateError(
                    f"the state of key {key[:80]!r} is split into {head['parts']} parts, which do not "
                    "add up to what was written; the state topic is incomplete"
                )
        out[key] = value
    return out


def state_records(
    key: str,
    auditor: Auditor,
    sequences: SeenSequences,
    owner: str | None,
    idle_written: dict[str, tuple[Auditor, int]],
) -> list[tuple[bytes, bytes | None]]:
    """The state records of a key a batch touched: its state, and its idle windows only when a pane
        closed since they were last written. The windows are most of a key's state (46 of 54 KB for a
        GPU with 72 h of panes) and change once a pane, while a live worker writes the rest at every
        poll (``idle_written``: each key's auditor and its ``idle.rolls`` as they were last written). When a pane
    closed, bindings no future event can reach are pruned first (``Auditor.prune``:
        the watermark moves them out of reach, and it moves a pane at a time)."""
    k = key.encode()
    written = idle_written.get(key)
    pane_closed = written is None or written[0] is not auditor or written[1] != auditor.idle_changes
    if pane_closed:
        auditor.prune()
    out = _chunked(
        k,
        _json({"v": STATE_VERSION, "audit": auditor.to_state(idle=False), "seq": sequences.to_state(), "owner": owner}),
    )
    if pane_closed:
        out += _chunked(IDLE_PREFIX + k, _json({"v": STATE_VERSION, "idle": auditor.idle_state()}))
        idle_written[key] = (auditor, auditor.idle_changes)
    return out


@dataclass
class Restored:
    """What a partition's state topic holds: each key's auditor, seen sequences and owner node, and
    the next input offset to apply (None: never processed)."""

    auditors: dict[str, Auditor]
    sequences: dict[str, SeenSequences]
    owners: dict[str, str]
    next_offset: int | None


def restored(audit: AuditSettings, latest: dict[bytes, bytes | None], audit_key: bytes | None = None) -> Restored:
    """Every key's state, from the latest value of each state record (a compacted state topic's view);
    ``audit_key`` signs the health records of the auditors restored."""
    latest = _joined(latest)
    progress = latest.pop(PROGRESS_KEY, None)
    if progress is not None:
        progress = _read_version(PROGRESS_KEY, json.loads(progress))
        progress = progress if isinstance(progress, int) else progress["next_offset"]
    idle = {k[len(IDLE_PREFIX) :].decode(): v for k, v in latest.items() if k.startswith(IDLE_PREFIX)}
    states = {
        k.decode(): _read_version(k, json.loads(v))
        for k, v in latest.items()
        if v is not None and not k.startswith(IDLE_PREFIX)
    }
    for key, st in states.items():
        if "idle" not in st["audit"]:  # written apart (a state written before that holds its own)
            windows = idle.get(key)
            if windows is None:
                raise StateError(
                    f"the state of key {key!r} has no idle windows; the state topic is incomplete "
                    "(was it written by another program, or compacted by hand?)"
                )
            windows = json.loads(windows)
            # version 0 maps GPUs to their windows, which are lists (a GPU may be called "v")
            versioned = "v" in windows and isinstance(windows.get("idle"), dict)
            st["audit"]["idle"] = _read_version(IDLE_PREFIX + key.encode(), windows)["idle"] if versioned else windows
    return Restored(
        {k: Auditor.from_state(st["audit"], audit, time.time_ns, audit_key) for k, st in states.items()},
        {k: SeenSequences.from_state(st["seq"]) for k, st in states.items()},
        {k: st["owner"] for k, st in states.items() if st.get("owner") is not None},
        progress,
    )
