"""Embedded runs of a scripted fleet, made once per fleet and configuration for the whole session (the hostile-input
tests of the consumers read them, and work on copies where they must change them)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from gpucost.embedded import run_embedded
from gpucost.producers.replay import read_inputs
from gpucost.schemas.codec import encode_event
from gpucost.schemas.events import Event
from gpucost.streams.settings import AuditSettings
from tests.conftest import horizon_label

#: pipeline outputs, one per fleet and configuration: each run once per session
_RUNS: dict[tuple[str, str], Path] = {}


def pipeline_run(
    factory: pytest.TempPathFactory,
    name: str,
    settings_: AuditSettings,
    events: Callable[[], list[Event]],
    key: bytes | None = None,
) -> Path:
    """The embedded run's output for ``events`` under ``settings_`` (health records signed with ``key``)."""
    cache = (name, horizon_label(settings_))
    if cache not in _RUNS:
        base = factory.mktemp(f"{name}-{horizon_label(settings_)}")
        (base / "events.jsonl").write_text("".join(encode_event(e) + "\n" for e in events()))
        run_embedded(read_inputs([base / "events.jsonl"]), settings_, base / "out", audit_key=key)
        _RUNS[cache] = base / "out"
    return _RUNS[cache]


def copy_of(out: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(out, tmp_path / "out"))
