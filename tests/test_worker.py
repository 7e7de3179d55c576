"""The worker's message handling, without a broker: a poll's messages give each key the outputs
of applying its messages one by one, in order, whatever the interleaving of keys."""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter, defaultdict

import pytest
from aiokafka import TopicPartition
from hypothesis import given, settings
from hypothesis import strategies as st

from gpucost.kafka.owned import Owned
from gpucost.kafka.sequences import SeenSequences
from gpucost.kafka.settings import KafkaSettings
from gpucost.kafka.state import IDLE_PREFIX, PROGRESS_KEY, STATE_VERSION, StateError, restored, state_records
from gpucost.kafka.worker import Worker
from gpucost.schemas.blocks import expand
from gpucost.schemas.codec import decode_line, encode_event
from gpucost.schemas.events import MemAccess
from gpucost.schemas.records import CostRecord, DeadLetter, IdleIndexRecord, MaeRecord
from gpucost.schemas.topics import CONTROL_HEADER, END_OF_INPUT, SEQUENCE_HEADER
from gpucost.streams.audit import Auditor
from gpucost.streams.settings import AuditSettings
from tests.fake_kafka import Message, RecordingProducer
from tests.strategies import BASE_NS, NS
from tests.support.worker_input import BAD, LINES

AUDIT = AuditSettings()


@st.composite
def polls(draw: st.DrawFn) -> list[Message]:
    """Each GPU's lines cut into messages (some with bad lines, some sent twice), keys interleaved,
    and each key's end of input last."""
    queues = []
    for key, lines in LINES.items():
        cuts = sorted(draw(st.sets(st.integers(1, len(lines) - 1), max_size=6)))
        chunks = [lines[a:b] for a, b in zip([0, *cuts], [*cuts, len(lines)])]
        messages = []
        for n, chunk in enumerate(chunks, 1):
            chunk = list(chunk)
            if draw(st.booleans()):
                chunk.insert(draw(st.integers(0, len(chunk))), draw(st.sampled_from(BAD)))
            m = (b"\n".join(chunk), [(SEQUENCE_HEADER, f"s:{n}".encode())])
            messages += [m, m] if draw(st.integers(0, 4)) == 0 else [m]
        messages.append((b"", [(CONTROL_HEADER, END_OF_INPUT)]))
        queues.append((key, messages))
    out: list[Message] = []
    while any(q for _, q in queues):
        key, q = draw(st.sampled_from([kq for kq in queues if kq[1]]))
        value, headers = q.pop(0)
        out.append(Message(key, value, len(out), headers))
    return out


def one_by_one(messages: list[Message]) -> dict[bytes, list]:
    """What each key's messages give applied one at a time, in order: every line labelled
    ``topic[partition]@offset#line``."""
    auditors: dict[bytes, Auditor] = {}
    seen: set[tuple[bytes, bytes]] = set()
    out: dict[bytes, list] = defaultdict(list)
    for m in messages:
        auditor = auditors.setdefault(m.key, Auditor(AUDIT))
        headers = dict(m.headers)
        if SEQUENCE_HEADER in headers:
            if (m.key, headers[SEQUENCE_HEADER]) in seen:
                continue
            seen.add((m.key, headers[SEQUENCE_HEADER]))
        if headers.get(CONTROL_HEADER) == END_OF_INPUT:
            out[m.key] += auditor.finish()
            continue
        lines = [(n, line) for n, line in enumerate(m.value.split(b"\n")) if line.strip()]
        out[m.key] += expand(
            auditor.ingest_lines(
                [line for _, line in lines],
                lambda i, m=m, lines=lines: f"{m.topic}[{m.partition}]@{m.offset}#{lines[i][0]}",
            )
        )
    return out


@pytest.mark.slow
@settings(max_examples=25, deadline=None)
@given(polls(), st.integers(1, 12))
def test_a_poll_gives_each_key_its_messages_outputs_in_order(messages: list[Message], polls_of: int) -> None:
    """Each key's outputs are what its messages give alone, whatever shares the polls; but for the one rule
    that depends on what shares a partition (a silent GPU's panes closing), which is kept out of reach."""
    worker = Worker(KafkaSettings(), AuditSettings(idle_timeout_s=366 * 86_400), group="g")
    owned = Owned(producer=None, auditors={}, sequences={}, next_offset=0)  # type: ignore[arg-type]
    key_at = {m.offset: m.key for m in messages}
    got: dict[bytes, list] = defaultdict(list)
    for i in range(0, len(messages), polls_of):  # the messages as several polls
        for record in worker.apply(owned, messages[i : i + polls_of], set(), Counter()):
            if isinstance(record, DeadLetter):  # source: topic[partition]@offset#line
                got[key_at[int(record.source.split("@")[1].split("#")[0])]].append(record)
            else:
                got[record.gpu_uuid.encode()].append(record)
    want = one_by_one(messages)
    assert {k: [r.model_dump() for r in v] for k, v in got.items()} == {
        k: [r.model_dump() for r in v] for k, v in want.items() if v
    }
    assert not any(a.open_panes() for a in owned.auditors.values())  # every key ended


