"""7. The state the revision horizon keeps, per GPU: at 1 s and 10 s sampling, 6 h and 24 h horizons.

A GPU with one process (one GPU sample and one process sample per interval, as NVML gives them) runs
through the auditor for the horizon plus an hour; then the revision state's bytes for it are read:
the log's rows (``Revisions.nbytes``) and the whole revision state as a worker's state record writes it
(JSON, its rows base64). The baseline, in the same run, is the same GPU's whole auditor state with
revisions off (``revision_horizon_s = 0``): the ratio says what the horizon multiplies a state record by.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from benchmarks.common import Result

if TYPE_CHECKING:
    from gpucost.streams.audit import Auditor

NS = 1_000_000_000
T0 = 1_736_121_600 * NS


def _fed(horizon_s: int, interval_s: int, hours: float) -> Auditor:
    """An auditor fed ``hours`` of one GPU's samples (and its one process's)."""
    from gpucost.schemas.events import GpuSample, ProcessSample, TenantBinding
    from gpucost.streams.audit import Auditor
    from gpucost.streams.settings import AuditSettings

    auditor = Auditor(AuditSettings(revision_horizon_s=horizon_s))
    auditor.update(
        TenantBinding(
            node_id="node-0", pid=1000, ts_ns=T0, team="team", env="prod", app="app", tier="online", sla="Gold"
        )
    )
    for k in range(int(hours * 3600 / interval_s)):
        ts, util = T0 + k * interval_s * NS, float(k % 100)
        auditor.update(
            GpuSample.model_construct(
                node_id="node-0",
                gpu_uuid="GPU-0",
                gpu_model="H100",
                ts_ns=ts,
                interval_s=float(interval_s),
                sm_util_pct=util,
                mem_bw_util_pct=10.0,
                mem_used_bytes=1,
                mem_total_bytes=2,
                power_w=300.0,
                temp_c=50.0,
            )
        )
        auditor.update(
            ProcessSample.model_construct(
                node_id="node-0",
                gpu_uuid="GPU-0",
                pid=1000,
                ts_ns=ts + 1,
                interval_s=float(interval_s),
                sm_util_pct=util,
                mem_bw_util_pct=10.0,
                mem_used_bytes=1,
            )
        )
    return auditor


def _json_bytes(state: object) -> int:
    return len(json.dumps(state, separators=(",", ":")))


def _state(horizon_s: int, interval_s: int, hours: float) -> tuple[int, int, int]:
    """(log bytes, revision state JSON bytes, whole state JSON bytes) of one GPU after ``hours`` of samples."""
    auditor = _fed(horizon_s, interval_s, hours)
    state = auditor.to_state()
    return auditor.revisions.nbytes("GPU-0"), _json_bytes(state.get("revisions", {})), _json_bytes(state)


def _forgotten(interval_s: int, hours: float) -> tuple[int, int]:
    """The whole state's JSON bytes with the GPU live, and once it has gone silent and been forgotten: another
    GPU's watermark an hour past the idle window (or horizon) and the timeout after its last pane."""
    auditor = _fed(21_600, interval_s, hours)
    live = _json_bytes(auditor.to_state())
    s = auditor.settings
    watermark = auditor.panes.largest_watermark()
    assert watermark is not None
    auditor.close_silent(watermark + s.idle_timeout_ns + max(s.window_ns, s.revision_horizon_ns) + 3600 * NS)
    assert auditor.counts["forgotten_gpus"] == 1
    return live, _json_bytes(auditor.to_state())


def run(horizons_h: tuple[int, ...] = (6, 24), intervals_s: tuple[int, ...] = (1, 10)) -> Result:
    rows = []
    for interval in intervals_s:
        for hours in horizons_h:
            log, revision_json, whole = _state(hours * 3600, interval, hours + 1)
            _, _, baseline = _state(0, interval, hours + 1)
            rows.append(
                (
                    f"{interval} s sampling, {hours} h horizon",
                    f"{log / 1024:,.0f} KiB of rows; {revision_json / 1024:,.0f} KiB as JSON; the whole state "
                    f"{whole / 1024:,.0f} KiB against {baseline / 1024:,.0f} KiB without revisions "
                    f"({whole / baseline:.1f}×)",
                )
            )
    live, left = _forgotten(10, 7)
    rows.append(
        (
            "a GPU gone for good (10 s, 6 h horizon)",
            f"its key's state {live / 1024:,.0f} KiB while it ran; "
            f"{left:,} bytes once forgotten (the floor, its bindings, prices, breaker and counts)",
        )
    )
    return Result(
        "7. Revision state per GPU",
        "a figure: bounded by the horizon and the sampling rate",
        None,
        rows,
        [
            "One GPU, one process: a GPU sample and a process sample per interval, for the "
            "horizon plus an hour. Rows are 41 bytes each (``streams/revisions.py``, ``LOG``); "
            "closed panes add a few dozen bytes each for their price and revision number.",
            "A worker writes a GPU's state record at each poll that touches it: with revisions, "
            "that record carries the horizon's rows.",
        ],
    )
