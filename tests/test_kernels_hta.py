"""Per-device kernel busy time of ``gpucost kernels`` against Holistic Trace Analysis' reading of the same
Kineto file (its parser, its interval merge), to 1 µs per device. HTA is the optional extra ``hta``."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from gpucost.cli import main

hta = pytest.importorskip("hta.trace_analysis", reason="Holistic Trace Analysis is absent: pip install -e '.[hta]'")
from hta.utils.utils import merge_kernel_intervals  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "profiler-traces" / "hta-kineto"
TRACES = ["sampled_rank-0.json.gz", "sampled_rank-1.json.gz", "nccl_data.json.gz"]


def _hta_busy_us(path: Path, tmp_path: Path, monkeypatch) -> dict[int, float]:
    # HTA by default shrinks every ns-resolution event to whole µs (start up, end down: pytorch#122425);
    # this reads the file's times as written, as gpucost does
    monkeypatch.setenv("HTA_DISABLE_NS_ROUNDING", "1")
    logging.disable(logging.CRITICAL)
    try:
        (tmp_path / path.name).symlink_to(path)
        trace = hta.TraceAnalysis(trace_dir=str(tmp_path), include_last_profiler_step=True).t
        sym = trace.symbol_table.get_sym_table()
        out = {}
        for df in trace.get_all_traces().values():
            kernels = df[(df["stream"] >= 0) & (df["cat"].map(lambda c: sym[c]) == "kernel")]
            for device, group in kernels.groupby("pid"):
                merged = merge_kernel_intervals(group.copy())
                out[int(device)] = float((merged.end - merged.ts).sum())
        return out
    finally:
        logging.disable(logging.NOTSET)


@pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data/profiler-traces/hta-kineto/ is absent")
@pytest.mark.parametrize("name", TRACES)
def test_busy_time_matches_hta(capsys, tmp_path, monkeypatch, name):
    path = DATA / name
    assert main(["kernels", str(path), "--format", "json"]) == 0
    ours = {d["device"]["device"]: d["busy_ns"] for d in json.loads(capsys.readouterr().out)["devices"]}
    theirs = _hta_busy_us(path.resolve(), tmp_path, monkeypatch)
    assert ours.keys() == theirs.keys()
    for device, busy_ns in ours.items():
        assert abs(busy_ns / 1000 - theirs[device]) <= 1, (device, busy_ns, theirs[device])
