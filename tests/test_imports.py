"""The import graph keeps its layers: the Kafka transport (``gpucost.kafka``) is built on the core (schemas,
operators, sinks, metrics) and the commands are built on it, never the reverse, so the transport can be read,
tested and replaced without the command line. And the tests keep theirs: no test module imports another (what
several share lives in tests/support/). Read from the source with ``ast`` (every import, at module level or inside
a function), not by importing anything.
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
    graph = {
        "gpucost.kafka.sink": {"gpucost.wiring"},
        "gpucost.wiring": {"gpucost.kafka.settings"},
        "gpucost.kafka.settings": set(),
        "gpucost.metrics": set(),
    }
    assert kafka_cycles(graph) == {"gpucost.kafka.sink": {"gpucost.wiring → gpucost.kafka.settings"}}
    graph["gpucost.kafka.sink"] = {"gpucost.metrics"}
    assert kafka_cycles(graph) == {}


# --- the tests' own structure: what several test modules share lives in tests/support/ -----------------------------


def modules_of_tests(root: Path) -> dict[str, Path]:
    """Every test module, by its dotted name (``tests.test_x``)."""
    return {f"tests.{path.stem}": path for path in sorted((root / "tests").glob("test_*.py"))}


def imported_test_modules(path: Path, known: set[str]) -> set[str]:
    """The test modules ``path`` imports anywhere in it: ``import tests.test_x``, ``from tests.test_x import y``,
    ``from tests import test_x`` and their relative forms (``from .test_x import y``, ``from . import test_x``)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = "tests" if node.level == 1 else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            out.add(module)
            out |= {f"{module}.{a.name}" for a in node.names}
    return out & known


def test_no_test_module_imports_another() -> None:
    """A helper, fixture or constant two test modules need lives in tests/support/ (or tests/conftest.py), so that
    a test module can be split, renamed or removed without another one breaking (docs/testing.md says so where it
    describes tests/support/)."""
    known = modules_of_tests(ROOT)
    assert "tests.test_imports" in known and len(known) > 50  # the modules were really found
    found = {
        name: sorted(imported) for name, path in known.items() if (imported := imported_test_modules(path, set(known)))
    }
    assert found == {}, f"move what these share into tests/support/: {found}"


def test_the_check_finds_a_test_module_imported_by_another(tmp_path: Path) -> None:
    """The check itself, on modules written here: each form of import of a test module is found, wherever it is
    (a function's body included); support modules, conftest and fakes are not test modules."""
    (tmp_path / "tests").mkdir()
    files = {
        "test_a.py": "from tests.test_b import helper\n",
        "test_b.py": "def f():\n    import tests.test_c\n",
        "test_c.py": "from tests import test_a, conftest\nfrom . import test_b\n",
        "test_d.py": "from .test_c import x\nfrom tests.support.hostile import KEY\nfrom tests.conftest import ROOT",
        "test_e.py": "from tests.fake_kafka import Message\nimport tests.support.cli\n",
    }
    for name, text in files.items():
        (tmp_path / "tests" / name).write_text(text)
    known = modules_of_tests(tmp_path)
    assert set(known) == {f"tests.test_{x}" for x in "abcde"}
    assert {name: imported_test_modules(path, set(known)) for name, path in known.items()} == {
        "tests.test_a": {"tests.test_b"},
        "tests.test_b": {"tests.test_c"},
        "tests.test_c": {"tests.test_a", "tests.test_b"},
        "tests.test_d": {"tests.test_c"},
        "tests.test_e": set(),
    }
