"""A peer for benchmark 11: per-GPU 60 s idle and covered sums with faust-streaming, exactly once.

Run in the peers' own virtual environment (``benchmarks/peers.py`` makes it). What it computes is
``quix_idle.py``'s, written as a faust user would: an agent over the events topic and a table of
sums per GPU and minute (its changelog in Kafka). Settings as ``quix_idle.py``'s.
"""

from __future__ import annotations

import json
import os
import tempfile
import time

import faust
from pane_sums import sample

MESSAGES, OUT = int(os.environ["PEER_MESSAGES"]), os.environ["PEER_OUT"]

app = faust.App(
    f"faust-idle-{time.time_ns()}",
    broker=f"kafka://{os.environ['PEER_BOOTSTRAP']}",
    processing_guarantee="exactly_once",
    store="memory://",
    topic_partitions=4,
    datadir=tempfile.mkdtemp(prefix="faust-data-"),
    web_enabled=False,
)
topic = app.topic(
    os.environ["PEER_TOPIC"], key_type=bytes, value_type=bytes, value_serializer="raw", key_serializer="raw"
)
sums = app.Table("sums", default=lambda: [0, 0], partitions=4)
seen = {"messages": 0, "events": 0, "first": 0.0, "last": 0.0}


@app.agent(topic)
async def idle(stream: faust.StreamT) -> None:
    async for key, value in stream.items():
        seen["first"] = seen["first"] or time.perf_counter()
        seen["messages"] += 1
        for line in value.split(b"\n") if value else ():  # an empty value: the producer's end of input
            seen["events"] += 1
            event = json.loads(line)
            if event["kind"] != "gpu_sample":
                continue
            pane, idle_ms, covered_ms = sample(event)
            k = f"{key.decode()}|{pane}"
            total = sums[k]
            sums[k] = [total[0] + idle_ms, total[1] + covered_ms]
        if seen["messages"] == MESSAGES:
            seen["last"] = time.perf_counter()
            windows = [(gpu, int(pane), *sums[k]) for k in sums for gpu, pane in [k.split("|")]]
            with open(OUT, "w") as fh:
                json.dump({**seen, "windows": windows}, fh)
            os._exit(0)


if __name__ == "__main__":
    app.main()  # run as ``faust_idle.py worker -l warn``
