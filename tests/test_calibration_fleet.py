"""The per-platform power fit end to end: a simulated fleet whose models draw unlike each other, through the pipeline's
own panes (``pane_features``) and ``gpucost fit-weights``; devices without a power reading made by the accelerator
sources' own event writer (gpucost/producers/accelerators/events.py), so their labels are the ones real captures get.
"""

from __future__ import annotations

import json
from dataclasses import replace
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest

from gpucost.calibration import calibrate
from gpucost.fit import Fit, pane_features
from gpucost.producers.accelerators.events import Placement, to_events
from gpucost.producers.simulate import FleetSpec, simulate
from gpucost.schemas.codec import encode_event
from gpucost.schemas.devices import DeviceSample, Parsed, ProcessUsage
from gpucost.streams.settings import AuditSettings
from tests.support.cli import gpucost

pytestmark = pytest.mark.slow
H100, A100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"
#: two models drawing by their own formula (idle W, W per SM %, W per BW %, W·ms per NUMA), the others by the
#: fleet's (``FleetSpec``'s defaults: 70 W, 3, 1.5, 20,000)
POWER = {H100: (110.0, 2.0, 0.5, 8_000.0), A100: (45.0, 4.5, 2.5, 30_000.0)}
SPEC = FleetSpec(gpus=8, hours=12, seed=2, interval_s=10)  # seed 2: three A100, two H100, two H200, one L40S


def formula(model: str) -> tuple[float, np.ndarray]:
    idle, *slopes = POWER.get(
        model, (SPEC.idle_power_w, SPEC.watts_per_sm_pct, SPEC.watts_per_bw_pct, SPEC.watt_ms_per_numa)
    )
    return idle, np.array(slopes)


def recovers(fit: Fit, model: str) -> bool:
    """The idle draw within 2 W and the SM and bandwidth slopes within 5 %: the simulator's noise (3 W a sample,
    only while a job runs) over hundreds of panes. NUMA events are rare (2 % of ticks), so the L slope is not held."""
    idle, slopes = formula(model)
    return abs(fit.intercept_w - idle) < 2 and bool(np.all(np.abs(fit.slopes[:2] - slopes[:2]) < 0.05 * slopes[:2]))


def write_fleet(path: Path, spec: FleetSpec) -> Path:
    path.mkdir()
    (path / "events.jsonl").write_text("".join(encode_event(e) + "\n" for e in simulate(spec, POWER)))
    return path


def test_each_simulated_platform_recovers_its_formula_and_the_pooled_fit_none(tmp_path: Path) -> None:
    cal = calibrate(pane_features([write_fleet(tmp_path / "fleet", SPEC)], AuditSettings()))
    by_model = {p.models[0]: p for p in cal.platforms}
    assert set(by_model) == {H100, A100, "NVIDIA H200", "NVIDIA L40S"}  # seed 2 draws every model
    assert cal.pooled is not None
    for model, p in by_model.items():
        assert p.fit is not None and p.why_not is None, (model, p.why_not)
        assert recovers(p.fit, model), (model, p.fit)
        assert p.r2 is not None and p.r2 > 0.95
    for model in (H100, A100):
        assert not recovers(cal.pooled, model) and not recovers(cal.fleet, model)
        p = by_model[model]
        assert p.pooled_rmse_w is not None and p.rmse_w is not None and p.pooled_rmse_w > 2 * p.rmse_w


def test_power_by_model_changes_only_the_watts_of_the_models_it_names() -> None:
    """Every record of a fleet stays as it was: the per-model power draws nothing from the generators, so only the
    named model's GPU samples' power_w moves."""
    base = replace(SPEC, gpus=4, hours=0.5)
    before, after = list(simulate(base)), list(simulate(base, {H100: POWER[H100]}))
    assert len(before) == len(after)
    moved = [(a, b) for a, b in zip(before, after) if a != b]
    assert moved and all(a.kind == "gpu_sample" and a.gpu_model == H100 for a, _ in moved)  # type: ignore[union-attr]
    assert all(a.model_dump(exclude={"power_w"}) == b.model_dump(exclude={"power_w"}) for a, b in moved)
    with pytest.raises(ValueError, match="power_by_model names 'NVIDIA B300', which is no simulated model"):
        next(simulate(base, {"NVIDIA B300": POWER[H100]}))


def devices_without_power(start_ns: int, minutes: int) -> list[str]:
    """JSON lines of two devices that report no power, as ``gpucost devices --events`` writes them: a Trainium2
    (no TDP in the platform table: 0 W, not_reported) and an MI300X whose tool gave no power (its TDP, estimated);
    their busy varies, so only the power label keeps them out of the fit."""
    samples = [
        DeviceSample(
            vendor=vendor,
            model=model,
            device_id=device,
            ts_ns=start_ns + k * 10**10,
            busy_pct=Decimal(k * 7 % 100),
            mem_used_bytes=1 << 30,
            mem_total_bytes=96 << 30,
            processes=(ProcessUsage(pid=4242, busy_pct=Decimal(k * 7 % 100)),),
        )
        for vendor, model, device in (("aws", "Trainium2", "nd0"), ("amd", "AMD Instinct MI300X", "gpu0"))
        for k in range(minutes * 6)
    ]
    parsed = Parsed()
    events = to_events(samples, Placement(node="mixed-node"), parsed)
    assert not parsed.dead_letters
    return [json.dumps(e) for e in events]


def test_fit_weights_json_lists_platforms_without_power_and_the_text_table(tmp_path: Path) -> None:
    spec = replace(SPEC, gpus=4, hours=3)
    events = write_fleet(tmp_path / "fleet", spec)
    (events / "devices.jsonl").write_text("\n".join(devices_without_power(spec.start_ns, 180)) + "\n")
    proc = gpucost("fit-weights", str(events), "--format", "json", "--write", str(tmp_path / "w.toml"))
    out = json.loads(proc.stdout)  # one JSON document: the --write message goes to stderr
    assert "settings written to" in proc.stderr
    by_name = {p["platform"]: p for p in out["platforms"]}
    assert by_name["Trn2"]["not_fitted"].startswith("no power reading: its GPU samples label power_w not_reported")
    assert by_name["Trn2"]["panes"] == by_name["Trn2"]["panes_without_power_reading"] == 180
    assert by_name["MI300X"]["panes_without_power_reading"] == 180 and by_name["MI300X"]["fit"] is None
    fitted = [p for p in out["platforms"] if p["fit"] is not None]
    assert fitted and all(p["rmse_w"] > 0 and p["held_out_panes"] >= 5 for p in fitted)
    # the fleet-wide fit: the simulated GPUs' panes only, and the snippet --write wrote is the one in the JSON
    assert out["fleet"]["panes"] == sum(p["panes"] - p["panes_without_power_reading"] for p in out["platforms"])
    assert (tmp_path / "w.toml").read_text() == out["snippet"]
    text = gpucost("fit-weights", str(events)).stdout
    assert text.startswith("panes used: ")
    assert "per platform: fitted on its panes but the latest 20%" in text
    assert "Trn2 (180 panes): not fitted: no power reading" in text
    assert "\nalpha = " in text  # the snippet, last, as before
