"""The CUPTI collector's range paths: each kernel carries the ranges open on its launching thread at its launch, read
against a brute force over the whole recording (docs/collecting.md)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.cupti_standin import cupti as standin
from tests.support.cupti_recording import copy, kernel, launch, marker, replay


@st.composite
def host_recordings(draw):
    """Ranges nesting or not on two threads, launches on them, and each launch's kernel or copy: the host's records
    (markers, launches) in the order they happened, the device's anywhere, in any buffers."""
    host, device, ranges = [], [], []
    for mid in range(draw(st.integers(0, 6))):
        start = draw(st.integers(0, 1000))
        end = None if draw(st.integers(0, 5)) == 0 else start + draw(st.integers(0, 600))
        tid, name = draw(st.sampled_from([1, 2])), draw(st.sampled_from(["step", "fwd", "bwd", "", 'é"%s', "\ud800x"]))
        ranges.append((mid, tid, start, end, name))
        host.append((start, 0, marker(mid, standin.ActivityFlag.MARKER_START, start, tid=tid, name=name)))
        if end is not None:
            host.append((end, 0, marker(mid, standin.MARKER_END, end)))
    launches = []
    for corr in range(1, draw(st.integers(1, 8)) + 1):
        at, tid = draw(st.integers(0, 1200)), draw(st.sampled_from([1, 2]))
        launches.append((corr, tid, at))
        host.append((at, 1, launch(corr, tid, at)))  # a marker at the same time is read first
        work = kernel(corr, at + 10, at + 50) if draw(st.booleans()) else copy(corr, at + 10, at + 20)
        device.append(work)
    ordered = [r for _, _, r in sorted(host, key=lambda h: h[:2])]
    for work in device:
        ordered.insert(draw(st.integers(0, len(ordered))), work)
    return ordered, ranges, launches, draw(st.randoms())


@settings(max_examples=150, deadline=None)
@given(host_recordings(), st.integers(0, 5))
def test_a_kernel_s_range_path_is_the_ranges_open_on_its_launching_thread_at_its_launch(recording, n_cuts):
    records, ranges, launches, rnd = recording
    cuts = sorted(rnd.randint(0, len(records)) for _ in range(n_cuts))
    got, _, _ = replay([records[a:b] for a, b in zip([0, *cuts], [*cuts, len(records)])], wall=(0, 0, 0, 0))
    paths = {o["correlation_id"]: o.get("range_path") for o in got if o["kind"] == "kernel_activity"}
    assert set(paths) == {corr for corr, _, _ in launches}
    for corr, tid, at in launches:
        open_then = sorted((s, n) for _, t, s, e, n in ranges if t == tid and s <= at and (e is None or e > at))
        # a name as valid UTF-8 (a lone surrogate replaced), an empty one named
        named = [n.encode("utf-8", "replace").decode() or "(unnamed)" for _, n in open_then]
        assert paths[corr] == (named or None), (corr, ranges)
