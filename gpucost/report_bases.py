"""The report's sections on the two bases and the labels: what each team held against what it used, and cost by
each label the tenants carry (docs/definitions.md, "Allocation basis" and "Labels").

Both end in rows that reconcile, so a reader can check the table against the bill: the held-against-used table's
``total`` row is the cost of the panes on the allocation basis on either side, and each label's values, with the
cost of the tenants without that label, add up to the whole bill.
"""

from __future__ import annotations

from typing import Any

import duckdb

__all__ = ["Section", "allocation_gap", "by_label"]

#: a section of the report: its heading, its columns and its rows (``gpucost.report`` lays it out)
Section = tuple[str, list[str], list[tuple[Any, ...]]]

#: per team, held against used, over the panes on the allocation basis (the ``allocation_gap`` view, its tenants of a
#: team netted per pane first: a team's hold under one key and its use under another, an SLA or a label apart, is
#: neither reserved idle nor borrowed at the team's level); then the
#: capacity no one held (``unallocated``), what the usage basis gave no tenant there (``idle``, ``unattributed``), and
#: the total of each side, which is the same µ$: the cost of those panes
_GAP = """
WITH panes AS (SELECT DISTINCT gpu_uuid, pane_start_ns FROM allocation),
by_team AS (SELECT team, sum(allocated_micro_usd) AS a, sum(used_micro_usd) AS u FROM allocation_gap
            GROUP BY gpu_uuid, pane_start_ns, team),
teams AS (SELECT team, sum(a) AS a, sum(u) AS u, sum(greatest(a - u, 0)) AS r, sum(greatest(u - a, 0)) AS b, 0 AS o
          FROM by_team GROUP BY team),
own AS (SELECT 'unallocated' AS team, sum(cost_micro_usd) AS a, NULL AS u, NULL AS r, NULL AS b, 1 AS o
        FROM allocation WHERE tenant_key = 'unallocated'
        UNION ALL
        SELECT 'idle and unattributed', NULL, sum(cost_micro_usd), NULL, NULL, 2
        FROM cost JOIN panes USING (gpu_uuid, pane_start_ns) WHERE team IN ('idle', 'unattributed')),
total AS (SELECT 'total' AS team, (SELECT sum(cost_micro_usd) FROM allocation) AS a,
                 (SELECT sum(cost_micro_usd) FROM cost JOIN panes USING (gpu_uuid, pane_start_ns)) AS u,
                 NULL AS r, NULL AS b, 3 AS o)
SELECT team, coalesce(printf('%.2f', a / 1e6), '') AS allocated_usd, coalesce(printf('%.2f', u / 1e6), '') AS used_usd,
       coalesce(printf('%.2f', r / 1e6), '') AS reserved_idle_usd, coalesce(printf('%.2f', b / 1e6), '') AS borrowed_usd
FROM (SELECT * FROM teams UNION ALL SELECT * FROM own UNION ALL SELECT * FROM total)
ORDER BY o, r DESC, team"""

#: per label key, its values' µ$ on the usage basis (the ``cost_by_label`` view), the top ``{top}`` by µ$ and the rest
#: as one row; then what the tenants without the label cost, so that each key's rows add up to the bill
_BY_LABEL = """
WITH v AS (SELECT label_key, label_value, sum(cost_micro_usd) AS m FROM cost_by_label WHERE cost_basis = 'usage'
           GROUP BY ALL),
r AS (SELECT *, row_number() OVER (PARTITION BY label_key ORDER BY m DESC, label_value) AS n FROM v),
shown AS (SELECT label_key, CASE WHEN n <= {top} THEN label_value ELSE '(other values)' END AS label_value,
                 sum(m) AS m, min(n) AS n FROM r GROUP BY ALL),
bill AS (SELECT sum(cost_micro_usd) AS m FROM cost),
without AS (SELECT k.label_key, '(without this label)' AS label_value, bill.m - sum(v.m) AS m, {top} + 2 AS n
            FROM (SELECT DISTINCT label_key FROM v) k JOIN v USING (label_key), bill GROUP BY k.label_key, bill.m)
SELECT label_key, label_value, m AS micro_usd, printf('%.2f', m / 1e6) AS usd,
       printf('%.1f%%', 100.0 * m / nullif((SELECT m FROM bill), 0)) AS share
FROM (SELECT * FROM shown UNION ALL SELECT * FROM without) ORDER BY label_key, n"""


def allocation_gap(con: duckdb.DuckDBPyConnection) -> Section | None:
    """The held-against-used section, or None where no GPU has allocations."""
    res = con.execute(_GAP)
    rows = res.fetchall()
    if not rows or rows[-1][1] == "":  # no allocation record: the total has no allocated side
        return None
    return (
        "Allocated against used by team, on the GPUs with allocations (reserved idle: held and not used, what a "
        "reclaim saves; borrowed: used beyond what was held; both totals are those panes' cost)",
        [d[0] for d in res.description],
        rows,
    )


def by_label(con: duckdb.DuckDBPyConnection, top: int = 10) -> Section | None:
    """Cost by label, or None where no tenant carries labels."""
    res = con.execute(_BY_LABEL.format(top=int(top)))
    rows = res.fetchall()
    if not rows:
        return None
    return (
        f"Cost by label over the run, usage basis (the {top} values costing most of each label, the rest as one row, "
        "and the parties without it, idle included; labels: docs/definitions.md, 'Labels')",
        [d[0] for d in res.description],
        rows,
    )
