"""JSON Schemas of every event and record, generated from the pydantic models, for other languages.

Each schema names the wire format's version (``$id``, ``x-gpucost-schema-version``) and each property says
what it is and in which unit (``description``, ``x-unit``, from ``gpucost.schemas.field_docs``): a consumer
in another language reading ``cost_micro_usd`` must know it is integer micro-dollars, and a difference in a
revision, without reading this code."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpucost.schemas.ebpf import TRACE_EVENT_SIZE
from gpucost.schemas.events import EVENT_MODELS, TRACE_SOURCES
from gpucost.schemas.field_docs import FIELD_DOCS, SCHEMA_VERSION, UNITS
from gpucost.schemas.records import OUTPUT_KINDS

__all__ = ["write_json_schemas", "documented"]

#: ebpf_trace travels as the packed struct in hex, not as the decoded fields its model holds
EBPF_TRACE_WIRE: dict[str, Any] = {
    "title": "EbpfTrace",
    "type": "object",
    "required": ["kind", "node_id", "trace_hex"],
    "properties": {
        "kind": {"const": "ebpf_trace"},
        "node_id": {"type": "string", "minLength": 1, "maxLength": 256},
        "trace_hex": {
            "type": "string",
            "pattern": f"^[0-9a-fA-F]{{{2 * TRACE_EVENT_SIZE}}}$",
            "description": "packed little-endian {u32 pid; u8 gpu_uuid[16]; u64 timestamp_ns; "
            "u32 sm_util_pct; u64 flops_64b}",
        },
        "trace_source": {
            "enum": list(TRACE_SOURCES),
            "default": TRACE_SOURCES[0],
            "description": "what flops_64b counts: threads launched (launch) or one BLAS call's "
            "floating-point operations (blas)",
        },
    },
}


def documented(schema: dict[str, Any], group: str, name: str) -> dict[str, Any]:
    """``schema`` with its version, and each property's description and unit. A property without an entry in
    ``FIELD_DOCS`` is an error here, so that no field reaches a consumer unexplained."""
    properties = {}
    for field, spec in schema["properties"].items():
        if field not in FIELD_DOCS and field != "trace_hex":
            raise KeyError(f"the field {field!r} of {group} {name} has no entry in gpucost.schemas.field_docs")
        unit, words = FIELD_DOCS.get(field, (None, spec.get("description", "")))
        extra: dict[str, Any] = {"description": spec.get("description", words)}
        if unit is not None:
            extra.update({"x-unit": unit, "description": f"{extra['description']} [{UNITS[unit]}]"})
        properties[field] = {**spec, **extra}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://github.com/gpucost/gpucost/schemas/v{SCHEMA_VERSION}/{group}.{name}.schema.json",
        "x-gpucost-schema-version": SCHEMA_VERSION,
        **schema,
        "properties": properties,
        "description": schema.get("description")
        or (f"gpucost {group} {name!r}, wire format version {SCHEMA_VERSION}; each figure: docs/definitions.md"),
    }


def write_json_schemas(out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for group, models in (("event", EVENT_MODELS), ("record", OUTPUT_KINDS)):
        for name, model in models.items():
            path = out_dir / f"{group}.{name}.schema.json"
            schema = EBPF_TRACE_WIRE if name == "ebpf_trace" else model.model_json_schema(mode="serialization")
            path.write_text(json.dumps(documented(schema, group, name), indent=2, ensure_ascii=False) + "\n")
            written.append(path)
    return written