@given(st.binary(min_size=1, max_size=64), st.integers(1, 64))
def test_output_partitions_are_the_default_partitioners(key: bytes, partitions: int) -> None:
    """Records are batched per partition by hand: each key must land where ``send(key=…)`` put it."""
    from aiokafka.partitioner import DefaultPartitioner

    from gpucost.kafka.outputs import key_slot

    every = list(range(partitions))
    assert key_slot(key, partitions) == DefaultPartitioner()(key, every, every)


def seen_sets(auditor: Auditor) -> dict[tuple[str, int], dict[tuple[str, int], list[int]]]:
    """What each open pane holds to refuse duplicates, as held (``to_state`` may write it from a cache)."""
    return {(pane.gpu_uuid, pane.pane_start_ns): pane.seen for pane in auditor.panes.open_totals()}


@pytest.mark.slow
@settings(max_examples=25, deadline=None)
@given(polls(), st.integers(1, 12))
def test_the_state_topic_restores_every_key_and_writes_idle_windows_only_when_a_pane_closed(
    messages: list[Message], polls_of: int
) -> None:
    """After every transaction, the latest value of each state record (what compaction keeps) restores
    each key's auditor exactly; a key's idle windows are written only when a pane of it closed."""
    worker = Worker(KafkaSettings(), AUDIT, group="g")
    tp = TopicPartition("gpucost.events", 3)
    producer = RecordingProducer()
    owned = worker.owned[tp] = Owned(producer, {}, {}, 0)  # type: ignore[arg-type]
    latest: dict[bytes, bytes | None] = {}
    for i in range(0, len(messages), polls_of):
        before = {k: (a, a.idle.rolls) for k, a in owned.auditors.items()}
        asyncio.run(worker.process(tp, messages[i : i + polls_of]))
        for topic, key, value in producer.transactions[-1]:
            assert topic == "gpucost.state.events"
            latest[key] = value
            if key.startswith(IDLE_PREFIX) and value is not None:
                auditor, rolls = before.get(key[len(IDLE_PREFIX) :].decode(), (None, -1))
                assert auditor is not owned.auditors[key[len(IDLE_PREFIX) :].decode()] or rolls != auditor.idle.rolls
        state = restored(AUDIT, latest)
        auditors, sequences = state.auditors, state.sequences
        assert state.next_offset == messages[min(i + polls_of, len(messages)) - 1].offset + 1
        assert {k: a.to_state() for k, a in auditors.items()} == {k: a.to_state() for k, a in owned.auditors.items()}
        assert {k: seen_sets(a) for k, a in auditors.items()} == {k: seen_sets(a) for k, a in owned.auditors.items()}
        assert {k: s.to_state() for k, s in sequences.items()} == {
            k: s.to_state() for k, s in owned.sequences.items() if k in owned.auditors
        }
    # every key ended: what stays of each is its watermarks and the message numbers it applied
    assert all(
        not json.loads(v)["audit"]["panes"]["open"]
        for k, v in latest.items()
        if k != PROGRESS_KEY and not k.startswith(IDLE_PREFIX)
    )


def test_a_state_written_whole_before_is_still_restored() -> None:
    """State topics written before the idle windows were written apart hold them inside each key's state."""
    auditor = Auditor(AUDIT)
    auditor.ingest_lines(LINES[next(iter(LINES))], str)
    whole = json.dumps({"audit": auditor.to_state(), "seq": SeenSequences().to_state()}).encode()
    state = restored(AUDIT, {b"gpu": whole, PROGRESS_KEY: b"7"})
    assert state.auditors["gpu"].to_state() == auditor.to_state() and state.next_offset == 7


