"""The ``gpucost`` command as a user runs it: a subprocess of this interpreter, from the repository root."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import ROOT


def gpucost(*args: str, env: dict[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``python -m gpucost.cli ARGS``; with ``check``, a non-zero exit fails the test with its stderr."""
    proc = subprocess.run(
        [sys.executable, "-m", "gpucost.cli", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        timeout=600,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"gpucost {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
    return proc
