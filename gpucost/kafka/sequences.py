"""Which messages of a key the worker has applied, by producer session and sequence number.

A producer numbers its messages per key (1, 2, …) within a session; a message the broker
holds twice (sent again after an attempt that did arrive, or a spool sent again) carries
the same number and is applied once. Numbers may arrive out of order after a partial
failure, so this keeps exactly which numbers were seen: everything up to a contiguous floor,
and the few above it. State stays small while messages arrive in order, which they do.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MalformedSequence", "SeenSequences", "parse_sequence"]

MAX_SESSIONS = 16  # producer restarts remembered per key; an older session's re-send falls back to event dedupe


#: a session is a short token and n a message count: anything longer is not a header a producer wrote
MAX_SESSION_CHARS, MAX_DIGITS = 64, 19


class MalformedSequence(ValueError):
    """A sequence header that no producer writes: the message is refused (``bad_message``)."""


def parse_sequence(header: bytes | None) -> tuple[str, int] | None:
    """``(session, n)`` of a sequence header; None when absent (then always applied).

    Raises ``MalformedSequence`` for a header that is not ``<session>:<n>`` with a session of at most
    64 printable ASCII characters and 1 ≤ n < 10^19: parsing thousands of digits would raise (Python
    caps int conversion at 4,300 digits) or cost quadratic time, and a message one cannot number
    cannot be told apart from its copies."""
    if header is None:
        return None
    text = header.decode("ascii", "replace")
    session, _, n = text.rpartition(":")
    if not (
        0 < len(session) <= MAX_SESSION_CHARS
        and session.isprintable()
        and 0 < len(n) <= MAX_DIGITS
        and n.isascii()
        and n.isdigit()
        and int(n) > 0
    ):
        raise MalformedSequence(
            f"header gpucost-seq {text[:80]!r} is not '<session>:<n>' (session of 1-"
            f"{MAX_SESSION_CHARS} characters, n from 1 to {MAX_DIGITS} digits)"
        )
    return session, int(n)


class SeenSequences:
    def __init__(self) -> None:
        self._sessions: dict[str, list[Any]] = {}  # session → [floor, sorted numbers seen above floor + 1]

    def first_time(self, session: str, n: int) -> bool:
        """True (and remembered) the first time ``(session, n)`` is seen; False for a re-delivery."""
        state = self._sessions.get(session)
        if state is None:
            if len(self._sessions) >= MAX_SESSIONS:
                del self._sessions[next(iter(self._sessions))]  # the oldest session
            state = self._sessions[session] = [0, []]
        floor, above = state
        if n <= floor or n in above:
            return False
        above.append(n)
        above.sort()
        while above and above[0] == state[0] + 1:
            state[0] = above.pop(0)
        return True

    def to_state(self) -> dict[str, list[Any]]:
        return {s: [floor, list(above)] for s, (floor, above) in self._sessions.items()}

    @classmethod
    def from_state(cls, state: dict[str, list[Any]]) -> SeenSequences:
        seen = cls()
        seen._sessions = {s: [floor, list(above)] for s, (floor, above) in state.items()}
        return seen
