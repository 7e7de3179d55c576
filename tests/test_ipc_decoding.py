"""The Arrow IPC input encoding's decoder and the producer's values (``gpucost.schemas.ipc``,
``gpucost.kafka.encoding``): every event as it went, and the decoder's limits driven directly: truncation at every
byte, a schema of other fields or types, a batch that claims 2^31 rows, a dictionary bomb, compression bombs in
the current and the Arrow 0.17 format, random bytes. The worker's handling of each is tests/test_hostile_arrow.py.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpucost.kafka.encoding import ARROW_HEADERS, ARROW_MIN_EVENTS, Oversized, message_values
from gpucost.schemas.arrow import EVENT_SCHEMA
from gpucost.schemas.codec import decode_line, encode_event
from gpucost.schemas.ipc import MAX_ROWS, IpcRefused, conform, decode_ipc, encode_ipc
from tests.support.arrow_messages import EVENTS, claiming, rows, stream, without_batch_compression_field
from tests.support.hostile import (
    keyring,  # noqa: F401 (a fixture)
)

# --- the decoder ---------------------------------------------------------------------------------------------


def test_every_event_comes_back_as_it_went() -> None:
    """Each row decodes to the event it was made from, and to what its JSON line decodes to."""
    batch = conform(decode_ipc(encode_ipc(EVENTS)))
    assert batch.schema == EVENT_SCHEMA and batch.num_rows == len(EVENTS)
    assert [decode_line(row) for row in rows(batch)] == EVENTS
    assert [decode_line(row) for row in rows(batch)] == [decode_line(encode_event(e)) for e in EVENTS]


def test_a_value_cut_anywhere_is_refused_or_whole() -> None:
    """Cut at every byte: refused, or (only the end-of-stream marker lost, which Arrow lets a stream leave out)
    every row as sent."""
    value = encode_ipc(EVENTS[:40])
    whole = rows(decode_ipc(value))
    outcomes = set()
    for cut in range(len(value)):
        try:
            got = rows(decode_ipc(value[:cut]))
        except IpcRefused:
            outcomes.add("refused")
            continue
        assert got == whole and cut >= len(value) - 8
        outcomes.add("whole")
    assert outcomes == {"refused", "whole"}


@pytest.mark.parametrize(
    ("table", "says"),
    [
        (pa.table({"kind": ["gpu_sample"], "ts_ns": ["1"]}), "ts_ns' is string, not int64"),
        (pa.table({"kind": ["gpu_sample"], "colour": [1]}), "'colour' is not a field"),
        (pa.table({"ts_ns": [1]}), "no kind column"),
        (pa.table([pa.array(["gpu_sample"]), pa.array(["a"])], names=["kind", "kind"]), "comes twice"),
        (pa.table({"kind": pa.array(["gpu_sample"], pa.large_string())}), "is large_string"),
    ],
    ids=["wrong-type", "unknown-field", "no-kind", "twice", "large-type"],
)
def test_a_schema_not_of_the_events_is_refused(table: pa.Table, says: str) -> None:
    with pytest.raises(IpcRefused, match=says):
        decode_ipc(stream(table))


def test_a_dictionary_bomb_is_refused_before_it_is_expanded() -> None:
    """A dictionary of one 1 MB string under a million indices would decode to a terabyte of text."""
    bomb = pa.DictionaryArray.from_arrays(pa.array([0] * 1_000_000, pa.int32()), pa.array(["x" * 1_000_000]))
    value = stream(pa.table({"kind": bomb}))
    assert len(value) < 8 << 20
    with pytest.raises(IpcRefused, match="dictionary"):
        decode_ipc(value)


def test_a_compression_bomb_is_refused_before_it_is_decompressed() -> None:
    """A 256 MB name packs into a few kilobytes of zstd; the batch is refused on its header."""
    value = stream(pa.table({"kind": ["gpu_sample"], "gpu_uuid": ["x" * (256 << 20)]}), compression="zstd")
    assert len(value) < 64 << 10
    with pytest.raises(IpcRefused, match="compressed"):
        decode_ipc(value)


def test_arrow_017_compression_is_refused_before_it_is_decompressed() -> None:
    """Format V4 with the experimental compression of Arrow 0.17 (signalled in the message's custom metadata, the
    batch's own compression field left out): a 33 kB value that Arrow would decompress to 256 MB."""
    table = pa.table({"kind": ["gpu_sample"], "gpu_uuid": ["x" * (256 << 20)]})
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression="zstd", metadata_version=pa.ipc.MetadataVersion.V4)
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_batch(table.to_batches()[0], custom_metadata={"ARROW:experimental_compression": "ZSTD"})
    value = without_batch_compression_field(sink.getvalue().to_pybytes())
    assert len(value) < 64 << 10
    with pytest.raises(IpcRefused, match="V4"):
        decode_ipc(value)


def test_custom_metadata_on_a_batch_is_refused() -> None:
    table = pa.table({"kind": ["gpu_sample"]})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_batch(table.to_batches()[0], custom_metadata={"ARROW:experimental_compression": "ZSTD"})
    with pytest.raises(IpcRefused, match="custom metadata"):
        decode_ipc(sink.getvalue().to_pybytes())


