"""What late data do to panes already closed: a late event within the revision horizon, or a binding that
arrives after the samples it covers, recomputes the panes it reaches and publishes what changed
(docs/definitions.md, "Late data become revisions"). A part of ``Auditor`` (``gpucost.streams.audit``), kept
apart because it is the one path where a closed pane's records change after they were published.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Container

from gpucost.schemas.events import Allocation, GpuSample, NumaEvent, ProcessSample, TenantBinding
from gpucost.schemas.kernels import KernelActivity
from gpucost.schemas.records import Output
from gpucost.streams.allocations import MAX_DENOMINATOR, MAX_HOLDS, AllocationSplit
from gpucost.streams.apportion import apportion
from gpucost.streams.differences import differences
from gpucost.streams.idle_index import IdleIndex
from gpucost.streams.kernel_cost import KernelCost, KernelRecord
from gpucost.streams.kernel_log import MAX_PANE_KERNELS
from gpucost.streams.letters import DeadLetters
from gpucost.streams.operator import CostSplit
from gpucost.streams.pane_rules import pane_start_ns
from gpucost.streams.pane_totals import PaneColumns, PaneTotals
from gpucost.streams.panes import GpuPanes
from gpucost.streams.revisions import Revisions
from gpucost.streams.tables import BindingTable, PriceTable

__all__ = ["LateData"]

#: a closed pane as last published: its sums, and its kernel cost lines and range paths (computed then: a binding
#: since moves them)
Before = tuple[PaneTotals, list[KernelRecord]]


class LateData(DeadLetters):
    """The revision paths of ``Auditor``: a late binding (``_binding``), a late event (``_revise``), and the
    recompute both end in (``_republish``)."""

    counts: Counter[str]
    panes: GpuPanes
    idle: IdleIndex
    cost: CostSplit
    revisions: Revisions
    bindings: BindingTable
    prices: PriceTable
    allocations: AllocationSplit
    kernels: KernelCost
    on_closed: Callable[[PaneColumns], None] | None
    prune_holds: Callable[[str], None]  # AuditState's

    def _binding(self, event: TenantBinding, raw: str | bytes | None, source: str) -> list[Output]:
        """A binding, joined as of each sample's event time whatever order they came in: it re-attributes the
        process's logged samples at or after its ``ts_ns`` in open panes (with revisions off too), and in closed
        panes within the horizon (revisions). One that repeats an instant already bound is a ``duplicate``.
        One that governs only time beyond the horizon (the process was bound again later, and that later binding
        too is older than the horizon, judged against the watermark of its node's GPUs: a later node's bindings,
        replayed after an earlier node's events, are not late) and reaches no pane kept here could change only
        panes beyond it, and is ``late`` (docs/definitions.md, "Late data become revisions"). One with no later binding
        still governs the samples its process sends from now on, however old it is: it is taken."""
        verdict = self.bindings.verdict(event)
        if verdict == "duplicate":
            return [
                self._dead(
                    "duplicate",
                    event,
                    raw,
                    source,
                    f"a binding of pid {event.pid} on {event.node_id} at ts_ns {event.ts_ns} "
                    "was already taken; the first one stays in force",
                )
            ]
        if verdict == "unchanged":  # no lookup changes now; kept as a repeat for a binding that lands before it
            self.bindings.take(event)
            self.counts["binding_unchanged"] += 1
            return []
        # the open panes it reaches, and the closed ones it may revise: within R and not closed for the GPUs
        # forgotten (billed for good, as for a late sample or hold)
        reached = [
            p
            for p in self.revisions.touched_by(event.node_id, event.pid, event.ts_ns)
            if self.panes.is_open(*p) or (self.revisions.enabled and self._revisable_pane(*p))
        ]
        # and the closed panes its process's kernels at or after it reach (a process may run kernels in a pane
        # where it sent no sample after the binding's time); a pane not closed yet (open, or with no sample so far)
        # takes its kernels' tenants at its close. Closed is judged by the watermark, as a late event is: a pane
        # that no sample has opened yet is not closed (the batch path takes a binding before its batch's samples)
        kernel_panes = self.kernels.log.touched_by(event.node_id, event.pid, event.ts_ns)
        if self.revisions.enabled and kernel_panes:
            reached = sorted(
                {*reached, *(p for p in kernel_panes if self.panes.is_late(*p) and self._revisable_pane(*p))}
            )
        watermarks = [
            w for gpu in self.revisions.gpus_of(event.node_id) if (w := self.panes.watermark(gpu)) is not None
        ]
        node_ns = max(watermarks, default=None)  # how far its node's GPUs have gone: a replay of one node after another
        beyond = self.settings.revision_horizon_ns + self.settings.pane_ns
        if node_ns is not None and event.ts_ns + beyond < node_ns:
            ends_ns = self.bindings.next_after(event.node_id, event.pid, event.ts_ns)
            if not reached and ends_ns is not None and ends_ns + beyond < node_ns:
                return [
                    self._dead(
                        "late",
                        event,
                        raw,
                        source,
                        f"a binding of pid {event.pid} on {event.node_id} at ts_ns {event.ts_ns}, "
                        f"superseded at ts_ns {ends_ns}, reaches no pane within the revision horizon "
                        f"({self.settings.revision_horizon_s} s) of its node's watermark {node_ns} ns: "
                        "the panes it covers are billed for good",
                    )
                ]
            self.counts["binding_past_horizon"] += 1  # panes it covers beyond R, if any, stay as billed
        before = {p: self._before(*p) for p in reached if not self.panes.is_open(*p)}
        self.bindings.take(event)
        self.counts[event.kind] += 1
        out: list[Output] = []
        for gpu, start in reached:
            if (gpu, start) in before:
                out += self._republish(gpu, start, before[(gpu, start)])
            else:
                self.panes.retenant(self.revisions.totals(gpu, start, self.bindings))
        if out:
            self.counts["revised_by_late"] += 1
            self.counts[f"revised_by_late:{event.kind}"] += 1
        return out

    def _revise(
        self, event: GpuSample | ProcessSample | NumaEvent, raw: str | bytes | None, source: str
    ) -> list[Output]:
        """A late event within the horizon: checked against its closed pane (``duplicate``, ``overlap``), taken
        into it, and the pane's changed records published (``_republish``)."""
        refused = self.revisions.admit(event)
        if refused == "duplicate":
            return [self.duplicate_letter(event, raw, source)]
        if refused == "overlap":
            return [self.overlap_letter(event, raw, source)]  # type: ignore[arg-type]  # never of a NUMA event
        start = pane_start_ns(event.ts_ns, self.settings.pane_ns)
        before = self._before(event.gpu_uuid, start)
        self.revisions.take(event)
        self.counts[event.kind] += 1
        self.counts["revised_by_late"] += 1
        self.counts[f"revised_by_late:{event.kind}"] += 1
        return self._republish(event.gpu_uuid, start, before)

    def _kernel(
        self, event: KernelActivity, raw: str | bytes | None, source: str, watermark_ns: int | None
    ) -> list[Output]:
        """A kernel: judged by its start as a GPU-keyed event is, moving no watermark. On time, it joins the panes
        it touches; late within the horizon, it joins them too, each closed one it touches left pending, to be
        republished once for the whole run of late kernels (``settle_kernels``); late beyond, sent again, or past
        what a pane keeps, it is dead-lettered. ``watermark_ns`` is its GPU's watermark where the kernel stands:
        the state's in the row path; in the batch path, which takes a late kernel after its batch's closes (its
        panes closed at its row stay closed), the one at its row (``gpucost.streams.batch_kernels``)."""
        gpu = event.gpu_uuid
        if self.beyond_horizon(gpu, event.start_ns, watermark_ns):
            return [self.late_letter(event, raw, source, watermark_ns)]
        refused = self.kernels.log.admit(event)
        if refused == "duplicate":
            return [self.duplicate_letter(event, raw, source)]
        if refused is not None:
            detail = (
                f"a kernel of GPU {event.gpu_uuid} past the {MAX_PANE_KERNELS:,} its pane of ts_ns {event.start_ns} "
                "keeps: a flood, or a producer sending one trace again and again under new ids; check the collector"
            )
            return [self._dead(refused, event, raw, source, detail)]
        closed = [p for p in self.kernels.log.panes_of(event) if self.panes.is_late(gpu, p)]
        for p in closed:
            self.kernels.log.hold_back(gpu, p)
        self.kernels.log.take(event)
        self.counts[event.kind] += 1
        if closed:
            self.counts["revised_by_late"] += 1
            self.counts[f"revised_by_late:{event.kind}"] += 1
        return []

    def settle_kernels(self, only: Container[str | tuple[str, int]] | None = None) -> list[Output]:
        """Republish every pending pane (late kernels joined it since it was last published) of the GPUs in
        ``only`` (all: None), by GPU then pane: one revision of each for however many kernels joined it. The
        auditor settles a GPU's panes before it takes the GPU's next sample, process sample or NUMA event (one
        that decodes and is not from the future: on time, late, or refused as a duplicate or overlap), at a silent
        close of the GPU (silent in event time too) and at the end of input, on both paths alike; a late binding
        that reaches a pending pane republishes it against the kernels as published (``_before``)."""
        out: list[Output] = []
        for gpu, starts in self.kernels.log.pending().items():
            if only is None or gpu in only:
                for start in starts:
                    out += self._republish(gpu, start, self._before(gpu, start))
        return out

    def revisable(self, ts_ns: int, watermark_ns: int | None) -> bool:
        """Whether the closed pane of ``ts_ns`` is within the revision horizon of its GPU's watermark
        ``watermark_ns``, and not one closed for the GPUs forgotten: a late event of it revises it rather than
        being ``late``."""
        end = pane_start_ns(ts_ns, self.settings.pane_ns) + self.settings.pane_ns
        return self.revisions.reaches(end, watermark_ns) and not self.panes.before_forgotten(end)

    def _revisable_pane(self, gpu: str, start_ns: int) -> bool:
        """``revisable`` of a GPU's closed pane by the GPU's watermark now."""
        return self.revisable(start_ns, self.panes.watermark(gpu))

    def beyond_horizon(self, gpu: str, ts_ns: int, watermark_ns: int | None) -> bool:
        """Whether the pane of ``ts_ns`` has closed (by the GPU's state) and is not ``revisable`` by
        ``watermark_ns``: billed for good, so an event there is ``late``."""
        return self.panes.is_late(gpu, ts_ns) and not self.revisable(ts_ns, watermark_ns)

    def _before(self, gpu: str, start: int) -> Before:
        """A closed pane recomputed from its rows and kernels as last published (before a late event or binding;
        a pending pane's late kernels left out)."""
        pane, held = self.revisions.totals(gpu, start, self.bindings), self.revisions.held(gpu, start)
        return pane, self.kernels.records(pane, held.price, published=True) if held.revision is not None else []

    def _republish(self, gpu: str, start: int, before: Before) -> list[Output]:
        """A closed pane recomputed from its rows and kernels (``before``: as last published): its cost records and
        kernel lines that changed, as differences, and its idle record if its idle or covered time changed, all with
        the pane's next revision number (0 if it is published for the first time). Nothing if nothing changed."""
        (was, kernels_before), after = before, self.revisions.totals(gpu, start, self.bindings)
        held = self.revisions.held(gpu, start)
        if held.revision is None and after.gpu_model is not None:  # billed for the first time: priced now
            held.price = self.prices.lookup(after.gpu_model, start)
        old = apportion(was, held.price, self.cost.weights) if held.revision is not None else []
        revision = 0 if held.revision is None else held.revision + 1
        out: list[Output] = list(differences(old, apportion(after, held.price, self.cost.weights), revision))
        old_held = self.allocations.records(was, held.price) if held.revision is not None else []
        out += differences(old_held, self.allocations.records(after, held.price), revision)
        out += differences(kernels_before, self.kernels.records(after, held.price), revision)
        if (
            after.node_id is not None
            and after.gpu_model is not None
            and (held.revision is None or (was.idle_ms, was.covered_ms) != (after.idle_ms, after.covered_ms))
        ):
            out.insert(
                0,
                self.idle.revise(gpu, after.node_id, after.gpu_model, start, after.idle_ms, after.covered_ms, revision),
            )
        if out:
            held.revision = revision
        self.kernels.log.settle(gpu, start)
        if self.on_closed is not None:
            self.on_closed(PaneColumns.of([after]))
        return out

    def _allocation(self, event: Allocation, raw: str | bytes | None, source: str) -> list[Output]:
        """An allocation, or its end: taken into the table (closes from now on split by it), and every published
        pane within the horizon whose allocation records it changes republished as differences, with the pane's
        next revision number. One whose hold lies wholly in panes already closed, none of them revisable, is
        ``late``; one that repeats or contradicts an allocation taken is a ``duplicate`` or a ``conflict``."""
        table = self.allocations.table
        verdict = table.admit(event)
        what = f"allocation {event.allocation_id!r} of {event.gpu_uuid}"
        if verdict == "duplicate":
            detail = f"{what} was already taken as it is; the first one stays in force"
        elif verdict == "conflict":
            detail = f"{what}: {table.contradiction(event)}"
        elif verdict == "late":
            detail = (
                f"{what} ended at ts_ns {table.gone_at(event)}, in panes billed for good beyond the revision horizon "
                f"({self.settings.revision_horizon_s} s): sent again, it is not billed again"
            )
        elif verdict is not None:
            detail = (
                f"{what}: its device already keeps {MAX_HOLDS:,} holds, or its fraction's denominator "
                f"{event.fraction_den} with theirs needs a common denominator past {MAX_DENOMINATOR:,}; send "
                "fractions over a common base (100 for percentages) and an end for every hold"
            )
        if verdict is not None:
            return [self._dead(verdict, event, raw, source, detail)]
        gpu, changed_ns, end = event.gpu_uuid, table.changes_from(event), event.end_ts_ns
        since, new, watermark = table.since(gpu), not table.known(event), self.panes.watermark(gpu)
        # the published panes it may revise: those closed for the GPUs forgotten are billed for good, as for a sample
        reached = [s for s in self.revisions.published(gpu, changed_ns) if self.revisable(s, watermark)]
        if new and end is not None:
            covered = [s for s in reached if s < end]  # the published panes the hold itself covers
            # wholly in panes closed and beyond the horizon: late (an end of a hold taken is never late: it changes
            # the panes after it, open ones too; the closed ones beyond R stay as billed). Its last pane within R
            # is no such pane, published or not: a late sample may yet bill it, split by this hold, in whatever
            # order the two arrive
            if not covered and self.beyond_horizon(gpu, end - 1, watermark):
                return [
                    self._dead(
                        "late",
                        event,
                        raw,
                        source,
                        f"{what} from ts_ns {event.ts_ns} to {end} lies in panes already closed beyond the revision "
                        f"horizon ({self.settings.revision_horizon_s} s): they are billed for good",
                    )
                ]
            if since is not None and since <= event.ts_ns:
                reached = covered  # it moves no device's start: the panes after its end do not change
        if self.beyond_horizon(gpu, changed_ns, watermark):
            self.counts["allocation_past_horizon"] += 1  # the panes it changes beyond R stay as billed
        panes = [
            (self.revisions.totals(gpu, start, self.bindings), self.revisions.held(gpu, start)) for start in reached
        ]
        before = [self.allocations.records(pane, held.price) for pane, held in panes]
        table.take(event)
        self.prune_holds(gpu)
        self.counts[event.kind] += 1
        out: list[Output] = []
        for (pane, held), old in zip(panes, before):
            assert held.revision is not None
            changed = differences(old, self.allocations.records(pane, held.price), held.revision + 1)
            if changed:
                held.revision += 1
                out += changed
        if out:
            self.counts["revised_by_late"] += 1
            self.counts[f"revised_by_late:{event.kind}"] += 1
        return out
