"""What every accelerator parser shares: the capture's body, table cells, "not reported" markers."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import TypeVar

from gpucost.schemas.devices import Parsed, UnitError

__all__ = ["body", "is_missing", "pipe_rows", "guarded", "json_body"]

T = TypeVar("T")
_MISSING = {"", "N/A", "NA", "n/a", "None", "-"}
_BOX = str.maketrans({c: "|" for c in "│┃"})


def body(text: str) -> list[str]:
    """The capture's lines without a quoted excerpt's four-line header (``excerpt of`` … ``---``)."""
    lines = text.splitlines()
    if lines and lines[0].startswith("excerpt of") and "---" in lines[:6]:
        return lines[lines.index("---") + 1 :]
    return lines


def is_missing(cell: str) -> bool:
    """A cell the tool fills when it has no reading (``N/A``, ``NA``, blank)."""
    return cell.strip() in _MISSING or cell.strip().startswith("N/A")


def pipe_rows(line: str) -> list[str] | None:
    """The cells of a table row drawn with ``|`` or box characters; None for rules and other lines."""
    line = line.translate(_BOX).strip()
    if not line.startswith("|") or re.fullmatch(r"[|\-=+:\s┡━╇┩┏┳┓└─┴┘]*", line):
        return None
    return [c.strip() for c in line.strip("|").split("|")]


def guarded(out: Parsed, reason: str, read: Callable[[], T]) -> T | None:
    """``read()``, or None with the failure counted under ``reason`` (a bad cell never stops a capture)."""
    try:
        return read()
    except (UnitError, ValueError, ArithmeticError, KeyError, IndexError, TypeError, AttributeError) as exc:
        out.reject(f"{reason}: {exc}")
        return None


def json_body(text: str, out: Parsed, tool: str, kind: type[T], expected: str) -> T | None:
    """The capture's JSON when it is a ``kind``; otherwise None, counted with what was wrong."""
    try:
        data = json.loads("\n".join(body(text)))
    except json.JSONDecodeError as exc:
        out.reject(f"{tool} JSON: not valid JSON ({exc.msg} at line {exc.lineno})")
        return None
    if not isinstance(data, kind):
        out.reject(f"{tool} JSON: expected {expected}")
        return None
    return data
