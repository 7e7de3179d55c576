"""The output as one self-contained HTML page of plots: what an analyst looks at before writing SQL.

Why Plotly: one well-kept library whose figures serialise to JSON and render in the browser from
one script, which the page carries inline (``include_plotlyjs=True``: nothing is fetched at view
time); Vega-Altair needs its three scripts from a CDN or a separate converter to inline them.
Every figure is aggregated in DuckDB first (per hour, per GPU-day, per process), so the page
carries only what its marks show, whatever the size of the Parquet behind it.
"""

from __future__ import annotations

import datetime as dt
import html
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import plotly.graph_objects as go

from gpucost.report import COSTLIEST, IDLE_WORDS, period_covered
from gpucost.schemas.records import GRADES
from gpucost.sinks.views import connect, spend_sql

__all__ = ["PLOTS", "Plot", "build_report", "team_table_sql"]

_BREAKER_STATES = ("in_service", "probation", "observation", "removed")


@dataclass(frozen=True)
class Plot:
    """One figure: its element id, title, what it shows, its query (``{where}``: the date filter), how its
    rows become traces, its axes' titles with their units (a bar of 0.4 means nothing until it says USD or %),
    and what the page says instead of an empty plot."""

    id: str
    title: str
    about: str
    sql: str
    figure: Callable[[list[tuple[Any, ...]]], go.Figure]
    x_title: str
    y_title: str
    empty: str


def _plotly_text(value: Any) -> Any:
    """``value`` as Plotly shows it literally: a string with ``&``, ``<`` and ``>`` as entities, anything else as it is.

    Why: Plotly reads the text of a figure (trace names, categories and their ticks, hover text, titles)
    as its own small HTML: a team named ``<a href="https://…">ads</a>`` would be a live link in the
    legend, ``<b>x</b>`` bold, ``<br>`` a line break. It turns ``&lt;``, ``&gt;`` and ``&amp;`` back into
    the characters, so escaped they show as written. Every value a query gives passes through here before it
    reaches a figure (``build_report``): each name from input, whatever figure and field it lands in.
    """
    return html.escape(value, quote=False) if isinstance(value, str) else value


def _stacked(rows: list[tuple[Any, ...]]) -> go.Figure:
    """Rows (t, series, value): one bar trace per series, stacked."""
    fig = go.Figure()
    for name in sorted({r[1] for r in rows}):
        mine = [r for r in rows if r[1] == name]
        fig.add_trace(go.Bar(x=[r[0] for r in mine], y=[r[2] for r in mine], name=str(name)))
    fig.update_layout(barmode="stack")
    return fig


def _grouped(rows: list[tuple[Any, ...]]) -> go.Figure:
    """Rows ``(x, series, y)`` as bars side by side, one colour per series."""
    fig = _stacked(rows)
    fig.update_layout(barmode="group")
    return fig


def _line(rows: list[tuple[Any, ...]]) -> go.Figure:
    return go.Figure([go.Scatter(x=[r[0] for r in rows], y=[r[1] for r in rows], mode="lines", name="idle share")])


def _bars(rows: list[tuple[Any, ...]]) -> go.Figure:
    return go.Figure([go.Bar(x=[str(r[0]) for r in rows], y=[r[1] for r in rows])])


def _heatmap(rows: list[tuple[Any, ...]]) -> go.Figure:
    """Rows (gpu, day, value): a GPU × day grid (a GPU-day without samples left blank)."""
    gpus, days = sorted({r[0] for r in rows}), sorted({r[1] for r in rows})
    cell = {(r[0], r[1]): r[2] for r in rows}
    z = [[cell.get((g, d)) for d in days] for g in gpus]
    fig = go.Figure(
        [
            go.Heatmap(
                x=[str(d) for d in days],
                y=gpus,
                z=z,
                zmin=0,
                zmax=100,
                colorscale="Viridis",
                colorbar={"title": "idle time (%)"},
            )
        ]
        if rows
        else []
    )
    fig.update_xaxes(type="category")  # days, not a time axis: one day would be spread over fractions of a second
    return fig


def _scatter(rows: list[tuple[Any, ...]]) -> go.Figure:
    return go.Figure(
        [
            go.Scatter(
                x=[r[1] for r in rows],
                y=[r[2] for r in rows],
                mode="markers",
                text=[str(r[0]) for r in rows],
                name="processes",
            )
        ]
        if rows
        else []
    )


