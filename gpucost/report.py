"""Plain-text tables and the end-of-run summary, read back through the DuckDB views."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb

from gpucost.embedded import RunStats
from gpucost.report_bases import allocation_gap, by_label
from gpucost.schemas.partitions import share_sql
from gpucost.schemas.records import GRADES
from gpucost.sinks.views import MIN_EFFECTIVE_TFLOP_HOURS, connect, unit_cost_sql
from gpucost.streams.discovery import OUT_OF_SERVICE

__all__ = [
    "COSTLIEST",
    "IDLE_WORDS",
    "RECLAIMS",
    "device_faults",
    "format_table",
    "gpus",
    "period_covered",
    "printable",
    "summary",
]

#: what "idle" is in the bill, in the words every output uses (docs/definitions.md, "Words the output uses"):
#: the cost of the GPUs' capacity no tenant's process used, each pane's 1 − busy fraction
IDLE_WORDS = "idle = cost of unused capacity"


def gpus(n: int) -> str:
    """``n`` GPUs in words: "1 GPU", "1,024 GPUs"."""
    return f"{n:,} GPU{'' if n == 1 else 's'}"


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
#: the costliest kernels and range paths, as revised (docs/definitions.md, "Kernel cost in the pipeline" and "Range
#: cost in the pipeline"), each (kind, title, what it sums, SQL over ``{spend}``): the view ``kernel_spend`` /
#: ``range_spend`` here, the same rows of the dates asked for in the HTML report (``views.spend_sql``); a range's
#: figures include the ranges inside it
COSTLIEST = (
    (
        "kernel",
        "Costliest kernels",
        "each team's kernel lines as revised; no_kernel left out",
        """SELECT team, category, kernel, calls, cost_micro_usd AS micro_usd,
       printf('%.2f', cost_micro_usd / 1e6) AS usd, round(busy_ns / 1e9, 1) AS busy_s,
       round(micro_usd_per_call, 1) AS micro_usd_per_call
FROM {spend} WHERE category <> 'no_kernel' ORDER BY cost_micro_usd DESC, team, kernel, category LIMIT 10""",
    ),
    (
        "range",
        "Costliest ranges",
        "the kernels launched in each, ranges inside it included",
        """SELECT team, array_to_string(from_json(range_path, '["VARCHAR"]'), ' > ') AS range, depth, calls,
       cost_micro_usd AS micro_usd, printf('%.2f', cost_micro_usd / 1e6) AS usd, round(busy_ns / 1e9, 1) AS busy_s
FROM {spend} ORDER BY cost_micro_usd DESC, team, range_path LIMIT 10""",
    ),
)
#: per GPU model and EFU source (never two sources in one figure), over the whole run; n/a below the minimum of work
_UNIT_COST = f"""
SELECT gpu_model, coalesce(efu_source, 'none') AS efu_source, round(sum(gpu_hours), 1) AS gpu_hours,
       round(sum(effective_tflop_hours), 1) AS eff_tflop_hours,
       coalesce(printf('%.4f', {
    unit_cost_sql("efu_source", "sum(cost_micro_usd)", "sum(opex_usd)", "sum(effective_tflop_hours)")
}), 'n/a') AS usd_per_eff_tflop_hour
FROM unit_cost GROUP BY gpu_model, efu_source ORDER BY gpu_model, efu_source NULLS LAST"""
_SHARE = share_sql("gpu_model")
#: what the triggers put at stake, per tier and over all tiers ('all tiers'): each GPU counted once, at its price at
#: its latest trigger (a trigger of an unpriced GPU frees nothing known), and the union of the idle runs up to their
#: triggers per GPU (two tenants idle on one GPU at once hold one GPU-hour, not two); a partition at its share of
#: its device's price and GPU-hours (docs/definitions.md, "Partitions")
RECLAIMS = f"""
WITH x AS (SELECT *, usd_per_gpu_hour * {_SHARE[0]} / {_SHARE[1]} AS usd, {_SHARE[0]} / {_SHARE[1]} AS share
           FROM reclaim),