@pytest.mark.parametrize("rows", [2**31, MAX_ROWS + 1, 2**63 - 1, -1])
def test_a_batch_claiming_more_rows_than_a_message_may_hold_is_refused(rows: int) -> None:
    with pytest.raises(IpcRefused, match=r"claims .* rows"):
        decode_ipc(claiming(rows))


def test_a_batch_claiming_more_rows_than_its_buffers_hold_is_refused() -> None:
    with pytest.raises(IpcRefused, match="cannot be read"):
        decode_ipc(claiming(MAX_ROWS))


def test_one_batch_a_message() -> None:
    table = pa.table({"kind": ["gpu_sample"] * 4})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=2)
    with pytest.raises(IpcRefused, match="after its record batch"):
        decode_ipc(sink.getvalue().to_pybytes())
    with pytest.raises(IpcRefused, match="ends before"):
        decode_ipc(stream(table)[: len(stream(table.slice(0, 0))) - 8])


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_random_damage_is_refused_or_read_within_limits(data: st.DataObject) -> None:
    """Bytes flipped anywhere: refused with IpcRefused, or a batch of the events' schema within the row limit
    whose every row either decodes or is refused by the models (never another exception)."""
    value = bytearray(encode_ipc(EVENTS[:30]))
    for _ in range(data.draw(st.integers(1, 8))):
        value[data.draw(st.integers(0, len(value) - 1))] = data.draw(st.integers(0, 255))
    try:
        batch = decode_ipc(bytes(value))
    except IpcRefused:
        return
    assert all(EVENT_SCHEMA.field(f.name).type == f.type for f in batch.schema) and batch.num_rows <= MAX_ROWS
    for row in rows(batch):
        decode_line(row)


# --- the producer's values -------------------------------------------------------------------------------


@given(st.integers(4096, 60_000), st.integers(0, len(EVENTS)), st.sampled_from(["arrow", "json"]))
def test_values_fit_the_limit_keep_the_order_and_say_their_encoding(limit: int, n: int, encoding: str) -> None:
    """Every event once, in order, in values of at most ``limit`` bytes; Arrow only where asked for and the batch
    has ``ARROW_MIN_EVENTS`` events, each value with the header its bytes need."""
    values = list(message_values(EVENTS[:n], encoding, limit))
    assert all(len(v.encode()) > limit if isinstance(v, Oversized) else len(v[0]) <= limit for v in values)
    assert [decode_line(e) for v in values for e in _events_of(v)] == EVENTS[:n]
    arrow = [v for v in values if not isinstance(v, Oversized) and v[1] == ARROW_HEADERS]
    assert all(len(_events_of(v)) >= ARROW_MIN_EVENTS for v in arrow)
    assert bool(arrow) <= (encoding == "arrow")
    whole = list(message_values(EVENTS[:n], encoding, 64 << 20))  # a limit no batch reaches: one message
    if n:
        assert [v[1] for v in whole] == [ARROW_HEADERS if encoding == "arrow" and n >= ARROW_MIN_EVENTS else ()]


def _events_of(value: tuple[bytes, tuple] | Oversized) -> list:
    """The wire objects (or lines) a value carries, read as a worker reads it: by its header."""
    if isinstance(value, Oversized):
        return [str(value)]
    data, headers = value
    if headers == ARROW_HEADERS:
        return rows(decode_ipc(data))
    assert headers == ()
    return data.split(b"\n")


def test_an_event_no_message_can_hold_comes_back_as_its_line() -> None:
    sample = next(e for e in EVENTS if e.kind == "gpu_sample")
    big = sample.model_copy(update={"node_id": "n" * 9000})  # no validation: a size no producer reaches
    batch = [*EVENTS[:ARROW_MIN_EVENTS], big, *EVENTS[ARROW_MIN_EVENTS : 2 * ARROW_MIN_EVENTS]]
    values = list(message_values(batch, "arrow", 8192))
    assert [str(v) for v in values if isinstance(v, Oversized)] == [encode_event(big)]
    assert [decode_line(e) for v in values if not isinstance(v, Oversized) for e in _events_of(v)] == [
        *EVENTS[:ARROW_MIN_EVENTS],
        *EVENTS[ARROW_MIN_EVENTS : 2 * ARROW_MIN_EVENTS],
    ]


def test_an_event_that_fits_as_json_is_never_oversized() -> None:
    """An Arrow message carries its schema beside its rows: an event of 5 kB fits a 6,000-byte message as its JSON
    line, not as a one-row Arrow batch. It goes as the line."""
    sample = next(e for e in EVENTS if e.kind == "gpu_sample")
    big = sample.model_copy(update={"node_id": "n" * 5000})
    assert len(encode_event(big)) < 6000 < len(encode_ipc([big]))
    batch = [*EVENTS[: 2 * ARROW_MIN_EVENTS], big, *EVENTS[2 * ARROW_MIN_EVENTS : 4 * ARROW_MIN_EVENTS]]
    values = list(message_values(batch, "arrow", 6000))
    assert not [v for v in values if isinstance(v, Oversized)]
    got = [e for v in values for e in _events_of(v)]
    at = 2 * ARROW_MIN_EVENTS
    assert got[at] == encode_event(big).encode()  # as its JSON line, in a JSON Lines message
    assert [decode_line(e) for e in got[:at] + got[at + 1 :]] == batch[:at] + batch[at + 1 :]
