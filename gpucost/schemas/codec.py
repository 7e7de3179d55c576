"""JSON Lines encoding of events: one object per line with ``kind`` and the wire fields."""

from __future__ import annotations

import contextlib
import json
from typing import Any, NamedTuple

from pydantic import ValidationError

from gpucost.schemas.events import EVENT_MODELS, Event

__all__ = [
    "REASONS",
    "Rejected",
    "decode_line",
    "decode_object",
    "encode_event",
    "explain",
    "JSON_TEXT_FIELDS",
    "present_fields",
    "raw_text",
    "reason_of",
]

#: every dead-letter reason, and what it means (the README's catalogue is this table)
REASONS: dict[str, str] = {
    "malformed_json": "the line is not valid JSON (torn write, wrong encoding)",
    "not_an_object": "valid JSON, but not an object",
    "unknown_kind": "the kind is missing or not one of the input kinds",
    "missing_field": "a required field is absent",
    "wrong_type": "a field has the wrong JSON type (a string for a number, a float for an integer, a bool)",
    "non_finite": "NaN or ±Infinity where a number is required",
    "negative": "a count, size or time that cannot be negative is",
    "out_of_range": "a value outside its physical range (a percentage over 100, a temperature of 500 °C)",
    "timestamp_out_of_range": "ts_ns before 2000 or from 2100 on: a unit error (s or ms for ns) or a broken clock",
    "invalid": "breaks a rule between fields or a format rule (used > total, an interval that rounds to 0 ms, "
    "a reserved team, a ':' in a tenant field)",
    "future_timestamp": "ts_ns further ahead of the worker's clock than the allowed skew; accepting it would close "
    "its GPU's panes early and make every true event late",
    "duplicate": "an event with the same key and ts_ns was already counted (the first one wins): re-sent, never "
    "billed twice",
    "overlap": "a gpu_sample (process_sample) within three quarters of its own interval of one already counted for "
    "the same GPU (GPU and pid) in its pane: a second sampler of one device, whose time would be billed "
    "twice; run one sampler per device",
    "late": "its pane had already closed when it arrived",
    "unsigned": "signature verification is on and the message carries no signature",
    "unknown_key": "signed with a key id the verifier does not hold",
    "bad_signature": "the signature does not match the message, or the key may not sign for the event's node",
    "bad_output": "an output topic held a record that is not of its kind (sink side)",
    "bad_message": "the Kafka message itself is unusable: no key, a key that is not UTF-8 or over 256 bytes, or a "
    "gpucost header that is malformed or over its size limit, or an Arrow IPC value that cannot be read within its "
    "limits (gpucost.schemas.ipc); the whole message is refused",
    "wrong_key": "an event in a message keyed for another GPU or process (a message may only carry events of its "
    "own key), or signed by a node other than the one that owns the GPU",
    "oversized": "a single event larger than the broker accepts in one message (producer side)",
}


class Rejected(NamedTuple):
    """Why a line is not an event: a short reason code and a sentence a person can act on."""

    reason: str
    detail: str
    kind: str | None


def explain(error: ValueError) -> str:
    """One line per problem: ``field: what is wrong (got value)``; any other ValueError, its message."""
    if not isinstance(error, ValidationError):
        return str(error)
    parts = []
    for err in error.errors(include_url=False):
        loc = ".".join(str(p) for p in err["loc"]) or "event"
        msg = err["msg"].removeprefix("Value error, ")
        got = err.get("input")
        shown = "" if isinstance(got, dict) else f" (got {got!r:.60})"
        parts.append(f"{loc}: {msg}{shown}")
    return "; ".join(parts)


def reason_of(error: ValidationError) -> str:
    """The catalogue name of a validation failure, from its first error."""
    err = error.errors(include_url=False)[0]
    kind, loc, ctx, got = err["type"], err["loc"], err.get("ctx") or {}, err.get("input")
    if kind == "missing":
        return "missing_field"
    if kind == "finite_number":
        return "non_finite"
    if kind.endswith(("_type", "_parsing")) or kind == "int_from_float":
        return "wrong_type"
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        if loc and loc[-1] == "ts_ns":
            return "timestamp_out_of_range"
        lower = ctx.get("ge", ctx.get("gt"))
        if lower is not None and float(lower) >= 0 and isinstance(got, (int, float)) and got < 0:
            return "negative"
        return "out_of_range"
    return "invalid"


