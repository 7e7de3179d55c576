"""The cost records as a FinOps FOCUS 1.2 Cost and Usage dataset (docs/definitions.md, "Late data become
revisions" and "Readings of the contract": FOCUS export); FOCUS 1.3, with split cost allocation, is
``gpucost.focus13``; both are made from ``gpucost.focus_rows``.

One row per cost record of the month (per GPU, pane and tenant, idle rows included), written by
DuckDB from the ``cost`` view: no record passes through a float. Costs are the µ$ as decimals
(``DECIMAL(38, 6)``, exact); the quantities are the party's GPU-hours, its share of the pane's
covered time (its µ$ over the pane's, or for an unpriced pane its share of the split). The Parquet holds
every name as the records do; the CSV's text cells are made safe for a spreadsheet (``gpucost.csv_cells``).
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

from gpucost.csv_cells import copy_csv
from gpucost.focus13 import check_weights, focus13_sql
from gpucost.focus_rows import MONTH, TAGS_JSON, USD, month_rows
from gpucost.sinks.views import connect, sql_string

__all__ = ["FORMATS", "MONTH", "VERSIONS", "cost_months", "focus_sql", "export_focus"]

FORMATS = ("csv", "parquet")
#: the FOCUS versions written; 1.2 the default (docs/analysts.md, "FOCUS export")
VERSIONS = ("1.2", "1.3")


def focus_sql(month: str, provider: str, billing_account: str, iso_text: bool, invoice_id: str | None = None) -> str:
    """The SELECT over the ``cost`` view giving ``month``'s rows (``iso_text``: times as ISO 8601 text, for CSV).

    ``InvoiceId`` is ``invoice_id`` on every row, or null without one: FOCUS wants it null for a charge no
    invoice carries, and only the user knows whether this month's chargeback is invoiced (a made-up id once
    failed the validator's ``InvoiceId-C-004-C`` on every row)."""
    if not MONTH.match(month):
        raise ValueError(f"month {month!r} is not YYYY-MM")

    def when(column: str) -> str:
        return f"strftime({column}, '%Y-%m-%dT%H:%M:%SZ')" if iso_text else column

    usd = USD
    provider, account = sql_string(provider), sql_string(billing_account)
    invoice = "NULL::VARCHAR" if invoice_id is None else sql_string(invoice_id)
    return f"""
{month_rows(month)}
SELECT
  {usd} AS BilledCost, {usd} AS EffectiveCost, {usd} AS ListCost, {usd} AS ContractedCost,
  'USD' AS BillingCurrency,
  {account} AS BillingAccountId, {account} AS BillingAccountName,
  {when("bs")} AS BillingPeriodStart, {when("bs + INTERVAL 1 MONTH")} AS BillingPeriodEnd,
  {when("ps")} AS ChargePeriodStart, {when("pe")} AS ChargePeriodEnd,
  CASE WHEN revision > 0 THEN 'Adjustment' ELSE 'Usage' END AS ChargeCategory, NULL::VARCHAR AS ChargeClass,
  CASE WHEN tenant_key = 'idle' THEN 'Idle GPU time on ' ELSE 'GPU time on ' END || gpu_model AS ChargeDescription,
  'Usage-Based' AS ChargeFrequency,
  gpu_hours AS ConsumedQuantity, 'GPU-Hours' AS ConsumedUnit, gpu_hours AS PricingQuantity, 'GPU-Hours' AS PricingUnit,
  usd_per_gpu_hour AS ListUnitPrice, usd_per_gpu_hour AS ContractedUnitPrice, 'Standard' AS PricingCategory,
  {invoice} AS InvoiceId, {provider} AS InvoiceIssuerName,
  {provider} AS ProviderName, {provider} AS PublisherName,
  gpu_uuid AS ResourceId, node_id || '/' || gpu_uuid AS ResourceName, 'GPU' AS ResourceType,
  'Compute' AS ServiceCategory, 'Other (Compute)' AS ServiceSubcategory, 'GPU compute' AS ServiceName,
  gpu_model AS SkuId, team AS SubAccountId, team AS SubAccountName,
  {TAGS_JSON} AS Tags,
  record_id AS x_RecordId, tenant_key AS x_TenantKey
FROM c ORDER BY ps, gpu_uuid, tenant_key"""


def export_focus(
    out_dir: Path,
    month: str,
    dest: Path,
    fmt: str = "csv",
    provider: str = "gpucost",
    billing_account: str = "gpucost",
    invoice_id: str | None = None,
    version: str = "1.2",
    weights: tuple[Decimal, Decimal, Decimal] | None = None,
    basis: str = "usage",
) -> int:
    """Write ``month``'s cost records of ``out_dir`` as FOCUS ``version`` rows to ``dest``; the number of rows.
    FOCUS 1.3 (split cost allocation, ``gpucost.focus13``) needs the weights α, β, γ the records were split with;
    it alone writes the allocation basis (its records split by what tenants held), one basis a file."""
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r}: choose one of {', '.join(FORMATS)}")
    if version not in VERSIONS:
        raise ValueError(f"FOCUS version {version!r}: choose one of {', '.join(VERSIONS)}")
    if basis != "usage" and version == "1.2":
        raise ValueError(f"the {basis} basis is written as FOCUS 1.3 split cost allocation: pass --focus-version 1.3")
    con = connect(out_dir)
    if version == "1.2":
        sql = focus_sql(month, provider, billing_account, iso_text=fmt == "csv", invoice_id=invoice_id)
    else:
        if weights is None:
            raise ValueError("FOCUS 1.3 needs the weights alpha, beta, gamma the records were split with")
        if basis == "usage":
            check_weights(con, month, *weights)
        sql = focus13_sql(month, provider, billing_account, fmt == "csv", weights, invoice_id, basis)
    if fmt == "csv":  # names from input reach a spreadsheet as text, never as a formula (gpucost.csv_cells)
        return copy_csv(con, sql, dest)
    (rows,) = con.execute(f"COPY ({sql}) TO {sql_string(str(dest))} (FORMAT PARQUET, COMPRESSION zstd)").fetchone()  # type: ignore[misc]
    return int(rows)


def cost_months(out_dir: Path, table: str = "cost") -> list[str]:
    """The months (YYYY-MM, UTC) that hold records of ``table`` (``cost`` or ``allocation``) in ``out_dir``, in order:
    what an export of another month can be told to pick instead."""
    if table not in ("cost", "allocation"):
        raise ValueError(f"table {table!r}: cost or allocation")
    rows = (
        connect(out_dir)
        .execute(
            f"SELECT DISTINCT strftime(make_timestamp(pane_start_ns // 1000), '%Y-%m') AS m FROM {table} ORDER BY m"
        )
        .fetchall()
    )
    return [m for (m,) in rows]


def usage_only(out_dir: Path, month: str) -> tuple[int, int]:
    """The panes of ``month`` billed on the usage basis and absent from the allocation basis (before their device's
    first hold, or on a device that never had one), and their µ$: what an allocation-basis export leaves out."""
    (panes, micro_usd) = connect(out_dir).execute(
        """WITH m AS (SELECT * FROM cost WHERE strftime(make_timestamp(pane_start_ns // 1000), '%Y-%m') = ?)
            SELECT count(DISTINCT (gpu_uuid, pane_start_ns)), coalesce(sum(cost_micro_usd), 0)::BIGINT FROM m
            WHERE (gpu_uuid, pane_start_ns) NOT IN (SELECT (gpu_uuid, pane_start_ns) FROM allocation)""",
        [month],
    ).fetchone() or (0, 0)
    return int(panes), int(micro_usd)
