"""The Alibaba GenAI 2026 GPU duty-cycle trace (real, anonymised) through the pipeline.

Each ``container_ip`` is one GPU; each row one 57 s sample. The idle index the pipeline
computes must equal what SQL computes straight from the CSV text.
"""

from __future__ import annotations

import csv
import io
import json
import tarfile
from pathlib import Path

import pytest

from gpucost.embedded import run_embedded
from gpucost.producers.replay import read_inputs
from gpucost.sinks.views import connect
from gpucost.streams.settings import AuditSettings

pytestmark = pytest.mark.slow
NS = 1_000_000_000
STEP_S = 57


def _events(csv_text: str) -> list[str]:
    rows = sorted(csv.DictReader(io.StringIO(csv_text)), key=lambda r: (float(r["timestamp_anon"]), r["container_ip"]))
    return [
        json.dumps(
            {
                "kind": "gpu_sample",
                "node_id": "alibaba-genai",
                "gpu_uuid": f"GPU-{r['container_ip']}",
                "gpu_model": "anonymised",
                "ts_ns": int(float(r["timestamp_anon"])) * NS,
                "interval_s": STEP_S,
                "sm_util_pct": float(r["value"]),
                "mem_bw_util_pct": 0,
                "mem_used_bytes": 0,
                "mem_total_bytes": 0,
                "power_w": 0,
                "temp_c": 0,
            }
        )
        for r in rows
    ]


def test_alibaba_duty_cycle_idle_index_matches_sql(shared_data: Path, tmp_path: Path) -> None:
    archive = shared_data / "alibaba-genai-2026" / "pod_gpu_duty_cycle_anon.tar.gz"
    if not archive.exists():
        pytest.skip(f"{archive} is absent")
    with tarfile.open(archive) as tar:
        member = tar.extractfile("pod_gpu_duty_cycle_anon.csv")
        assert member is not None
        text = member.read().decode()
    (tmp_path / "duty.csv").write_text(text)
    (tmp_path / "events.jsonl").write_text("\n".join(_events(text)) + "\n")

    out = tmp_path / "out"
    stats = run_embedded(read_inputs([tmp_path / "events.jsonl"]), AuditSettings(), out)
    assert stats.inputs == 157_417 and not stats.dead_letters

    con = connect(out)
    con.execute(f"""
        CREATE MACRO half_even(x) AS CAST(CASE WHEN x - floor(x) > 0.5 THEN floor(x) + 1
            WHEN x - floor(x) < 0.5 THEN floor(x) WHEN floor(x) % 2 = 0 THEN floor(x) ELSE floor(x) + 1 END AS BIGINT);
        CREATE TABLE panes AS
          SELECT 'GPU-' || container_ip AS gpu_uuid,
                 CAST(timestamp_anon AS BIGINT) * {NS}
                   - CAST(timestamp_anon AS BIGINT) * {NS} % {60 * NS} AS pane_start_ns,
                 count(*) * {STEP_S * 1000} AS covered_ms,
                 count(*) FILTER (WHERE half_even(value * 100) < 500) * {STEP_S * 1000} AS idle_ms
          FROM read_csv('{tmp_path / "duty.csv"}', header = true,
                        columns = {{'value': 'DECIMAL(38,16)', 'timestamp_anon': 'DOUBLE', 'container_ip': 'VARCHAR'}})
          GROUP BY ALL;
        CREATE TABLE want AS SELECT *, sum(idle_ms) OVER w AS i72, sum(covered_ms) OVER w AS c72 FROM panes
          WINDOW w AS (PARTITION BY gpu_uuid ORDER BY pane_start_ns
                       RANGE BETWEEN {72 * 3600 * NS - 60 * NS} PRECEDING AND CURRENT ROW);
    """)
    counts = con.execute("SELECT (SELECT count(*) FROM want), (SELECT count(*) FROM idle_index)").fetchone()
    assert counts[0] == counts[1] > 100_000
    bad = con.execute("""
        SELECT count(*) FROM want w FULL JOIN idle_index g USING (gpu_uuid, pane_start_ns)
        WHERE g.idle_ms IS DISTINCT FROM w.idle_ms OR g.covered_ms IS DISTINCT FROM w.covered_ms
           OR g.idle_ms_72h IS DISTINCT FROM w.i72 OR g.covered_ms_72h IS DISTINCT FROM w.c72
           OR abs(g.idle_index_72h - w.i72 / w.c72) > 1e-12""").fetchone()
    assert bad == (0,)
    # the trace's own character: most samples idle, as its README says (two thirds)
    (fleet_idle,) = con.execute("SELECT sum(idle_ms) / sum(covered_ms) FROM idle_index").fetchone()
    assert 0.6 < fleet_idle < 0.8
    # every sample is one GPU-pane's worth of cost record: the idle record carries no share
    assert con.execute("SELECT count(*) FROM cost WHERE tenant_key <> 'idle'").fetchone() == (0,)
