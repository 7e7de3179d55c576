"""Which messages of a key the worker has applied, by producer session and sequence number.

A producer numbers its messages per key (1, 2, …) within a session; a message the broker
holds twice (sent again after an attempt that did arrive, or a spool sent again) carries
the same number and is applied once. Numbers may arrive out of order after a partial
failure, so this keeps exactly which numbers were seen: everything up to a contiguous floor,
and the few above it. State stays small while messages arrive in order, which they do.
"""
from __future__ import annotations

from typing import Any

__all__ = ["SeenSequences", "parse_sequence"]

MAX_SESSIONS = 16  # producer restarts remembered per key; an older session's re-send falls back to event dedupe


def parse_sequence(header: bytes | None) -> tuple[str, int] | None:
    """``(session, n)`` of a sequence header, or None when absent or malformed (then always applied)."""
    if header is None:
        return None
    session, _, n = header.decode("ascii", "replace").rpartition(":")
    return (session, int(n)) if session and n.isdigit() and int(n) > 0 else None


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
    def from_state(cls, state: dict[str, list[Any]]) -> "SeenSequences":
        seen = cls()
        seen._sessions = {s: [floor, list(above)] for s, (floor, above) in state.items()}
        return seen
