"""Where gpucost keeps what must outlive one run on this machine: ``$XDG_STATE_HOME/gpucost`` (the XDG base
directory for state, ``~/.local/state/gpucost`` when unset). The producer's spool of unsent messages and the
reclaim ledger of triggers acted on live there by default, so a command started from another folder (a cron
job's, another shell's) finds the same ones: a ledger in the working folder was not found by the next run, which
then acted on every trigger again.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["state_dir"]


def state_dir() -> Path:
    """The state folder (made by whoever writes in it first)."""
    return Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "gpucost"
