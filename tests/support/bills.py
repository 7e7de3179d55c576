"""The auditor's row path run over events in the order given, and its bill per (GPU, pane, tenant) summed over
revisions: what revisions and silence must leave equal to a replay in time order."""

from __future__ import annotations

from collections import defaultdict

from gpucost.schemas.events import Event
from gpucost.schemas.records import CostRecord, Output
from gpucost.streams.audit import Auditor
from gpucost.streams.settings import AuditSettings


def run(s: AuditSettings, events: list[Event]) -> list[Output]:
    auditor = Auditor(s)
    out: list[Output] = []
    for e in events:
        out += auditor.update(e)
    return out + auditor.finish()


def bills(out: list[Output]) -> dict[tuple[str, int, str], int]:
    total: dict[tuple[str, int, str], int] = defaultdict(int)
    for r in out:
        if isinstance(r, CostRecord):
            total[(r.gpu_uuid, r.pane_start_ns, r.tenant_key)] += r.cost_micro_usd
    return dict(total)
