"""One entry of the command line: a command's name, its one-line help, its flags and what runs it. Each command's
module declares its entries; ``gpucost.cli`` builds the parser from the table of them and dispatches through it,
so adding a command is one entry there and its module here."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Command"]


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    #: adds the command's flags and arguments to its sub-parser
    arguments: Callable[[argparse.ArgumentParser], None]
    #: runs it; the exit status (errors the user can act on are raised as ``UsageError`` and the like, which
    #: ``gpucost.cli.main`` turns into a message and a status)
    run: Callable[[argparse.Namespace], int]
