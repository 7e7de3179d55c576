"""A reclaim webhook receiver that fails, refuses and accepts as a test scripts it."""

from __future__ import annotations

import http.server
import json
import threading
from typing import Any


class Webhook:
    """A receiver that answers 503 to the first ``fail`` attempts of each trigger, 400 to those of ``refuse``,
    then 200; it keeps every body it accepted, with its Idempotency-Key."""

    def __init__(self, fail: int, refuse: frozenset[str] = frozenset()) -> None:
        self.accepted: list[tuple[str, dict[str, Any]]] = []
        self.attempts: dict[str, int] = {}
        hook = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (the http.server name)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                key = self.headers["Idempotency-Key"]
                hook.attempts[key] = hook.attempts.get(key, 0) + 1
                status = 400 if key in refuse else 503 if hook.attempts[key] <= fail else 200
                if status == 200:
                    hook.accepted.append((key, body))
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/reclaim"
