"""The producer's outbox: whatever the bound, messages leave in the order they came, none lost."""

from __future__ import annotations

import asyncio
import itertools
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpucost.kafka.outbox import Message, Outbox
from gpucost.kafka.publish import Stopped, publish
from gpucost.kafka.settings import KafkaSettings
from gpucost.producers.simulate import FleetSpec, simulate


def msg(i: int) -> Message:
    return Message("events", f"GPU-{i % 3}".encode(), b"x" * (i % 50) + str(i).encode(), (("h", bytes([i % 256])),))


@pytest.mark.slow
@given(
    st.lists(
        st.one_of(st.tuples(st.just("in"), st.integers(1, 20)), st.tuples(st.just("out"), st.integers(1, 20))),
        max_size=40,
    ),
    st.integers(1, 2000),
    st.integers(0, 5),
)
def test_fifo_through_memory_and_spool(ops: list[tuple[str, int]], bound: int, crash_at: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        spool = Path(tmp) / "spool"
        box = Outbox(spool, bound)
        sent: list[Message] = []
        acked: list[Message] = []
        n = 0
        for step, (op, k) in enumerate(ops):
            if op == "in":
                for _ in range(k):
                    box.append(m := msg(n))
                    sent.append(m)
                    n += 1
            else:
                head = box.head(k)
                assert head == sent[len(acked) : len(acked) + len(head)]  # always the oldest unacknowledged
                box.pop(len(head))
                acked += head
            if step == crash_at:  # the producer dies here: the next one sends what the spool holds, in order
                memory_only = box.memory_only()  # dies with the process
                survivors = Outbox(spool, bound)
                resent = []
                while head := survivors.head(7):
                    resent += head
                    survivors.pop(len(head))
                where = [sent.index(m) for m in resent]
                assert where == sorted(set(where))  # in the order sent, each once
                assert set(sent[len(acked) :]) - set(memory_only) <= set(resent)
                assert not spool.exists()
                return
        assert len(box) == len(sent) - len(acked)
        while head := box.head(5):
            acked += head
            box.pop(len(head))
        assert acked == sent
        assert not spool.exists()


@given(st.integers(0, 30), st.integers(0, 30), st.integers(1, 3000))
def test_a_stopped_producer_keeps_every_waiting_message(n: int, acked: int, bound: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        spool = Path(tmp) / "spool"
        box = Outbox(spool, bound)
        sent = [msg(i) for i in range(n)]
        for m in sent:
            box.append(m)
        done = len(box.head(acked))  # the broker acknowledged these
        box.pop(done)
        kept = box.close()
        again = Outbox(spool, bound)
        resent = []
        while head := again.head(4):
            resent += head
            again.pop(len(head))
        assert kept == n - done and resent == sent[done:]


@pytest.mark.slow
def test_publish_stops_when_told_while_its_source_is_busy_and_the_broker_away(tmp_path: Path) -> None:
    """A source that never ends and a broker nobody runs: ``stop`` ends the producer within seconds, with
    what was not acknowledged in the spool (a cancelled task could lose its cancellation in asyncio.wait_for)."""
    endless = itertools.chain.from_iterable(itertools.repeat(list(simulate(FleetSpec(gpus=2, hours=0.05)))))

    async def run() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(3, stop.set)
        await asyncio.wait_for(
            publish(
                endless,
                KafkaSettings(bootstrap="127.0.0.1:1"),
                flush_interval_s=0.2,
                spool=tmp_path / "spool",
                buffer_bytes=1 << 16,
                stop=stop,
            ),
            timeout=60,
        )

    with pytest.raises(Stopped):
        asyncio.run(run())
    assert (tmp_path / "spool").stat().st_size > 0
