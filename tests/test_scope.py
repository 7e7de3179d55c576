"""``Scope``'s two forms of one rule: ``check`` (an event) and ``refused_many`` (a batch's columns, what the
batch path runs) refuse the same rows, for any message key and signer's node list."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from gpucost.schemas.events import GpuSample, MemAccess, NumaEvent, ProcessSample
from gpucost.streams.scope import Scope

GPUS = ["GPU-a", "GPU-b", "n1/7"]  # a GPU id that reads like a process key too
NODES = ["n1", "n2"]
KINDS = {"gpu_sample": GpuSample, "process_sample": ProcessSample, "numa_event": NumaEvent, "mem_access": MemAccess}

rows = st.lists(
    st.tuples(
        st.sampled_from(sorted(KINDS)),
        st.sampled_from(GPUS),
        st.sampled_from(NODES),
        st.sampled_from([7, 8, 1234567890123]),
    ),
    max_size=12,
)
keys = st.one_of(st.none(), st.sampled_from([*GPUS, "n1/7", "n2/8", "n1/x", "n1/12345678901"]))
node_lists = st.one_of(st.none(), st.frozensets(st.sampled_from([*NODES, "n3"])))


@given(rows, keys, node_lists)
def test_the_batch_form_refuses_exactly_the_rows_check_refuses(batch, key, nodes) -> None:
    scope = Scope(key=key, nodes=nodes)
    events = []
    for kind, gpu, node, pid in batch:  # model_construct: the check reads only the kind, ids and pid
        fields = (
            {"node_id": node, "pid": pid} if kind == "mem_access" else {"gpu_uuid": gpu, "node_id": node, "pid": pid}
        )
        events.append(KINDS[kind].model_construct(**fields))
    gpu_names, node_names = sorted({g for _, g, _, _ in batch}), sorted({n for _, _, n, _ in batch})
    mem = np.array([kind == "mem_access" for kind, *_ in batch], bool)
    gpu = np.array(
        [len(gpu_names) if kind == "mem_access" else gpu_names.index(g) for kind, g, _, _ in batch], np.int64
    )
    node = np.array([node_names.index(n) for _, _, n, _ in batch], np.int64)
    pid = np.array([p for *_, p in batch], np.int64)
    got = scope.refused_many(~mem, mem, gpu, gpu_names, node, node_names, pid)
    assert got.tolist() == [scope.check(e) is not None for e in events]
