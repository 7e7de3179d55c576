"""The batch entry of ``GpuPanes`` (``judge_many`` then ``add_many``: a batch's rows as columns), over the
state the row entry (``gpucost.streams.panes``) keeps; it decides every row as the row entry would in
arrival order (``tests/test_operator_entries.py`` holds them to it). Kept apart for size: the row entry is
the definition, this is the same rules over arrays.
"""

from __future__ import annotations

import numpy as np

from gpucost.streams.pane_rules import (
    GPU,
    KINDS,
    NO_TS,
    PROC,
    TRACE,
    first_model,
    gpu_sums,
    model_order,
    process_sums,
)
from gpucost.streams.pane_totals import (
    EFFICIENCY_SUMS,
    HEALTH_SUMS,
    PaneColumns,
    PaneRows,
    PaneTotals,
    Verdicts,
    objects,
)
from gpucost.streams.pane_verdicts import PaneVerdicts
from gpucost.streams.runs import runs
from gpucost.streams.tables import UNATTRIBUTED, Tenant

__all__ = ["PaneBatch"]


class PaneBatch(PaneVerdicts):
    """The batch entry (``judge_many`` from ``PaneVerdicts``, then ``add_many``); ``GpuPanes`` extends it and
    holds the state."""

    pane_ns: int
    lateness_ns: int
    idle_threshold_cp: int
    max_jump_ns: int
    _max_ts: dict[str, int]
    _pending: dict[str, int]
    _open: dict[str, dict[int, PaneTotals]]
    _forgotten: int | None

    def _set_max_ts(self, gpu_uuid: str, ts_ns: int, pending: int | None) -> None:
        if pending is None and ts_ns == self._forgotten and gpu_uuid not in self._max_ts:
            return  # still at the floor: nothing of its own to keep (both entries take this path)
        self._max_ts[gpu_uuid] = ts_ns
        if pending is None:
            self._pending.pop(gpu_uuid, None)
        else:
            self._pending[gpu_uuid] = pending

    def add_many(
        self, rows: PaneRows, verdicts: Verdicts, tenant_of: np.ndarray, tenants: list[Tenant]
    ) -> tuple[np.ndarray, PaneColumns]:
        """The accepted rows summed into their panes (``tenant_of``: each process sample's and NUMA event's
        tenant, an index into ``tenants``), the watermarks moved; returns the panes that close, and for
        each the batch row that closes it (``PaneRows.row``), in no particular order."""
        blas = np.zeros(len(rows.kind), bool)
        blas[list(rows.flops)] = True
        acc = np.flatnonzero(verdicts.accepted & ((rows.kind != TRACE) | blas))  # a launch trace sums nothing
        group, pane = rows.group[acc], rows.ts_ns[acc] - rows.ts_ns[acc] % self.pane_ns
        order = np.lexsort((pane, group))  # by GPU, pane, then arrival
        at, group, pane = acc[order], group[order], pane[order]
        firsts, lasts = runs(group, pane)
        kind = rows.kind[at]
        is_gpu, is_trace = kind == GPU, kind == TRACE
        interval = rows.interval_ms[at]
        seg_all = np.repeat(np.arange(len(firsts)), lasts - firsts)  # each accepted row's pane here

        def per_pane(values: np.ndarray, reduce: np.ufunc = np.add) -> list[int]:
            return reduce.reduceat(values, firsts).tolist() if len(at) else []

        covered, idle, busy, energy = (
            per_pane(np.where(is_gpu, v, 0))
            for v in gpu_sums(interval, rows.sm_cp[at], rows.power_mw[at], self.idle_threshold_cp)
        )
        unattributed = tenants.index(UNATTRIBUTED) if UNATTRIBUTED in tenants else -1
        placed = per_pane(((kind == PROC) & (tenant_of[at] != unattributed)).astype(np.int64))
        gpu_rows = per_pane(is_gpu.astype(np.int64))
        trace_rows = per_pane(is_trace.astype(np.int64))
        tensor, dram = rows.tensor_cp[at], rows.dram_cp[at]
        has_tensor, has_dram = is_gpu & (tensor >= 0), is_gpu & (dram >= 0)
        fatal, warning = rows.fault_fatal[at], rows.fault_warning[at]  # -1: not reported
        sums = dict(
            zip(
                EFFICIENCY_SUMS + HEALTH_SUMS,
                (
                    per_pane(v)
                    for v in (
                        np.where(is_gpu, rows.bw_cp[at] * interval, 0),
                        np.where(has_tensor, tensor * interval, 0),
                        np.where(has_tensor, interval, 0),
                        np.where(has_dram, dram * interval, 0),
                        np.where(has_dram, interval, 0),
                        (is_gpu & ((fatal >= 0) | (warning >= 0))).astype(np.int64),
                        np.where(is_gpu, np.maximum(fatal, 0), 0),
                        np.where(is_gpu, np.maximum(warning, 0), 0),
                        np.where(is_gpu & (rows.power_estimated[at] > 0), interval, 0),
                    )
                ),
            )
        )
        flops: dict[int, dict[int, int]] = {}  # pane here → pid → Σ flops, in Python integers
        for k, p in zip(seg_all[is_trace].tolist(), at[is_trace].tolist()):
            by_pid = flops.setdefault(k, {})
            by_pid[int(rows.pid[p])] = by_pid.get(int(rows.pid[p]), 0) + rows.flops[p]

        # (pane, tenant) sums of the process samples and NUMA events, in order of first arrival
        t_at = np.flatnonzero(~is_gpu & ~is_trace)
        seg = seg_all[t_at]
        tenant = tenant_of[at[t_at]]
        t_order = np.lexsort((tenant, seg))
        t_at, seg, tenant = t_at[t_order], seg[t_order], tenant[t_order]
        t_firsts, _ = runs(seg, tenant)
        t_pos = at[t_at]
        t_pane, t_who = seg[t_firsts], tenant[t_firsts]
        t_sums = [np.zeros(0, np.int64)] * 4
        t_first = np.zeros(0, np.int64)
        if len(t_at):
            is_proc = kind[t_at] == PROC
            sm, bw = process_sums(interval[t_at], rows.sm_cp[t_pos], rows.bw_cp[t_pos])
            t_sums = [
                np.add.reduceat(v, t_firsts)
                for v in (
                    np.where(is_proc, sm, 0),
                    np.where(is_proc, bw, 0),
                    np.where(is_proc, 0, rows.numa[t_pos]),
                    is_proc.astype(np.int64),
                )
            ]
            t_first = np.minimum.reduceat(rows.row[t_pos], t_firsts)

        # the smallest node name and first model (``model_order``) of each pane's GPU samples (a GPU that reports
        # two names in one pane gets the same one whatever the order), by rank among the batch's names
        node_by_rank, model_by_rank = sorted(rows.node_names), sorted(rows.model_names, key=model_order)
        big = max(len(node_by_rank), len(model_by_rank))
        # rank of each batch name, and `big` at index -1 (no name)
        node_rank, model_rank = (
            np.array([*(rank[n] for n in names), big])
            for names, rank in (
                (rows.node_names, {n: i for i, n in enumerate(node_by_rank)}),
                (rows.model_names, {n: i for i, n in enumerate(model_by_rank)}),
            )
        )
        node_min = per_pane(np.where(is_gpu, node_rank[rows.node[at]], big), np.minimum)
        model_min = per_pane(np.where(is_gpu, model_rank[rows.model[at]], big), np.minimum)
        group_k, starts_k = group[firsts], pane[firsts]  # each pane's GPU and start
        at_rows = np.array(self._close_rows(rows, verdicts, group_k, starts_k) if len(at) else [], np.int64)
        keys = [t.key for t in tenants]
        tenant_events = lasts - firsts - np.array(gpu_rows, np.int64) - np.array(trace_rows, np.int64)

        # a pane held open here, or that stays open, goes through its PaneTotals; the others, new panes
        # that close within the batch (nearly all of a replay's), straight to columns
        slow = at_rows < 0
        by_gpu = np.searchsorted(group_k, np.arange(len(rows.names) + 1))  # each GPU's panes, in start order
        untouched: dict[str, list[int]] = {}  # open panes that took no row here
        for j, name in enumerate(rows.names):
            held = list(self._open.get(name, ()))
            if held:  # a few panes: found by bisection among the GPU's panes here, which are in start order
                here, wanted = starts_k[by_gpu[j] : by_gpu[j + 1]], np.array(held, np.int64)
                found = np.searchsorted(here, wanted)
                hit = found < len(here)
                hit[hit] = here[found[hit]] == wanted[hit]
                slow[by_gpu[j] + found[hit]] = True
                untouched[name] = [start for start, h in zip(held, hit.tolist()) if not h]
        fast = np.flatnonzero(~slow)
        by_tenant: dict[int, list[tuple[int, int, int, int, int, int]]] = {}
        for k in np.flatnonzero(slow[t_pane]).tolist():
            by_tenant.setdefault(int(t_pane[k]), []).append(
                (int(t_first[k]), int(t_who[k]), *(int(v[k]) for v in t_sums))  # type: ignore[arg-type]
            )

        closes: list[tuple[int, PaneTotals]] = []
        for k in np.flatnonzero(slow).tolist():
            first, last, name, start = int(firsts[k]), int(lasts[k]), rows.names[int(group_k[k])], int(starts_k[k])
            kept = self._open.get(name, {})
            totals = kept.pop(start, None) or PaneTotals(name, start, start + self.pane_ns)
            if gpu_rows[k]:
                node, model = node_by_rank[node_min[k]], model_by_rank[model_min[k]]
                totals.node_id = node if totals.node_id is None else min(node, totals.node_id)
                totals.gpu_model = first_model(totals.gpu_model, model)
            totals.covered_ms += covered[k]
            totals.idle_ms += idle[k]
            totals.energy_uj += energy[k]
            totals.busy_cp_ms += busy[k]
            totals.placed += placed[k]
            for field, values in sums.items():
                setattr(totals, field, getattr(totals, field) + values[k])
            for pid, n in flops.get(k, {}).items():
                totals.flops[pid] = totals.flops.get(pid, 0) + n
            totals.tenant_events += int(tenant_events[k])
            for _, tn, sm, bw, numa, samples in sorted(by_tenant.get(k, ())):
                t = totals.tenant(tenants[tn], keys[tn])
                t.sm += sm
                t.bw += bw
                t.numa += numa
                t.samples += samples
            if at_rows[k] >= 0:
                closes.append((int(at_rows[k]), totals))
                continue
            members = at[first:last]
            for code, pid, ts in zip(
                rows.kind[members].tolist(), rows.pid[members].tolist(), rows.ts_ns[members].tolist()
            ):
                totals.remember(KINDS[code], pid, ts)  # a sample's, a NUMA event's or a blas call's
            self._open.setdefault(name, {})[start] = totals
        for j, name in enumerate(rows.names):  # open panes that took no row here may close too
            idle_panes = untouched.get(name, [])
            for start, row in zip(
                idle_panes,
                self._close_rows(rows, verdicts, np.full(len(idle_panes), j), np.array(idle_panes, np.int64)),
            ):
                if row >= 0:
                    closes.append((row, self._open[name].pop(start)))
        for j, name in enumerate(rows.names):
            if (high := int(verdicts.high[rows.ends[j] - 1])) != NO_TS:  # a GPU of traces alone has no time yet
                self._set_max_ts(name, high, verdicts.pending.get(j))

        position = np.full(len(firsts), -1, np.int64)
        position[fast] = np.arange(len(fast))
        tenant_rows = np.flatnonzero(~slow[t_pane])
        key_rank = np.argsort(np.argsort(np.array(keys, dtype=object))) if keys else np.zeros(0, np.int64)
        tenant_rows = tenant_rows[np.lexsort((key_rank[t_who[tenant_rows]], position[t_pane[tenant_rows]]))]
        who = t_who[tenant_rows]
        no_name = [None] * (big + 1)  # a rank of `big`: the pane had no GPU sample
        f_rows = sorted(
            (int(position[k]), pid, n) for k, by_pid in flops.items() if not slow[k] for pid, n in by_pid.items()
        )
        # one starred list: mypy would give ``*(…)`` every parameter after it (as in ``PaneColumns.of``)
        columns = PaneColumns(
            *[
                objects(rows.names)[group_k[fast]],
                starts_k[fast],
                starts_k[fast] + self.pane_ns,
                objects(node_by_rank + no_name)[np.array(node_min, np.int64)[fast]],
                objects(model_by_rank + no_name)[np.array(model_min, np.int64)[fast]],
                np.array(covered, np.int64)[fast],
                np.array(idle, np.int64)[fast],
                tenant_events[fast],
                *(np.array(v, np.int64)[fast] for v in (energy, busy, placed, *sums.values())),
                position[t_pane[tenant_rows]],
                objects(keys)[who],
                objects(tenants)[who],
                *(v[tenant_rows].astype(object) for v in t_sums[:3]),
                t_sums[3][tenant_rows].astype(np.int64),
                np.array([k for k, _, _ in f_rows], np.int64),
                np.array([pid for _, pid, _ in f_rows], np.int64),
                objects(n for _, _, n in f_rows),
            ]
        )
        return (
            np.concatenate([at_rows[fast], np.array([row for row, _ in closes], np.int64)]),
            PaneColumns.concat([columns, PaneColumns.of([totals for _, totals in closes])]),
        )

    def _close_rows(self, rows: PaneRows, verdicts: Verdicts, group_of: np.ndarray, start: np.ndarray) -> list[int]:
        """For panes of these GPUs (indices into ``rows.names``) and starts, the batch row whose watermark first
        reaches the pane's end plus the lateness (the row that closes it), or -1 if none does."""
        target = group_of * verdicts.levels.width + verdicts.levels.of(start + self.pane_ns + self.lateness_ns)
        k = np.searchsorted(verdicts.upto, target)
        last = len(rows.row) - 1
        return np.where(k < rows.ends[group_of], rows.row[np.minimum(k, last)], -1).tolist()  # type: ignore
