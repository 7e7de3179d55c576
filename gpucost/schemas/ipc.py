"""Arrow IPC encoding of input messages: one record batch of ``EVENT_SCHEMA``'s columns per message.

Why: a worker spent about a quarter of its CPU in Arrow's JSON reader turning JSON Lines back into the
columns its batch path works on (BENCHMARKS.md, benchmark 2). A message in this encoding is those columns
already: the worker checks it and hands the batch on with no loop over its rows. A message says it is in
this encoding by its header ``gpucost-encoding: arrow-ipc`` (``gpucost.schemas.topics``); a message without
it is JSON Lines, so producers of either kind feed one worker.

The bytes come from the network, so reading them trusts nothing that would cost more than the message's
own size before it is checked (docs/definitions.md, "Input encodings"):

- the stream holds a schema, exactly one record batch, and its end: a dictionary batch, a second record
  batch, or a tensor is refused;
- every column is a field of ``EVENT_SCHEMA`` with its type, once (so no dictionary-encoded column, and no
  view or large type whose decoding could be asked to expand);
- the record batch's header is read before its body is: compressed buffers are refused (a few kilobytes of
  zstd can claim gigabytes; Kafka's own compression already packs the message), in the current format and in
  the experimental one of Arrow 0.17 (format V4 with custom metadata: any format but V5 and any custom metadata
  are refused), and so is a row count over ``MAX_ROWS``;
- the batch is then validated in full (offsets, lengths, UTF-8), so a body shorter than its header claims,
  or a string that is not text, is refused here, not met by an operator.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import pyarrow as pa

from gpucost.schemas.arrow import EVENT_SCHEMA, events_table
from gpucost.schemas.events import Event

__all__ = ["MAX_ROWS", "IpcRefused", "conform", "decode_ipc", "encode_ipc"]

#: the most rows one message may hold: a producer's batch is at most 100,000 events (``batch_events``)
MAX_ROWS = 100_000
#: the record batch header's place in the IPC ``Message`` union (Message.fbs)
_RECORD_BATCH = 3
_TYPES = {field.name: field.type for field in EVENT_SCHEMA}


class IpcRefused(ValueError):
    """The message's value is not an Arrow IPC batch a worker takes; the text says what it is instead."""


def encode_ipc(events: Sequence[Event]) -> bytes:
    """``events`` as one Arrow IPC stream of one record batch: the ``EVENT_SCHEMA`` columns that hold a value
    (``kind`` always), uncompressed (the producer's Kafka compression packs the message)."""
    table = events_table(list(events))
    keep = [i for i, col in enumerate(table.columns) if i == 0 or col.null_count < len(col)]
    table = table.select(keep).combine_chunks()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=None) or [pa.RecordBatch.from_pylist([], table.schema)]:
            writer.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


def decode_ipc(value: bytes) -> pa.RecordBatch:
    """The record batch a message holds, its columns as sent (each an ``EVENT_SCHEMA`` field of its type), or
    ``IpcRefused`` saying what is wrong with it."""
    try:
        reader = pa.ipc.MessageReader.open_stream(pa.py_buffer(value))
        first = reader.read_next_message()
        if first.type != "schema":
            raise IpcRefused(f"its Arrow stream begins with a {first.type}, not a schema")
        schema = _checked(pa.ipc.read_schema(first))
        message = reader.read_next_message()
        if message.type != "record batch":
            raise IpcRefused(f"its Arrow stream holds a {message.type} after its schema, not one record batch")
        if message.metadata_version != pa.ipc.MetadataVersion.V5:
            raise IpcRefused(f"its record batch is of Arrow's format {message.metadata_version.name}, not V5")
        _check_header(message.metadata.to_pybytes())
        batch = pa.ipc.read_record_batch(message, schema)
        batch.validate(full=True)
        try:
            extra = reader.read_next_message()
        except StopIteration:
            extra = None
        if extra is not None:
            raise IpcRefused(f"its Arrow stream holds a {extra.type} after its record batch (one batch a message)")
    except IpcRefused:
        raise
    except StopIteration:
        raise IpcRefused("its Arrow stream ends before its record batch") from None
    except (pa.ArrowException, OSError, ValueError, struct.error, OverflowError) as exc:  # Arrow's reading errors
        raise IpcRefused(f"its Arrow stream cannot be read: {str(exc).splitlines()[0][:300]}") from None
    return batch


