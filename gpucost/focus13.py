"""The cost records as a FinOps FOCUS 1.3 Cost and Usage dataset, with split cost allocation (docs/analysts.md,
"FOCUS export").

FOCUS 1.3's data generator-calculated split cost allocation takes an *origin charge* and splits it into
*allocated charges* from which the origin can be derived (FOCUS_Spec, attributes/
data_generator_calculated_split_cost_allocation_handling.md). Here the origin charge is one GPU pane's cost ``C``
(per revision: a revision's origin is the adjustment ``C_new − C_old``) and its allocated charges are the pane's
cost records, one per party, ``idle`` (the unused capacity) included. The rows are the allocated charges alone:
the origin is the sum of its allocated rows (same ResourceId, ChargePeriodStart and ``x_Revision``), so the
dataset's costs still add up to what the panes cost, once.

What the requirements model asks of each row (specification/requirements_model/model_rules/attributes/
datageneratorcalculatedsplitcostallocationhandling.json), and how it is met:

- A-003-M: allocated rows sum to the origin in every summable metric: the µ$ are the records' own, which the split
  made add up to ``C`` (largest remainder); the quantities are the origin's hours by construction.
- A-004-M: every dimension and unit price of an allocated row is the origin's: the row says the GPU, the pane, the
  price; ChargeDescription no longer names the party, and SubAccount and Tags (the tenant, in 1.2) are null.
  The party is in AllocatedResourceId/Name/Tags, which are the columns made for it.
- The allocation basis (``basis="allocation"``) reads the ``allocation`` records instead (docs/definitions.md,
  "Allocation basis"): method ``gpucost-allocation``, ``unallocated`` the unallocated portion as ``idle`` is on the
  usage basis. One basis a file, so its BilledCost adds up to what the panes cost, once.
- ``idle`` is the unallocated portion (A-009-O allows it as its own row): AllocatedResourceId, AllocatedResourceName
  and AllocatedTags are null on it (CAU-AllocatedResourceId-C-005-C).
- AllocatedMethodDetails: ``{"Elements": [{"AllocatedRatio", "UsageUnit", "UsageQuantity", x_…}], x_…}``; the
  ratios of an origin's rows sum to exactly 1: each is the row's µ$ over the origin's (GPU-hours over the origin's
  when the origin is 0 µ$), in 10^-12 units split by largest remainder; null when both are 0 (a revision that only
  moved µ$ between parties), which the column allows (SHOULD NOT be null).
"""

from __future__ import annotations

from decimal import Decimal

import duckdb

from gpucost.focus_rows import MONTH, TAGS_JSON, USD, allocation_month_rows, month_rows
from gpucost.sinks.views import sql_string

__all__ = ["BASES", "METHOD", "RATIO_UNITS", "check_weights", "focus13_sql"]

#: AllocatedMethodId of each basis: the usage split (docs/definitions.md, "Cost split") and the allocation split
#: ("Allocation basis"); a file holds one basis, so its BilledCost adds up to what the panes cost, once
METHOD = {"usage": "gpucost-usage", "allocation": "gpucost-allocation"}
BASES = tuple(METHOD)
#: AllocatedRatio's resolution: ratios are whole multiples of 1 / RATIO_UNITS
RATIO_UNITS = 10**12
#: a record's float weight against α·t + β·b + γ·l of the weights given: further apart, they are other weights
_WEIGHT_TOLERANCE = 1e-9


def check_weights(con: duckdb.DuckDBPyConnection, month: str, alpha: Decimal, beta: Decimal, gamma: Decimal) -> None:
    """Raise ValueError unless every tenant record of ``month`` has the weight α·t + β·b + γ·l of these weights: the
    records do not carry α, β and γ, and AllocatedMethodDetails must name the ones the split was made with."""
    (off,) = con.execute(  # type: ignore[misc]
        """SELECT max(abs(weight - (? * t_share + ? * b_share + ? * l_share))) FROM cost
            WHERE tenant_key <> 'idle' AND strftime(make_timestamp(pane_start_ns // 1000), '%Y-%m') = ?""",
        [float(alpha), float(beta), float(gamma), month],
    ).fetchone()
    if off is not None and off > _WEIGHT_TOLERANCE:
        raise ValueError(
            f"the cost records of {month} were split with other weights than alpha={alpha}, beta={beta}, "
            f"gamma={gamma} (a record's weight is {off:.3g} away); pass the --config or --alpha/--beta/--gamma "
            "they were billed with"
        )


