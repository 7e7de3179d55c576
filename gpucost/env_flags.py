"""A flag that falls back to an environment variable, the one way the commands' flags are declared
(``gpucost.flags``, ``gpucost.kube_flags``): a module of its own so that a group of flags declared beside
what it sets can use it without importing every command's flags."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from typing import Any

__all__ = ["env_default", "env_flag", "add_tool_timeout", "on_off", "seconds", "TOOL_TIMEOUT_ENV"]

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


def seconds(env: str, at_most: float = math.inf) -> Callable[[str], float]:
    """The type of a flag of seconds falling back to ``env``: finite, above 0 and at most ``at_most`` (a NaN or an
    infinity would be no deadline, no period); its error names the flag's variable."""
    bound = "" if math.isinf(at_most) else f", at most {at_most:g}"

    def checked(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not 0 < value <= at_most or math.isinf(value):
            raise argparse.ArgumentTypeError(f"{text!r}: give a number of seconds above 0{bound} (or env {env})")
        return value

    return checked


def add_tool_timeout(p: argparse._ActionsContainer, flag: str, what: str) -> None:
    """The deadline of a live source's sample (a vendor tool's run, a library or NVML read, an exporter's page),
    ``flag`` falling back to ``TOOL_TIMEOUT_ENV``, 10 s, at most an hour."""
    env_flag(p, flag, TOOL_TIMEOUT_ENV, seconds(TOOL_TIMEOUT_ENV, 3600), "10", what)


def on_off(text: str) -> bool:
    """A switch written ``on`` or ``off``."""
    if text not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"{text!r}: write on or off")
    return text == "on"
