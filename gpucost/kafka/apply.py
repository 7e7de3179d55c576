"""The worker's apply step: one poll's messages of an input partition, checked, then handed to their keys'
auditors; the records they give, in the order each key's messages came.

What a message may do is decided before its key gets an auditor: one without a usable key or with a malformed
header is refused whole (``bad_message``), as is an Arrow IPC value that cannot be read within its limits
(``gpucost.schemas.ipc``, read only once its signature is checked); one not signed by a key of the keyring, or
signed by a node that does not own the key's GPU, is refused line by line; a message the broker held twice is
skipped. A refused message creates no state. Apart from the transaction loop (``gpucost.kafka.worker``), which
writes what this gives.
"""

from __future__ import annotations

import time
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

import pyarrow as pa

from gpucost.kafka.owned import Owned
from gpucost.kafka.sequences import MalformedSequence, SeenSequences, parse_sequence
from gpucost.kafka.signing import Keyring, SigningKey, Verdict
from gpucost.schemas.arrow import wire_rows
from gpucost.schemas.blocks import expand
from gpucost.schemas.codec import raw_text
from gpucost.schemas.events import EVENT_MODELS
from gpucost.schemas.ipc import IpcRefused, decode_ipc
from gpucost.schemas.records import DeadLetter, Output
from gpucost.schemas.topics import ARROW_IPC, CONTROL_HEADER, ENCODING_HEADER, END_OF_INPUT, SEQUENCE_HEADER
from gpucost.streams.audit import Auditor
from gpucost.streams.scope import Scope, claimed_node
from gpucost.streams.settings import AuditSettings

__all__ = ["MAX_KEY_BYTES", "MAX_HEADER_BYTES", "Poll"]

#: a Kafka key gpucost writes is a GPU UUID or ``node_id/pid``; a gpucost header is a short token
MAX_KEY_BYTES = 512
MAX_HEADER_BYTES = 256

#: a message's source (``topic[partition]@offset``) and its non-blank lines, numbered as in the message, or its
#: Arrow record batch (rows numbered from 0)
_Chunk = tuple[str, list[tuple[int, bytes]] | pa.RecordBatch]


def _message_problem(key: bytes | None, headers: dict[str, bytes]) -> str | None:
    """Why a message cannot be filed under any key, or None. Checked before anything else: a key
    that is not UTF-8 once stopped the worker, at every restart, on the same message."""
    if not key:
        return "the message has no key (gpucost producers key every message by GPU or by node/pid)"
    if len(key) > MAX_KEY_BYTES:
        return f"its key has {len(key):,} bytes (at most {MAX_KEY_BYTES})"
    try:
        key.decode()
    except UnicodeDecodeError:
        return f"its key {key[:64]!r} is not UTF-8"
    for name, value in headers.items():
        if name.startswith("gpucost-") and len(value) > MAX_HEADER_BYTES:
            return f"its header {name[:64]!r} has {len(value):,} bytes (at most {MAX_HEADER_BYTES})"
    encoding = headers.get(ENCODING_HEADER)
    if encoding is not None and encoding != ARROW_IPC:
        return (
            f"its header {ENCODING_HEADER} is {encoding[:64]!r}: this worker reads {ARROW_IPC.decode()} or, "
            "without the header, JSON Lines"
        )
    return None


def _labels(chunks: list[_Chunk]) -> Callable[[int], str]:
    """The label of line (row) ``i`` of the chunks' lines (rows) taken as one batch: ``topic[partition]@offset#n``."""
    ends = list(accumulate(len(numbered) for _, numbered in chunks))

    def label(i: int) -> str:
        c = bisect_right(ends, i)
        source, numbered = chunks[c]
        at = i - (ends[c - 1] if c else 0)
        return f"{source}#{at if isinstance(numbered, pa.RecordBatch) else numbered[at][0]}"

    return label


