"""A price given under any name of a platform row prices every name of it (docs/definitions.md, "Tenants and
prices"): NVML's ``NVIDIA H100 80GB HBM3`` and the platform table's ``H100`` bill alike, a model's own price first.

The expected prices are brute force over the price events, with the platform rows read from ``platforms.toml``
with ``tomllib`` here, not through the product's lookup; the bills are compared with the ones the same fleet
gives when its price book names each model as its samples do.
"""

from __future__ import annotations

import re
import tomllib
from collections import defaultdict
from decimal import Decimal
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from gpucost.embedded import run_embedded
from gpucost.producers.replay import input_files, read_inputs
from gpucost.producers.simulate import FleetSpec, simulate
from gpucost.schemas.codec import encode_event
from gpucost.schemas.events import Event, Price
from gpucost.sinks.views import connect
from gpucost.streams.settings import AuditSettings
from gpucost.streams.tables import PriceTable
from tests.conftest import ROOT
from tests.support.batch_path import closing_at
from tests.support.bills import bills, run

with (ROOT / "gpucost" / "schemas" / "platforms.toml").open("rb") as f:
    ROWS = {name: [name, *row.get("aliases", [])] for name, row in tomllib.load(f).items()}
#: names drawn: two platform rows' names in full, a part of no row, a partition of each row, and the fallback
NAMES = [*ROWS["H100"], *ROWS["MI300X"], *ROWS["Alveo U280"], "Mystery X1"]
#: an Alveo shell's name: its row's alias and ``_`` then the shell (``platform_for``'s prefix rule)
MODELS = [*NAMES, "MI300X 1/8", "AMD Instinct MI300X 1/2", "NVIDIA H100 1/2", "xilinx_u280_gen3x16_xdma_base_1"]
T0 = 1_767_571_200 * 10**9


def expected(prices: list[Price], model: str, ts_ns: int) -> Decimal | None:
    """The price of ``model`` at ``ts_ns``: each candidate name's latest price at or before it (the first of an
    instant), its own name first, then its row's in the table's order, then ``default``."""
    whole = re.sub(r" [1-9][0-9]*/[1-9][0-9]*$", "", model)
    row = next((ns for ns in ROWS.values() if any(whole == n or whole.startswith(n + "_") for n in ns)), [])
    for name in [whole, *(n for n in row if n != whole), "default"]:
        seen = [p for p in prices if p.gpu_model == name and p.ts_ns <= ts_ns]
        if seen:
            last = max(p.ts_ns for p in seen)
            return next(p.usd_per_gpu_hour for p in seen if p.ts_ns == last)
    return None


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from([*NAMES, "default"]), st.integers(0, 20), st.integers(0, 999)), max_size=12),
    st.lists(st.tuples(st.sampled_from(MODELS), st.integers(-1, 21)), min_size=1, max_size=20),
)
def test_a_model_takes_its_own_price_then_its_rows_then_the_default(
    given_prices: list[tuple[str, int, int]], asked: list[tuple[str, int]]
) -> None:
    table, taken = PriceTable(), []
    for name, ts, cents in given_prices:
        p = Price(gpu_model=name, ts_ns=T0 + ts, usd_per_gpu_hour=Decimal(cents) / 100)
        if table.admit(p) is None:
            table.take(p)
            taken.append(p)
    for model, ts in asked:
        assert table.lookup(model, T0 + ts) == expected(taken, model, T0 + ts), (model, ts)


def _bills_both_paths(events: list[Event], out: Path) -> tuple[dict, dict]:
    out.mkdir()
    path = out / "events.jsonl"
    path.write_text("".join(encode_event(e) + "\n" for e in events))
    row = bills(run(AuditSettings(), events))
    with closing_at(1):
        run_embedded(read_inputs(input_files([path])), AuditSettings(), out / "parquet")
    batch: dict[tuple[str, int, str], int] = defaultdict(int)
    query = "SELECT gpu_uuid, pane_start_ns, tenant_key, cost_micro_usd FROM cost"
    for gpu, start, tenant, cost in connect(out / "parquet").execute(query).fetchall():
        batch[(gpu, start, tenant)] += cost
    return row, dict(batch)


def test_a_price_book_of_the_platform_tables_names_bills_nvml_names_alike(tmp_path: Path) -> None:
    """The simulated fleet's samples name their models as NVML does; its price book named by the platform rows
    instead (``H100`` for ``NVIDIA H100 80GB HBM3``) gives the same bill, µ$ for µ$, on both paths; and a price
    under the row's name beside the model's own changes nothing, as the own one comes first."""
    events = list(simulate(FleetSpec(gpus=4, hours=0.5, interval_s=10.0, seed=11, gpus_per_node=2)))
    row_of = {alias: name for name, names in ROWS.items() for alias in names}
    prices = [e for e in events if isinstance(e, Price) and e.gpu_model != "default"]
    assert prices and all(p.gpu_model in row_of and p.gpu_model != row_of[p.gpu_model] for p in prices)
    renamed = [
        e.model_copy(update={"gpu_model": row_of[e.gpu_model]}) if isinstance(e, Price) and e in prices else e
        for e in events
    ]
    beside = events[:1] + [
        p.model_copy(update={"gpu_model": row_of[p.gpu_model], "usd_per_gpu_hour": Decimal(99)}) for p in prices
    ]
    beside += events[1:]

    own_row, own_batch = _bills_both_paths(events, tmp_path / "own")
    assert own_row == own_batch and sum(own_row.values()) > 0
    for name, changed in (("renamed", renamed), ("beside", beside)):
        row, batch = _bills_both_paths(changed, tmp_path / name)
        assert row == own_row and batch == own_batch, name
    unpriced_row, _ = _bills_both_paths([e for e in events if e not in prices], tmp_path / "unpriced")
    assert unpriced_row != own_row  # the prices matter: without them every pane takes the default