def conform(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A decoded batch with every ``EVENT_SCHEMA`` column, in its order: those it left out as nulls."""
    n, names = batch.num_rows, batch.schema.names
    columns = [batch.column(f.name) if f.name in names else pa.nulls(n, f.type) for f in EVENT_SCHEMA]
    return pa.RecordBatch.from_arrays(columns, schema=EVENT_SCHEMA)


def _checked(schema: pa.Schema) -> pa.Schema:
    """``schema`` if each of its fields is an ``EVENT_SCHEMA`` field of the same type, once, ``kind`` among them."""
    seen: set[str] = set()
    for field in schema:
        want = _TYPES.get(field.name)
        if want is None:
            raise IpcRefused(f"its column {field.name[:64]!r} is not a field of any event")
        if field.type != want:
            raise IpcRefused(f"its column {field.name!r} is {str(field.type)[:64]}, not {want}")
        if field.name in seen:
            raise IpcRefused(f"its column {field.name!r} comes twice")
        seen.add(field.name)
    if "kind" not in seen:
        raise IpcRefused("it has no kind column")
    return schema


def _check_header(meta: bytes) -> None:
    """The record batch header's row count and compression, read from its flatbuffer (Arrow's Message.fbs)
    before the body is: Arrow would decompress every buffer first, to the sizes the buffers claim. Custom
    metadata on the message is refused too: Arrow 0.17's experimental compression was signalled there (read by
    Arrow only for format V4, which is refused before this; refused here as well, as no producer of ours sets any)."""
    message = _table(meta, _u32(meta, 0))
    if _field(meta, message, 1, "<B", 0) != _RECORD_BATCH:
        raise IpcRefused("its record batch message has another header")
    if _slot(meta, message, 4) is not None:
        raise IpcRefused("its record batch message carries custom metadata (gpucost producers write none)")
    at = _slot(meta, message, 2)
    if at is None:
        raise IpcRefused("its record batch message has no header")
    batch = _table(meta, at + _u32(meta, at))
    rows = _field(meta, batch, 0, "<q", 0)
    if not 0 <= rows <= MAX_ROWS:
        raise IpcRefused(f"its record batch claims {rows:,} rows (at most {MAX_ROWS:,} a message)")
    if _slot(meta, batch, 3) is not None:
        raise IpcRefused("its record batch is compressed (send it uncompressed: Kafka's compression packs it)")


def _u32(buf: bytes, at: int) -> int:
    if not 0 <= at <= len(buf) - 4:
        raise IpcRefused("its record batch header points outside itself")
    return int(struct.unpack_from("<I", buf, at)[0])


def _table(buf: bytes, at: int) -> tuple[int, int, int]:
    """A flatbuffer table at ``at``: (its place, its vtable's place, the vtable's length in bytes)."""
    if not 0 <= at <= len(buf) - 4:
        raise IpcRefused("its record batch header points outside itself")
    vtable = at - struct.unpack_from("<i", buf, at)[0]
    if not 0 <= vtable <= len(buf) - 4:
        raise IpcRefused("its record batch header points outside itself")
    return at, vtable, struct.unpack_from("<H", buf, vtable)[0]


def _slot(buf: bytes, table: tuple[int, int, int], index: int) -> int | None:
    """Where field ``index`` of ``table`` is stored, or None when the table leaves it out."""
    at, vtable, length = table
    entry = 4 + 2 * index
    if entry + 2 > length or vtable + entry + 2 > len(buf):
        return None
    offset = struct.unpack_from("<H", buf, vtable + entry)[0]
    return at + offset if offset else None


def _field(buf: bytes, table: tuple[int, int, int], index: int, fmt: str, default: int) -> int:
    """A scalar field of ``table``, ``default`` where left out."""
    at = _slot(buf, table, index)
    if at is None:
        return default
    if not 0 <= at <= len(buf) - struct.calcsize(fmt):
        raise IpcRefused("its record batch header points outside itself")
    return int(struct.unpack_from(fmt, buf, at)[0])
