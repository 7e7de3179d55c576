"""The real dcgm-exporter scrapes of the shared data, their values read by a plain regex, and an exporter serving
one on 127.0.0.1."""

from __future__ import annotations

import contextlib
import http.server
import re
import threading
from collections.abc import Callable, Iterator
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


#: the fault metrics NVIDIA/dcgm-exporter's etc/default-counters.csv and etc/dcp-metrics-included.csv type
#: ``counter`` (XID_ERRORS and ROW_REMAP_FAILURE are ``gauge`` there)
FAULT_COUNTERS = {
    *(f"DCGM_FI_DEV_ECC_{bits}_{kind}_TOTAL" for bits in ("SBE", "DBE") for kind in ("VOL", "AGG")),
    *(f"DCGM_FI_DEV_NVLINK_{kind}_ERROR_COUNT_TOTAL" for kind in ("CRC_FLIT", "CRC_DATA", "REPLAY", "RECOVERY")),
    "DCGM_FI_DEV_RETIRED_SBE",
    "DCGM_FI_DEV_RETIRED_DBE",
}


def l4_with(shared_data: Path, *lines: str, typed: bool = False) -> str:
    """The L4 scrape's own line 72 relabelled as each ``NAME VALUE`` given (its labels kept); ``typed``, each
    after a ``# TYPE`` line as the exporter writes one: line 71 (``counter``) or 101 (``gauge``) relabelled."""
    text = metric_text(shared_data, "l4-kops-output.md")
    capture = (shared_data / "dcgm-exporter" / "l4-kops-output.md").read_text(encoding="utf-8").splitlines()
    template = capture[72 - 1]
    labels = template[template.index("{") : template.rindex("}") + 1]
    counter, gauge = capture[71 - 1].split()[2], capture[101 - 1].split()[2]
    for name, value in (ln.split() for ln in lines):
        if typed:
            text += (
                capture[71 - 1].replace(counter, name)
                if name in FAULT_COUNTERS
                else capture[101 - 1].replace(gauge, name)
            ) + "\n"
        text += f"{name}{labels} {value}\n"
    return text


@pytest.fixture
def exporter(shared_data: Path) -> Iterator[tuple[str, str]]:
    text = metric_text(shared_data, SCRAPES[0])
    with serving(text) as url:
        yield url, text


@contextlib.contextmanager
def serving(metrics: str, pages: Callable[[], str] | None = None) -> Iterator[str]:
    """``metrics`` served as an exporter's /metrics on 127.0.0.1 (or, where given, what ``pages`` returns at each
    request: a scrape that changes); yields its URL."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            page = (pages() if pages else metrics).encode()
            self.wfile.write(page if self.path == "/metrics" else b"")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()
