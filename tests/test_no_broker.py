"""Every command that talks to Kafka, started where no broker answers: one clean error line and exit status 3,
no traceback, and no client left open (aiokafka prints "Unclosed AIOKafkaConsumer" at exit for a client whose
``start()`` failed and that was never stopped: each of these commands printed it after its own error).

Run as subprocesses, since the warning comes as the interpreter collects the client, at exit.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import free_ports

COMMANDS = {
    "reclaim": ["reclaim", "--actions-file", "{tmp}/actions.jsonl"],
    "discovery": ["discovery", "--file-sd", "{tmp}/sd.json"],
    "topics create": ["topics", "create"],
    "worker": ["worker"],
    "sink": ["sink", "--out", "{tmp}/out"],
}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_no_broker_gives_one_clean_error_and_leaves_no_client_open(name: str, tmp_path: Path) -> None:
    args = [a.format(tmp=tmp_path) for a in COMMANDS[name]] + ["--bootstrap", f"127.0.0.1:{free_ports(1)}"]
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from gpucost.cli import main; sys.exit(main())", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    errors = [line for line in done.stderr.splitlines() if line.startswith("gpucost: error:")]
    assert done.returncode == 3 and len(errors) == 1, done.stderr
    assert "Traceback" not in done.stderr and "Unclosed" not in done.stderr, done.stderr
