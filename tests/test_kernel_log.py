"""The kernel log's index of which panes a process's kernels reach (``KernelLog.touched_by``, what a late binding
revises), held to a pass over every kernel kept, through takes, pruning and snapshots; and its bound on kernels of a
GPU that never sends a sample (``KernelLog.unsampled``)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpucost.schemas.kernels import KernelActivity
from gpucost.streams.audit import Auditor
from gpucost.streams.kernel_log import KernelLog
from gpucost.streams.settings import AuditSettings
from gpucost.streams.silence import RunSilence, close_partition
from tests.support import kernel_fleet

NS = 10**9
PANE_NS = 60 * NS
SETTINGS = AuditSettings(pane_s=60, revision_horizon_s=600)
AUDIT = AuditSettings(pane_s=60)  # the default horizon and idle window
BASE_NS = kernel_fleet.BASE_NS

kernels = st.lists(
    st.tuples(
        st.sampled_from(["GPU-0", "GPU-1"]),
        st.sampled_from(["a", "b"]),
        st.integers(1, 2),
        st.integers(0, 12 * 60),  # start, s: a dozen panes, so that a process has several kernels in one
        st.integers(0, 150),  # length, s
    ),
    min_size=1,
    max_size=40,
)


def activity(i: int, gpu: str, node: str, pid: int, start_s: int, length_s: int) -> KernelActivity:
    return KernelActivity(
        node_id=node,
        pid=pid,
        name=f"k{i % 3}",
        start_ns=BASE_NS + start_s * NS,
        end_ns=BASE_NS + (start_s + length_s) * NS,
        gpu_uuid=gpu,
        device=0,
        stream=0,
        correlation_id=i,
        category="kernel",
    )


def brute_force(log: KernelLog, node: str, pid: int, ts_ns: int) -> list[tuple[str, int]]:
    """Every kept pane with a kernel of the process starting at or after ``ts_ns``, by a look at each kernel."""
    state = log.to_state()
    out = []
    for gpu, saved in sorted(state.items()):
        names = saved["names"]
        for pane, rows in saved["panes"]:
            if any(names[r[3]] == node and r[2] == pid and r[0] >= ts_ns for r in rows):
                out.append((gpu, pane))
    return sorted(out)


@given(kernels, st.integers(0, 25 * 60), st.booleans())
def test_the_panes_a_binding_reaches_are_those_a_pass_over_every_kernel_finds(
    taken: list[tuple[str, str, int, int, int]], watermark_s: int, snapshot: bool
) -> None:
    log = KernelLog(SETTINGS)
    for i, k in enumerate(taken):
        event = activity(i, *k)
        if log.admit(event) is None:
            log.take(event)
    log.prune("GPU-0", BASE_NS + watermark_s * NS)
    if snapshot:
        log = KernelLog.from_state(log.to_state(), SETTINGS)
    instants = {BASE_NS + (start_s + d) * NS for _, _, _, start_s, _ in taken for d in (0, 1)}  # at and after each
    for node in ("a", "b"):
        for pid in (1, 2):
            for at in sorted(instants | {BASE_NS}):
                assert log.touched_by(node, pid, at) == brute_force(log, node, pid, at)


def ghost_and_fleet(hours: int) -> tuple[Auditor, Auditor]:
    """The Kafka worker's two keys of one partition: a GPU that sends samples for ``hours``, and a GPU ``n/0`` (a
    collector's name for it without pynvml) of which only kernels come, in its first minutes."""
    fleet, ghost = Auditor(AUDIT), Auditor(AUDIT)
    for e in kernel_fleet.fleet(hours * 60):
        fleet.update(e)
    for i in range(5):
        ghost.update(activity(i, "n/0", "n", 1, 60 + i, 1))
    return fleet, ghost


def test_a_live_partition_drops_and_counts_the_kernels_of_a_gpu_that_never_sends_a_sample() -> None:
    """A live worker never reaches an end of input: the kernels of a key that never sends samples were kept for ever.
    They go, counted ``unbilled_kernels``, once the key is quiet on the clock and as far behind the partition in event
    time as a GPU is forgotten (the idle timeout and the longer of the idle window and the revision horizon)."""
    fleet, ghost = ghost_and_fleet(73)  # 73 h of samples: past the 72 h idle window
    keys = {"GPU-0": fleet, "n/0": ghost}
    out, changed = close_partition(keys, {"n/0": 0.0}, 0.0, 1.0, AUDIT)  # heard a second ago: kept
    assert ghost.holds_unsampled_kernels() and "n/0" not in changed
    out, changed = close_partition(keys, {"n/0": 0.0}, 0.0, 10_000.0, AUDIT)
    assert not ghost.holds_unsampled_kernels() and ghost.counts["unbilled_kernels"] == 5 and "n/0" in changed


def test_kernels_of_a_gpu_without_samples_are_kept_while_they_may_still_be_billed() -> None:
    """Kernels given before their samples (the order the docs advise for a replay) wait for them: only those as far
    back as a forgotten GPU's go."""
    fleet, ghost = ghost_and_fleet(2)
    close_partition({"GPU-0": fleet, "n/0": ghost}, {}, 0.0, 10_000.0, AUDIT)
    assert ghost.holds_unsampled_kernels() and not ghost.counts["unbilled_kernels"]


