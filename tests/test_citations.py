"""Code, tests and docs cite the repository's contract, docs/definitions.md, never the upstream spec.

The upstream specification lives beside the repository, not in it: a clone cannot follow a citation
of it. docs/definitions.md states every rule in this implementation's words and, in its section
"Readings of the contract", where and why it reads the upstream text the way it does; that page is
the one place allowed to name the upstream file.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.conftest import ROOT

#: the upstream file's name, also without its suffix; not a name that merely contains it
#: (``GPUCOST_METRICS_ADDRESS``, ``GPM_METRICS``)
UPSTREAM = re.compile(r"\bMETRICS(\.md)?\b")
#: docs/definitions.md says where it departs from the upstream text, naming it; this file names it in the
#: examples its own check of the pattern runs on
ALLOWED = {"docs/definitions.md", "tests/test_citations.py"}


def _tracked() -> list[str]:
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout: which files are the repository's is not known here")
    return [name for name in listed.stdout.decode().split("\0") if name]


def citing(names: list[str]) -> set[str]:
    """The files among ``names`` whose text names the upstream file."""
    out = set()
    for name in names:
        path = ROOT / name
        if path.is_symlink() or not path.is_file():
            continue
        if UPSTREAM.search(path.read_bytes().decode("utf-8", "replace")):
            out.add(name)
    return out


def test_only_definitions_md_names_the_upstream_spec() -> None:
    found = citing(_tracked()) - ALLOWED
    assert not found, f"cite docs/definitions.md (its section by name) instead of the upstream file in: {sorted(found)}"


def test_the_pattern_finds_citations_and_only_them(tmp_path, monkeypatch) -> None:
    """The scan itself, on files written here: a citation with or without its suffix is found, names that
    merely contain the word are not."""
    monkeypatch.setattr("tests.test_citations.ROOT", tmp_path)
    files = {
        "a.py": '# see METRICS.md, "Watermarks"',
        "b.md": '(METRICS, "Efficiency")',
        "c.py": "GPUCOST_METRICS_ADDRESS = GPM_METRICS",
        "d.md": "metrics.md is another file",
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert citing(sorted(files)) == {"a.py", "b.md"}