@dataclass
class Poll:
    """One poll's messages of one owned partition, applied (``apply``); the keys applied to join ``touched``
    and the events their auditors took, by kind, ``taken``. Refusals and re-deliveries are counted in ``counts``
    (the worker's), the ends of input applied in ``ends``.

    A key's data messages are queued and go through the batch path together when the poll ends, or before
    anything else of that key (a dead letter, the end of its input, a message of another signer): the batch
    path's fixed costs are per call, and 400-line messages paid them ~40 % over. Keys are independent, each with
    its own auditor, so only outputs of different keys change places; a record's partition order within one key
    is what consumers see."""

    owned: Owned
    audit: AuditSettings
    audit_key: bytes | None  # signs the health records' snapshot hashes of the auditors made here
    keyring: Keyring | None  # when set, only messages signed by one of its keys are applied
    counts: Counter[str]
    monotonic: Callable[[], float]  # the clock a key is heard on (``Owned.heard``)
    touched: set[str]
    taken: Counter[str]
    out: list[Output] = field(default_factory=list)
    #: per key: its data messages waiting for the batch path, and the scope they are applied in
    queued: dict[str, tuple[Scope | None, list[_Chunk]]] = field(default_factory=dict)
    ends: int = 0

    def apply(self, messages: list[Any]) -> list[Output]:
        """The records of ``messages``, each key's in the order of its messages."""
        for message in messages:
            self.message(message)
        for key in list(self.queued):
            self.flush(key)
        return self.out

    def message(self, message: Any) -> None:
        """One message: refused, skipped, applied at once (an end of input) or queued for the batch path."""
        source = f"{message.topic}[{message.partition}]@{message.offset}"
        value = message.value or b""
        headers = {name: v or b"" for name, v in message.headers or ()}
        problem = _message_problem(message.key, headers)
        seq = None
        if problem is None:
            try:
                seq = parse_sequence(headers.get(SEQUENCE_HEADER))
            except MalformedSequence as exc:
                problem = str(exc)
        if problem is not None:  # no key to file it under, or a header no producer writes: refused whole
            self.out.append(self.refused("bad_message", f"{problem}; the message is skipped", source, value))
            return
        key = message.key.decode()
        arrow = headers.get(ENCODING_HEADER) == ARROW_IPC
        lines = [] if arrow else [(n, line) for n, line in enumerate(value.split(b"\n")) if line.strip()]
        signer = self.signer(key, message.key, value, headers)
        if isinstance(signer, Verdict):  # forged, unsigned or foreign: every line (an Arrow value whole) refused
            self.flush(key)
            self.out += [
                self.refused(signer.reason, signer.detail, f"{source}#{n}", line) for n, line in lines or [(0, value)]
            ]
            return
        sequences = self.owned.sequences.setdefault(key, SeenSequences())
        if seq is not None and not sequences.first_time(*seq):
            self.counts["redelivered_messages"] += 1  # the broker held it twice; applied the first time
            return
        body: list[tuple[int, bytes]] | pa.RecordBatch = lines
        if arrow:
            try:
                body = decode_ipc(value)
            except IpcRefused as exc:
                self.flush(key)
                self.out.append(self.refused("bad_message", f"{exc}; the message is skipped", source, value))
                return
        auditor = self.auditor(key)
        scope = self.scope(key, signer, _rows(body))
        if headers.get(CONTROL_HEADER) == END_OF_INPUT:
            self.end_of_input(key, auditor)
            return
        if key in self.queued and (self.queued[key][0] != scope or _arrow(self.queued[key][1]) != arrow):
            self.flush(key)
        self.queued.setdefault(key, (scope, []))[1].append((source, body))

    def signer(self, key: str, raw_key: bytes, value: bytes, headers: dict[str, bytes]) -> SigningKey | Verdict | None:
        """The key that signed the message (None: no keyring, every message is applied), or why it is refused:
        its signature does not verify, or its signer may not speak for the node that owns ``key``."""
        signer = None if self.keyring is None else self.keyring.check(raw_key, value, headers)
        if isinstance(signer, SigningKey):
            owner = self.owned.owners.get(key)
            if owner is not None and signer.nodes is not None and owner not in signer.nodes:
                return Verdict(
                    "wrong_key",
                    f"key {key[:256]!r} belongs to node {owner[:256]!r}, and key "
                    f"{signer.key_id!r} may not speak for it",
                )
        return signer

    def auditor(self, key: str) -> Auditor:
        """``key``'s auditor (a new one for a key not seen before), the key noted as touched and heard now."""
        self.touched.add(key)
        self.owned.heard[key] = self.monotonic()
        auditor = self.owned.auditors.get(key)
        if auditor is None:
            auditor = self.owned.auditors[key] = Auditor(self.audit, time.time_ns, self.audit_key)
        return auditor

    def scope(self, key: str, signer: SigningKey | None, lines: Iterable[bytes | dict[str, Any]]) -> Scope:
        """What the message's signer may say of ``key``'s node and of prices. The first node whose own events of
        the key a single-node signer signs becomes the key's owner."""
        if signer is None:
            return Scope(key)
        if (
            self.owned.owners.get(key) is None
            and signer.nodes is not None
            and len(signer.nodes) == 1
            and claimed_node(key, node := next(iter(signer.nodes)), lines)
        ):
            self.owned.owners[key] = node
        assert self.keyring is not None
        price_keys = self.keyring.price_keys
        return Scope(key, signer.nodes, price_keys, signer.key_id in price_keys)

    def end_of_input(self, key: str, auditor: Auditor) -> None:
        """``key``'s input finished: its panes close, and what follows starts afresh above the watermark it
        reached, so that the same input produced again is late, never billed twice."""
        self.ends += 1
        self.flush(key)
        self.out += auditor.finish()
        self.owned.auditors[key] = auditor.successor()

    def flush(self, key: str) -> None:
        """``key``'s queued messages through the batch path, as one batch (all JSON Lines, or all Arrow)."""
        scope, chunks = self.queued.pop(key, (None, []))
        if not chunks:
            return
        auditor = self.owned.auditors[key]
        before = [auditor.counts[kind] for kind in EVENT_MODELS]
        if _arrow(chunks):
            batches = [body for _, body in chunks if isinstance(body, pa.RecordBatch)]
            outputs = auditor.ingest_arrow(batches, _labels(chunks), scope)
        else:
            lines = [line for _, numbered in chunks if isinstance(numbered, list) for _, line in numbered]
            outputs = auditor.ingest_lines(lines, _labels(chunks), scope)
        self.out.extend(expand(outputs))  # records, for their JSON
        self.taken.update({kind: auditor.counts[kind] - n for kind, n in zip(EVENT_MODELS, before)})

    def refused(self, reason: str, detail: str, source: str, raw: bytes) -> DeadLetter:
        """The dead letter of (a line of) a message refused before any auditor saw it, counted."""
        self.counts[reason] += 1
        return DeadLetter(
            reason=reason, detail=detail, kind=None, source=source, raw=raw_text(raw), ts_ns=None, gpu_uuid=None
        )


def _arrow(chunks: list[_Chunk]) -> bool:
    """Whether the queued chunks are Arrow batches (a key's queue holds one encoding at a time)."""
    return bool(chunks) and isinstance(chunks[0][1], pa.RecordBatch)


def _rows(body: list[tuple[int, bytes]] | pa.RecordBatch) -> Iterator[bytes | dict[str, Any]]:
    """A message's events as ``claimed_node`` reads them: its lines, or its rows as wire objects, the first on its
    own (the claim is almost always there, and a message may hold 100,000 rows)."""
    if isinstance(body, list):
        yield from (line for _, line in body)
        return
    yield from wire_rows(body.slice(0, 1))
    yield from wire_rows(body.slice(1))
