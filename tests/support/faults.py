"""What the fault-injection modules share: the events a recording holds, and the summary line of each fault that
pytest prints at the end of the session (tests/conftest.py's FAULT_LINES)."""

from __future__ import annotations

from pathlib import Path

from gpucost.producers.replay import input_files
from gpucost.sinks.views import connect
from tests.conftest import FAULT_LINES
from tests.support.deployment import Deployment


def events_in(folder: Path) -> int:
    return sum(sum(1 for line in f.open("rb") if line.strip()) for f in input_files([folder]))


def report(fault: str, sent: int, d: Deployment, embedded: Path) -> None:
    got, want = connect(d.out), connect(embedded)
    records = sum(got.execute(f"SELECT count(*) FROM {v}").fetchone()[0] for v in ("cost", "idle_index", "mae"))
    reasons = dict(got.execute("SELECT reason, count(*) FROM dlq GROUP BY reason ORDER BY reason").fetchall())
    billed = got.execute("SELECT coalesce(sum(cost_micro_usd), 0)::BIGINT FROM cost").fetchone()[0]
    expected = want.execute("SELECT coalesce(sum(cost_micro_usd), 0)::BIGINT FROM cost").fetchone()[0]
    FAULT_LINES.append(
        f"{fault:<28} events sent {sent:>7,} | records out {records:>6,} | dead-lettered "
        f"{sum(reasons.values()):>4} {reasons or ''} | µ$ billed {billed:,} vs expected {expected:,}"
        f" {'OK' if billed == expected else 'MISMATCH'}"
    )
