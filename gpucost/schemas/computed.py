"""Records the pipeline computed itself, built without pydantic's validation (``gpucost.schemas.records`` re-exports
them): every field is given, in the model's order, so the record equals the validated model of the same values."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel

__all__ = ["R", "computed", "computed_from"]

R = TypeVar("R", bound=BaseModel)
_ALL_FIELDS: dict[type, tuple[tuple[str, ...], set[str]]] = {}


def computed(cls: type[R], **values: Any) -> R:
    """A record of values the pipeline computed itself, every field given: ``model_construct``
    without its per-field loop, which cost more than the cost split (records are built by the
    hundred thousand per second). Equal to the validated model of the same values."""
    return computed_from(cls, values)


def computed_from(cls: type[R], values: dict[str, Any]) -> R:
    """``computed`` of a dict the caller hands over (the record keeps it as its fields). The
    fields must come in the model's order, which is the order its JSON is written in."""
    known = _ALL_FIELDS.get(cls)
    if known is None:
        known = _ALL_FIELDS[cls] = (tuple(cls.model_fields), set(cls.model_fields))
    order, fields = known
    if tuple(values) != order:
        raise TypeError(f"{cls.__name__} needs exactly its fields, in order {order}; got {tuple(values)}")
    record = cls.__new__(cls)
    object.__setattr__(record, "__dict__", values)
    object.__setattr__(record, "__pydantic_fields_set__", fields)
    object.__setattr__(record, "__pydantic_extra__", None)
    object.__setattr__(record, "__pydantic_private__", None)
    return record
