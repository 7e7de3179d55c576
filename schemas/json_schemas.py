"""JSON Schemas of every event and record, generated from the pydantic models, for other languages."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpucost.schemas.ebpf import TRACE_EVENT_SIZE
from gpucost.schemas.events import EVENT_MODELS, TRACE_SOURCES
from gpucost.schemas.records import OUTPUT_KINDS

__all__ = ["write_json_schemas"]

#: ebpf_trace travels as the packed struct in hex, not as the decoded fields its model holds
EBPF_TRACE_WIRE: dict[str, Any] = {
    "title": "EbpfTrace", "type": "object", "required": ["kind", "node_id", "trace_hex"],
    "properties": {
        "kind": {"const": "ebpf_trace"},
        "node_id": {"type": "string", "minLength": 1, "maxLength": 256},
        "trace_hex": {"type": "string", "pattern": f"^[0-9a-fA-F]{{{2 * TRACE_EVENT_SIZE}}}$",
                      "description": "packed little-endian {u32 pid; u8 gpu_uuid[16]; u64 timestamp_ns; "
                                     "u32 sm_util_pct; u64 flops_64b}"},
        "trace_source": {"enum": list(TRACE_SOURCES), "default": TRACE_SOURCES[0],
                         "description": "what flops_64b counts: threads launched (launch) or one BLAS call's "
                                        "floating-point operations (blas)"},
    },
}


def write_json_schemas(out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for group, models in (("event", EVENT_MODELS), ("record", OUTPUT_KINDS)):
        for name, model in models.items():
            path = out_dir / f"{group}.{name}.schema.json"
            schema = EBPF_TRACE_WIRE if name == "ebpf_trace" else model.model_json_schema(mode="serialization")
            path.write_text(json.dumps(schema, indent=2) + "\n")
            written.append(path)
    return written