def decode_line(line: str | bytes | dict[str, Any]) -> Event | Rejected:
    """One JSON Lines line (or a row of an events Parquet file, as a dict) → an event, or why not."""
    if isinstance(line, dict):
        return decode_object(line)
    try:
        obj = json.loads(line)
    except ValueError as exc:  # includes UnicodeDecodeError, and integers over 4300 digits
        return Rejected("malformed_json", f"not valid JSON: {exc}", None)
    except RecursionError:
        return Rejected("malformed_json", "not valid JSON: nested too deeply", None)
    return decode_object(obj)


def decode_object(obj: object) -> Event | Rejected:
    if not isinstance(obj, dict):
        return Rejected("not_an_object", f"expected a JSON object, got {type(obj).__name__}", None)
    kind = obj.get("kind")
    model = EVENT_MODELS.get(kind) if isinstance(kind, str) else None
    if kind == "annotation_range":
        return Rejected(
            "unknown_kind",
            "annotation_range (an NVTX range) is not an input of the pipeline: a range is billed through the "
            "kernels launched in it, each carrying its range_path (gpucost collect-kernels and gpucost "
            "trace-events write it); leave the ranges out of its input (grep -v annotation_range)",
            kind,
        )
    if model is None:
        known = ", ".join(sorted(EVENT_MODELS))
        return Rejected(
            "unknown_kind", f"kind {kind!r} is not one of: {known}", kind if isinstance(kind, str) else None
        )
    try:
        return model.model_validate(obj)  # type: ignore[return-value]
    except ValidationError as exc:
        return Rejected(reason_of(exc), explain(exc), kind)
    except ValueError as exc:  # raised by a before-validator outside pydantic's wrapping
        return Rejected("invalid", str(exc), kind)


#: the fields that are a JSON object on the wire and the object's JSON text in an events Parquet file (a Parquet
#: column has one type: ``EVENT_SCHEMA``'s, text); every Parquet row is read back through ``present_fields``
JSON_TEXT_FIELDS = ("labels",)


def present_fields(row: dict[str, Any]) -> dict[str, Any]:
    """A Parquet row as the wire object it stands for: its non-null fields, a ``JSON_TEXT_FIELDS`` text as the
    object it holds. A text that is not JSON is left as it is: validation refuses it (``invalid``), as it does a
    JSON text that is not an object."""
    out = {k: v for k, v in row.items() if v is not None}
    for name in JSON_TEXT_FIELDS:
        if isinstance(out.get(name), str):
            with contextlib.suppress(ValueError, RecursionError):  # not JSON: refused as it is, by validation
                out[name] = json.loads(out[name])
    return out


#: a dead letter keeps at most this much of its input. Events are a few hundred bytes; a line of
#: megabytes, its invalid bytes escaped 4-fold and then escaped again into JSON, would make a
#: record over a Kafka topic's message limit, which would stop the worker at that line forever.
MAX_RAW_CHARS = 65_536


def raw_text(payload: str | bytes | dict[str, Any]) -> str:
    """What a dead letter keeps of an input: the line as text, or a Parquet row as a JSON line,
    cut after ``MAX_RAW_CHARS`` with a note of how much was left out."""
    if isinstance(payload, dict):
        text = json.dumps(payload, default=str, separators=(",", ":"))
    else:
        text = payload if isinstance(payload, str) else payload.decode("utf-8", "backslashreplace")
    if len(text) > MAX_RAW_CHARS:
        cut = len(text) - MAX_RAW_CHARS
        text = f"{text[:MAX_RAW_CHARS]}… [cut: {cut:,} more characters; the whole input is at its source]"
    return text


def encode_event(event: Event) -> str:
    return json.dumps(event.to_wire(), separators=(",", ":"))