#: the page's figures, in order; each query reads one view, filtered by ``{where}``
PLOTS = (
    Plot(
        "cost-by-team",
        "Cost by team, per hour (USD)",
        f"Each team's µ$ summed per hour of pane start, stacked; {IDLE_WORDS}.",
        "SELECT date_trunc('hour', make_timestamp(pane_start_ns // 1000)) AS t, team, sum(cost_micro_usd) / 1e6 "
        "FROM cost {where} GROUP BY ALL ORDER BY t, team",
        _stacked,
        "hour (UTC)",
        "cost (USD)",
        "no cost records",
    ),
    Plot(
        "held-against-used",
        "Held against used by team, on the GPUs with allocations (USD)",
        "Per team, what it held (the allocation basis: its holds' share of each pane's cost) beside what it used "
        "(the usage basis, over the same panes): held and not used is reserved idle, what a reclaim saves.",
        "SELECT team, what, usd FROM (SELECT team, 'held' AS what, sum(cost_micro_usd) / 1e6 AS usd "
        "FROM allocation {where} GROUP BY ALL UNION ALL SELECT team, 'used', sum(cost_micro_usd) / 1e6 "
        "FROM (SELECT * FROM cost {where}) SEMI JOIN (SELECT DISTINCT gpu_uuid, pane_start_ns FROM allocation) "
        "USING (gpu_uuid, pane_start_ns) GROUP BY ALL) ORDER BY team, what",
        _grouped,
        "team",
        "cost (USD)",
        "no allocation records (no GPU with allocations)",
    ),
    Plot(
        "idle-share",
        "Idle share of the cost, per hour (%)",
        "The idle party's µ$ over all µ$ of the hour: the share of the bill that was unused capacity.",
        "SELECT date_trunc('hour', make_timestamp(pane_start_ns // 1000)) AS t, "
        "100.0 * sum(cost_micro_usd) FILTER (WHERE team = 'idle') / nullif(sum(cost_micro_usd), 0) "
        "FROM cost {where} GROUP BY ALL HAVING sum(cost_micro_usd) > 0 ORDER BY t",
        _line,
        "hour (UTC)",
        "idle share of the cost (%)",
        "no cost records",
    ),
    Plot(
        "idle-heatmap",
        "Idle time per GPU and day (%)",
        "Each GPU-day's idle ms over its covered ms (a GPU sample "
        "below the idle threshold is idle); blank where the GPU reported nothing.",
        "SELECT gpu_uuid, date, 100.0 * sum(idle_ms) / sum(covered_ms) FROM idle_index {where} GROUP BY ALL "
        "ORDER BY ALL",
        _heatmap,
        "day (UTC)",
        "GPU",
        "no idle index records",
    ),
    Plot(
        "most-idle",
        "The ten most idle GPUs (72 h idle index, latest, %)",
        "Each GPU's idle index at its latest pane: the share of its last 72 h of samples below the idle threshold.",
        "SELECT gpu_uuid, 100 * arg_max(idle_index_72h, pane_end_ns) AS idle FROM idle_index {where} GROUP BY ALL "
        "ORDER BY idle DESC, gpu_uuid LIMIT 10",
        _bars,
        "GPU",
        "72 h idle index (%)",
        "no idle index records",
    ),
    Plot(
        "health-grades",
        "Health audit windows by grade",
        "Audit windows (one per GPU and audit hour) per grade.",
        f"SELECT grade, count(*) FROM health {{where}} GROUP BY grade ORDER BY array_position({list(GRADES)}, grade)",
        _bars,
        "grade",
        "audit windows",
        "no health audit windows",
    ),
    Plot(
        "breaker-states",
        "GPUs by breaker state (latest)",
        "Each GPU's breaker state after its latest window; "
        "removed and probation GPUs leave service discovery, observation GPUs stay in it.",
        "SELECT state, count(*) FROM (SELECT gpu_uuid, arg_max(breaker_state, window_start_ns) AS state FROM health "
        f"{{where}} GROUP BY ALL) GROUP BY state ORDER BY array_position({list(_BREAKER_STATES)}, state)",
        _bars,
        "breaker state",
        "GPUs",
        "no health audit windows",
    ),
    Plot(
        "device-faults",
        "Device faults per GPU, summed over its audit windows",
        "Per GPU, the device faults its samples reported (ECC, XID, retired or remapped memory, link and PCIe "
        "errors…), fatal and warning apart: a fatal fault fails its audit window, and the breaker acts on it. "
        "GPUs without faults, and those whose tools report none, are not drawn.",
        "SELECT gpu_uuid, severity, n FROM (SELECT gpu_uuid, 'fatal' AS severity, sum(faults_fatal) AS n "
        "FROM health {where} GROUP BY ALL UNION ALL SELECT gpu_uuid, 'warning', sum(faults_warning) "
        "FROM health {where} GROUP BY ALL) WHERE n > 0 ORDER BY severity, gpu_uuid",
        _grouped,
        "GPU",
        "device faults",
        "no device faults (or no GPU whose samples report them)",
    ),
    Plot(
        "reclaims",
        "Reclaim triggers by SLA tier",
        "Idle runs that reached their tier's duration.",
        "SELECT sla, count(*) FROM reclaim {where} GROUP BY sla "
        "ORDER BY array_position(['Gold', 'Silver', 'Bronze'], sla), sla",
        _bars,
        "SLA tier",
        "reclaim triggers",
        "no reclaim triggers",
    ),
    Plot(
        "mae",
        "Memory-access entropy per process, with the L2 estimate",
        "One point per process: its mean MAE "
        "(bits) over its windows against the mean L2 evictions per 1,000 accesses estimated from it.",
        "SELECT node_id || '/' || pid, avg(mae_bits), avg(l2_evictions_per_1k_est) FROM mae {where} "
        "GROUP BY ALL ORDER BY ALL",
        _scatter,
        "mean MAE (bits)",
        "L2 evictions per 1,000 accesses (estimate)",
        "no memory-access windows",
    ),
    Plot(
        "dead-letters",
        "Dead letters by reason",
        "Inputs refused, by reason (see the dlq view).",
        "SELECT reason, count(*) FROM dlq {where} GROUP BY reason ORDER BY count(*) DESC, reason",
        _bars,
        "reason",
        "inputs refused",
        "no dead letters",
    ),
)


