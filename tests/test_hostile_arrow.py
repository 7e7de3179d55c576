"""The Arrow IPC input encoding (``gpucost.schemas.ipc``): the same bill as JSON Lines, and hostile values.

The decoder's own limits are driven directly (truncation at every byte, a schema of other fields or types, a
batch that claims 2^31 rows, a dictionary bomb, a compression bomb, random bytes); the worker's handling of each
in both configurations (revisions on by default, and off): one bounded ``bad_message`` dead letter, no state, and
the next message billed as the embedded run bills the same events.
"""

from __future__ import annotations

import struct

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpucost.kafka.encoding import ARROW_HEADERS, ARROW_MIN_EVENTS, Oversized, message_values
from gpucost.kafka.settings import KafkaSettings
from gpucost.kafka.signing import Keyring
from gpucost.kafka.worker import Worker
from gpucost.schemas.arrow import EVENT_SCHEMA
from gpucost.schemas.codec import decode_line, encode_event, present_fields
from gpucost.schemas.events import Event
from gpucost.schemas.ipc import MAX_ROWS, IpcRefused, conform, decode_ipc, encode_ipc
from gpucost.schemas.topics import CONTROL_HEADER, END_OF_INPUT
from gpucost.streams.settings import AuditSettings
from tests.fake_kafka import Message
from tests.support.hostile import (
    CONFIGS,
    KEY,
    SECRET_A,
    SECRET_B,
    apply,
    billed,
    expected_micro_usd,
    keyring,  # noqa: F401 (a fixture)
    letters,
    report,
    sign_prices,
    signed,
)
from tests.support.worker_input import LINES

EVENTS: list[Event] = [decode_line(line) for line in LINES[KEY]]  # type: ignore[misc]
OTHER = next(k for k in LINES if k != KEY)


def _stream(table: pa.Table, **options: object) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=pa.ipc.IpcWriteOptions(**options)) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _rows(batch: pa.RecordBatch) -> list[dict]:
    return [present_fields(row) for row in batch.to_pylist()]


# --- the decoder ---------------------------------------------------------------------------------------------


def test_every_event_comes_back_as_it_went() -> None:
    """Each row decodes to the event it was made from, and to what its JSON line decodes to."""
    batch = conform(decode_ipc(encode_ipc(EVENTS)))
    assert batch.schema == EVENT_SCHEMA and batch.num_rows == len(EVENTS)
    assert [decode_line(row) for row in _rows(batch)] == EVENTS
    assert [decode_line(row) for row in _rows(batch)] == [decode_line(encode_event(e)) for e in EVENTS]


def test_a_value_cut_anywhere_is_refused_or_whole() -> None:
    """Cut at every byte: refused, or (only the end-of-stream marker lost, which Arrow lets a stream leave out)
    every row as sent."""
    value = encode_ipc(EVENTS[:40])
    whole = _rows(decode_ipc(value))
    outcomes = set()
    for cut in range(len(value)):
        try:
            rows = _rows(decode_ipc(value[:cut]))
        except IpcRefused:
            outcomes.add("refused")
            continue
        assert rows == whole and cut >= len(value) - 8
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
        decode_ipc(_stream(table))


def test_a_dictionary_bomb_is_refused_before_it_is_expanded() -> None:
    """A dictionary of one 1 MB string under a million indices would decode to a terabyte of text."""
    bomb = pa.DictionaryArray.from_arrays(pa.array([0] * 1_000_000, pa.int32()), pa.array(["x" * 1_000_000]))
    value = _stream(pa.table({"kind": bomb}))
    assert len(value) < 8 << 20
    with pytest.raises(IpcRefused, match="dictionary"):
        decode_ipc(value)


def test_a_compression_bomb_is_refused_before_it_is_decompressed() -> None:
    """A 256 MB name packs into a few kilobytes of zstd; the batch is refused on its header."""
    value = _stream(pa.table({"kind": ["gpu_sample"], "gpu_uuid": ["x" * (256 << 20)]}), compression="zstd")
    assert len(value) < 64 << 10
    with pytest.raises(IpcRefused, match="compressed"):
        decode_ipc(value)


def _claiming(rows: int) -> bytes:
    """A valid batch of 7,777 rows whose header (and field nodes) claim ``rows``: the count patched in place."""
    value = _stream(pa.table({"kind": ["gpu_sample"] * 7_777}))
    old, new = struct.pack("<q", 7_777), struct.pack("<q", rows)
    assert value.count(old) >= 2
    return value.replace(old, new)


@pytest.mark.parametrize("rows", [2**31, MAX_ROWS + 1, 2**63 - 1, -1])
def test_a_batch_claiming_more_rows_than_a_message_may_hold_is_refused(rows: int) -> None:
    with pytest.raises(IpcRefused, match=r"claims .* rows"):
        decode_ipc(_claiming(rows))


def test_a_batch_claiming_more_rows_than_its_buffers_hold_is_refused() -> None:
    with pytest.raises(IpcRefused, match="cannot be read"):
        decode_ipc(_claiming(MAX_ROWS))


