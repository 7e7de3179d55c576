"""What a billing consumer sums: µ$ per team over every cost record and revision, by hand. The hostile-input tests
compare it between an attack and a clean send (re-sent input, late bindings)."""

from __future__ import annotations

from collections import Counter

from gpucost.schemas.records import CostRecord

__all__ = ["by_team"]


def by_team(out: list) -> dict[str, int]:
    """µ$ per team, summed over every cost record and revision by hand (what a billing consumer sums)."""
    teams: Counter[str] = Counter()
    for r in out:
        if isinstance(r, CostRecord):
            teams[r.team] += r.cost_micro_usd
    return dict(teams)
