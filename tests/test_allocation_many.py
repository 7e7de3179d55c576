"""The allocation basis's batch entry (``split_many_panes``) against its row entry (``split``), pane by pane, over
devices with many holds: several tenants and sharing modes, holds that end inside a pane or are still held, that
start or end outside every pane, and denominators whose products pass 64 bits (the exact path) beside small ones
(int64). The row entry is itself held to a brute-force split in tests/test_allocation_basis.py."""

from __future__ import annotations

from decimal import Decimal

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from gpucost.schemas.blocks import Emitted
from gpucost.streams.allocation_split import Hold, split, split_many_panes
from gpucost.streams.pane_totals import PaneColumns, PaneTotals
from gpucost.streams.tables import Tenant

PANE_NS = 60_000_000_000
GPUS = ["GPU-a", "GPU-b", "GPU-c"]
#: t1 with an env, and with an env of "" and none, which are one tenant (``Tenant.canonical``, as every hold's is)
TENANTS = [Tenant.canonical(Tenant.named(team)) for team in ("t1", "t2", "t3")] + [
    Tenant.canonical(("t1", env, *([None] * 6))) for env in ("prod", "")
]


@st.composite
def holds(draw: st.DrawFn) -> list[Hold]:
    out = []
    for _ in range(draw(st.integers(0, 7))):
        start = draw(st.integers(-2, 12)) * PANE_NS + draw(st.sampled_from([0, 1, PANE_NS // 3]))
        end = draw(st.one_of(st.none(), st.integers(start + 1, start + 8 * PANE_NS)))
        den = draw(st.sampled_from([1, 2, 3, 100, 999_983, 10**12]))
        num = draw(st.integers(1, den)) if den < 10**6 else draw(st.sampled_from([1, den // 2, den]))
        sharing = draw(st.sampled_from(["mps", "time_slicing", "hami", "exclusive"]))
        out.append(Hold(start, end, num, den, sharing, draw(st.sampled_from(TENANTS))))
    return out


@st.composite
def fleets(draw: st.DrawFn) -> tuple[list[PaneTotals], list[Decimal | None], list[bool], dict[str, list[Hold]]]:
    panes, prices = [], []
    for k in range(draw(st.integers(1, 14))):
        gpu = draw(st.sampled_from(GPUS))
        pane = PaneTotals(gpu, k * PANE_NS, (k + 1) * PANE_NS)
        pane.node_id = "node-0"
        pane.gpu_model = draw(st.sampled_from(["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB"]))
        pane.covered_ms = draw(st.sampled_from([1, 30_000, 60_000]))
        panes.append(pane)
        prices.append(draw(st.sampled_from([None, Decimal("2.5"), Decimal("98.123457"), Decimal("0.000001")])))
    panes.sort(key=lambda p: (p.gpu_uuid, p.pane_start_ns))  # each GPU's panes ascending
    return panes, prices, [draw(st.booleans()) for _ in panes], {gpu: draw(holds()) for gpu in GPUS}


@given(fleets())
def test_the_batch_entry_gives_each_pane_the_row_entrys_records(fleet) -> None:
    panes, prices, billed, held = fleet
    table, given_prices, rows = split_many_panes(PaneColumns.of(panes), np.array(billed), prices, held)
    got = Emitted("allocation", table, rows, {"usd_per_gpu_hour": given_prices}).per_pane(len(panes))
    for pane, price, bill, records in zip(panes, prices, billed, got):
        if not bill:
            assert records == []
            continue
        start, end = pane.pane_start_ns, pane.pane_end_ns
        covering = [h for h in held[pane.gpu_uuid] if h.overlap_ns(start, end) > 0]
        assert pane.node_id is not None and pane.gpu_model is not None
        want = split(pane.gpu_uuid, pane.node_id, pane.gpu_model, start, end, pane.covered_ms, price, covering)
        assert records == want
