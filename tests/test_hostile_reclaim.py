"""Hostile input against the reclaim webhook: receivers that redirect, stall, dribble and flood.

Issue 35, item 7. Each attack runs on the reclaim triggers of a real pipeline run (the embedded run of the SLA
scripts, tests/support/sla_fleet.py), in both configurations of the ``horizon`` fixture, and appends one line to
the hostile-input summary: what was sent, what was refused and why, and the outcome. Receivers are local servers on
free ports of 127.0.0.1 whose loops stop by themselves.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import socketserver
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gpucost.cli import main
from gpucost.sinks.views import connect
from gpucost.streams.settings import AuditSettings
from tests.support.hostile import line
from tests.support.pipeline_runs import pipeline_run
from tests.support.sla_fleet import SCRIPTS as SLA_SCRIPTS
from tests.support.sla_fleet import fleet as sla_fleet

# --- item 7: the reclaim webhook -------------------------------------------------------------------


class Counting(http.server.ThreadingHTTPServer):
    """An HTTP server on a free port of 127.0.0.1 that counts what reaches it (the redirect's target) or answers
    ``status`` with ``Location: location`` (the configured webhook), keeping each attempt's key and time."""

    daemon_threads = True

    def __init__(self, status: int | None = None, location: str = "") -> None:
        self.hits: list[tuple[str, dict[str, str]]] = []
        self.attempts: dict[str, list[float]] = {}
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def answer(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                server.hits.append((self.command, dict(self.headers)))
                key = self.headers.get("Idempotency-Key", "")
                server.attempts.setdefault(key, []).append(time.monotonic())
                self.send_response(status or 200)
                if location:
                    self.send_header("Location", location)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST = do_PUT = answer  # noqa: N815 (http.server's names)

            def log_message(self, *args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}/reclaim"
        threading.Thread(target=self.serve_forever, daemon=True).start()


def triggers_of(tmp_path_factory: pytest.TempPathFactory, settings_: AuditSettings, gpus: tuple[str, ...]) -> Path:
    """The output of an embedded run of the SLA scripts (tests/support/sla_fleet.py) for ``gpus`` (their reclaim
    triggers)."""
    run = settings_.model_copy(update={"lateness_s": 0})
    return pipeline_run(
        tmp_path_factory, "reclaim-" + "-".join(gpus), run, lambda: sla_fleet({g: SLA_SCRIPTS[g] for g in gpus})
    )


def reclaim(out: Path, tmp_path: Path, url: str, *flags: str) -> tuple[int, dict[str, str], float]:
    """``gpucost reclaim --out`` to ``url``: exit status, each trigger's outcome (the actions file), seconds."""
    actions = tmp_path / "actions.jsonl"
    started = time.monotonic()
    code = main(
        [
            "reclaim",
            "--out",
            str(out),
            "--webhook",
            url,
            "--ledger",
            str(tmp_path / "ledger"),
            "--actions-file",
            str(actions),
            *flags,
        ]
    )
    elapsed = time.monotonic() - started
    outcomes = {a["trigger_id"]: a["outcome"] for a in map(json.loads, actions.read_text().splitlines())}
    return code, outcomes, elapsed


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308, 503])
def test_a_redirect_is_a_failed_attempt_never_followed(
    status: int, horizon: AuditSettings, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    out = triggers_of(tmp_path_factory, horizon, ("G0", "G1"))
    triggers = {t for (t,) in connect(out).execute("SELECT trigger_id FROM reclaim").fetchall()}
    target = Counting()
    hook = Counting(status, target.url + "?stolen=1")
    try:
        code, outcomes, _ = reclaim(out, tmp_path, hook.url, "--max-attempts", "3", "--backoff-s", "0.05")
    finally:
        hook.shutdown()
        target.shutdown()
    assert code == 1 and len(triggers) == 3  # failed deliveries: a script sees exit 1
    assert target.hits == [], "a request reached the redirect's target"
    assert {k: len(v) for k, v in hook.attempts.items()} == dict.fromkeys(triggers, 3), "not retried to the budget"
    gaps = [b - a for times in hook.attempts.values() for a, b in zip(times, times[1:])]
    assert all(g >= 0.05 for g in gaps[0::2]) and all(g >= 0.1 for g in gaps[1::2]), "no doubling back-off"
    assert outcomes == dict.fromkeys(triggers, "failed")
    assert not (tmp_path / "ledger").exists() or not (tmp_path / "ledger").read_text().split(), (
        "a failed trigger was ledgered: acting again would never retry it"
    )
    line(
        f"reclaim: webhook answers {status}",
        horizon,
        f"{len(triggers)} triggers, 3 attempts each",
        f"{sum(outcomes[t] == 'failed' for t in triggers)} failed",
        f"requests at the redirect target {len(target.hits)}",
    )


class Dribbling(socketserver.ThreadingTCPServer):
    """A raw server on a free port of 127.0.0.1: to each connection it sends ``head``, then ``more`` bytes in
    ``chunk``-byte pieces every ``every`` seconds, and stops at the end or when the client goes (``sent``: bytes
    it managed to send, per connection)."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, head: bytes, more: int, chunk: int, every: float) -> None:
        self.sent: list[int] = []
        server = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                self.request.recv(65536)
                sent, zeros = 0, bytes(chunk)
                try:
                    self.request.sendall(head)
                    sent = len(head)
                    while sent - len(head) < more:
                        self.request.sendall(zeros)
                        sent += chunk
                        if every:
                            time.sleep(every)
                except OSError:
                    pass
                server.sent.append(sent)

        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}/reclaim"
        threading.Thread(target=self.serve_forever, daemon=True).start()


@pytest.mark.slow
def test_a_slowloris_receiver_fails_the_attempt_within_the_total_timeout(
    horizon: AuditSettings, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """One byte a second, for 20 s at most: each byte comes well within the read timeout (5 s), so only the total
    (2 s) can end the attempt."""
    out = triggers_of(tmp_path_factory, horizon, ("G0",))
    slow = Dribbling(b"", 20, 1, 1.0)
    try:
        code, outcomes, elapsed = reclaim(
            out,
            tmp_path,
            slow.url,
            "--total-timeout-s",
            "2",
            "--read-timeout-s",
            "5",
            "--max-attempts",
            "2",
            "--backoff-s",
            "0.05",
        )
    finally:
        slow.shutdown()
    assert code == 1 and list(outcomes.values()) == ["failed"]
    assert elapsed < 2 * 2 + 3, f"two attempts of 2 s took {elapsed:.1f} s"
    line(
        "reclaim: slowloris (1 byte/s)",
        horizon,
        "1 trigger, 2 attempts",
        "1 failed",
        f"done in {elapsed:.1f} s (bound 2 x 2 s total timeout)",
    )


def test_a_huge_answer_is_read_no_further_than_the_cap(
    horizon: AuditSettings, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A 2xx head then 256 MiB of zeros, streamed: the status decides, the body is left unread; an endless head
    fails once the cap is read."""
    from gpucost.webhook import WebhookSettings, post

    out = triggers_of(tmp_path_factory, horizon, ("G0",))
    body = 256 << 20
    huge = Dribbling(f"HTTP/1.1 200 OK\r\nContent-Length: {body}\r\n\r\n".encode(), body, 1 << 16, 0)
    endless = Dribbling(b"HTTP/1.1 200 OK\r\nX-Pad: ", body, 1 << 16, 0)
    settings_ = WebhookSettings(max_response_bytes=65_536)
    try:
        code, outcomes, _ = reclaim(out, tmp_path, huge.url)
        answer = asyncio.run(post(huge.url, b"{}", {"Idempotency-Key": "t"}, settings_))
        cut = asyncio.run(post(endless.url, b"{}", {"Idempotency-Key": "t"}, settings_))
        deadline = time.monotonic() + 10
        while len(huge.sent) + len(endless.sent) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        huge.shutdown()
        endless.shutdown()
    assert code == 0 and list(outcomes.values()) == ["delivered"]
    assert answer.status == 200 and answer.bytes_read <= 65_536
    assert cut.status is None and cut.bytes_read == 65_536 and "cap" in cut.why
    assert len(huge.sent) + len(endless.sent) == 3 and max(huge.sent + endless.sent) < 64 << 20, (
        f"the servers sent {huge.sent + endless.sent} bytes: the answers were read on"
    )
    line(
        "reclaim: 256 MiB answer",
        horizon,
        "1 trigger; a 2xx head then 256 MiB, an endless head",
        f"the endless head at {cut.bytes_read:,} bytes",
        f"delivered; read {answer.bytes_read:,} bytes, servers sent at most {max(huge.sent + endless.sent) >> 20} MiB",
    )


def test_a_receiver_that_goes_quiet_fails_the_attempt_within_the_read_timeout() -> None:
    """One byte, then 3 s of nothing: the read timeout (1 s) ends the attempt long before the total (10 s)."""
    from gpucost.webhook import WebhookSettings, post

    quiet = Dribbling(b"", 2, 1, 3.0)
    started = time.monotonic()
    try:
        answer = asyncio.run(
            post(quiet.url, b"{}", {"Idempotency-Key": "t"}, WebhookSettings(read_timeout_s=1, total_timeout_s=10))
        )
    finally:
        quiet.shutdown()
    elapsed = time.monotonic() - started
    assert answer.status is None and "read timeout" in answer.why and elapsed < 2.5, (answer, elapsed)
    line(
        "reclaim: receiver quiet after 1 byte",
        None,
        "1 attempt",
        "1 (read timeout 1 s)",
        f"failed after {elapsed:.1f} s (total timeout 10 s)",
    )
