"""What FOCUS 1.2 (``gpucost.focus``) and 1.3 (``gpucost.focus13``) rows are made from: a month's cost records with
their pane, billing period and GPU-hours, and the exact dollars of their µ$."""

from __future__ import annotations

import re

from gpucost.schemas.partitions import share_sql
from gpucost.sinks.views import sql_string

__all__ = ["MONTH", "TAGS", "TAGS_JSON", "USD", "allocation_month_rows", "month_rows"]

#: a partition's share of its device: its covered hours are that share of GPU-hours (docs/definitions.md, "Partitions")
_SHARE = share_sql("gpu_model")

MONTH = re.compile(r"^(\d{4})-(0[1-9]|1[0-2])$")
#: the tenant fields a row's Tags carry
TAGS = ("team", "env", "app", "tier", "sla", "git_commit", "ci_pipeline_id")
_FIELDS = f"to_json(struct_pack({', '.join(f'{f} := {f}' for f in TAGS)}))"
_NOT_FIELDS = "'{" + ",".join(f'"{f}":null' for f in TAGS) + "}'"  # a merge patch taking the fields' keys out
#: a row's tags as a JSON object: the tenant's fields (null where unset), and its labels beside them
#: (docs/definitions.md, "Labels"); a label named as a tenant field gives way to the field
TAGS_JSON = (
    f"CASE WHEN labels IS NULL THEN {_FIELDS} "
    f"ELSE json_merge_patch({_FIELDS}, json_merge_patch(labels, {_NOT_FIELDS})) END"
)


#: a cost record's µ$ as dollars, exactly: µ$ · 10^-6 in a DECIMAL(38, 6)
USD = "CAST(CAST(cost_micro_usd AS DECIMAL(38, 6)) * 0.000001 AS DECIMAL(38, 6))"


def month_rows(month: str) -> str:
    """``WITH c0 AS (…), c AS (…)``: ``month``'s cost records with ``ps``/``pe`` (the pane), ``bs`` (its month) and
    ``gpu_hours`` (the party's GPU-hours: the pane's covered hours × its µ$ over the pane's, or in an unpriced pane
    its share of the split), exact in DECIMAL(38, 12)."""
    return f"""WITH c0 AS (
  SELECT *, make_timestamp(pane_start_ns // 1000) AS ps, make_timestamp(pane_end_ns // 1000) AS pe,
         sum(weight) FILTER (WHERE tenant_key <> 'idle') OVER (PARTITION BY gpu_uuid, pane_start_ns) AS w_all
  FROM cost WHERE strftime(make_timestamp(pane_start_ns // 1000), '%Y-%m') = {sql_string(month)}),
c AS (
  SELECT *, date_trunc('month', ps) AS bs,
         CAST(CAST(covered_ms AS DECIMAL(38, 12)) * {_SHARE[0]} / (3600000 * {_SHARE[1]}) * CASE
           WHEN pane_cost_micro_usd > 0 THEN CAST(cost_micro_usd AS DECIMAL(38, 12)) / pane_cost_micro_usd
           WHEN tenant_key = 'idle' THEN 1 - CAST(busy_fraction AS DECIMAL(38, 12))
           ELSE coalesce(CAST(busy_fraction * weight / nullif(w_all, 0) AS DECIMAL(38, 12)), 0) END
           AS DECIMAL(38, 12)) AS gpu_hours
  FROM c0)"""


def allocation_month_rows(month: str) -> str:
    """``month_rows`` of the allocation records (docs/definitions.md, "Allocation basis"): a party's GPU-hours are the
    pane's covered hours × its µ$ over the pane's, or in an unpriced pane its ``allocated_share``."""
    return f"""WITH c0 AS (
  SELECT *, make_timestamp(pane_start_ns // 1000) AS ps, make_timestamp(pane_end_ns // 1000) AS pe
  FROM allocation WHERE strftime(make_timestamp(pane_start_ns // 1000), '%Y-%m') = {sql_string(month)}),
c AS (
  SELECT *, date_trunc('month', ps) AS bs,
         CAST(CAST(covered_ms AS DECIMAL(38, 12)) * {_SHARE[0]} / (3600000 * {_SHARE[1]}) * CASE
           WHEN pane_cost_micro_usd > 0 THEN CAST(cost_micro_usd AS DECIMAL(38, 12)) / pane_cost_micro_usd
           ELSE CAST(allocated_share AS DECIMAL(38, 12)) END
           AS DECIMAL(38, 12)) AS gpu_hours
  FROM c0)"""