r AS (SELECT sla AS tier, gpu_uuid, run_start_ns AS s, trigger_ns AS e, usd, share FROM x
      UNION ALL SELECT 'all tiers', gpu_uuid, run_start_ns, trigger_ns, usd, share FROM x),
o AS (SELECT *, max(e) OVER (PARTITION BY tier, gpu_uuid ORDER BY s, e
                             ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reach FROM r),
i AS (SELECT *, sum(CASE WHEN reach >= s THEN 0 ELSE 1 END) OVER (PARTITION BY tier, gpu_uuid ORDER BY s, e
                                                                ROWS UNBOUNDED PRECEDING) AS island FROM o),
u AS (SELECT tier, sum((e - s) * share) AS ns
      FROM (SELECT tier, min(s) AS s, max(e) AS e, any_value(share) AS share FROM i GROUP BY tier, gpu_uuid, island)
      GROUP BY tier),
g AS (SELECT tier, gpu_uuid, count(*) AS triggers, arg_max(coalesce(usd, 0), e) AS usd FROM r GROUP BY ALL)
SELECT tier, sum(triggers) AS triggers, count(*) AS gpus, printf('%.2f', any_value(u.ns) / 3.6e12) AS idle_gpu_hours,
       CAST(sum(usd * 1000000) AS BIGINT) AS micro_usd_per_hour, printf('%.2f', sum(usd)) AS usd_per_hour
FROM g JOIN u USING (tier) GROUP BY tier
ORDER BY tier = 'all tiers', array_position(['Gold', 'Silver', 'Bronze'], tier), tier"""
#: what late data changed, per team: the adjustments of revised panes (revision > 0) against the bill as first published
_REVISIONS = """
SELECT team, count(DISTINCT (gpu_uuid, pane_start_ns)) AS panes_revised, count(*) AS records,
       sum(cost_micro_usd) AS adjustment_micro_usd,
       (SELECT sum(cost_micro_usd) FROM cost_as_first_published f WHERE f.team = c.team) AS first_published_micro_usd
FROM cost c WHERE revision > 0 GROUP BY team ORDER BY team"""
#: each GPU's breaker state after its latest window, for those not plainly in service: removed and probation leave
#: service discovery, observation (one failed window) stays in it
_OUT_OF_SERVICE = """
SELECT * FROM (
  SELECT gpu_uuid, arg_max(node_id, window_start_ns) AS node_id, arg_max(breaker_state, window_start_ns) AS state,
         -- the end of the GPU's last audit window, not the time it was said: a window closed at the end of the
         -- input (a short live run) ends later than the run did
         epoch_ms(max(window_end_ns) // 1000000) AS window_end_utc,
         arg_max(array_to_string(fail_reasons, ','), window_start_ns) AS last_fail_reasons
  FROM health GROUP BY gpu_uuid)
WHERE state <> 'in_service' ORDER BY array_position(['removed', 'observation', 'probation'], state), gpu_uuid"""

#: per GPU, the device faults of its audit windows (docs/definitions.md, "Health audit"): the windows a fatal one
#: failed, the faults summed, and the end of the last window with any; GPUs whose windows reported none left out
_FAULTS = """
SELECT gpu_uuid, arg_max(node_id, window_start_ns) AS node_id,
       count(*) FILTER (WHERE faults_fatal > 0) AS failed_windows,
       sum(faults_fatal) AS fatal, sum(faults_warning) AS warning,
       epoch_ms(max(window_end_ns) // 1000000) AS last_window_end_utc
FROM health WHERE faults_fatal > 0 OR faults_warning > 0
GROUP BY gpu_uuid ORDER BY fatal DESC, warning DESC, gpu_uuid"""
_FAULTS_REPORTED = "SELECT count(DISTINCT gpu_uuid) FROM health WHERE faults_fatal IS NOT NULL"
_ESTIMATED = "SELECT count(*), count(DISTINCT gpu_uuid) FROM health WHERE power_estimated_ms > 0"

#: the period the output covers: the event time of the first and last pane of its cost and idle records
_PERIOD = (
    "SELECT min(s), max(e) FROM (SELECT pane_start_ns AS s, pane_end_ns AS e FROM cost {where} "
    "UNION ALL SELECT pane_start_ns, pane_end_ns FROM idle_index {where})"
)


def period_covered(con: duckdb.DuckDBPyConnection, where: str = "") -> str:
    """The period covered, in event time (UTC, to the minute), or that there is none: a figure means little
    until it says over when (``where``: a date filter both views take)."""
    bounds = con.execute(_PERIOD.format(where=where)).fetchone()
    if bounds is None or bounds[0] is None:
        return "Period covered: none (no cost or idle index records)"
    start, end = (dt.datetime.fromtimestamp(ns // 10**9, dt.UTC).strftime("%Y-%m-%d %H:%M") for ns in bounds)
    return f"Period covered: {start} UTC to {end} UTC (event time of the first and last pane)"


def _table(con: duckdb.DuckDBPyConnection, sql: str, none: str) -> str:
    """``sql``'s result as a table, or ``none`` where it has no row: an empty table reads as a broken one."""
    res = con.execute(sql)
    rows = res.fetchall()
    return format_table([d[0] for d in res.description], rows) if rows else none


def _service(con: duckdb.DuckDBPyConnection) -> str:
    """The GPUs out of service discovery (removed, probation) apart from those under observation, which stay in it:
    one count would call a warned GPU out of service."""
    res = con.execute(_OUT_OF_SERVICE)
    columns, rows = [d[0] for d in res.description], res.fetchall()
    out = [r for r in rows if r[2] in OUT_OF_SERVICE]
    watched = [r for r in rows if r[2] not in OUT_OF_SERVICE]
    text = (
        f"\nGPUs out of service ({len(out)}; removed or in probation, left out of service discovery):\n"
        + format_table(columns, out)
        if out
        else "\nNo GPU is out of service (none removed or in probation)."
    )
    if watched:
        text += (
            f"\n\nGPUs under observation ({len(watched)}; failed their last audit, still in service):\n"
            + format_table(columns, watched)
        )
    return text


def device_faults(con: duckdb.DuckDBPyConnection) -> str | None:
    """The device faults per GPU, or that there were none among the GPUs whose tools report them (a GPU whose
    tool reports no fault field is not a GPU without faults: with none reporting, nothing is said)."""
    (reporting,) = con.execute(_FAULTS_REPORTED).fetchone() or (0,)
    if not reporting:
        return None
    res = con.execute(_FAULTS)
    rows = res.fetchall()
    if not rows:
        return f"\nDevice faults: none in the audit windows of the {gpus(reporting)} whose samples report them."
    return (
        f"\nDevice faults by GPU ({len(rows):,} of the {gpus(reporting)} whose samples report them; a fatal fault "
        "fails its audit window):\n" + format_table([d[0] for d in res.description], rows)
    )


def summary(out_dir: Path, stats: RunStats, opex_usd_per_gpu_hour: Decimal = Decimal(0)) -> str:
    con = connect(out_dir, opex_usd_per_gpu_hour)
    parts = []
    here = stats.inputs - stats.resumed_inputs  # what this run read, in the seconds it ran
    rate = here / stats.seconds if stats.seconds else 0.0
    before = f" ({stats.resumed_inputs:,} of them before a restart)" if stats.resumed_inputs else ""
    parts.append(
        f"processed {stats.inputs:,} inputs{before} in {stats.seconds:.1f} s ({rate:,.0f}/s); "
        + ", ".join(f"{k}: {v:,}" for k, v in sorted(stats.rows.items()))
        + (" rows written by this run" if stats.resumed_inputs else " rows written")
    )
    parts.append(period_covered(con))
    parts.append(
        "\nGPUs with the highest 72 h idle index (share of their last 72 h of samples below the idle "
        "threshold):\n" + _table(con, _MOST_IDLE, "no idle index records")
    )
    parts.append(f"\nCost by team over the run ({IDLE_WORDS}):\n" + _table(con, _BY_TEAM, "no cost records"))
    for section in (allocation_gap(con), by_label(con)):
        if section is not None:
            parts.append(f"\n{section[0]}:\n" + format_table(section[1], section[2]))
    res = con.execute(_GRADES)
    graded = res.fetchall()
    if graded:
        parts.append(
            "\nHealth audit windows (one per GPU and audit hour) by grade:\n"
            + format_table([d[0] for d in res.description], graded)
        )
        windows, gpus = con.execute(_ESTIMATED).fetchone() or (0, 0)
        if windows:  # docs/definitions.md, "Health audit": power_estimated_ms
            parts.append(
                f"({windows:,} of these windows, on {gpus:,} GPU(s), were judged on power estimated from the platform "
                "table's TDP, their devices reporting none: their kW/TOPS and grades are estimates; the health "
                "records' power_estimated_ms says how much of each window)"
            )
        parts.append(_service(con))
        if faults := device_faults(con):
            parts.append(faults)
    res = con.execute(RECLAIMS)
    triggers = res.fetchall()
    if triggers:
        parts.append(
            "\nReclaim triggers by SLA tier (tenants idle on a GPU for the tier's duration; each GPU counted "
            "once: idle GPU-hours are the union of its idle runs, $ at stake per hour its price):\n"
            + format_table([d[0] for d in res.description], triggers)
        )
    res = con.execute(_REVISIONS)
    revised = res.fetchall()
    if revised:
        late = ", ".join(
            f"{k.split(':', 1)[1]}: {v:,}" for k, v in sorted(stats.counts.items()) if k.startswith("revised_by_late:")
        )
        parts.append(
            f"\nRevisions: late events and bindings within the horizon adjusted the bill ({late}):\n"
            + format_table([d[0] for d in res.description], revised)
        )
    for kind, title, what, sql in COSTLIEST:
        res = con.execute(sql.format(spend=f"{kind}_spend"))
        top = res.fetchall()
        if top:
            parts.append(f"\n{title} over the run ({what}):\n" + format_table([d[0] for d in res.description], top))
    res = con.execute(_UNIT_COST)
    units = res.fetchall()
    if units:
        parts.append(
            f"\nUnit cost by GPU model and EFU source (billed µ$ + opex {opex_usd_per_gpu_hour} USD/GPU-h, "
            "over effective TFLOP-hours: EFU × peak × hours; n/a with no EFU or under "
            f"{MIN_EFFECTIVE_TFLOP_HOURS} effective TFLOP-hour):\n"
            + format_table([d[0] for d in res.description], units)
        )
    (unpriced,) = con.execute("SELECT count(DISTINCT (gpu_uuid, pane_start_ns)) FROM cost WHERE unpriced").fetchone()
    if unpriced:
        parts.append(
            f"\n{unpriced:,} GPU-panes had no price (model and its platform row unpriced, no 'default'): billed 0 µ$"
        )
    if stats.counts.get("unbilled"):
        parts.append(
            f"{stats.counts['unbilled']:,} process/NUMA events fell in panes without a GPU sample "
            "(no covered time to bill)"
        )
    if stats.counts.get("unbilled_kernels"):
        parts.append(
            f"{stats.counts['unbilled_kernels']:,} kernels started in panes never billed (without a GPU sample), or "
            "are of GPUs that sent none: billed to no one (a kernel's gpu_uuid must be the samples' NVML UUID: "
            "install pynvml where the collector runs)"
        )
    if stats.counts.get("binding_past_horizon"):
        parts.append(
            f"{stats.counts['binding_past_horizon']:,} bindings started more than the revision horizon "
            "back: panes they cover beyond it, if any, stay as billed (raise --revision-horizon-s)"
        )
    if stats.counts.get("silent_closes"):
        parts.append(
            f"{stats.counts['silent_closes']:,} panes of GPUs gone silent closed before the end of the "
            f"input; {gpus(stats.counts.get('forgotten_gpus', 0))} gone for good forgotten"
        )
    if stats.counts.get("mae_silent_closes"):
        parts.append(
            f"{stats.counts['mae_silent_closes']:,} MAE windows of processes gone silent published "
            "partial before the end of the input"
        )
    dead = sum(stats.dead_letters.values())
    detail = ", ".join(f"{r}: {n:,}" for r, n in sorted(stats.dead_letters.items()))
    parts.append(f"\ndead letters: {dead:,}" + (f" ({detail}); see the dlq view" if dead else ""))
    return "\n".join(parts)