def _written(lines: list[bytes]) -> tuple[Auditor, dict[bytes, bytes | None]]:
    """A key's auditor after ``lines``, and the state records a worker wrote for it."""
    worker, producer = Worker(KafkaSettings(), AUDIT, group="g"), RecordingProducer()
    tp = TopicPartition("gpucost.events", 0)
    owned = worker.owned[tp] = Owned(producer, {}, {}, 0)  # type: ignore[arg-type]
    key = b"GPU-v"
    asyncio.run(worker.process(tp, [Message(key, b"\n".join(lines), 0)]))
    return owned.auditors[key.decode()], {k: v for _, k, v in producer.transactions[-1]}


def test_every_state_record_carries_the_version_and_an_unmarked_one_is_read_as_version_0() -> None:
    auditor, latest = _written(LINES[next(iter(LINES))])
    assert {json.loads(v)["v"] for v in latest.values() if v is not None} == {STATE_VERSION}
    unmarked = {}
    for k, v in latest.items():  # as gpucost wrote them before records carried a version
        record = json.loads(v)
        del record["v"]
        unmarked[k] = json.dumps(
            record["idle"] if k.startswith(IDLE_PREFIX) else record["next_offset"] if k == PROGRESS_KEY else record
        ).encode()
    for state in (restored(AUDIT, latest), restored(AUDIT, unmarked)):
        assert state.auditors["GPU-v"].to_state() == auditor.to_state() and state.next_offset == 1


@pytest.mark.parametrize("which", ["key", "idle", "progress"])
@pytest.mark.parametrize("version", [STATE_VERSION + 1, 10**6, "1", -1])
def test_a_state_record_of_a_later_or_unknown_version_is_refused_by_name(which: str, version: object) -> None:
    """Read as if it were this version, a later layout would be restored wrongly and billed from: the
    worker stops, naming the record and what to run instead."""
    _, latest = _written(LINES[next(iter(LINES))])
    key = {"key": b"GPU-v", "idle": IDLE_PREFIX + b"GPU-v", "progress": PROGRESS_KEY}[which]
    record = json.loads(latest[key])
    record["v"] = version
    latest[key] = json.dumps(record).encode()
    with pytest.raises(StateError, match=re.escape(f"state version {version!r}") + ".*newer gpucost"):
        restored(AUDIT, latest)


def test_a_key_ended_and_begun_again_in_one_poll_writes_its_new_idle_windows() -> None:
    """The new auditor may have rolled as many panes as the old one had when its windows were last
    written: the windows are still new."""
    key = next(iter(LINES))
    lines = [line for line in LINES[key] if b'"gpu_sample"' in line]
    half = len(lines) // 2
    worker = Worker(KafkaSettings(), AUDIT, group="g")
    tp = TopicPartition("gpucost.events", 3)
    producer = RecordingProducer()
    owned = worker.owned[tp] = Owned(producer, {}, {}, 0)  # type: ignore[arg-type]
    latest: dict[bytes, bytes | None] = {}
    asyncio.run(worker.process(tp, [Message(key, b"\n".join(lines[:half]), 0)]))
    latest.update((key, value) for _, key, value in producer.transactions[-1])
    old = owned.auditors[key.decode()]
    rolls_written = old.idle.rolls
    asyncio.run(
        worker.process(
            tp, [Message(key, b"", 1, [(CONTROL_HEADER, END_OF_INPUT)]), Message(key, b"\n".join(lines[half:]), 2)]
        )
    )  # later panes
    latest.update((key, value) for _, key, value in producer.transactions[-1])
    new = owned.auditors[key.decode()]
    assert new is not old and new.idle.rolls == rolls_written > 0  # what makes the case
    assert restored(AUDIT, latest).auditors[key.decode()].to_state() == new.to_state()


