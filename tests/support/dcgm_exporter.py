"""The real dcgm-exporter scrapes of the shared data, their values read by a plain regex, and an exporter serving
one on 127.0.0.1."""

from __future__ import annotations

import contextlib
import http.server
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

SCRAPES = ["l4-kops-output.md", "t4-ericsson-ccd.md", "l40s-upcloud.md", "a100-vgpu-vks.md"]
LINE = re.compile(r"^(DCGM_FI_\w+)\{([^}]*)\} (\S+)$")


def metric_text(shared_data: Path, name: str) -> str:
    path = shared_data / "dcgm-exporter" / name
    if not path.exists():
        pytest.skip(f"{path} is absent")
    lines = [ln for ln in path.read_text().splitlines() if ln.startswith(("# HELP", "# TYPE", "DCGM_FI_"))]
    return "\n".join(lines) + "\n"


def expected(text: str) -> dict[str, dict[str, object]]:
    """Per UUID, the last value of each field and the labels: read with a plain regex."""
    out: dict[str, dict[str, object]] = {}
    for line in text.splitlines():
        m = LINE.match(line)
        if m:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m[2]))
            gpu = out.setdefault(labels["UUID"], {})
            gpu[m[1]] = float(m[3])
            gpu["_labels"] = labels
    return out


@pytest.fixture
def exporter(shared_data: Path) -> Iterator[tuple[str, str]]:
    text = metric_text(shared_data, SCRAPES[0])
    with serving(text) as url:
        yield url, text


@contextlib.contextmanager
def serving(metrics: str) -> Iterator[str]:
    """``metrics`` served as an exporter's /metrics on 127.0.0.1; yields its URL."""
    text = metrics.encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(text if self.path == "/metrics" else b"")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()
