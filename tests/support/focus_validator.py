"""focus-validator, the FinOps Foundation's FOCUS validator, in a virtual environment of its own (it needs Python 3.12):
the fixture ``validator`` for tests/test_focus.py and tests/test_focus13.py, and ``run_validator``."""

from __future__ import annotations

import glob
import shutil
import subprocess
from pathlib import Path

import pytest

__all__ = ["VALIDATOR", "python312", "run_validator", "validator"]

VALIDATOR = "focus-validator==2.2.1"


def python312() -> str | None:
    """An interpreter focus-validator 2.2.1 installs on (it needs Python 3.12): on PATH, then pyenv's, the first that
    starts (a pyenv shim on PATH may name a version it will not run), as .ci/run looks for a second interpreter."""
    pyenv = Path.home() / ".pyenv" / "versions"
    candidates = [shutil.which("python3.12"), *sorted(glob.glob(str(pyenv / "3.12*" / "bin" / "python3.12")))]
    for found in filter(None, candidates):
        if subprocess.run([found, "-c", "pass"], capture_output=True).returncode == 0:
            return found
    return None


@pytest.fixture(scope="module")
def validator() -> Path:
    """focus-validator in a virtual environment of its own (kept under ~/.cache for the next run), with the numpy
    and pyarrow it was built for."""
    python = python312()
    if python is None:
        pytest.skip("focus-validator 2.2.1 needs Python 3.12, and this machine has none")
    venv = Path.home() / ".cache" / "gpucost" / "focus-validator-2.2.1"
    if not (venv / "bin" / "focus-validator").exists():
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
        done = subprocess.run(
            [str(venv / "bin" / "pip"), "install", "-q", VALIDATOR, "numpy<2", "pyarrow<18"],
            capture_output=True,
            text=True,
            timeout=900,
        )
        if done.returncode != 0:
            shutil.rmtree(venv, ignore_errors=True)
            pytest.skip(f"could not install {VALIDATOR}: {done.stderr.strip()[-300:]}")
    return venv


def run_validator(venv: Path, data: Path, version: str) -> subprocess.CompletedProcess[str]:
    """Run it offline on ``data`` against FOCUS ``version``, from its own package's folder (it opens its rules' data
    files relative to the working directory)."""
    (site,) = glob.glob(str(venv / "lib" / "python3.12" / "site-packages"))
    return subprocess.run(
        [
            str(venv / "bin" / "focus-validator"),
            "--data-file",
            str(data),
            "--validate-version",
            version,
            "--block-download",
        ],
        capture_output=True,
        text=True,
        cwd=site,
        timeout=600,
    )
