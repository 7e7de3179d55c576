"""JSON Lines encoding of events: one object per line with ``kind`` and the wire fields."""
from __future__ import annotations

import json
from typing import NamedTuple

from pydantic import ValidationError

from schemas.events import EVENT_MODELS, Event

__all__ = ["Rejected", "decode_line", "encode_event", "explain"]


class Rejected(NamedTuple):
    """Why a line is not an event: a short reason code and a sentence a person can act on."""

    reason: str
    detail: str
    kind: str | None


def explain(error: ValidationError) -> str:
    """One line per problem: ``field: what is wrong (got value)``."""
    parts = []
    for err in error.errors(include_url=False):
        loc = ".".join(str(p) for p in err["loc"]) or "event"
        msg = err["msg"].removeprefix("Value error, ")
        got = err.get("input")
        shown = "" if isinstance(got, dict) else f" (got {got!r:.60})"
        parts.append(f"{loc}: {msg}{shown}")
    return "; ".join(parts)


def decode_line(line: str | bytes) -> Event | Rejected:
    try:
        obj = json.loads(line)
    except (ValueError, UnicodeDecodeError) as exc:
        return Rejected("malformed_json", f"not valid JSON: {exc}", None)
    if not isinstance(obj, dict):
        return Rejected("not_an_object", f"expected a JSON object, got {type(obj).__name__}", None)
    kind = obj.get("kind")
    model = EVENT_MODELS.get(kind) if isinstance(kind, str) else None
    if model is None:
        known = ", ".join(sorted(EVENT_MODELS))
        return Rejected("unknown_kind", f"kind {kind!r} is not one of: {known}",
                        kind if isinstance(kind, str) else None)
    try:
        return model.model_validate(obj)  # type: ignore[return-value]
    except ValidationError as exc:
        return Rejected("invalid", explain(exc), kind)
    except ValueError as exc:  # raised by a before-validator outside pydantic's wrapping
        return Rejected("invalid", str(exc), kind)


def encode_event(event: Event) -> str:
    return json.dumps(event.to_wire(), separators=(",", ":"))
