"""Each event field's declared bounds, read from the models' own metadata.

Why: the batch path checks whole columns with numpy instead of building a model per row, and a
row those checks accept is never validated again. Were its ranges written by hand a second time,
a bound tightened on a model would leave the batch path accepting what the row path refuses,
with no test failing. Here the checks are derived from the ``Field(ge=…, lt=…, max_length=…)``
of ``gpucost.schemas.events``, so a bound is declared once and both paths enforce it.
"""

from __future__ import annotations

import operator
import typing
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import annotated_types as at
import numpy as np
from pydantic import BaseModel

__all__ = ["Bounds", "field_bounds"]

_OPS: dict[str, Callable[[Any, Any], Any]] = {
    "ge": operator.ge,
    "gt": operator.gt,
    "le": operator.le,
    "lt": operator.lt,
}
_COMPARE: dict[type, str] = {at.Ge: "ge", at.Gt: "gt", at.Le: "le", at.Lt: "lt"}


@dataclass(frozen=True)
class Bounds:
    """What a field's value must satisfy: its comparisons (``("ge", 0)``…), its length limits (strings),
    whether it must be finite (floats) and whether the field may be left out."""

    required: bool
    compare: tuple[tuple[str, int | float], ...] = ()
    min_length: int | None = None
    max_length: int | None = None
    finite: bool = False

    def holds(self, values: np.ndarray, present: np.ndarray | None = None) -> np.ndarray:
        """Which of ``values`` (string lengths, for a string field) are within the bounds; a row where
        the field is absent (``present`` False) passes only if the field is optional."""
        ok = np.ones(len(values), dtype=bool)
        for name, bound in self.compare:
            ok &= _compare(values, name, bound)
        if self.min_length is not None:
            ok &= values >= self.min_length
        if self.max_length is not None:
            ok &= values <= self.max_length
        if self.finite:
            ok &= np.isfinite(values)
        if present is None:
            return ok
        return np.where(present, ok, not self.required)


def _compare(values: np.ndarray, name: str, bound: int | float) -> np.ndarray:
    """``values <name> bound``, also for a bound outside the values' integer type (``lt=2**64`` of a
    uint64 column), which numpy would otherwise compare as floats, or refuse."""
    op = _OPS[name]
    if values.dtype.kind in "iu" and isinstance(bound, int):
        info = np.iinfo(values.dtype)
        if not info.min <= bound <= info.max:  # every value is on one side of it
            return np.full(len(values), bool(op(info.min if bound > info.max else info.max, bound)))
    result: np.ndarray = op(values, bound)
    return result


@cache
def field_bounds(model: type[BaseModel], name: str) -> Bounds:
    """The bounds ``model`` declares for field ``name``, also when the field is optional (the
    constraints then sit on the ``Annotated`` inside ``X | None``)."""
    info = model.model_fields[name]
    metadata = list(info.metadata)
    for arg in typing.get_args(info.annotation):  # Annotated[int, Field(...)] | None
        for inner in getattr(arg, "__metadata__", ()):
            metadata += getattr(inner, "metadata", [inner])
    compare, lengths, finite = [], {}, False
    for m in metadata:
        if type(m) in _COMPARE:
            key = _COMPARE[type(m)]
            compare.append((key, getattr(m, key)))
        elif isinstance(m, at.MinLen):
            lengths["min_length"] = m.min_length
        elif isinstance(m, at.MaxLen):
            lengths["max_length"] = m.max_length
        elif getattr(m, "allow_inf_nan", True) is False:
            finite = True
    return Bounds(required=info.is_required(), compare=tuple(compare), finite=finite, **lengths)
