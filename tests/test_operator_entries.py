"""Each operator's batch entry against its own row entry, directly: the same records at the same
positions, and the same state, over random inputs cut into random batches.

(The whole audit's two paths are compared in tests/test_columnar.py; these hold each operator to
it alone, so that a drift shows where it is.)
"""
from __future__ import annotations

import json

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from gpucost.schemas.events import MemAccess, TenantBinding
from gpucost.streams.mae import Mae
from gpucost.streams.settings import AuditSettings
from gpucost.streams.tables import UNATTRIBUTED, BindingTable

T0 = 1_736_121_600 * 10**9


@st.composite
def mae_cases(draw: st.DrawFn) -> tuple[AuditSettings, list[tuple[int, int]], list[int]]:
    lo = draw(st.sampled_from([0, 1 << 12, (1 << 64) - (1 << 20)]))
    hi = draw(st.sampled_from([lo + 4096, lo + (1 << 32), 1 << 64]).filter(lambda h: h > lo))
    settings = AuditSettings(mae_window=draw(st.integers(1, 40)), mae_bins=draw(st.sampled_from([1, 7, 256, 1 << 16])),
                             mae_lo=lo, mae_hi=min(hi, 1 << 64))
    accesses = draw(st.lists(st.tuples(st.integers(0, 2), st.integers(0, (1 << 64) - 1)), max_size=200))
    cuts = sorted(draw(st.sets(st.integers(0, len(accesses)), max_size=5)))
    return settings, accesses, cuts


@given(mae_cases())
def test_mae_update_many_is_update_address_by_address(case: tuple[AuditSettings, list[tuple[int, int]], list[int]]) -> None:
    settings, accesses, cuts = case
    by_row, by_batch = Mae(settings), Mae(settings)
    want = []
    for i, (pid, address) in enumerate(accesses):
        record = by_row.update(MemAccess(node_id="n", pid=pid, ts_ns=T0 + i, address=address))
        if record is not None:
            want.append((i, record))
    got = []
    for lo, hi in zip([0, *cuts], [*cuts, len(accesses)]):
        part = accesses[lo:hi]
        for pid in sorted({p for p, _ in part}):
            at = np.array([lo + k for k, (p, _) in enumerate(part) if p == pid], np.int64)
            address = np.array([a for p, a in part if p == pid], np.uint64)
            got += [(int(at[k]), r) for k, r in by_batch.update_many(("n", pid), T0 + at, by_batch.bins_of(address))]
    assert sorted(got, key=lambda g: g[0]) == want
    assert normalised(by_batch) == normalised(by_row)


def normalised(mae: Mae) -> str:
    """The state with each window's bins in bin order (their order carries no meaning)."""
    return json.dumps(sorted([n, p, sorted(counts), *rest] for n, p, counts, *rest in mae.to_state()))


@given(st.lists(st.tuples(st.integers(0, 50), st.sampled_from(["a", "b", "c"])), max_size=30),
       st.lists(st.integers(-5, 60), max_size=40))
def test_binding_lookup_many_is_lookup_time_by_time(bindings: list[tuple[int, str]], times: list[int]) -> None:
    table = BindingTable()
    for ts, team in bindings:
        table.update(TenantBinding(node_id="n", pid=1, ts_ns=T0 + ts, team=team, env="", app="", tier="",
                                   sla="Gold"))
    tenants, at = table.lookup_many("n", 1, T0 + np.array(times, np.int64))
    assert [UNATTRIBUTED if i < 0 else tenants[i] for i in at.tolist()] == [table.lookup("n", 1, T0 + t) for t in times]
    assert table.lookup_many("n", 2, T0 + np.array(times, np.int64))[0] == []  # another process has none
