"""Plain-text tables and the end-of-run summary, read back through the DuckDB views."""
from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

from gpucost.embedded import RunStats
from gpucost.schemas.records import GRADES
from gpucost.sinks.views import connect

__all__ = ["format_table", "printable", "summary"]


def printable(text: str) -> str:
    """``text`` with every character a terminal would act on or not show (ANSI escapes, zero-width and
    other control or format characters) written as its escape: a team name cannot repaint a terminal."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def format_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[("NULL" if v is None else printable(str(v))) for v in row] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    line = lambda vals: "  ".join(v.ljust(w) for v, w in zip(vals, widths)).rstrip()  # noqa: E731
    return "\n".join([line(columns), line(["-" * w for w in widths])] + [line(r) for r in cells])


_MOST_IDLE = """
SELECT gpu_uuid, gpu_model, node_id,
       round(arg_max(idle_index_72h, pane_end_ns), 4) AS idle_index_72h,
       round(arg_max(covered_ms_72h, pane_end_ns) / 3.6e6, 1) AS hours_covered
FROM idle_index GROUP BY ALL ORDER BY idle_index_72h DESC, gpu_uuid LIMIT 5"""
_BY_TEAM = """
SELECT team, sum(cost_micro_usd) AS micro_usd, printf('%.2f', sum(cost_micro_usd) / 1e6) AS usd,
       printf('%.1f%%', 100.0 * sum(cost_micro_usd) / nullif(sum(sum(cost_micro_usd)) OVER (), 0)) AS share
FROM cost GROUP BY team ORDER BY micro_usd DESC, team"""
_GRADES = f"""
SELECT grade, count(*) AS windows, count(*) FILTER (WHERE passed) AS passed,
       printf('%.1f%%', 100.0 * count(*) / sum(count(*)) OVER ()) AS share
FROM health GROUP BY grade ORDER BY array_position({list(GRADES)}, grade)"""
#: what reclaiming each trigger's GPU would free: its price, per hour (a trigger of an unpriced GPU frees nothing known)
_UNIT_COST = """
SELECT gpu_model, round(sum(gpu_hours), 1) AS gpu_hours, round(sum(effective_tflop_hours), 1) AS eff_tflop_hours,
       round(sum(gpu_hours_without_efu), 1) AS hours_no_efu,
       printf('%.4f', (sum(cost_micro_usd) / 1e6 + sum(opex_usd)) / nullif(sum(effective_tflop_hours), 0))
         AS usd_per_eff_tflop_hour
FROM unit_cost GROUP BY gpu_model ORDER BY gpu_model"""
_RECLAIMS = """
SELECT sla AS tier, count(*) AS triggers, count(DISTINCT gpu_uuid) AS gpus,
       sum(coalesce(usd_per_gpu_hour, 0) * 1000000)::BIGINT AS micro_usd_per_hour,
       printf('%.2f', sum(coalesce(usd_per_gpu_hour, 0))) AS usd_per_hour
FROM reclaim GROUP BY sla ORDER BY array_position(['Gold', 'Silver', 'Bronze'], sla), sla"""
#: what late data changed, per team: the adjustments of revised panes (revision > 0) against the bill as first published
_REVISIONS = """
SELECT team, count(DISTINCT (gpu_uuid, pane_start_ns)) AS panes_revised, count(*) AS records,
       sum(cost_micro_usd) AS adjustment_micro_usd,
       (SELECT sum(cost_micro_usd) FROM cost_as_first_published f WHERE f.team = c.team) AS first_published_micro_usd
