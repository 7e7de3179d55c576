"""The allocation basis whatever the order of arrival and whatever a transport does between events
(docs/definitions.md, "Allocation basis", "Re-sent input"): a late end ends its hold; an input sent again after
its holds were dropped past the horizon bills nothing again; a device's holds are dropped against its own
watermark, in event order, never by another device's or by when a transport prunes; a device forgotten while
silent keeps the holds no pod released. All in the default configuration (a 6 h revision horizon)."""

from __future__ import annotations

from collections import Counter

from gpucost.schemas.events import Allocation, Event, GpuSample, Price, ProcessSample, TenantBinding
from gpucost.schemas.records import AllocationRecord, CostRecord, DeadLetter, Output
from gpucost.streams.audit import Auditor
from gpucost.streams.settings import AuditSettings
from tests.support.allocations import steady

NS = 10**9
T0 = 1_750_000_020 * NS - (1_750_000_020 * NS) % (60 * NS)
PRICE = Price(gpu_model="M", ts_ns=T0 - 3600 * NS, usd_per_gpu_hour="2.718281")


def sample(k: int, gpu: str = "GPU-0", step_s: int = 10) -> GpuSample:
    return steady(gpu, T0 + k * step_s * NS, step_s)


def hold(name: str, start: int, end: int | None = None, gpu: str = "GPU-0", team: str = "search") -> Allocation:
    return Allocation(node_id="n1", gpu_uuid=gpu, allocation_id=name, ts_ns=start, end_ts_ns=end, team=team)


def run(events: list[Event], auditor: Auditor | None = None) -> list[Output]:
    a = auditor or Auditor(AuditSettings())
    return [r for e in events for r in a.update(e)] + a.finish()


def billed(out: list[Output], gpu: str = "GPU-0", after_ns: int = 0) -> Counter[str]:
    """Each party's µ$ on the allocation basis (summed over revisions) of the GPU's panes from ``after_ns`` on."""
    total: Counter[str] = Counter()
    for r in out:
        if isinstance(r, AllocationRecord) and r.gpu_uuid == gpu and r.pane_start_ns >= after_ns:
            total[r.team] += r.cost_micro_usd
    return total


def test_a_late_end_ends_its_hold_whenever_it_arrives() -> None:
    """The GPU goes quiet 8 h (a node rebooted) and the end of a hold that started on time comes before it is back,
    or just after: either way the hold ends and the panes after it are unallocated (a late end was once dead-lettered
    and the tenant billed the whole device for good)."""
    start, end = hold("pod", T0 + NS), hold("pod", T0 + NS, T0 + 300 * NS)
    before = [PRICE, start, *(sample(k) for k in range(60))]
    back = [sample(k) for k in range(2880, 2892)]
    after = [sample(k) for k in range(2892, 3000)]
    early, late = run([*before, end, *back, *after]), run([*before, *back, end, *after])
    assert not [r for r in early + late if isinstance(r, DeadLetter)]
    returned = T0 + 8 * 3600 * NS
    assert billed(early, after_ns=returned) == billed(late, after_ns=returned)
    assert billed(late, after_ns=returned)["search"] == 0 and billed(late, after_ns=returned)["unallocated"] > 0


def test_an_input_sent_again_after_its_holds_were_dropped_bills_nothing_again() -> None:
    """A hold of minutes, 8 h of samples, then another hold (its device drops the first past the horizon): the first
    hold's start and end sent again (a second ``produce`` of the file) are ``late``, and no µ$ moves."""
    first = [hold("a", T0 + NS), hold("a", T0 + NS, T0 + 120 * NS)]
    events = [PRICE, *first, *(sample(k) for k in range(2880)), hold("b", T0 + 2879 * 10 * NS, team="ads")]
    once, twice = run(events), run([*events, *first, sample(2880)])
    assert [r.reason for r in twice if isinstance(r, DeadLetter)] == ["late", "late"]
    assert all("sent again, it is not billed again" in r.detail for r in twice if isinstance(r, DeadLetter))
    assert billed(twice) == billed(run([*events, sample(2880)])) and billed(once)["search"] > 0


def test_a_devices_holds_are_dropped_against_its_own_watermark_in_event_order() -> None:
    """GPU-B's hold comes before any of its samples, GPU-A runs 8 h, GPU-A takes a hold and the transport prunes;
    GPU-B's samples, on time for GPU-B, still split by GPU-B's hold, as when they came first."""
    b_hold = hold("pod-b", T0 + NS, T0 + 180 * NS, gpu="GPU-B")
    a_run = [*(sample(k, "GPU-A") for k in range(2880)), hold("pod-a", T0 + 2879 * 10 * NS, gpu="GPU-A", team="ads")]
    b_run = [sample(k, "GPU-B") for k in range(60)]
    auditor = Auditor(AuditSettings())
    out = [r for e in [PRICE, b_hold, *a_run] for r in auditor.update(e)]
    auditor.prune()  # a publication's, or a Kafka state write's: when it runs is no event's business
    out += run(b_run, auditor)
    first = run([PRICE, b_hold, *b_run, *a_run])
    assert billed(out, "GPU-B") == billed(first, "GPU-B") and billed(out, "GPU-B")["search"] > 0


