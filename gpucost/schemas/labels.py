"""A tenant's labels (docs/definitions.md, "Labels"): the bounds, and the one canonical text the same labels from
any source become. On the wire an object of strings; held, on an event and on its tenant, as that text."""

from __future__ import annotations

import json
import re
import unicodedata
from typing import Annotated, Any

from pydantic import BeforeValidator, PlainSerializer, WithJsonSchema

__all__ = ["LABELS_MAX", "LABEL_KEY_MAX", "LABEL_VALUE_MAX", "Labels", "labels_read", "labels_text"]

#: how many labels a binding or an allocation carries at most, and how long a key and a value may be: a label is
#: part of its tenant's key, which every cost record repeats (Kubernetes' own limits are 63 characters for a
#: name, 253 for a prefix, 63 for a value; an annotation or an environment variable can be longer, and is cut
#: nowhere: it is refused, with what to do)
LABELS_MAX, LABEL_KEY_MAX, LABEL_VALUE_MAX = 16, 128, 256
_LABEL_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_./-]*")


def labels_text(value: Any) -> str | None:
    """A binding's or an allocation's ``labels`` (a JSON object of strings on the wire) as its tenant carries it:
    the object's canonical JSON text (keys sorted, no spaces, UTF-8 as is), so that the same labels give the same
    tenant key from every source; an empty object or none is None (no labels). docs/definitions.md, "Labels"."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError(f"labels must be a JSON object of strings, not {type(value).__name__}")
    if len(value) > LABELS_MAX:
        raise ValueError(f"{len(value)} labels, at most {LABELS_MAX}: send fewer (a source: name fewer --label-keys)")
    for key, text in value.items():
        if not isinstance(key, str) or len(key) > LABEL_KEY_MAX or not _LABEL_KEY.fullmatch(key):
            raise ValueError(
                f"label key {key!r} must be 1 to {LABEL_KEY_MAX} letters, digits, '_', '.', '/' or '-', "
                "beginning with a letter or digit"
            )
        if not isinstance(text, str):
            kind = "null" if text is None else type(text).__name__
            raise ValueError(f"label {key!r}: its value must be a string, not {kind}")
        if len(text) > LABEL_VALUE_MAX:
            raise ValueError(f"label {key!r}: its value has {len(text)} characters, at most {LABEL_VALUE_MAX}")
        if any(unicodedata.category(c) in ("Cc", "Cs") for c in text):
            raise ValueError(
                f"label {key!r}: its value holds a control character or an unpaired surrogate (a \\uD800 escape, "
                "which no UTF-8 text can hold): send printable text"
            )
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False) if value else None


def labels_read(text: str | None) -> dict[str, str] | None:
    """A record's ``labels`` text as the object it holds, read leniently: None for none, or for a text that is not
    a JSON object of strings (a record on a topic anyone may write: what reads it carries on without them)."""
    try:
        found = None if text is None else json.loads(text)
    except ValueError:
        return None
    if not isinstance(found, dict) or not all(isinstance(v, str) for v in found.values()):
        return None
    return found


def _labels_wire(text: str | None) -> dict[str, str] | None:
    """``labels`` back as the object it was sent as (``to_wire``, the JSON schemas)."""
    return None if text is None else json.loads(text)


#: the labels a tenant carries as dimensions to group cost by (Kubernetes labels, annotations and pod metadata,
#: environment variables, Slurm's account and partition): an object on the wire, held as its canonical text
Labels = Annotated[
    str | None,
    BeforeValidator(labels_text),
    PlainSerializer(_labels_wire),
    WithJsonSchema(
        {
            "anyOf": [
                {
                    "type": "object",
                    "maxProperties": LABELS_MAX,
                    "propertyNames": {"pattern": f"^{_LABEL_KEY.pattern}$", "maxLength": LABEL_KEY_MAX},
                    "additionalProperties": {"type": "string", "maxLength": LABEL_VALUE_MAX},
                },
                {"type": "null"},
            ]
        }
    ),
]