FROM cost c WHERE revision > 0 GROUP BY team ORDER BY team"""
#: each GPU's breaker state after its latest window, for those not in service
_OUT_OF_SERVICE = """
SELECT * FROM (
  SELECT gpu_uuid, arg_max(node_id, window_start_ns) AS node_id, arg_max(breaker_state, window_start_ns) AS state,
         epoch_ms(max(window_end_ns) // 1000000) AS as_of,
         arg_max(array_to_string(fail_reasons, ','), window_start_ns) AS last_fail_reasons
  FROM health GROUP BY gpu_uuid)
WHERE state <> 'in_service' ORDER BY array_position(['removed', 'observation', 'probation'], state), gpu_uuid"""


def summary(out_dir: Path, stats: RunStats, opex_usd_per_gpu_hour: Decimal = Decimal(0)) -> str:
    con = connect(out_dir, opex_usd_per_gpu_hour)
    parts = []
    rate = stats.inputs / stats.seconds if stats.seconds else 0.0
    parts.append(f"processed {stats.inputs:,} inputs in {stats.seconds:.1f} s ({rate:,.0f}/s); "
                 + ", ".join(f"{k}: {v:,}" for k, v in sorted(stats.rows.items())) + " rows written")
    res = con.execute(_MOST_IDLE)
    parts.append("\nGPUs most idle over the last 72 h:\n"
                 + format_table([d[0] for d in res.description], res.fetchall()))
    res = con.execute(_BY_TEAM)
    parts.append("\nCost by team (idle = cost of time no tenant used):\n"
                 + format_table([d[0] for d in res.description], res.fetchall()))
    res = con.execute(_GRADES)
    graded = res.fetchall()
    if graded:
        parts.append("\nHealth audit windows by grade:\n" + format_table([d[0] for d in res.description], graded))
        res = con.execute(_OUT_OF_SERVICE)
        out = res.fetchall()
        parts.append(f"\nGPUs not in service ({len(out)}; removed and probation leave service discovery):\n"
                     + format_table([d[0] for d in res.description], out) if out else "\nEvery GPU is in service.")
    res = con.execute(_RECLAIMS)
    triggers = res.fetchall()
    if triggers:
        parts.append("\nReclaim triggers by SLA tier (GPUs held idle past the tier's tolerance):\n"
                     + format_table([d[0] for d in res.description], triggers))
    res = con.execute(_REVISIONS)
    revised = res.fetchall()
    if revised:
        late = ", ".join(f"{k.split(':', 1)[1]}: {v:,}" for k, v in sorted(stats.counts.items())
                         if k.startswith("revised_by_late:"))
        parts.append(f"\nRevisions: late events and bindings within the horizon adjusted the bill ({late}):\n"
                     + format_table([d[0] for d in res.description], revised))
    res = con.execute(_UNIT_COST)
    units = res.fetchall()
    if units:
        parts.append(f"\nUnit cost by GPU model (billed µ$ + opex {opex_usd_per_gpu_hour} USD/GPU-h, over effective "
                     "TFLOP-hours: EFU × peak × hours):\n" + format_table([d[0] for d in res.description], units))
    (unpriced,) = con.execute("SELECT count(DISTINCT (gpu_uuid, pane_start_ns)) FROM cost WHERE unpriced").fetchone()
    if unpriced:
        parts.append(f"\n{unpriced:,} GPU-panes had no price (model unpriced, no 'default'): billed 0 µ$")
    if stats.counts.get("unbilled"):
        parts.append(f"{stats.counts['unbilled']:,} process/NUMA events fell in panes without a GPU sample "
                     "(no covered time to bill)")
    if stats.counts.get("binding_past_horizon"):
        parts.append(f"{stats.counts['binding_past_horizon']:,} bindings started more than the revision horizon "
                     "back: panes they cover beyond it, if any, stay as billed (raise --revision-horizon-s)")
    if stats.counts.get("silent_closes"):
        parts.append(f"{stats.counts['silent_closes']:,} panes of GPUs gone silent closed before the end of the "
                     f"input; {stats.counts.get('forgotten_gpus', 0):,} GPUs gone for good forgotten")
    if stats.counts.get("mae_silent_closes"):
        parts.append(f"{stats.counts['mae_silent_closes']:,} MAE windows of processes gone silent published "
                     "partial before the end of the input")
    dead = sum(stats.dead_letters.values())
    detail = ", ".join(f"{r}: {n:,}" for r, n in sorted(stats.dead_letters.items()))
    parts.append(f"\ndead letters: {dead:,}" + (f" ({detail}); see the dlq view" if dead else ""))
    return "\n".join(parts)