def test_a_process_gone_silent_has_its_mae_window_published_once_its_partition_moves_on() -> None:
    """A ``mem_access`` key is one process: when it exits it sends no end of input, and its partial window would
    stay in the worker and its state for good. Once another process of its partition has moved ``idle_timeout_s``
    of event time past its last address, and nothing of it came for that long on the clock, the window is
    published as at an end of input, and written as closed; the same pid's next address starts a new window."""

    def lines(pid: int, start_s: int, count: int, step_ms: int) -> list[bytes]:
        return [
            encode_event(
                MemAccess(
                    node_id="node-0",
                    pid=pid,
                    ts_ns=BASE_NS + start_s * NS + i * step_ms * 10**6,
                    address=(i * 2654435761) % (1 << 32),
                )
            ).encode()
            for i in range(count)
        ]

    exited, busy = b"node-0/7", b"node-0/9"
    audit = AuditSettings(mae_window=64)
    worker = Worker(KafkaSettings(), audit, group="g")
    clock = [0.0]
    worker.monotonic = lambda: clock[0]
    owned = Owned(RecordingProducer(), {}, {}, 0, since=0.0)  # type: ignore[arg-type]
    out = worker.apply(owned, [Message(exited, b"\n".join(lines(7, 0, 100, 1000)), 0)], set(), Counter())
    assert [r.n for r in out if isinstance(r, MaeRecord)] == [64]  # the 36 after it: an open window
    # the other process an hour ahead in event time, but the first heard from a moment ago: only behind
    clock[0] = audit.idle_timeout_s - 1
    touched: set[str] = set()
    out = worker.apply(owned, [Message(busy, b"\n".join(lines(9, 3600, 10, 1000)), 1)], touched, Counter())
    assert not [r for r in out if isinstance(r, MaeRecord)] and exited.decode() not in touched
    clock[0] = audit.idle_timeout_s  # and now silent in both times
    out = worker.apply(owned, [Message(busy, b"\n".join(lines(9, 3610, 1, 1000)), 2)], touched, Counter())
    closed = [r for r in out if isinstance(r, MaeRecord)]
    assert [(r.pid, r.n, r.first_ts_ns, r.last_ts_ns) for r in closed] == [
        (7, 36, BASE_NS + 64 * NS, BASE_NS + 99 * NS)
    ]
    assert exited.decode() in touched and owned.auditors[exited.decode()].counts["mae_silent_closes"] == 1
    state = dict(state_records(exited.decode(), owned.auditors[exited.decode()], SeenSequences(), None, {}))
    assert restored(audit, state).auditors[exited.decode()].mae.latest_ns() == {}  # written closed
    again = worker.apply(owned, [Message(exited, b"\n".join(lines(7, 7200, 64, 1000)), 3)], set(), Counter())
    assert [(r.n, r.first_ts_ns) for r in again if isinstance(r, MaeRecord)] == [(64, BASE_NS + 7200 * NS)]


def test_a_gpu_gone_silent_has_its_last_panes_closed_once_its_partition_moves_on() -> None:
    """A GPU taken off the fleet sends no end of input: its open panes close once another key of its
    partition has moved ``idle_timeout_s`` of event time past their end (docs/definitions.md, "Time, panes and
    watermarks") and nothing of it
    came for that long on the worker's clock, billed as an end of input would have billed them; its own
    events for them later are duplicates (of what the revision horizon keeps), never billed twice."""
    gone, other = list(LINES)[:2]
    start = min(json.loads(line)["ts_ns"] for line in LINES[gone] if b'"gpu_sample"' in line)
    first = [line for line in LINES[gone] if decode_line(line).ts_ns < start + 10 * 60 * 10**9]  # type: ignore[union-attr]
    alone = Auditor(AUDIT)
    records = expand(alone.ingest_lines(first, str)) + alone.finish()
    want = sum(r.cost_micro_usd for r in records if isinstance(r, CostRecord))
    panes = {r.pane_start_ns for r in records if isinstance(r, IdleIndexRecord)}
    worker = Worker(KafkaSettings(), AUDIT, group="g")
    clock = [0.0]
    worker.monotonic = lambda: clock[0]
    owned = Owned(RecordingProducer(), {}, {}, 0, since=0.0)  # type: ignore[arg-type]
    out = worker.apply(owned, [Message(gone, b"\n".join(first), 0, [(SEQUENCE_HEADER, b"s:1")])], set(), Counter())
    assert {r.pane_start_ns for r in out if isinstance(r, IdleIndexRecord)} < panes  # the last ones stay open
    # another key 20 min ahead in event time, but the silent one was heard from a moment ago: only behind
    clock[0] = AUDIT.idle_timeout_s - 1
    touched: set[str] = set()
    out += worker.apply(owned, [Message(other, b"\n".join(LINES[other]), 1)], touched, Counter())
    assert gone.decode() not in touched
    clock[0] = AUDIT.idle_timeout_s  # and now silent in both times
    out += worker.apply(owned, [Message(other, b"\n".join(LINES[other][-1:]), 2)], touched, Counter())
    mine = [r for r in out if getattr(r, "gpu_uuid", None) == gone.decode()]
    assert {r.pane_start_ns for r in mine if isinstance(r, IdleIndexRecord)} == panes
    assert sum(r.cost_micro_usd for r in mine if isinstance(r, CostRecord)) == want
    assert gone.decode() in touched and owned.auditors[gone.decode()].counts["silent_closes"] > 0
    again = worker.apply(owned, [Message(gone, b"\n".join(first), 3, [(SEQUENCE_HEADER, b"s2:1")])], set(), Counter())
    assert not [r for r in again if isinstance(r, CostRecord)]
    samples = sum(1 for line in first if b'"gpu_sample"' in line or b'"process_sample"' in line)
    assert Counter(
        r.reason for r in again if isinstance(r, DeadLetter) and r.kind in ("gpu_sample", "process_sample")
    ) == Counter({"duplicate": samples})  # (its prices and bindings: too)
    # and once the partition has moved a whole idle window past its last pane, its window goes too
    sample = json.loads(next(line for line in LINES[other] if b'"gpu_sample"' in line))
    later = [
        json.dumps(dict(sample, ts_ns=start + (AUDIT.window_h * 3600 + 3600 + k) * 10**9)).encode() for k in (0, 10)
    ]  # two: one alone that far ahead is only a pending jump
    assert owned.auditors[gone.decode()].idle.to_state()
    touched = set()
    clock[0] += AUDIT.idle_timeout_s
    worker.apply(owned, [Message(other, b"\n".join(later), 4)], touched, Counter())
    assert gone.decode() in touched and owned.auditors[gone.decode()].idle.to_state() == {}
    # a GPU silent for the window and the horizon past the timeout is forgotten: nothing of it kept but the floor
    # its key's events are judged against, so that what it was billed for, sent again, is late, not billed again
    assert AUDIT.window_h * 3600 >= AUDIT.revision_horizon_s
    auditor = owned.auditors[gone.decode()]
    assert auditor.counts["forgotten_gpus"] == 1
    state = auditor.to_state()
    assert gone.decode() not in json.dumps({k: v for k, v in state.items() if k not in ("health", "allocations")})
    # but the holds no pod released (docs/definitions.md, "Allocation basis"): should it come back, they split it
    assert all(h[1] is None for h in state["allocations"]["holds"].get(gone.decode(), {}).values())
    again = worker.apply(owned, [Message(gone, b"\n".join(first), 5, [(SEQUENCE_HEADER, b"s3:1")])], set(), Counter())
    assert not [r for r in again if isinstance(r, (CostRecord, IdleIndexRecord))]
    assert Counter(
        r.reason for r in again if isinstance(r, DeadLetter) and r.kind in ("gpu_sample", "process_sample")
    ) == Counter({"late": samples})