def focus13_sql(
    month: str,
    provider: str,
    billing_account: str,
    iso_text: bool,
    weights: tuple[Decimal, Decimal, Decimal],
    invoice_id: str | None = None,
    basis: str = "usage",
) -> str:
    """The SELECT over the ``cost`` view (``basis`` usage) or the ``allocation`` view (allocation) giving ``month``'s
    FOCUS 1.3 rows (``iso_text``: times as ISO 8601 text). The unallocated portion is each basis's own party:
    ``idle`` on the usage basis, ``unallocated`` on the allocation basis."""
    if not MONTH.match(month):
        raise ValueError(f"month {month!r} is not YYYY-MM")
    if basis not in METHOD:
        raise ValueError(f"basis {basis!r}: choose one of {', '.join(BASES)}")

    def when(column: str) -> str:
        return f"strftime({column}, '%Y-%m-%dT%H:%M:%SZ')" if iso_text else column

    def dec(value: Decimal) -> str:
        return f"CAST({sql_string(str(value))} AS DECIMAL(38, 12))"

    alpha, beta, gamma = weights
    own = "'idle'" if basis == "usage" else "'unallocated'"
    rows = month_rows(month) if basis == "usage" else allocation_month_rows(month)
    element = (
        "'x_TimeShare', t_share, 'x_MemoryBandwidthShare', b_share, 'x_NumaShare', l_share, 'x_Weight', weight, "
        "'x_BusyFraction', busy_fraction"
        if basis == "usage"
        else "'x_AllocatedShare', allocated_share, 'x_AllocatedFraction', allocated_fraction, 'x_Sharing', sharing, "
        "'x_Holds', allocations"
    )
    split_by = (
        f"'x_Alpha', {dec(alpha)}, 'x_Beta', {dec(beta)}, 'x_Gamma', {dec(gamma)}, 'x_IdlePolicy', 'separate'"
        if basis == "usage"
        else "'x_Capacity', 'held fraction × held time; unallocated the rest'"
    )
    provider, account = sql_string(provider), sql_string(billing_account)
    invoice = "NULL::VARCHAR" if invoice_id is None else sql_string(invoice_id)
    origin = "PARTITION BY gpu_uuid, pane_start_ns, revision"
    units = RATIO_UNITS
    # each row's ratio numerator and the origin's denominator, as integers: µ$, else GPU-hours · 10^12
    return f"""
{rows},
h AS (
  SELECT *, CAST(gpu_hours * 1000000000000 AS HUGEINT) AS h_int,
         sum(cost_micro_usd) OVER ({origin}) AS o_cost
  FROM c),
n AS (
  SELECT *, CASE WHEN o_cost <> 0 THEN CAST(cost_micro_usd AS HUGEINT) ELSE h_int END AS num,
         CASE WHEN o_cost <> 0 THEN CAST(o_cost AS HUGEINT) ELSE sum(h_int) OVER ({origin}) END AS den
  FROM h),
q AS (
  SELECT *, CASE WHEN den = 0 THEN NULL WHEN a >= 0 THEN a // abs(den) ELSE -((-a + abs(den) - 1) // abs(den)) END
         AS fl
  FROM (SELECT *, num * sign(den) * {units} AS a FROM n)),
r AS (
  SELECT *, fl + CASE WHEN row_number() OVER ({origin} ORDER BY a - fl * abs(den) DESC, tenant_key)
                          <= {units} - sum(fl) OVER ({origin}) THEN 1 ELSE 0 END AS ratio_units
  FROM q)
SELECT
  {USD} AS BilledCost, {USD} AS EffectiveCost, {USD} AS ListCost, {USD} AS ContractedCost,
  'USD' AS BillingCurrency,
  {account} AS BillingAccountId, {account} AS BillingAccountName,
  {when("bs")} AS BillingPeriodStart, {when("bs + INTERVAL 1 MONTH")} AS BillingPeriodEnd,
  {when("ps")} AS ChargePeriodStart, {when("pe")} AS ChargePeriodEnd,
  CASE WHEN revision > 0 THEN 'Adjustment' ELSE 'Usage' END AS ChargeCategory, NULL::VARCHAR AS ChargeClass,
  'GPU time on ' || gpu_model AS ChargeDescription,
  'Usage-Based' AS ChargeFrequency,
  gpu_hours AS ConsumedQuantity, 'GPU-Hours' AS ConsumedUnit, gpu_hours AS PricingQuantity, 'GPU-Hours' AS PricingUnit,
  usd_per_gpu_hour AS ListUnitPrice, usd_per_gpu_hour AS ContractedUnitPrice, 'Standard' AS PricingCategory,
  {invoice} AS InvoiceId, {provider} AS InvoiceIssuerName,
  {provider} AS ProviderName, {provider} AS PublisherName,
  {provider} AS ServiceProviderName, {provider} AS HostProviderName,
  gpu_uuid AS ResourceId, node_id || '/' || gpu_uuid AS ResourceName, 'GPU' AS ResourceType,
  'Compute' AS ServiceCategory, 'Other (Compute)' AS ServiceSubcategory, 'GPU compute' AS ServiceName,
  gpu_model AS SkuId, NULL::VARCHAR AS SubAccountId, NULL::VARCHAR AS SubAccountName,
  NULL::VARCHAR AS Tags,
  {sql_string(METHOD[basis])} AS AllocatedMethodId,
  CASE WHEN ratio_units IS NOT NULL THEN json_object(
    'Elements', [json_object(
      'AllocatedRatio', CAST(CAST(ratio_units AS DECIMAL(38, 12)) * 0.000000000001 AS DECIMAL(38, 12)),
      'UsageUnit', 'GPU-Hours', 'UsageQuantity', gpu_hours, {element})],
    'x_Basis', {sql_string(basis)}, 'x_RatioOf', CASE WHEN o_cost <> 0 THEN 'BilledCost' ELSE 'ConsumedQuantity' END,
    {split_by}
  ) END AS AllocatedMethodDetails,
  CASE WHEN tenant_key <> {own} THEN tenant_key END AS AllocatedResourceId,
  CASE WHEN tenant_key <> {own} THEN team END AS AllocatedResourceName,
  CASE WHEN tenant_key <> {own} THEN {TAGS_JSON} END AS AllocatedTags,
  record_id AS x_RecordId, tenant_key AS x_TenantKey, revision AS x_Revision
FROM r ORDER BY ps, gpu_uuid, revision, tenant_key"""
