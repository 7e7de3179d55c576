"""A peer for benchmark 11: per-GPU 60 s idle and covered sums with quixstreams, exactly once.

Run in the peers' own virtual environment (``benchmarks/peers.py`` makes it), not gpucost's: it
imports nothing of gpucost, and computes from docs/definitions.md ("Idle index") what gpucost's ``idle_index``
records carry per pane (``pane_sums.py``).

``idiomatic``: each event is a row (the message's lines expanded), its event time the row's
timestamp, summed by a tumbling window that takes events as late as gpucost's panes do.
``presum``: each message's samples are summed per pane before a row reaches the window, one row
per pane and message. Settings (environment):
``PEER_BOOTSTRAP``, ``PEER_TOPIC``, ``PEER_MESSAGES`` (stop after this many), ``PEER_OUT`` (a JSON
file: the first and last message's times, the events seen, the closed windows).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

from pane_sums import LATENESS_MS, PANE_MS, sample
from quixstreams import Application


def main(mode: str) -> None:
    messages, out_path = int(os.environ["PEER_MESSAGES"]), os.environ["PEER_OUT"]
    app = Application(
        broker_address=os.environ["PEER_BOOTSTRAP"],
        consumer_group=f"quix-{mode}-{time.time_ns()}",
        auto_offset_reset="earliest",
        processing_guarantee="exactly-once",
        state_dir=tempfile.mkdtemp(prefix="quix-state-"),
    )
    topic = app.topic(os.environ["PEER_TOPIC"], key_deserializer="bytes", value_deserializer="bytes")
    seen = {"messages": 0, "events": 0, "first": 0.0, "last": 0.0}
    windows: list[tuple[str, int, int, int]] = []

    def arrived(value: bytes) -> bytes:
        seen["messages"] += 1
        seen["events"] += value.count(b"\n") + 1 if value else 0  # an empty value: the producer's end of input
        now = time.perf_counter()
        seen["first"] = seen["first"] or now
        if seen["messages"] == messages:
            seen["last"] = now  # every earlier message went through every step before this one arrived
            app.stop()
        return value

    def lines(value: bytes) -> list[dict]:
        return [e for e in map(json.loads, value.split(b"\n") if value else ()) if e["kind"] == "gpu_sample"]

    def presummed(value: bytes) -> list[list[int]]:
        panes: dict[int, list[int]] = {}
        for event in lines(value):
            start, idle, covered = sample(event)
            sums = panes.setdefault(start, [start, 0, 0])
            sums[1] += idle
            sums[2] += covered
        return list(panes.values())

    sdf = app.dataframe(topic).apply(arrived)
    if mode == "idiomatic":
        sdf = sdf.apply(lines, expand=True)
        sdf = sdf.set_timestamp(lambda value, key, timestamp, headers: value["ts_ns"] // 1_000_000)
        sdf = sdf.apply(lambda event: list(sample(event)[1:]))
    else:
        sdf = sdf.apply(presummed, expand=True)
        sdf = sdf.set_timestamp(lambda value, key, timestamp, headers: value[0])
        sdf = sdf.apply(lambda sums: sums[1:])
    sdf = (
        sdf.tumbling_window(duration_ms=PANE_MS, grace_ms=LATENESS_MS)
        .reduce(reducer=lambda total, v: [total[0] + v[0], total[1] + v[1]], initializer=lambda v: list(v))
        .final()
    )
    sdf.update(
        lambda value, key, timestamp, headers: windows.append(
            (key.decode(), value["start"], value["value"][0], value["value"][1])
        ),
        metadata=True,
    )
    app.run()
    with open(out_path, "w") as fh:
        json.dump({**seen, "windows": windows}, fh)


if __name__ == "__main__":
    main(sys.argv[1])
