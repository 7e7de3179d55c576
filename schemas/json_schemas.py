"""JSON Schemas of every event and record, generated from the pydantic models, for other languages."""
from __future__ import annotations

import json
from pathlib import Path

from schemas.events import EVENT_MODELS
from schemas.records import OUTPUT_KINDS

__all__ = ["write_json_schemas"]


def write_json_schemas(out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for group, models in (("event", EVENT_MODELS), ("record", OUTPUT_KINDS)):
        for name, model in models.items():
            path = out_dir / f"{group}.{name}.schema.json"
            path.write_text(json.dumps(model.model_json_schema(mode="serialization"), indent=2) + "\n")
            written.append(path)
    return written