def test_where_partitions_begin_is_asked_for_new_ones_and_a_kept_one_whose_state_is_gone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A partition kept across a rebalance knows its next offset, so where it begins is not asked (the
    consumer's connection answers only after its open fetch); if its state was read again and holds no
    progress (a state topic made anew), it is asked then, and the partition starts from its beginning."""
    new, kept, gone = (TopicPartition("t.events", p) for p in range(3))
    asked: list[list[TopicPartition]] = []
    seeks: dict[TopicPartition, int] = {}

    class Consumer:
        async def beginning_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
            asked.append(sorted(tps))
            return {tp: 100 + tp.partition for tp in tps}

        def seek(self, tp: TopicPartition, offset: int) -> None:
            seeks[tp] = offset

    class Producer(RecordingProducer):
        async def stop(self) -> None:  # a revoked partition's producer is stopped
            pass

    async def take(
        kafka: KafkaSettings,
        audit: AuditSettings,
        tp: TopicPartition,
        state_tp: TopicPartition,
        transactional_id: str,
        parked: Owned | None = None,
        audit_key: bytes | None = None,
    ) -> tuple[Owned, str]:
        """``take_partition`` without a broker: ``kept``'s state kept, the others' read again and empty."""
        if tp == kept:
            assert parked is not None
            return parked, "kept"
        return Owned(Producer(), {}, {}, -1), "restored"  # never processed, or its state gone

    monkeypatch.setattr("gpucost.kafka.worker.take_partition", take)
    worker = Worker(KafkaSettings(topic_prefix="t."), AuditSettings(), group="g")
    worker.consumer = Consumer()  # type: ignore[assignment]
    worker.owned = {kept: Owned(Producer(), {}, {}, 7), gone: Owned(Producer(), {}, {}, 9)}  # type: ignore[arg-type]

    async def rebalance() -> None:
        await worker.on_partitions_revoked([kept, gone])  # aiokafka's eager protocol revokes every partition
        await worker.on_partitions_assigned([new, kept, gone])

    asyncio.run(rebalance())
    assert asked == [[new], [gone]]
    assert seeks == {new: 100, kept: 7, gone: 102}
    assert worker.taken == {"kept": 1, "restored": 2}
