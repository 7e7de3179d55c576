"""The import graph keeps its layers: the Kafka transport (``gpucost.kafka``) is built on the core (schemas,
operators, sinks, metrics) and the commands are built on it, never the reverse, so the transport can be read,
tested and replaced without the command line. Read from the source with ``ast`` (every import, at module level
or inside a function), not by importing anything.
"""
from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT


def modules() -> dict[str, Path]:
    """Every module of the package, by name (the top-level producers/, streams/… are links into gpucost/)."""
    found: dict[str, Path] = {}
    for path in (ROOT / "gpucost").rglob("*.py"):
        name = ".".join(("gpucost", *path.relative_to(ROOT / "gpucost").with_suffix("").parts))
        found[name.removesuffix(".__init__")] = path
    return found


def imports(path: Path, known: set[str]) -> set[str]:
    """The project modules ``path`` imports anywhere in it (``from a.b import c`` names ``a.b.c`` where that is a
    module, else ``a.b``)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gpucost"):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                out.add(full if full in known else node.module)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
    return out & known


def reaches(graph: dict[str, set[str]], start: set[str]) -> set[str]:
    seen, todo = set(start), list(start)
    while todo:
        for dep in graph[todo.pop()] - seen:
            seen.add(dep)
            todo.append(dep)
    return seen


def kafka_cycles(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Each module outside ``gpucost.kafka`` that a Kafka module imports and that leads back into the package."""
    inside = {m for m in graph if m == "gpucost.kafka" or m.startswith("gpucost.kafka.")}
    bad: dict[str, set[str]] = {}
    for module in sorted(inside):
        for dep in graph[module] - inside:
            if back := reaches(graph, {dep}) & inside:
                bad.setdefault(module, set()).add(f"{dep} → {sorted(back)[0]}")
    return bad


def test_the_kafka_transport_does_not_import_back_from_the_layers_above_it() -> None:
    known = modules()
    graph = {m: imports(p, set(known)) - {m} for m, p in known.items()}
    assert "gpucost.kafka.worker" in graph and graph["gpucost.kafka.worker"]  # the graph was really read
    assert kafka_cycles(graph) == {}


def test_the_check_finds_a_cycle_through_a_command_module() -> None:
    """The check itself: a Kafka module importing the command wiring (which imports the Kafka settings) is found."""
    graph = {"gpucost.kafka.sink": {"gpucost.wiring"}, "gpucost.wiring": {"gpucost.kafka.settings"},
             "gpucost.kafka.settings": set(), "gpucost.metrics": set()}
    assert kafka_cycles(graph) == {"gpucost.kafka.sink": {"gpucost.wiring → gpucost.kafka.settings"}}
    graph["gpucost.kafka.sink"] = {"gpucost.metrics"}
    assert kafka_cycles(graph) == {}