def test_the_embedded_run_drops_them_only_once_that_gpu_itself_is_quiet() -> None:
    """From a review: another GPU going quiet dropped them while their own GPU was still heard (its kernels had just
    come); the embedded run now hears a GPU without samples by its kernels' latest start."""
    auditor = Auditor(AUDIT)  # one auditor for the run: GPU-0 samples for 73 h, n/0 sends only kernels
    for i in range(5):
        auditor.update(activity(i, "n/0", "n", 1, 60 + i, 1))
    for e in kernel_fleet.fleet(73 * 60):
        auditor.update(e)
    silence = RunSilence(timeout_s=900, forget=True)
    silence.close(auditor, 0.0)  # the first look: each heard now
    auditor.update(activity(5, "n/0", "n", 1, 70, 1))  # n/0 heard again (a late buffer); GPU-0 is quiet
    silence.close(auditor, 1_000.0)
    assert auditor.holds_unsampled_kernels() and not auditor.counts["unbilled_kernels"]
    silence.close(auditor, 2_000.0)  # n/0 quiet too
    assert not auditor.holds_unsampled_kernels() and auditor.counts["unbilled_kernels"] == 6


@given(kernels, st.integers(0, 25 * 60), st.booleans())
def test_a_gpu_keeps_the_names_of_its_kept_kernels_and_no_others(
    taken: list[tuple[str, str, int, int, int]], watermark_s: int, snapshot: bool
) -> None:
    """Node ids and kernel names are freed with the last kernel kept that uses them (names of kernels compiled at
    run time, nodes gone, kept for ever, grew the state with the run's length), and a freed code is handed out again
    before the table grows, so it is never longer than the most names in use at once; checked by a look at every
    kernel kept."""
    settings, peak = AuditSettings(pane_s=60, revision_horizon_s=60), {}
    log = KernelLog(settings)
    for i, k in enumerate(taken):
        event = activity(i, *k).model_copy(update={"name": f"k{i}"})  # a name of its own: each freed with its kernel
        if log.admit(event) is None:
            log.take(event)
        for gpu, saved in log.to_state().items():  # the most in use at once: after a take, before pruning
            peak[gpu] = max(peak.get(gpu, 0), len(saved["names"]))
        for gpu in ("GPU-0", "GPU-1"):  # the watermark its own latest start and a GPU's lead, up to 25 minutes
            log.prune(gpu, BASE_NS + (k[3] + watermark_s) * NS)
    if snapshot:
        log = KernelLog.from_state(log.to_state(), settings)
    for gpu, saved in log.to_state().items():
        names = saved["names"]
        assert sorted(names) == sorted(
            {names[row[col]] for _, rows in saved["panes"] for row in rows for col in (3, 4)}
        )
        assert log.name_slots(gpu) <= peak[gpu]  # the table in memory, freed codes included


def test_a_snapshot_is_the_same_for_the_same_kernels_kept_whatever_was_freed_before() -> None:
    """The batch path takes a batch's kernels before its samples prune, the row path in turn: codes are handed out in
    another order, and the snapshots (which workers compare and restore) must still be equal."""
    late = KernelLog(SETTINGS)
    late.take(activity(0, "GPU-0", "a", 1, 0, 1).model_copy(update={"name": "gone"}))
    late.prune("GPU-0", BASE_NS + 3 * 60 * NS + SETTINGS.revision_horizon_ns)  # pane 0 dropped, "gone" freed
    fresh = KernelLog(SETTINGS)
    for log in (late, fresh):
        for i, name in ((1, "x"), (2, "y")):
            log.take(activity(i, "GPU-0", "b", 1, 4 * 60 + i, 1).model_copy(update={"name": name}))
    assert late.to_state() == fresh.to_state() and late.to_state()["GPU-0"]["names"] == ["b", "x", "y"]


def test_names_a_snapshot_of_version_4_kept_for_ever_are_freed_when_it_is_restored() -> None:
    log = KernelLog(SETTINGS)
    for i in range(4):
        log.take(activity(i, "GPU-0", "a", 1, i * 60, 1).model_copy(update={"name": f"k{i}"}))
    state = log.to_state()
    saved = dict(state["GPU-0"])
    saved["names"] = ["gone", *saved["names"]]  # as a snapshot before names were freed kept it: a name no kernel uses
    saved["panes"] = [[p, [[*r[:3], r[3] + 1, r[4] + 1, *r[5:]] for r in rows]] for p, rows in saved["panes"]]
    restored = KernelLog.from_state({"GPU-0": saved}, SETTINGS)
    assert restored.to_state() == state and restored.name_slots("GPU-0") == 6  # "gone", "a", k0 to k3
    restored.take(activity(9, "GPU-0", "a", 1, 5 * 60, 1).model_copy(update={"name": "new"}))
    assert restored.name_slots("GPU-0") == 6  # "gone"'s code, freed at the restore, is handed out again
