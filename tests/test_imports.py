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


# --- the tests reach the code through its public names ---------------------------------------------------------------

#: names behind an underscore that are public all the same: ``os._exit`` (a child that dies as SIGKILL would leave it,
#: without exit handlers or flushing) and a named tuple's documented API (the underscore only keeps it apart from
#: the fields)
ALLOWED_ATTRIBUTES = {"os._exit"}
NAMEDTUPLE_API = {"_fields", "_field_defaults", "_asdict", "_replace", "_make"}

#: a third party's private name that a test reads for want of a public one, by (test module, use): prometheus_client
#: (0.26) keeps a metric family's declared label names only as ``_labelnames`` (a ``Metric`` offers name,
#: documentation, type, unit and samples), and a family with no samples yet, as every labelled one of a component
#: that has seen nothing, shows no label in the exposition, so test_dashboards reads them there
THIRD_PARTY = {("tests.test_dashboards", "getattr('_labelnames')")}


def is_private(name: str) -> bool:
    """``_name`` or ``__name``, not ``__name__``."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_uses(path: Path) -> set[str]:
    """What the test code at ``path`` reaches behind a leading underscore, as written: an attribute ``x._name`` of
    anything but ``self`` and ``cls``; ``_name`` imported from gpucost or benchmarks, or any name from a private module
    of theirs; and ``getattr``, ``setattr``, ``delattr``, ``hasattr`` or ``monkeypatch.setattr`` naming ``_name``, or a
    dotted ``gpucost.…._name`` path through a private part."""
    out: set[str] = set()
    ours = ("gpucost", "benchmarks")
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and is_private(node.attr):
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            text = f"{ast.unparse(node.value)}.{node.attr}"
            if text not in ALLOWED_ATTRIBUTES and node.attr not in NAMEDTUPLE_API:
                out.add(text)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in ours:
            private_module = any(map(is_private, node.module.split(".")))
            out |= {f"from {node.module} import {a.name}" for a in node.names if private_module or is_private(a.name)}
        elif isinstance(node, ast.Import):
            out |= {f"import {a.name}" for a in node.names if a.name.split(".")[0] in ours and "._" in a.name}
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name | ast.Attribute):
            call = node.func.id if isinstance(node.func, ast.Name) else node.func.attr
            if call not in ("getattr", "setattr", "delattr", "hasattr"):
                continue
            for arg in node.args[:2]:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    parts = arg.value.split(".")
                    if (len(parts) == 1 and is_private(arg.value)) or (
                        parts[0] in ours and any(map(is_private, parts))
                    ):
                        out.add(f"{call}({arg.value!r})")
    return out


def test_no_test_module_reaches_a_private_name() -> None:
    """A test that reaches behind an underscore pins the code's insides: it breaks when they are renamed, and
    passes while the public behaviour it stands for is broken. What a test needs is a documented public name (a
    parameter, a hook, a function of the module). Allowed: a third party's name with no public counterpart
    (``THIRD_PARTY``)."""
    known = modules_of_tests(ROOT)
    found = {(name, use) for name, path in known.items() for use in private_uses(path)}
    allowed = THIRD_PARTY
    assert sorted(found - allowed) == [], "reach these through public names (or add one to the code)"
    assert sorted(allowed - found) == [], "gone: remove them from their list"


def test_the_check_finds_each_way_of_reaching_a_private_name(tmp_path: Path) -> None:
    """The check itself, on a module written here: each form is found; ``self``/``cls``, dunders, ``os._exit``, a
    named tuple's API and private names of the test module's own (not of gpucost) are not."""
    (tmp_path / "test_x.py").write_text(
        "import os\nimport gpucost._native\nimport gpucost.sinks.compact\n"
        "from gpucost.sinks.compact import _exchange, compact\nfrom gpucost._hidden import thing\n"
        "from benchmarks.producer_overhead import _build\nfrom tests.support.hostile import _helper\n"
        "def test(monkeypatch, probe, t):\n"
        "    probe._epoch_offset_ns\n    gpucost.sinks.compact._exchange = None\n    probe.__dict__\n"
        "    os._exit(0)\n    t._fields\n    self._x\n    cls._y\n    _local()\n"
        "    monkeypatch.setattr(gpucost.sinks.compact, '_exchange', None)\n"
        "    monkeypatch.setattr('gpucost.sinks.landlock._RESTRICT_SELF', -1)\n"
        "    monkeypatch.setattr('gpucost.sinks.compact.exchange_folders', None)\n"
        "    getattr(probe, '__name__')\n"
    )
    assert private_uses(tmp_path / "test_x.py") == {
        "import gpucost._native",
        "from gpucost.sinks.compact import _exchange",
        "from gpucost._hidden import thing",
        "from benchmarks.producer_overhead import _build",
        "probe._epoch_offset_ns",
        "gpucost.sinks.compact._exchange",
        "setattr('_exchange')",
        "setattr('gpucost.sinks.landlock._RESTRICT_SELF')",
    }
