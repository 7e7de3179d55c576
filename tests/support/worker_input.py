"""A worker's input without a broker: a simulated fleet's lines as the router keys them on the events topic, and
message values that are no event at all."""

from __future__ import annotations

from collections import defaultdict

from gpucost.kafka.routing import Router
from gpucost.producers.simulate import FleetSpec, simulate
from gpucost.schemas.codec import encode_event

#: lines a message may carry that decode to no event: torn JSON, an unknown kind, bytes that are no UTF-8, a bad field
BAD = [b'{"kind":"gpu_sample"', b'{"kind":"mystery"}', b"\xff\xfe", b'{"kind":"gpu_sample","ts_ns":-1}']


def _lines_by_gpu() -> dict[bytes, list[bytes]]:
    router, out = Router(), defaultdict(list)
    for ev in simulate(FleetSpec(gpus=3, hours=0.5, interval_s=10)):
        for topic, key, routed in router.route(ev):
            if topic == "events":
                out[key.encode()].append(encode_event(routed).encode())
    return dict(out)


#: each GPU's stream (its samples, its node's bindings, the prices) by its key on the events topic: 3 GPUs, 30 min
LINES = _lines_by_gpu()
