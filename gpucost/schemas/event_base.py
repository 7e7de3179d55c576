"""What every input event is built of: its time, identifiers and base model. Apart from
``gpucost.schemas.events`` so that the kernel events (``gpucost.schemas.kernels``), which the event union
includes, are built of the same fields without importing the union."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["TS_MIN_NS", "TS_MAX_NS", "TsNs", "Pid", "Ident", "WireEvent"]

TS_MIN_NS = 946_684_800 * 10**9  # 2000-01-01T00:00:00Z: anything earlier is a broken clock
TS_MAX_NS = 4_102_444_800 * 10**9  # 2100-01-01T00:00:00Z

TsNs = Annotated[int, Field(ge=TS_MIN_NS, lt=TS_MAX_NS)]
Pid = Annotated[int, Field(ge=0, lt=2**32)]
Ident = Annotated[str, Field(min_length=1, max_length=256)]


class WireEvent(BaseModel):
    """An input event as it travels: ``kind`` names its model (``gpucost.schemas.events.EVENT_MODELS``)."""

    model_config = ConfigDict(frozen=True, strict=True, extra="ignore")
    kind: str

    def to_wire(self) -> dict[str, Any]:
        """The JSON object of this event, ``kind`` first, optional fields left out when unset."""
        return self.model_dump(mode="json", exclude_none=True)