def test_a_device_forgotten_while_silent_keeps_the_holds_no_pod_released() -> None:
    """GPU-B silent for 80 h is forgotten; its hold has no end, so when it comes back its panes are still split by
    that hold (forgetting it once dropped every hold and the device left the allocation basis)."""
    auditor = Auditor(AuditSettings())
    out = [r for e in [PRICE, hold("pod-b", T0 + NS, gpu="GPU-B"), sample(0, "GPU-B", 600)] for r in auditor.update(e)]
    for k in range(480):
        out += auditor.update(sample(k, "GPU-A", 600))
    out += auditor.close_silent(auditor.largest_watermark() or 0)
    assert auditor.counts["forgotten_gpus"] == 1
    came_back = run([sample(k, "GPU-B", 600) for k in range(480, 486)], auditor)
    assert billed(came_back, "GPU-B")["search"] > 0 and billed(came_back, "GPU-B")["unallocated"] == 0


def test_a_hold_in_closed_panes_within_the_horizon_is_taken_whether_or_not_they_were_billed_yet() -> None:
    """A device silent for minutes 5-10, its samples of minutes 6-7 sent late (a node's buffer replayed), and a hold
    of those two minutes arriving after the watermark passed them, before or after those samples: within R, the
    hold is taken either way, and the panes the late samples bill are split by it as they are when the hold comes
    first. (A hold that covered no pane billed yet was once dead-lettered "beyond the horizon" 5 minutes back, so
    the bill hung on which of the two came first.) With revisions off, both are late."""
    gap = [sample(k) for k in range(36, 48)]  # minutes 6 and 7
    pod = hold("pod", T0 + 360 * NS, T0 + 480 * NS, team="ads")
    head = [PRICE, *(sample(k) for k in range(30))]
    resumed = [sample(k) for k in range(60, 120)]  # minutes 10-20: the watermark passes the gap's panes
    first = run([*head, pod, *resumed, *gap])
    for order in ([*head, *resumed, pod, *gap], [*head, *resumed, *gap, pod]):
        auditor = Auditor(AuditSettings())
        late = run(order, auditor)
        assert not [r for r in late if isinstance(r, DeadLetter)]
        assert billed(late) == billed(first)
        assert auditor.counts["allocation_past_horizon"] == 0  # every pane it changes is within R
    # the two minutes' cost is the hold's, and only theirs (the samples' panes, each split by the hold alone)
    in_gap = Counter[str]()
    for r in first:
        if isinstance(r, AllocationRecord) and T0 + 360 * NS <= r.pane_start_ns < T0 + 480 * NS:
            in_gap[r.team] += r.cost_micro_usd
    assert in_gap["ads"] > 0 and in_gap["unallocated"] == 0
    off = Auditor(AuditSettings(revision_horizon_s=0))
    reasons = Counter(r.reason for r in run([*head, *resumed, pod, *gap], off) if isinstance(r, DeadLetter))
    assert reasons == {"late": 1 + len(gap)}


def test_a_hold_reaching_back_past_the_horizon_is_counted_so_once() -> None:
    """A hold from 7 h back to the present (a scheduler's record replayed) reaches panes beyond R: it is taken for the
    panes within R and counted ``allocation_past_horizon``; one starting within R is not counted."""
    auditor = Auditor(AuditSettings())
    samples = [sample(k, step_s=600) for k in range(48)]  # 8 h at 10 min
    run([PRICE, *samples, hold("old", T0 + 600 * NS, T0 + 48 * 600 * NS), hold("new", T0 + 45 * 600 * NS)], auditor)
    assert auditor.counts["allocation_past_horizon"] == 1
    assert auditor.counts["allocation"] == 2


def test_a_hold_or_binding_in_panes_closed_for_the_gpus_forgotten_revises_none_of_them() -> None:
    """GPU-B goes silent and is forgotten while GPU-C runs 80 h ahead and GPU-A's node replays hours behind: the panes
    before GPU-B's last are never revised, of any GPU (docs/definitions.md, "GPUs that leave the fleet"). A hold of
    GPU-A there is ``late``, as GPU-A's late sample there is; a late binding of a GPU-A process revises its panes
    after them only. (The hold once revised them and counted itself ``allocation_past_horizon`` for the very panes it
    had changed; the binding revised them too.)"""
    auditor = Auditor(AuditSettings())
    b = [sample(k, "GPU-B", 600) for k in range(6)]
    a = [e for k in range(20) for e in (process(k, "GPU-A"), sample(k, "GPU-A", 600))]
    for e in [PRICE, *b, *a, *(sample(k, "GPU-C", 600) for k in range(480))]:
        auditor.update(e)
    auditor.close_silent(auditor.largest_watermark() or 0, only={"GPU-B"})
    assert auditor.counts["forgotten_gpus"] == 1 and auditor.panes.before_forgotten(T0 + 1200 * NS)
    late = [hold("pod", T0 + 600 * NS, T0 + 1200 * NS, gpu="GPU-A"), steady("GPU-A", T0 + 900 * NS, 600)]
    out = [r for e in late for r in auditor.update(e)]
    assert [r.reason for r in out if isinstance(r, DeadLetter)] == ["late", "late"]
    assert not [r for r in out if isinstance(r, AllocationRecord)]
    assert auditor.counts["allocation_past_horizon"] == 0
    revised = {
        r.pane_start_ns
        for r in auditor.update(
            TenantBinding(node_id="n1", pid=7, ts_ns=T0, team="ads", env="", app="", tier="", sla="Gold")
        )
        if isinstance(r, CostRecord)
    }
    assert revised and not [s for s in revised if auditor.panes.before_forgotten(s + 60 * NS)]


def process(k: int, gpu: str) -> ProcessSample:
    """A process of node n1 busy on ``gpu`` in the k-th 10-minute step."""
    return ProcessSample(
        node_id="n1",
        gpu_uuid=gpu,
        pid=7,
        ts_ns=T0 + k * 600 * NS + NS,
        interval_s=10.0,
        sm_util_pct=40.0,
        mem_bw_util_pct=10.0,
        mem_used_bytes=1,
    )
