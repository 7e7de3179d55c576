"""SLA tiers in action: per GPU and tenant, idle runs, reclaim triggers and the quota scale.

docs/definitions.md, "SLA tiers". The operator sees each closed pane that has GPU samples, each GPU's in
ascending order. Its candidates in a pane are the tenants with process samples there and, on a device with
holds, the tenants holding an allocation that covers part of the pane (``gpucost.streams.sla_holds``: read from
the allocation basis's table, as it stands when the pane closes), with process samples or not; one candidate per
tenant key. A candidate (with a tier: its ``sla`` in the tier table) is idle in a
pane when its process samples' ``Σ sm_util_cp · interval_ms`` (0 without any) over the pane's ``covered_ms`` is
below its tier's threshold (compared as integers: ``Σ < threshold_cp · covered_ms``; a threshold of
0 means "is 0"). An idle run is the tenant's consecutive panes of the GPU, each idle; a pane of the
GPU without the tenant, with it busy, or a pane index skipped (no GPU sample there) ends it. The
pane where the run first reaches the tier's duration emits one ``reclaim`` record; every pane emits
a ``quota`` record per tenant with a tier.

State: per (GPU, tenant) idle in the GPU's latest closed pane, the run's start and length. A
tenant absent from a GPU's latest pane has none.
"""

from __future__ import annotations

import math
from dataclasses import astuple, dataclass
from decimal import Decimal
from functools import lru_cache
from typing import Any

import numpy as np
import pyarrow as pa

from gpucost.schemas.arrow import ARROW_SCHEMAS
from gpucost.schemas.blocks import Emitted
from gpucost.schemas.exact import ratios
from gpucost.schemas.records import Output, QuotaRecord, ReclaimRecord, computed, trigger_id
from gpucost.streams.allocations import AllocationTable
from gpucost.streams.operator import Closing, ClosingMany
from gpucost.streams.pane_totals import PaneColumns, TenantTotals
from gpucost.streams.settings import AuditSettings, SlaTier
from gpucost.streams.sla_holds import held_by, held_in, held_only
from gpucost.streams.tables import Tenant

__all__ = ["SlaOperator", "quota_scale"]


def quota_scale(tier: SlaTier, idle_run_ms: int, sm: int, covered_ms: int) -> float:
    """The seed's ``calcQuotaScale``: ``base · (0.3 + 0.7 · e^(−idle_s / 300))`` while idle, else
    ``base · min(1.5, 1 + 0.5 · avg_util)``, ``avg_util`` the exact ratio rounded once. In float64
    (docs/definitions.md, "SLA tiers": to 1e-12); the batch entry does the same operations elementwise (IEEE's,
    which numpy and
    Python round alike) and takes the exponential from ``_decay`` too, so both paths give the same bits."""
    base = float(tier.quota_base)
    if idle_run_ms > 0:
        return base * _decay(idle_run_ms)
    return base * min(1.5, 1 + 0.5 * (sm / (10_000 * covered_ms)))  # int / int: correctly rounded


@lru_cache(maxsize=4096)
def _decay(idle_run_ms: int) -> float:
    """``0.3 + 0.7 · e^(−idle_s / 300)``: by ``math.exp`` alone (a vectorised exponential may differ in the
    last bit); a run's length is a multiple of the pane, so few values recur."""
    return 0.3 + 0.7 * math.exp(-(idle_run_ms / 1000) / 300)


@dataclass
class _Run:
    start_ns: int
    panes: int
    last_k: int  # the pane index of its latest pane