def test_one_batch_a_message() -> None:
    table = pa.table({"kind": ["gpu_sample"] * 4})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=2)
    with pytest.raises(IpcRefused, match="after its record batch"):
        decode_ipc(sink.getvalue().to_pybytes())
    with pytest.raises(IpcRefused, match="ends before"):
        decode_ipc(_stream(table)[: len(_stream(table.slice(0, 0))) - 8])


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
    for row in _rows(batch):
        decode_line(row)


# --- the producer's values -------------------------------------------------------------------------------


@given(st.integers(4096, 60_000), st.integers(0, len(EVENTS)), st.sampled_from(["arrow", "json"]))
def test_values_fit_the_limit_keep_the_order_and_say_their_encoding(limit: int, n: int, encoding: str) -> None:
    """Every event once, in order, in values of at most ``limit`` bytes; Arrow only where asked for and the batch
    has ``ARROW_MIN_EVENTS`` events, each value with the header its bytes need."""
    values = list(message_values(EVENTS[:n], encoding, limit))
    assert all(isinstance(v, Oversized) or len(v[0]) <= limit for v in values)
    assert [decode_line(e) for v in values for e in _events_of(v)] == EVENTS[:n]
    arrow = [v for v in values if not isinstance(v, Oversized) and v[1] == ARROW_HEADERS]
    assert bool(arrow) == (encoding == "arrow" and n >= ARROW_MIN_EVENTS)


def _events_of(value: tuple[bytes, tuple] | Oversized) -> list:
    """The wire objects (or lines) a value carries, read as a worker reads it: by its header."""
    if isinstance(value, Oversized):
        return [str(value)]
    data, headers = value
    if headers == ARROW_HEADERS:
        return _rows(decode_ipc(data))
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


# --- the worker ---------------------------------------------------------------------------------------------


def _arrow(key: bytes, events: list[Event], offset: int) -> Message:
    return Message(key, encode_ipc(events), offset, list(ARROW_HEADERS))


def _end(offset: int) -> Message:
    return Message(KEY, b"", offset, [(CONTROL_HEADER, END_OF_INPUT)])


def _comparable(out: list) -> list[str]:
    """The records as published, dead letters without their raw text (JSON keeps the line, Arrow re-encodes)."""
    return [
        r.model_copy(update={"raw": ""}).model_dump_json() if hasattr(r, "raw") else r.model_dump_json() for r in out
    ]


@CONFIGS
def test_arrow_messages_give_what_json_lines_give(audit: AuditSettings) -> None:
    """Every record, in order, the same from the same events in either encoding, cut into messages alike."""
    cuts = [0, 7, 150, 151, 400, len(EVENTS)]
    json_messages = [Message(KEY, b"\n".join(LINES[KEY][a:b]), i) for i, (a, b) in enumerate(zip(cuts, cuts[1:]))]
    arrow_messages = [_arrow(KEY, EVENTS[a:b], i) for i, (a, b) in enumerate(zip(cuts, cuts[1:]))]
    n = len(json_messages)
    from_json, _ = apply(Worker(KafkaSettings(), audit, group="g"), [*json_messages, _end(n)])
    from_arrow, _ = apply(Worker(KafkaSettings(), audit, group="g"), [*arrow_messages, _end(n)])
    assert _comparable(from_arrow) == _comparable(from_json)
    assert billed(from_arrow) == expected_micro_usd(LINES[KEY], audit) > 0


def _hostile_values() -> dict[str, bytes]:
    table = pa.table({"kind": ["gpu_sample"]})
    return {
        "arrow: cut short": encode_ipc(EVENTS[:50])[:-40],
        "arrow: JSON under the header": b"\n".join(LINES[KEY][:5]),
        "arrow: schema mismatch": _stream(pa.table({"kind": ["gpu_sample"], "ts_ns": ["soon"]})),
        "arrow: claims 2^31 rows": _claiming(2**31),
        "arrow: dictionary bomb": _stream(
            pa.table({"kind": pa.DictionaryArray.from_arrays(pa.array([0] * 100_000, pa.int32()), pa.array(["x" * 9]))})
        ),
        "arrow: zstd bomb": _stream(pa.table({"kind": ["x" * (16 << 20)]}), compression="zstd"),
        "arrow: two batches": _stream(table)[:-8] + _stream(table)[len(_stream(table.slice(0, 0))) - 8 :],
    }


@pytest.mark.parametrize("attack", list(_hostile_values()))
@CONFIGS
def test_a_hostile_arrow_message_is_refused_and_the_next_one_billed(audit: AuditSettings, attack: str) -> None:
    worker = Worker(KafkaSettings(), audit, group="g")
    bad = Message(KEY, _hostile_values()[attack], 0, list(ARROW_HEADERS))
    out, owned = apply(worker, [bad, _arrow(KEY, EVENTS, 1), _end(2)])
    refused = letters(out)
    assert [d.reason for d in refused] == ["bad_message"] and refused[0].source.endswith("@0")
    assert "skipped" in refused[0].detail and len(refused[0].raw) < 70_000
    assert worker.counts["bad_message"] == 1
    report(attack, len(EVENTS) + 1, refused, billed(out), expected_micro_usd(LINES[KEY], audit), audit)
    assert billed(out) == expected_micro_usd(LINES[KEY], audit)


