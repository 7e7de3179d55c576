"""The command line is one table (``gpucost.cli.TABLE``): every entry has a help line and flags that parse, the
parser lists exactly the table, and every command is run by some test of the suite."""

from __future__ import annotations

import contextlib
import io
import re

import pytest

from gpucost.cli import COMMANDS, TABLE, main, subcommand_parsers
from tests.conftest import ROOT


def test_the_parser_lists_the_table_once_each() -> None:
    names = [c.name for c in TABLE]
    assert len(names) == len(set(names)) == len(COMMANDS)
    assert list(subcommand_parsers()) == names  # argparse's own record of them


@pytest.mark.parametrize("command", TABLE, ids=lambda c: c.name)
def test_each_command_has_help_and_flags_that_parse(command: object) -> None:
    name = command.name  # type: ignore[attr-defined]
    assert command.help.strip() and callable(command.run)  # type: ignore[attr-defined]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as done:
        main([name, "--help"])
    assert done.value.code == 0 and f"usage: gpucost {name}" in out.getvalue()


def test_every_command_is_run_by_a_test() -> None:
    """A command only the table knows is a command no test runs: each name must appear as the first argument of a
    command line in some test (``"name"`` first in a call's arguments or list, after at most one other argument such
    as a fixture, or ``gpucost name`` in a shell line)."""
    text = "\n".join(p.read_text() for p in (ROOT / "tests").glob("test_*.py") if p.name != "test_command_table.py")
    untested = [
        c.name
        for c in TABLE
        if not re.search(
            rf'\(\[?\s*(?:\w+,\s*)?"{re.escape(c.name)}"|gpucost {re.escape(c.name)}\b|'
            rf'"gpucost\.cli", "{re.escape(c.name)}"',
            text,
        )
    ]
    assert untested == []


def test_version_prints_the_version_the_project_declares(capsys: pytest.CaptureFixture[str]) -> None:
    """``gpucost --version``: what a bug report or an audit quotes, the version pyproject.toml declares."""
    import tomllib

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code in (0, None)
    assert capsys.readouterr().out.strip() == f"gpucost {declared}"


@pytest.mark.parametrize(
    "argv",
    [["run", "--hours", "abc"], ["query", "--format", "xml", "SELECT 1"], [], ["nosuch"], ["health", "snapshot"]],
    ids=["bad value", "bad choice", "no command", "no such command", "missing required flag"],
)
def test_a_bad_command_line_is_one_error_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """The README's contract for every error: one line ``gpucost: error: …`` and exit 2 (argparse printed its
    whole usage block first)."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and err.startswith("gpucost: error: "), err
    assert "--help" in err  # where to look next
