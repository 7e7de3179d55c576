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
TRACES = [pytest.param("sampled_rank-0.json.gz"), pytest.param("sampled_rank-1.json.gz"),
          pytest.param("nccl_data.json.gz", marks=pytest.mark.xfail(
              strict=True, reason="HTA 0.5 reads 152,778 µs of kernel busy time on this newer trace (float µs "
                                  "relative to baseTimeNanoseconds), a brute force over the raw JSON 155,215.315 "
                                  "µs; the gap is not yet explained"))]


def _hta_busy_us(path: Path, tmp_path: Path) -> dict[int, float]:
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
def test_busy_time_matches_hta(capsys, tmp_path, name):
    path = DATA / name
    assert main(["kernels", str(path), "--format", "json"]) == 0
    ours = {d["device"]["device"]: d["busy_ns"] for d in json.loads(capsys.readouterr().out)["devices"]}
    theirs = _hta_busy_us(path.resolve(), tmp_path)
    assert ours.keys() == theirs.keys()
    for device, busy_ns in ours.items():
        assert abs(busy_ns / 1000 - theirs[device]) <= 1, (device, busy_ns, theirs[device])
