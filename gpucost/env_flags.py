"""A flag that falls back to an environment variable, the one way the commands' flags are declared
(``gpucost.flags``, ``gpucost.kube_flags``): a module of its own so that a group of flags declared beside
what it sets can use it without importing every command's flags."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

__all__ = ["env_default", "env_flag"]


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