@CONFIGS
def test_an_unknown_encoding_is_refused_whole(audit: AuditSettings) -> None:
    worker = Worker(KafkaSettings(), audit, group="g")
    out, owned = apply(worker, [Message(KEY, encode_ipc(EVENTS), 0, [("gpucost-encoding", b"protobuf")])])
    assert [d.reason for d in letters(out)] == ["bad_message"] and not owned.auditors
    assert "protobuf" in letters(out)[0].detail


@CONFIGS
def test_another_gpus_rows_in_an_arrow_message_are_refused_row_by_row(audit: AuditSettings) -> None:
    """A message keyed for one GPU carrying another's samples bills neither twice: the vectorised scope check
    refuses each foreign row as the JSON path refuses each foreign line."""
    foreign = [decode_line(line) for line in LINES[OTHER] if b'"gpu_sample"' in line][:5]
    worker = Worker(KafkaSettings(), audit, group="g")
    out, _ = apply(worker, [_arrow(KEY, [*EVENTS[:100], *foreign, *EVENTS[100:]], 0), _end(1)])  # type: ignore[list-item]
    assert [d.reason for d in letters(out)] == ["wrong_key"] * 5
    assert billed(out) == expected_micro_usd(LINES[KEY], audit)
    report("arrow: another GPU's rows", len(EVENTS) + 5, letters(out), billed(out), billed(out), audit)


@CONFIGS
def test_a_signed_arrow_message_verifies_and_its_header_is_signed(audit: AuditSettings, keyring: Keyring) -> None:
    """Signed as a producer signs it, it is billed; the same bytes with the encoding header taken off (read as
    JSON Lines) or put on a signed JSON Lines message are refused as altered."""
    events = [decode_line(line) for line in sign_prices(LINES[KEY])]
    value = encode_ipc(events)  # type: ignore[arg-type]
    good = signed(KEY, value, SECRET_A, "node-a", list(ARROW_HEADERS), offset=1)
    stripped = Message(KEY, value, 0, [h for h in good.headers if h not in ARROW_HEADERS])
    lines = b"\n".join(sign_prices(LINES[KEY]))
    json_signed = signed(KEY, lines, SECRET_A, "node-a")
    added = Message(KEY, lines, 0, [*json_signed.headers, *ARROW_HEADERS])
    end = signed(KEY, b"", SECRET_A, "node-a", [(CONTROL_HEADER, END_OF_INPUT)], offset=2)
    for hostile in (stripped, added):
        worker = Worker(KafkaSettings(), audit, group="g", keyring=keyring)
        out, _ = apply(worker, [hostile, good, end])
        assert {d.reason for d in letters(out)} == {"bad_signature"}
        assert billed(out) == expected_micro_usd(sign_prices(LINES[KEY]), audit) > 0
    report("arrow: signature header stripped or added", 2, letters(out), billed(out), billed(out), audit)


@CONFIGS
def test_json_and_arrow_messages_of_one_key_interleave(audit: AuditSettings) -> None:
    """A key's messages in both encodings in one poll (a producer upgraded mid-stream): each run of one encoding
    goes through the batch path alone, and every record is what all-JSON input gives."""
    cuts = [0, 40, 90, 200, 260, len(EVENTS)]
    spans = list(zip(cuts, cuts[1:]))
    mixed = [
        _arrow(KEY, EVENTS[a:b], i) if i % 2 else Message(KEY, b"\n".join(LINES[KEY][a:b]), i)
        for i, (a, b) in enumerate(spans)
    ]
    plain = [Message(KEY, b"\n".join(LINES[KEY][a:b]), i) for i, (a, b) in enumerate(spans)]
    from_mixed, _ = apply(Worker(KafkaSettings(), audit, group="g"), [*mixed, _end(len(spans))])
    from_json, _ = apply(Worker(KafkaSettings(), audit, group="g"), [*plain, _end(len(spans))])
    assert _comparable(from_mixed) == _comparable(from_json)


@CONFIGS
def test_an_arrow_message_makes_its_signer_the_gpus_owner(audit: AuditSettings, keyring: Keyring) -> None:
    """The first Arrow message a single-node key signs for a GPU of its node claims the GPU, as a JSON one does:
    another node's key then may not speak for it."""
    events = [decode_line(line) for line in sign_prices(LINES[KEY])]
    first = signed(KEY, encode_ipc(events[:200]), SECRET_A, "node-a", list(ARROW_HEADERS), offset=0)  # type: ignore[arg-type]
    other = signed(KEY, encode_ipc(events[200:]), SECRET_B, "node-b", list(ARROW_HEADERS), offset=1)  # type: ignore[arg-type]
    out, owned = apply(Worker(KafkaSettings(), audit, group="g", keyring=keyring), [first, other])
    assert owned.owners == {KEY.decode(): "node-000"}
    assert [d.reason for d in letters(out)] == ["wrong_key"]
