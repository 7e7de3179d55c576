"""Every `gpucost query` the README and docs/ show a user runs: each example line of a code block, taken from the
Markdown as written, against a simulated fleet's output, exits 0. A query that DuckDB's newest release refuses
(``unnest`` grouped in one SELECT: "Cannot group on an UNNEST") was shown in docs/analysts.md until a newcomer
ran it; this keeps the docs' examples working with whatever DuckDB pip resolves.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from gpucost.cli import main
from tests.conftest import ROOT

#: a command line in a code block: `gpucost query …` or `.venv/bin/gpucost query …`, whole on its line
_QUERY = re.compile(r"^\s*(?:\.venv/bin/)?gpucost query (.+)$")


def documented_queries() -> list[tuple[str, list[str]]]:
    """(where, arguments) of each `gpucost query` line inside a fenced code block of README.md and docs/*.md."""
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        fenced = False
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if line.lstrip().startswith("```"):
                fenced = not fenced
                continue
            if fenced and (m := _QUERY.match(line)) and "…" not in line:
                args = shlex.split(m.group(1))
                ends = [at for at, arg in enumerate(args) if arg in ("|", ">", ">>")]  # a pipe or redirection after
                found.append((f"{path.relative_to(ROOT)}:{number}", args[: ends[0]] if ends else args))
    return found


def test_the_docs_show_queries_to_run() -> None:
    assert len(documented_queries()) >= 15  # the examples of docs/analysts.md and the walkthroughs


@pytest.mark.parametrize(("where", "args"), documented_queries(), ids=[w for w, _ in documented_queries()])
def test_each_documented_query_runs(where: str, args: list[str], recorded: tuple[Path, Path], capsys) -> None:
    _, out = recorded
    while "--out" in args:  # the docs' own folder (audit/, /var/lib/…) stands for the user's output
        at = args.index("--out")
        del args[at : at + 2]
    code = main(["query", "--out", str(out), *args])
    assert code == 0, f"{where}: {capsys.readouterr().err}"
