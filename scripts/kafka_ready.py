"""Exit 0 once a Kafka broker at HOST:PORT answers a Metadata request listing a broker.

Stdlib only, so scripts/kafka.sh can use it before any virtual environment exists.
Speaks Metadata v4 (Kafka 4 dropped v0–v3), request header v1.
"""

from __future__ import annotations

import socket
import struct
import sys
import time


def brokers(host: str, port: int, timeout_s: float = 3.0) -> int:
    client = b"gpucost-ready"
    body = struct.pack(">hhih", 3, 4, 1, len(client)) + client + struct.pack(">i?", -1, False)
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        sock.sendall(struct.pack(">i", len(body)) + body)
        size = struct.unpack(">i", _read(sock, 4))[0]
        payload = _read(sock, size)
    correlation, _throttle, count = struct.unpack(">iii", payload[:12])
    if correlation != 1:
        raise ConnectionError(f"unexpected correlation id {correlation}")
    return count


def _read(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("broker closed the connection")
        buf += chunk
    return buf


def main() -> int:
    host, port, deadline = sys.argv[1], int(sys.argv[2]), time.monotonic() + float(sys.argv[3])
    last = "no answer yet"
    while time.monotonic() < deadline:
        try:
            if brokers(host, port) > 0:
                return 0
            last = "metadata lists no broker yet"
        except (OSError, struct.error) as exc:
            last = str(exc) or type(exc).__name__
        time.sleep(0.3)
    print(f"kafka at {host}:{port} not ready: {last}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
