"""The repository's folders install under one root, and the code imports them by that name only.

producers/, streams/, sinks/ and schemas/ stay at the top of the repository, but a distribution
that put ``schemas`` or ``streams`` in site-packages would collide with others of those names
(``schemas`` is a published package). They install as ``gpucost.schemas`` and so on; a module
imported under both names would also be two modules, whose classes fail each other's isinstance.
"""
from __future__ import annotations

import ast
import tomllib
from pathlib import Path

from tests.conftest import ROOT

CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
#: folders of the repository that hold Python packages but are not installed
NOT_INSTALLED = {"tests", "benchmarks", "examples"}


def test_every_installed_package_is_under_gpucost_and_every_package_folder_is_installed() -> None:
    assert all(p == "gpucost" or p.startswith("gpucost.") for p in CONFIG["packages"])
    folders = {p.parent.name for p in ROOT.glob("*/__init__.py")} - NOT_INSTALLED
    mapped = {v: k for k, v in CONFIG["package-dir"].items()}
    assert folders - {"gpucost"} == set(mapped), "a top-level package folder that is not mapped under gpucost"
    assert set(mapped.values()) <= set(CONFIG["packages"])
    # and every sub-package of gpucost/ is listed (setuptools installs only what the list names)
    nested = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "gpucost").glob("*/**/__init__.py")}
    assert nested <= set(CONFIG["packages"])


def test_the_code_imports_the_folders_only_as_gpucost_modules() -> None:
    bare = {"producers", "schemas", "sinks", "streams"}
    found = []
    for path in ROOT.glob("**/*.py"):
        parts = path.relative_to(ROOT).parts
        if "build" in parts or any(part.startswith(".") for part in parts):  # virtual environments, git
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
            found += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names if n.split(".")[0] in bare]
    assert not found, found


def _modules() -> dict[str, Path]:
    """Every installed module's dotted name and file."""
    out = {}
    for package, folder in [("gpucost", "gpucost"), *((k, v) for k, v in CONFIG["package-dir"].items())]:
        for path in (ROOT / folder).glob("*.py"):
            out[f"{package}.{path.stem}".removesuffix(".__init__")] = path
        if package == "gpucost":
            for path in (ROOT / folder).glob("*/*.py"):
                if path.parent.name not in {"schemas", "streams", "sinks", "producers"}:
                    out[f"gpucost.{path.parent.name}.{path.stem}".removesuffix(".__init__")] = path
    return out


def test_no_import_circle_in_the_project() -> None:
    """Counting every import, also those inside functions and under TYPE_CHECKING: a circle means two
    modules that cannot be understood, or changed, apart."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                       [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
                       if isinstance(node, ast.ImportFrom) and node.module else [])
            deps |= {t for t in targets if t in modules and t != name}
        graph[name] = deps
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph[node]):
            assert state.get(dep) != 1, "import circle: " + " → ".join(path[path.index(dep):] + [node, dep]) \
                if dep in path else f"import circle: {node} → {dep}"
            if dep not in state:
                visit(dep, [*path, node])
        state[node] = 2

    assert len(modules) > 40
    for name in sorted(graph):
        if name not in state:
            visit(name, [])


def test_the_license_is_an_spdx_expression() -> None:
    """A license table made setuptools warn three times at every install."""
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"] == "Apache-2.0"