class SlaOperator:
    """Row entry ``on_close`` (one closed pane), batch entry ``close_many`` (a block), over one state.

    ``allocations``: the holds it reads, read-only (the auditor's ``AllocationSplit.table``, wired by
    ``AuditState``; None: no holds, only tenants with process samples are judged). Not its state: the table is
    the allocation split's, snapshotted there."""

    def __init__(self, settings: AuditSettings, allocations: AllocationTable | None = None) -> None:
        self.allocations = allocations
        self.tiers = settings.sla_tiers
        self.pane_ns = settings.pane_ns
        self.pane_ms = self.pane_ns // 1_000_000
        self._runs: dict[str, dict[str, _Run]] = {}  # GPU → tenant key → its idle run

    def _idle(self, tier: SlaTier, sm: int, covered_ms: int) -> bool:
        threshold = tier.threshold_cp
        return sm < threshold * covered_ms if threshold else sm == 0

    # --- the row entry ---------------------------------------------------------------------------

    def on_close(self, closing: Closing) -> list[Output]:
        """A closed pane with GPU samples in: its tenants' quota records, then the reclaim triggers it fires,
        each by tenant key."""
        pane, price = closing.pane, closing.price
        assert pane.node_id is not None and pane.gpu_model is not None
        k = pane.pane_start_ns // self.pane_ns
        before = self._runs.pop(pane.gpu_uuid, {})
        runs: dict[str, _Run] = {}
        quotas: list[Output] = []
        triggers: list[Output] = []
        held = held_by(self.allocations, pane.gpu_uuid, pane.pane_start_ns, pane.pane_end_ns)
        alone = held_only(held, (key for key, t in pane.tenants.items() if t.samples and t.sm > 0))
        for key in sorted(pane.tenants.keys() | alone):
            t = pane.tenants.get(key)
            if t is None or not t.samples:  # held all the pane, with no process sample here: judged at sm 0
                if key not in alone:
                    continue
                t = TenantTotals(held[key].tenant, 0 if t is None else t.sm)
            tier = self.tiers.get(t.tenant.sla or "")
            if tier is None:
                continue
            idle_run_ms = 0
            if self._idle(tier, t.sm, pane.covered_ms):
                run = before.get(key)
                run = (
                    _Run(run.start_ns, run.panes + 1, k)
                    if run is not None and run.last_k == k - 1
                    else _Run(pane.pane_start_ns, 1, k)
                )
                runs[key] = run
                idle_run_ms = run.panes * self.pane_ms
                if idle_run_ms >= tier.duration_s * 1000 > idle_run_ms - self.pane_ms:
                    triggers.append(
                        self._trigger(pane, t.tenant, key, run.start_ns, idle_run_ms, tier, price, key in held)
                    )
            quotas.append(
                computed(
                    QuotaRecord,
                    gpu_uuid=pane.gpu_uuid,
                    pane_start_ns=pane.pane_start_ns,
                    tenant_key=key,
                    team=t.tenant.team,
                    sla=t.tenant.sla,
                    util_pct=t.sm / (100 * pane.covered_ms),
                    idle_run_ms=idle_run_ms,
                    quota_scale=quota_scale(tier, idle_run_ms, t.sm, pane.covered_ms),
                )
            )
        if runs:
            self._runs[pane.gpu_uuid] = runs
        return quotas + triggers

    def drop(self, gpu_uuid: str) -> None:
        """Forget a GPU gone from the fleet (``GpuPanes.forget``): a pane of it later starts its runs afresh."""
        self._runs.pop(gpu_uuid, None)

    def _trigger(
        self,
        pane: Any,
        tenant: Tenant,
        key: str,
        start_ns: int,
        idle_run_ms: int,
        tier: SlaTier,
        price: Decimal | None,
        held: bool,
    ) -> ReclaimRecord:
        return computed(
            ReclaimRecord,
            trigger_id=trigger_id(pane.gpu_uuid, key, start_ns),
            gpu_uuid=pane.gpu_uuid,
            node_id=pane.node_id,
            gpu_model=pane.gpu_model,
            tenant_key=key,
            team=tenant.team,
            env=tenant.env,
            app=tenant.app,
            tier=tenant.tier,
            sla=tenant.sla,
            run_start_ns=start_ns,
            trigger_ns=pane.pane_end_ns,
            idle_run_ms=idle_run_ms,
            deadline_ns=start_ns + tier.max_idle_s * 1_000_000_000,
            usd_per_gpu_hour=price,
            held=held,
            labels=tenant.labels,
        )

    # --- the batch entry -------------------------------------------------------------------------

    def close_many(self, closing: ClosingMany) -> Emitted:
        """``on_close`` of closed panes with GPU samples (each GPU's in ascending order) at once: the quota
        records as a table in the row entry's order with their count per pane, and each trigger with its pane.

        The runs are found with numpy: the tenant rows sorted by (GPU, tenant key, pane); a row continues
        the run of the row before it when both are idle, of one (GPU, tenant), and a pane apart; the first
        row of a (GPU, tenant) continues the run the state holds when that run ended in the pane before. The
        tenants holding a pane's device with no process sample there join as rows of their own (``_candidates``)."""
        panes, prices = closing.panes, closing.prices
        pane, key, sm, code, held, who, tier_of = self._candidates(panes)
        gpu_of, gpu_names = panes.gpus
        gpu = gpu_of[pane]  # grouped by codes, not by sorting strings
        key_of = pa.array(key, pa.string()).dictionary_encode().indices.to_numpy()
        k = panes.pane_start_ns[pane] // self.pane_ns
        covered = panes.covered_ms[pane]
        figures = [
            (t.threshold_cp, t.duration_s * 1000, float(t.quota_base)) if t is not None else (0, 0, 0.0)
            for t in tier_of
        ]
        threshold = np.array([f[0] for f in figures], np.int64)[code]
        sm_o, covered_o = sm.astype(object), covered.astype(object)
        idle = np.where(threshold > 0, sm_o < threshold.astype(object) * covered_o, sm_o == 0).astype(bool)

        order = np.lexsort((k, key_of, gpu))
        g, kk, kc, ii, ko = gpu[order], key[order], key_of[order], idle[order], k[order]
        first = np.ones(len(order), bool)
        first[1:] = (g[1:] != g[:-1]) | (kc[1:] != kc[:-1])
        at = np.arange(len(order))
        cont = np.zeros(len(order), bool)
        cont[1:] = ~first[1:] & ii[1:] & ii[:-1] & (ko[1:] == ko[:-1] + 1)
        carried = np.zeros(len(order), bool)  # a group's first row continuing the run the state holds
        carried_panes, carried_start = np.zeros(len(order), np.int64), np.zeros(len(order), np.int64)
        for j in np.flatnonzero(first & ii).tolist():
            run = self._runs.get(gpu_names[g[j]], {}).get(kk[j])
            if run is not None and run.last_k == int(ko[j]) - 1:
                carried[j], carried_panes[j], carried_start[j] = True, run.panes, run.start_ns
        # each row's run's first row here: the last row at or before it that opens a run (every group's
        # first row does: it starts a run, or carries one in)
        run_first = np.maximum.accumulate(np.where(~cont | carried, at, 0)) if len(order) else at
        panes_in_run = at - run_first + 1 + carried_panes[run_first]
        run_start = np.where(
            carried[run_first],
            carried_start[run_first],
            panes.pane_start_ns[pane[order]][run_first] if len(order) else 0,
        )
        idle_run_ms = np.where(ii, panes_in_run * self.pane_ms, 0)
        duration_ms = np.array([f[1] for f in figures], np.int64)[code][order]
        fires = ii & (idle_run_ms >= duration_ms) & (idle_run_ms - self.pane_ms < duration_ms)

        # the state: each (GPU, tenant) idle in its GPU's latest pane here; GPUs with no pane here keep theirs
        latest = np.full(len(gpu_names), np.iinfo(np.int64).min)
        np.maximum.at(latest, gpu_of, panes.pane_start_ns // self.pane_ns)
        latest_k = dict(zip(gpu_names, latest.tolist()))
        for name in latest_k:
            self._runs.pop(name, None)
        last_row = np.flatnonzero(np.append(first[1:], True)) if len(order) else np.zeros(0, np.int64)
        for j in last_row.tolist():
            name = gpu_names[g[j]]
            if ii[j] and int(ko[j]) == latest_k[name]:
                self._runs.setdefault(name, {})[kk[j]] = _Run(int(run_start[j]), int(panes_in_run[j]), int(ko[j]))

        back = np.empty(len(order), np.int64)
        back[order] = np.arange(len(order))  # each row's place in ``order``
        run_ms = idle_run_ms[back]
        base = np.array([f[2] for f in figures], np.float64)[code]
        lengths, length_of = np.unique(run_ms, return_inverse=True)  # a run's length is a multiple of the pane
        decay = np.array([_decay(ms) if ms else 0.0 for ms in lengths.tolist()], np.float64)[length_of]
        quota = np.where(run_ms > 0, base * decay, base * np.minimum(1.5, 1 + 0.5 * ratios(sm, covered * 10_000)))
        table = pa.table(
            [
                pa.array(panes.gpu_uuid[pane], pa.string()),
                panes.pane_start_ns[pane],
                pa.array(key, pa.string()),
                pa.array([t.team for t in who], pa.string()).take(code),
                pa.array([t.sla for t in who], pa.string()).take(code),
                ratios(sm_o, covered_o * 100),
                run_ms,
                quota,
            ],
            schema=ARROW_SCHEMAS["quota"],
        )
        triggers: list[tuple[int, Output]] = []
        for j in np.flatnonzero(fires).tolist():
            r = int(order[j])
            p = int(pane[r])
            tier = tier_of[code[r]]
            assert tier is not None  # only tiered rows are here
            triggers.append(
                (
                    p,
                    self._trigger(
                        _PaneView(panes, p),
                        who[code[r]],
                        key[r],
                        int(run_start[j]),
                        int(idle_run_ms[j]),
                        tier,
                        prices[p],
                        bool(held[r]),
                    ),
                )
            )
        triggers.sort(key=lambda t: (t[0], t[1].tenant_key))  # type: ignore[union-attr]  # triggers only
        return Emitted("quota", table, np.bincount(pane, minlength=len(panes)), tagged=triggers)

    def _candidates(
        self, panes: PaneColumns
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[Tenant], list[SlaTier | None]]:
        """The candidates of ``panes`` with a tier, in the row entry's order (by pane, then tenant key): each one's
        pane, tenant key, ``sm`` (Python integers), tenant code (into the tenants and their tiers, also returned)
        and whether it held the device there. The tenant rows with process samples, then, on devices with holds,
        the holders with none (their fields the hold's, their ``sm`` their row's if they have one)."""
        codes, who = panes.distinct_tenants  # each tier's figures are taken per distinct tenant
        tier_of = [self.tiers.get(t.sla or "") for t in who]
        tiered = np.array([tier is not None for tier in tier_of], bool)
        rows = np.flatnonzero(tiered[codes] & (panes.t_samples > 0)) if len(codes) else np.zeros(0, np.int64)
        pane, key, sm, code = panes.t_pane[rows], panes.t_key[rows], panes.t_sm[rows], codes[rows]
        holders = held_in(self.allocations, panes)
        if not holders:
            return pane, key, sm, code, np.zeros(len(rows), bool), who, tier_of
        who, tier_of = list(who), list(tier_of)  # the cached distinct tenants stay as they are
        index = {t: c for c, t in enumerate(who)}
        held_rows: list[int] = []
        extra: list[tuple[int, str, Any, int]] = []
        for j, holding in holders.items():
            lo, hi = np.searchsorted(panes.t_pane, [j, j + 1]).tolist()
            names = panes.t_key[lo:hi].tolist()
            busy = (n for n, s_, u in zip(names, panes.t_samples[lo:hi], panes.t_sm[lo:hi]) if s_ > 0 and u > 0)
            alone = held_only(holding, busy)
            for name, (tenant, _) in holding.items():
                r = lo + names.index(name) if name in names else None
                if r is not None and panes.t_samples[r] > 0:
                    held_rows.append(r)  # a candidate already, if it has a tier
                    continue
                tier = self.tiers.get(tenant.sla or "")
                if tier is None or name not in alone:
                    continue
                if tenant not in index:
                    index[tenant] = len(who)
                    who.append(tenant)
                    tier_of.append(tier)
                extra.append((j, name, 0 if r is None else panes.t_sm[r], index[tenant]))
        held = np.isin(rows, held_rows)
        if extra:
            pane = np.concatenate([pane, np.array([e[0] for e in extra], np.int64)])
            key = np.concatenate([key, np.fromiter((e[1] for e in extra), object)])
            sm = np.concatenate([sm, np.fromiter((e[2] for e in extra), object)])
            code = np.concatenate([code, np.array([e[3] for e in extra], np.int64)])
            held = np.concatenate([held, np.ones(len(extra), bool)])
            _, rank = np.unique(key, return_inverse=True)  # keys are text: ranked as Python sorts them
            order = np.lexsort((rank, pane))
            pane, key, sm, code, held = pane[order], key[order], sm[order], code[order], held[order]
        return pane, key, sm, code, held, who, tier_of

    # --- state -----------------------------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        return {g: {key: list(astuple(run)) for key, run in runs.items()} for g, runs in self._runs.items()}

    @classmethod
    def from_state(
        cls, state: dict[str, Any], settings: AuditSettings, allocations: AllocationTable | None = None
    ) -> SlaOperator:
        op = cls(settings, allocations)
        op._runs = {g: {key: _Run(*run) for key, run in runs.items()} for g, runs in state.items()}
        return op


class _PaneView:
    """One pane of a ``PaneColumns``, with the attributes a trigger reads."""

    def __init__(self, panes: PaneColumns, j: int) -> None:
        self.gpu_uuid, self.node_id, self.gpu_model = panes.gpu_uuid[j], panes.node_id[j], panes.gpu_model[j]
        self.pane_end_ns = int(panes.pane_end_ns[j])
