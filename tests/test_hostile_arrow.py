"""The Arrow IPC input encoding at the worker: the same bill as JSON Lines, and hostile messages.

In both configurations (revisions on by default, and off): each hostile value is one bounded ``bad_message``
dead letter, no state, and the next message billed as the embedded run bills the same events; signatures cover
the encoding header; another GPU's rows are refused row by row. The decoder's own limits are
tests/test_ipc_decoding.py.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal

import pyarrow as pa
import pytest

from gpucost.kafka.encoding import ARROW_HEADERS
from gpucost.kafka.settings import KafkaSettings
from gpucost.kafka.signing import Keyring
from gpucost.kafka.worker import Worker
from gpucost.schemas.blocks import expand
from gpucost.schemas.codec import decode_line
from gpucost.schemas.events import Event
from gpucost.schemas.ipc import encode_ipc
from gpucost.schemas.topics import CONTROL_HEADER, END_OF_INPUT
from gpucost.streams import columnar
from gpucost.streams.audit import Auditor
from gpucost.streams.settings import AuditSettings
from tests.fake_kafka import Message
from tests.support.arrow_messages import EVENTS, claiming, stream
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

OTHER = next(k for k in LINES if k != KEY)


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


@CONFIGS
@pytest.mark.parametrize("limit", [1, 30_000])
def test_a_keys_batch_cut_by_size_gives_every_record(
    audit: AuditSettings, limit: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A poll's batch of one key is cut where it would pass ``COMBINE_BYTES`` (Arrow's columns hold 2 GiB at most):
    with the limit made small, every record of every piece comes, in order, in either encoding."""
    spans = [(0, 150), (150, 300), (300, len(EVENTS))]
    for make in (
        lambda i, a, b: _arrow(KEY, EVENTS[a:b], i),
        lambda i, a, b: Message(KEY, b"\n".join(LINES[KEY][a:b]), i),
    ):
        messages = [make(i, a, b) for i, (a, b) in enumerate(spans)]
        whole, _ = apply(Worker(KafkaSettings(), audit, group="g"), [*messages, _end(3)])
        with monkeypatch.context() as patch:
            patch.setattr(columnar, "COMBINE_BYTES", limit)
            cut, _ = apply(Worker(KafkaSettings(), audit, group="g"), [*messages, _end(3)])
        assert _comparable(cut) == _comparable(whole) and billed(cut) > 0


@CONFIGS
@pytest.mark.parametrize("spelling", ["short", "-0"])
def test_a_price_reads_alike_in_either_encoding(audit: AuditSettings, spelling: str) -> None:
    """A price written ``3.99`` (or ``-0``) in JSON and the same price as an Arrow decimal (six places, no negative
    zero) give records of one text: a price is held to its six decimals, whatever its input's form."""

    def written(usd: str) -> str:
        return str(Decimal(usd).normalize()) if spelling == "short" else "-0"

    short = [
        json.dumps({**json.loads(line), "usd_per_gpu_hour": written(json.loads(line)["usd_per_gpu_hour"])}).encode()
        if b'"kind":"price"' in line
        else line
        for line in LINES[KEY]
    ]
    assert short != LINES[KEY]
    from_json, _ = apply(Worker(KafkaSettings(), audit, group="g"), [Message(KEY, b"\n".join(short), 0), _end(1)])
    events = [decode_line(line) for line in short]
    from_arrow, _ = apply(Worker(KafkaSettings(), audit, group="g"), [_arrow(KEY, events, 0), _end(1)])  # type: ignore[arg-type]
    assert _comparable(from_arrow) == _comparable(from_json)


@CONFIGS
def test_a_state_written_with_short_prices_restores_them_at_six_places(audit: AuditSettings) -> None:
    """A state from before prices were held to six decimals holds ``3.99``; restored, it publishes what an
    uninterrupted run publishes."""
    half = len(LINES[KEY]) // 2
    straight = Auditor(audit)
    want = expand(straight.ingest_lines(LINES[KEY], str)) + straight.finish()
    first = Auditor(audit)
    got = expand(first.ingest_lines(LINES[KEY][:half], str))
    text = json.dumps(first.to_state())
    state = json.loads(re.sub(r'"([0-9]+\.[0-9]+?)0+"', r'"\1"', text))  # "2.210000" → "2.21"
    assert json.dumps(state) != text
    restored = Auditor.from_state(state, audit)
    got += expand(restored.ingest_lines(LINES[KEY][half:], str)) + restored.finish()
    assert [r.model_dump_json() for r in got] == [r.model_dump_json() for r in want]


def _hostile_values() -> dict[str, bytes]:
    table = pa.table({"kind": ["gpu_sample"]})
    return {
        "arrow: cut short": encode_ipc(EVENTS[:50])[:-40],
        "arrow: JSON under the header": b"\n".join(LINES[KEY][:5]),
        "arrow: schema mismatch": stream(pa.table({"kind": ["gpu_sample"], "ts_ns": ["soon"]})),
        "arrow: claims 2^31 rows": claiming(2**31),
        "arrow: dictionary bomb": stream(
            pa.table({"kind": pa.DictionaryArray.from_arrays(pa.array([0] * 100_000, pa.int32()), pa.array(["x" * 9]))})
        ),
        "arrow: zstd bomb": stream(pa.table({"kind": ["x" * (16 << 20)]}), compression="zstd"),
        "arrow: two batches": stream(table)[:-8] + stream(table)[len(stream(table.slice(0, 0))) - 8 :],
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
