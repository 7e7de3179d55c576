"""The health audit's scripted fleet: per GPU, one behaviour per window (a grade, a breaker state, a skipped or
thin window), as events; the settings it is audited under, its two paths through the auditor, and its embedded
replay to Parquet. The behaviours reach every grade and every breaker state (tests/test_health.py checks that they
do)."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

from gpucost.schemas.arrow import events_table
from gpucost.schemas.blocks import expand
from gpucost.schemas.codec import encode_event
from gpucost.schemas.events import Event, GpuSample, ProcessSample, TenantBinding
from gpucost.schemas.records import Output
from gpucost.streams.audit import Auditor
from gpucost.streams.settings import AuditSettings

NS = 1_000_000_000
T0 = 1_767_571_200 * NS  # 2026-01-05, a multiple of every window length used here
H_S = 3600
#: a small peak table, so that ordinary powers and utilisations span every grade
PEAKS = {"H100": 2, "T4": 1, "default": Decimal("1.5")}
#: a GPU's node is named by its id's last letter: GPU-h100b and GPU-xb share node-b
MODELS = {
    "GPU-h100": "NVIDIA H100 80GB HBM3",
    "GPU-t4": "Tesla T4",
    "GPU-x": "Acme X9",
    "GPU-h100b": "H100 PCIe",
    "GPU-xb": "Acme X9",
    "GPU-newc": "NVIDIA H200",
}

#: what a GPU does in one window: (GPU samples' SM %, power W, share of the window sampled, tenant placed)
BEHAVIOURS: dict[str, tuple[float, float, float, bool]] = {
    "excellent": (80.0, 100.0, 1.0, True),  # 0.1 kW over 1.6 TOPS (H100 at 2): 0.0625
    "good": (50.0, 220.0, 1.0, True),  # 0.22 kW over 1 TOPS: 0.22
    "needs": (30.0, 300.0, 1.0, True),  # 0.3 kW over 0.6 TOPS: 0.5
    "spare": (0.0, 40.0, 1.0, False),  # no busy time at all: grade idle, passes
    "held_idle": (0.0, 60.0, 1.0, True),  # placed and left idle: grade idle, deviation 1, fails on it alone
    "busy_unplaced": (60.0, 50.0, 1.0, False),  # busy with nothing placed: deviation 1 (and so graded down)
    "thin": (80.0, 100.0, 0.5, True),  # half the window sampled: coverage fails
    "skip": (0.0, 0.0, 0.0, False),  # no GPU sample in the window at all
    # on the T4 (peak 1) exactly at a threshold: 0.18 kW/TOPS is good, not excellent; 0.25 is still good
    "at_excellent": (100.0, 180.0, 1.0, True),
    "at_good": (100.0, 250.0, 1.0, True),
}
#: behaviours whose power stays exactly as given (the others vary by an eighth of a watt, pane by pane)
STEADY = {"at_excellent", "at_good"}


def fleet(scripts: dict[str, list[str]], pane_s: int = 60) -> list[Event]:
    """Per GPU, one behaviour per window: a GPU sample and, where placed, a process sample of a bound
    pid every pane (the sampled share of the window's panes). GPUs interleave in time order."""
    events: list[Event] = []
    for gpu in scripts:
        node = f"node-{gpu[-1]}"
        events.append(
            TenantBinding(node_id=node, pid=7, ts_ns=T0, team="search", env="prod", app="a", tier="t", sla="Gold")
        )
    per_window = H_S // pane_s
    for w in range(max(map(len, scripts.values()))):
        for p in range(per_window):
            ts = T0 + (w * H_S + p * pane_s) * NS + 5 * NS
            for gpu, script in scripts.items():
                if w >= len(script):
                    continue
                sm, power, share, placed = BEHAVIOURS[script[w]]
                if p >= per_window * share:
                    continue
                node = f"node-{gpu[-1]}"
                events.append(
                    GpuSample(
                        node_id=node,
                        gpu_uuid=gpu,
                        gpu_model=MODELS[gpu],
                        ts_ns=ts,
                        interval_s=float(pane_s),
                        sm_util_pct=sm,
                        mem_bw_util_pct=10.0,
                        mem_used_bytes=1,
                        mem_total_bytes=2,
                        power_w=power + (0 if script[w] in STEADY else 0.125 * (p % 3)),
                        temp_c=50.0,
                    )
                )
                if placed:
                    events.append(
                        ProcessSample(
                            node_id=node,
                            gpu_uuid=gpu,
                            pid=7,
                            ts_ns=ts + NS,
                            interval_s=float(pane_s),
                            sm_util_pct=sm,
                            mem_bw_util_pct=10.0,
                            mem_used_bytes=1,
                        )
                    )
                else:  # an unbound process: unattributed, so the pane is not allocated
                    events.append(
                        ProcessSample(
                            node_id=node,
                            gpu_uuid=gpu,
                            pid=99,
                            ts_ns=ts + NS,
                            interval_s=float(pane_s),
                            sm_util_pct=sm,
                            mem_bw_util_pct=10.0,
                            mem_used_bytes=1,
                        )
                    )
    return events


def audit_settings(admission_h: int = 2, **kw: Any) -> AuditSettings:
    return AuditSettings(
        pane_s=60, lateness_s=0, window_h=2, health_window_h=1, admission_h=admission_h, peak_tops=PEAKS, **kw
    )


def by_rows(events: list[Event], s: AuditSettings, key: bytes | None = None) -> list[Output]:
    auditor = Auditor(s, audit_key=key)
    out = [r for e in events for r in auditor.update(e)]
    return out + auditor.finish()


def by_batches(events: list[Event], s: AuditSettings, key: bytes | None = None) -> list[Output]:
    auditor = Auditor(s, audit_key=key)
    lines = [encode_event(e).encode() for e in events]
    out = expand(auditor.ingest_lines(lines[: len(lines) // 2], str))
    out += expand(auditor.ingest_batch(events_table(_decode(lines[len(lines) // 2 :])).to_batches()[0], str))
    return out + auditor.finish()


def _decode(lines: list[bytes]) -> list[Event]:
    from gpucost.schemas.codec import decode_line

    return [decode_line(line) for line in lines]  # type: ignore[misc]


SCRIPTS = {
    # probation 2 windows, then in service; fails twice: removed; two passes: back in service
    "GPU-h100": [
        "excellent",
        "excellent",
        "good",
        "needs",
        "needs",
        "excellent",
        "needs",
        "excellent",
        "excellent",
        "held_idle",
        "excellent",
    ],
    # a spare (no busy time), a thin window in probation (restarts admission), a skipped window
    "GPU-t4": [
        "spare",
        "thin",
        "spare",
        "spare",
        "skip",
        "spare",
        "busy_unplaced",
        "spare",
        "skip",
        "skip",
        "good",
        "at_excellent",
        "at_good",
        "held_idle",
    ],
    # a model the peak table lacks: the default peak
    "GPU-x": ["good", "excellent", "needs", "excellent", "thin", "thin", "thin", "excellent", "excellent"],
    "GPU-h100b": ["needs", "needs", "needs", "excellent", "needs", "needs", "good", "spare"],
    # admitted, then failing until removed: its node leaves service though GPU-h100b, beside it, is in
    "GPU-xb": ["needs", "needs", "needs", "needs", "needs"],
    # one window: still in probation at the end
    "GPU-newc": ["excellent"],
}


def replayed(tmp_path: Path, key: bytes | None) -> Path:
    """The scripted fleet replayed to Parquet, with its health records signed by ``key`` (if any)."""
    from gpucost.embedded import run_embedded
    from gpucost.producers.replay import read_inputs

    events = tmp_path / "events.jsonl"
    events.write_text("".join(encode_event(e) + "\n" for e in fleet(SCRIPTS)))
    out = tmp_path / "out"
    run_embedded(read_inputs([events]), audit_settings(), out, audit_key=key)
    return out
