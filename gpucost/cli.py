"""``gpucost``: run the audit, simulate a fleet, replay recordings, query the output."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from importlib.metadata import version
from typing import Any, NoReturn

from aiokafka.errors import KafkaConnectionError

from gpucost.analysis_commands import EXPORT, FIT_WEIGHTS, HTML_REPORT, WHATIF
from gpucost.collect_kernels import COLLECT_KERNELS
from gpucost.command import Command
from gpucost.commands import COMPACT, PRICES, QUERY, REPLAY, SIMULATE, VIEWS
from gpucost.config import ConfigError
from gpucost.devices import DEVICES
from gpucost.kafka.state import StateError
from gpucost.kafka_commands import SINK, WORKER
from gpucost.kernels import KERNELS
from gpucost.operations import DISCOVERY, HEALTH, RECLAIM
from gpucost.produce_commands import PRODUCE, TOPICS
from gpucost.run import RUN
from gpucost.sinks.compact import CompactError
from gpucost.sinks.lock import OutputBusyError
from gpucost.sinks.parquet import SinkWriteError
from gpucost.trace_events import TRACE_EVENTS
from gpucost.wiring import UsageError

__all__ = ["main", "build_parser", "subcommand_parsers", "command_flags", "TABLE", "COMMANDS"]


#: every command, in the order ``gpucost --help`` lists them; each module declares its own (``gpucost.command``)
TABLE: tuple[Command, ...] = (
    RUN,
    SIMULATE,
    REPLAY,
    QUERY,
    PRICES,
    VIEWS,
    TOPICS,
    PRODUCE,
    WORKER,
    SINK,
    DISCOVERY,
    RECLAIM,
    HEALTH,
    FIT_WEIGHTS,
    WHATIF,
    HTML_REPORT,
    EXPORT,
    COMPACT,
    DEVICES,
    KERNELS,
    COLLECT_KERNELS,
    TRACE_EVENTS,
)
COMMANDS = {command.name: command for command in TABLE}


def build_parser() -> argparse.ArgumentParser:
    """The whole command line, from ``TABLE``."""
    return _parser_and_commands()[0]


def subcommand_parsers() -> dict[str, argparse.ArgumentParser]:
    """Each command's sub-parser by name, in the order ``gpucost --help`` lists them, from argparse's own record of
    them (the sub-parsers action's ``choices``), not from ``TABLE``: so that what reads a command's help (the checks
    of the service files, the compose file and the table itself) sees what the parser really holds without reaching
    into argparse's private attributes."""
    return dict(_parser_and_commands()[1].choices)


def command_flags(name: str) -> list[argparse.Action]:
    """Every flag and argument of command ``name`` (``-h`` and those of its argument groups included), each with its
    ``option_strings``, ``dest`` and ``help``. argparse keeps them in a private list and offers no public way to
    them; it is read here, in the one module that builds the parser, so that no caller depends on it."""
    return list(subcommand_parsers()[name]._actions)


def _parser_and_commands() -> tuple[argparse.ArgumentParser, argparse._SubParsersAction[argparse.ArgumentParser]]:
    parser = _Parser(prog="gpucost", description=__doc__)
    # the installed distribution's version: what a bug report, a billing audit or a fleet inventory quotes
    parser.add_argument("--version", action="version", version=f"gpucost {version('gpucost')}")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in TABLE:
        command.arguments(sub.add_parser(command.name, help=command.help))
    return parser, sub


#: a flag's value named by what its ``dest`` ends with, in the help (``--read-timeout-s S``, not ``READ_TIMEOUT_S``)
_METAVARS = (
    ("_file", "FILE"),
    ("_dir", "DIR"),
    ("_url", "URL"),
    ("_address", "HOST:PORT"),
    ("_bytes", "BYTES"),
    ("_fraction", "FRACTION"),
    ("_per_gpu_hour", "USD"),
    ("_sd", "FILE"),
    ("write", "FILE"),
    ("_pod_resources", "SOCKET"),
    ("_allocations", "on|off"),
    ("_s", "S"),
)


class _Help(argparse.HelpFormatter):
    """argparse's help, a flag's value named short: by its unit or kind where its name ends with one, else by the
    name's last word (``--kube-sharing SHARING``); a flag that names its own metavar keeps it."""

    def _get_default_metavar_for_optional(self, action: argparse.Action) -> str:
        found = next((name for suffix, name in _METAVARS if action.dest.endswith(suffix)), None)
        return found or ("N" if action.type is int else action.dest.rsplit("_", 1)[-1].upper())


class _Parser(argparse.ArgumentParser):
    """argparse's parser (each command's sub-parser is one too), its errors one line like every other error of
    gpucost (README: ``gpucost: error: …``, exit 2) instead of the whole usage block first, its help ``_Help``'s."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Help)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix("gpucost").strip()
        self.exit(2, f"gpucost: error: {command + ': ' if command else ''}{message} (see {self.prog} --help)\n")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command].run(args)
    except (UsageError, ConfigError, OutputBusyError, CompactError) as exc:
        print(f"gpucost: error: {exc}", file=sys.stderr)
        return 2
    except SinkWriteError as exc:
        print(f"gpucost: error: {exc}", file=sys.stderr)
        return 4
    except StateError as exc:
        print(f"gpucost: error: {exc}", file=sys.stderr)
        return 5
    except KafkaConnectionError as exc:
        print(
            f"gpucost: error: {exc}. Check the broker address (GPUCOST_KAFKA_BOOTSTRAP) and, for a secured "
            "listener, GPUCOST_KAFKA_SECURITY_PROTOCOL and its TLS/SASL settings; the line above says why the "
            "connection failed",
            file=sys.stderr,
        )
        return 3
    except KeyboardInterrupt:
        print("gpucost: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader left (`| head -1`): stop quietly, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the flush at exit fails no more
        return 141


if __name__ == "__main__":
    sys.exit(main())