def _table(res: duckdb.DuckDBPyConnection, table_id: str) -> tuple[str, int]:
    """A query's rows as an HTML table with its column names for a head, every cell escaped, and how many rows."""
    rows = res.fetchall()
    head = "".join(f"<th>{html.escape(d[0])}</th>" for d in res.description)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row) + "</tr>" for row in rows)
    return f'<table id="{table_id}"><tr>{head}</tr>{body}</table>', len(rows)


def team_table_sql(where: str) -> str:
    """The figures behind the cost plots, per team: µ$, USD, share of the total, and panes."""
    return (
        "SELECT team, sum(cost_micro_usd) AS micro_usd, count(*) AS records, "
        "round(100.0 * sum(cost_micro_usd) / nullif(sum(sum(cost_micro_usd)) OVER (), 0), 2) AS share_pct "
        f"FROM cost {where} GROUP BY team ORDER BY micro_usd DESC, team"
    )


def _where(kind: str, since: dt.date | None, until: dt.date | None) -> str:
    """The date filter of a view (``dlq``'s date is text: unknown for lines without a valid time)."""
    date = "TRY_CAST(date AS DATE)" if kind == "dlq" else "date"
    terms = ([f"{date} >= DATE '{since.isoformat()}'"] if since else []) + (
        [f"{date} <= DATE '{until.isoformat()}'"] if until else []
    )
    return f"WHERE {' AND '.join(terms)}" if terms else ""


def _kind(sql: str) -> str:
    return sql.split(" FROM ", 1)[1].split()[0]


def build_report(out_dir: Path, since: dt.date | None = None, until: dt.date | None = None) -> str:
    """The page: every figure of ``PLOTS`` and the team table, over ``out_dir``'s views between the dates."""
    con = connect(out_dir)
    con.execute("SET enable_progress_bar = false")  # its bar on stderr would interleave with the command's output
    parts: list[str] = []
    script = False
    for plot in PLOTS:
        rows = [
            tuple(map(_plotly_text, r))
            for r in con.execute(plot.sql.format(where=_where(_kind(plot.sql), since, until))).fetchall()
        ]
        if not rows:  # an empty plot looks like a broken one: say what there is none of
            parts.append(
                f'<section id="{plot.id}"><h2>{html.escape(plot.title)}</h2>'
                f'<p class="empty">{html.escape(plot.empty)}</p></section>'
            )
            continue
        fig = plot.figure(rows)
        fig.update_layout(
            title=plot.title,
            height=420 if plot.id != "idle-heatmap" else max(420, 18 * len({r[0] for r in rows}) + 160),
            margin={"t": 60},
            xaxis_title=plot.x_title,
            yaxis_title=plot.y_title,
        )
        parts.append(
            f"<section><p>{html.escape(plot.about)}</p>"
            + fig.to_html(
                full_html=False,
                include_plotlyjs=not script,
                div_id=plot.id,
                config={"displaylogo": False, "responsive": True},
            )
            + "</section>"
        )
        script = True  # the first figure drawn carries the script, whichever it is
    span = " to ".join(d.isoformat() for d in (since, until) if d) or "all dates"
    teams, _ = _table(con.execute(team_table_sql(_where("cost", since, until))), "teams")
    for kind, title, what, sql in COSTLIEST:  # the summary's tables, over the dates asked for
        res = con.execute(sql.format(spend=f"({spend_sql(kind, _where(f'{kind}_cost', since, until))})"))
        table, rows = _table(res, f"costliest-{kind}s-table")
        shown = (
            f"<p>{html.escape(what)}; the ten costliest lines, {span}.</p>{table}"
            if rows
            else f'<p class="empty">no {kind} cost lines in this period: kernels reach the bill as kernel_activity '
            "events (docs/collecting.md)</p>"
        )
        parts.append(f'<section id="costliest-{kind}s"><h2>{html.escape(title)}</h2>{shown}</section>')
    period = period_covered(con, _where("cost", since, until))
    return (
        f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>gpucost report</title><style>'
        "body{font-family:sans-serif;margin:2em;max-width:1200px}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right;overflow-wrap:anywhere}"
        "td:first-child{text-align:left}</style>"
        f"</head><body><h1>gpucost report</h1><p>{html.escape(str(out_dir))}, {span}</p>"
        f'<p id="period">{period}</p>' + "".join(parts) + f"<section><h2>Cost by team</h2>{teams}</section>"
        "</body></html>"
    )
