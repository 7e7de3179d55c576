"""Arrow IPC messages for the tests of the input encoding: a GPU's events, streams written by hand, and damage
that the code under test is not asked to find (the flatbuffer walked here independently of it)."""

from __future__ import annotations

import struct

import pyarrow as pa

from gpucost.schemas.codec import decode_line, present_fields
from gpucost.schemas.events import Event
from tests.support.hostile import KEY
from tests.support.worker_input import LINES

#: one GPU's stream as events (prices, bindings, samples…), as the router keys them on the events topic
EVENTS: list[Event] = [decode_line(line) for line in LINES[KEY]]  # type: ignore[misc]


def stream(table: pa.Table, **options: object) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=pa.ipc.IpcWriteOptions(**options)) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def rows(batch: pa.RecordBatch) -> list[dict]:
    return [present_fields(row) for row in batch.to_pylist()]


def without_batch_compression_field(value: bytes) -> bytes:
    """``value`` with its record batch's ``compression`` field (RecordBatch field 3, Message.fbs) taken out of the
    flatbuffer's vtable, found by walking the stream's framing and the flatbuffer by hand (not by the code under
    test): the buffers stay compressed, and only Arrow 0.17's custom metadata says so."""
    out, at = bytearray(value), 0
    while True:
        assert struct.unpack_from("<I", out, at)[0] == 0xFFFFFFFF
        (size,) = struct.unpack_from("<i", out, at + 4)
        meta = at + 8
        root = meta + struct.unpack_from("<I", out, meta)[0]

        def slot(table: int, index: int) -> int:
            vtable = table - struct.unpack_from("<i", out, table)[0]
            return vtable + 4 + 2 * index

        def offset(table: int, index: int) -> int:  # the field's place in the table; 0 where it is left out
            vtable = table - struct.unpack_from("<i", out, table)[0]
            if 4 + 2 * index >= struct.unpack_from("<H", out, vtable)[0]:
                return 0
            return int(struct.unpack_from("<H", out, slot(table, index))[0])

        header_type = out[root + offset(root, 1)]
        body = struct.unpack_from("<q", out, root + offset(root, 3))[0] if offset(root, 3) else 0
        if header_type == 3:  # the record batch
            where = root + offset(root, 2)
            batch = where + struct.unpack_from("<I", out, where)[0]
            struct.pack_into("<H", out, slot(batch, 3), 0)
            return bytes(out)
        at = meta + size + body


def claiming(rows: int) -> bytes:
    """A valid batch of 7,777 rows whose header (and field nodes) claim ``rows``: the count patched in place."""
    value = stream(pa.table({"kind": ["gpu_sample"] * 7_777}))
    old, new = struct.pack("<q", 7_777), struct.pack("<q", rows)
    assert value.count(old) >= 2
    return value.replace(old, new)
