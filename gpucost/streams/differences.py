"""The records a revision publishes (docs/definitions.md, "Late data become revisions"): a recomputed pane's
cost records as differences from what was published before, so that summing a party's records over every
revision gives its current amount, and a party left with nothing gets a closing record. Apart from
``gpucost.streams.revisions``, which keeps what a pane is recomputed from: this is what is published of it.
"""

from __future__ import annotations

from gpucost.schemas.records import CostRecord, record_id

__all__ = ["differences"]


def differences(old: list[CostRecord], new: list[CostRecord], revision: int) -> list[CostRecord]:
    """The records a recomputation publishes: one for every party whose record changed in any value or that
    is new, its ``cost_micro_usd`` the difference from its previous total, its other fields the new values;
    a closing record of −(its total), shares 0, for a party left with nothing. Empty if nothing changed.
    ``old`` and ``new`` are one pane's records (``apportion``), ``old`` empty if it was never published."""
    before = {r.tenant_key: r for r in old}
    after = {r.tenant_key: r for r in new}
    out = []
    for key, r in after.items():
        was = before.get(key)
        values = r.model_dump(exclude={"record_id", "revision"})
        if was is not None and was.model_dump(exclude={"record_id", "revision"}) == values:
            continue
        out.append(
            r.model_copy(
                update={
                    "record_id": record_id(r.gpu_uuid, r.pane_start_ns, key, revision),
                    "revision": revision,
                    "cost_micro_usd": r.cost_micro_usd - (0 if was is None else was.cost_micro_usd),
                }
            )
        )
    if not out and before.keys() <= after.keys():
        return []
    pane = new[0] if new else None
    for key, was in before.items():
        if key in after:
            continue
        closing = {
            "record_id": record_id(was.gpu_uuid, was.pane_start_ns, key, revision),
            "revision": revision,
            "cost_micro_usd": -was.cost_micro_usd,
            "t_share": 0.0,
            "b_share": 0.0,
            "l_share": 0.0,
            "weight": 0.0,
            "t_num": 0,
            "b_num": 0,
            "l_num": 0,
        }
        if pane is not None:
            closing.update(
                {
                    f: getattr(pane, f)
                    for f in (
                        "busy_fraction",
                        "pane_cost_micro_usd",
                        "usd_per_gpu_hour",
                        "unpriced",
                        "busy_num",
                        "covered_ms",
                    )
                }
            )
        out.append(was.model_copy(update=closing))
    return sorted(out, key=lambda r: (r.tenant_key != "idle", r.tenant_key))
