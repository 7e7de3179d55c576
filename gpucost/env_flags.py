"""A flag that falls back to an environment variable, the one way the commands' flags are declared
(``gpucost.flags``, ``gpucost.kube_flags``): a module of its own so that a group of flags declared beside
what it sets can use it without importing every command's flags."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

__all__ = ["env_default", "env_flag", "add_tool_timeout", "on_off", "TOOL_TIMEOUT_ENV"]

#: how long one run of a vendor tool, or one read of an exporter's page, may take (``gpucost devices --timeout-s``,
#: ``run``/``produce --device-timeout-s``): one variable for both
TOOL_TIMEOUT_ENV = "GPUCOST_DEVICES_TIMEOUT_S"


def env_default(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_flag(
    p: argparse._ActionsContainer, flag: str, env: str, kind: Callable[[str], Any], default: str | None, what: str
) -> None:
    """A flag that falls back to an environment variable; the help says both, and the default."""
    shown = "unset" if default is None else default
    p.add_argument(
        flag,
        type=kind,
        default=os.environ.get(env, default),
        help=f"{what} (env {env}; default {shown})".replace("%", "%%"),
    )


def _tool_seconds(text: str) -> float:
    """Seconds above 0, at most an hour (a NaN or an infinity would be no deadline)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give a number of seconds above 0, at most 3600 (the flag, or env {TOOL_TIMEOUT_ENV})"
        )
    return value


def add_tool_timeout(p: argparse._ActionsContainer, flag: str, what: str) -> None:
    """The deadline of a live vendor tool's run or an exporter's page, ``flag`` falling back to
    ``TOOL_TIMEOUT_ENV``, 10 s."""
    env_flag(p, flag, TOOL_TIMEOUT_ENV, _tool_seconds, "10", what)


def on_off(text: str) -> bool:
    """A switch written ``on`` or ``off``."""
    if text not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"{text!r}: write on or off")
    return text == "on"
