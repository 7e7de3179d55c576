"""Exit 0 when a running `gpucost run` (or produce, worker, sink) says it is healthy, else 1 with the
reason on stderr.

gpucost-run-healthz.service runs this every minute with gpucost-run.service's environment, and restarts
the run when it fails. It asks ``/healthz`` at ``GPUCOST_METRICS_ADDRESS`` (on Linux, an address on every
interface, 0.0.0.0 or [::], reaches this host), which answers 200, or 503 with the reason once the run's
loop has not moved for 60 s, or its source has given no events for 60 s and past its deadline (a wedged
driver, an exporter that does not answer; gpucost.metrics.Health). It asks up to ATTEMPTS times, PAUSE_S apart, so that
a run that is starting (a refused connection) or busy for a moment is not taken for a dead one.

usage: gpucost-healthz.py [ATTEMPTS]
"""

from __future__ import annotations

import http.client
import os
import sys
import time
import urllib.error
import urllib.request

from gpucost.metrics import parse_address

ATTEMPTS, PAUSE_S, TIMEOUT_S = 3, 10.0, 5.0


def healthz_url(address: str) -> str:
    host, port = parse_address(address)
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/healthz"


def problem(url: str) -> str | None:
    """None when ``url`` answers 200, else what went wrong."""
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S):  # any status but 2xx raises HTTPError
            return None
    except urllib.error.HTTPError as exc:
        return f"{url} answered {exc.code}: {exc.read().decode('utf-8', 'replace').strip()}"
    except (OSError, http.client.HTTPException) as exc:  # refused, timed out, not HTTP
        return f"{url}: {exc}"


def main(argv: list[str]) -> int:
    attempts = int(argv[0]) if argv else ATTEMPTS
    address = os.environ.get("GPUCOST_METRICS_ADDRESS")
    if not address:
        print("gpucost-healthz: GPUCOST_METRICS_ADDRESS is unset, so the run serves no /healthz", file=sys.stderr)
        return 1
    try:
        url = healthz_url(address)
    except ValueError as exc:
        print(f"gpucost-healthz: {exc}", file=sys.stderr)
        return 1
    for attempt in range(1, attempts + 1):
        why = problem(url)
        if why is None:
            return 0
        print(f"gpucost-healthz: attempt {attempt} of {attempts}: {why}", file=sys.stderr)
        if attempt < attempts:
            time.sleep(PAUSE_S)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
