"""A run's Parquet output read back as whole rows, and the revision horizons the kill tests run under."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import duckdb
import pytest

from gpucost.schemas.records import OUTPUT_KINDS

#: every record kind a run writes, dead letters included
KINDS = tuple(OUTPUT_KINDS)
#: with revisions (6 h of event time) and without
HORIZONS = pytest.mark.parametrize("horizon_s", [21600, 0], ids=["R=6h", "R=0"])


def rows(out: Path) -> dict[str, Counter[str]]:
    """Every row of every kind, as a multiset (the order files hold them in is not the bill)."""
    got = {}
    for kind in KINDS:
        files = sorted(out.glob(f"{kind}/date=*/part-*.parquet"))
        table = duckdb.sql(f"SELECT * FROM read_parquet({[str(f) for f in files]})").fetchall() if files else []
        got[kind] = Counter(repr(r) for r in table)
    return got
