"""Re-delivered messages are recognised whatever order the copies arrive in; nothing new is refused."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpucost.kafka.sequences import MalformedSequence, SeenSequences, parse_sequence


@given(st.lists(st.integers(1, 60), max_size=200), st.integers(0, 200))
def test_each_number_is_applied_exactly_once(arrivals: list[int], cut: int) -> None:
    seen = SeenSequences()
    applied = []
    for i, n in enumerate(arrivals):
        if i == cut:  # the worker restarts from its committed state
            seen = SeenSequences.from_state(json.loads(json.dumps(seen.to_state())))
        if seen.first_time("s1", n):
            applied.append(n)
    assert sorted(applied) == sorted(set(arrivals))


def test_sessions_are_separate_and_headers_parse() -> None:
    seen = SeenSequences()
    assert seen.first_time("a", 1) and seen.first_time("b", 1) and not seen.first_time("a", 1)
    assert parse_sequence(b"0f3c:12") == ("0f3c", 12)
    assert parse_sequence(None) is None
    # a header no producer writes refuses its message (bad_message), whatever its length: thousands of
    # digits once stopped the worker with int()'s ValueError
    for bad in (b"12", b"s:x", b"s:0", b"s:" + b"9" * 5000, b"x" * 65 + b":1", b":1", b"s:-1", b"s:\xd9\xa3"):
        with pytest.raises(MalformedSequence):
            parse_sequence(bad)
