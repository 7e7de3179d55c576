"""The repository's packages live under one root, and the code imports them by that name only.

producers/, streams/, sinks/ and schemas/ live in gpucost/, so that a tool reading the sources
(mypy, pyright, an import graph) finds ``gpucost.streams`` where it is, without an install; the
top-level names are links to them, for readers (docs/testing.md, "Why this layout"). Installed,
``schemas`` or ``streams`` would collide with other distributions' (``schemas`` is a published
package); and a module imported under both names would be two modules, whose classes fail each
other's isinstance.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.conftest import ROOT

CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
#: folders of the repository that hold Python packages but are not installed
NOT_INSTALLED = {"tests", "benchmarks", "examples"}


def test_every_installed_package_is_under_gpucost_and_every_top_level_package_is_a_link_into_it() -> None:
    assert all(p == "gpucost" or p.startswith("gpucost.") for p in CONFIG["packages"])
    assert "package-dir" not in CONFIG, "a package mapped from elsewhere is one tools cannot find without an install"
    folders = {p.parent.name for p in ROOT.glob("*/__init__.py")} - NOT_INSTALLED - {"gpucost"}
    assert folders == {"producers", "schemas", "sinks", "streams"}
    for name in folders:
        assert (ROOT / name).is_symlink() and (ROOT / name).resolve() == ROOT / "gpucost" / name, name
    # and every sub-package of gpucost/ is listed (setuptools installs only what the list names)
    nested = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "gpucost").glob("*/**/__init__.py")}
    assert nested == set(CONFIG["packages"]) - {"gpucost"}


def test_a_package_imported_by_its_top_level_link_says_which_name_to_use() -> None:
    for name in ["producers", "schemas", "sinks", "streams"]:
        run = subprocess.run([sys.executable, "-c", f"import {name}"], cwd=ROOT, capture_output=True, text=True)
        assert run.returncode != 0 and f"import gpucost.{name}, not {name}" in run.stderr, (name, run.stderr)


def test_the_code_imports_the_folders_only_as_gpucost_modules() -> None:
    bare = {"producers", "schemas", "sinks", "streams"}
    found = []
    for path in ROOT.glob("**/*.py"):
        parts = path.relative_to(ROOT).parts
        if "build" in parts or any(part.startswith(".") for part in parts):  # virtual environments, git
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module]
                if isinstance(node, ast.ImportFrom) and node.module and not node.level
                else []
            )
            found += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names if n.split(".")[0] in bare]
    assert not found, found


def _modules() -> dict[str, Path]:
    """Every installed module's dotted name and file."""
    return {
        ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): path
        for path in (ROOT / "gpucost").rglob("*.py")
    }


def test_no_import_circle_in_the_project() -> None:
    """Counting every import, also those inside functions and under TYPE_CHECKING: a circle means two
    modules that cannot be understood, or changed, apart."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
                if isinstance(node, ast.ImportFrom) and node.module
                else []
            )
            deps |= {t for t in targets if t in modules and t != name}
        graph[name] = deps
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph[node]):
            assert state.get(dep) != 1, (
                "import circle: " + " → ".join(path[path.index(dep) :] + [node, dep])
                if dep in path
                else f"import circle: {node} → {dep}"
            )
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
