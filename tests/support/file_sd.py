"""What Prometheus would refuse in a file_sd JSON file, written from its documented format, not from gpucost's
writer."""

from __future__ import annotations

import json


def prometheus_file_sd_problems(text: str) -> list[str]:
    """What Prometheus would refuse in a file_sd JSON file (its documented format: a list of target groups, each
    ``targets`` (strings) and optional ``labels`` (label name → string), no other key, as its targetgroup decoder
    enforces with DisallowUnknownFields; label names of its data model)."""
    import re

    problems = []
    groups = json.loads(text)
    if not isinstance(groups, list):
        return ["not a JSON list"]
    for g in groups:
        if not isinstance(g, dict) or set(g) - {"targets", "labels"}:
            problems.append(f"not a target group: {g!r}")
            continue
        if not isinstance(g.get("targets"), list) or not all(isinstance(t, str) and t for t in g["targets"]):
            problems.append(f"targets must be a list of host[:port] strings: {g.get('targets')!r}")
        labels = g.get("labels", {})
        if not isinstance(labels, dict) or not all(
            isinstance(k, str) and re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", k) and isinstance(v, str)
            for k, v in labels.items()
        ):
            problems.append(f"labels must map label names to strings: {labels!r}")
    return problems
