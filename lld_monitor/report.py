"""Self-contained HTML report of an analysed run: plotly panels, phases shaded, alerts marked.

The HTML inlines plotly.js (no CDN, no network), so the file opens anywhere, offline.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from lld_monitor import columns as C

#: (panel title, [(column, legend label)], log y axis, horizontal reference line or None)
PANELS: tuple[tuple[str, tuple[tuple[str, str], ...], bool, float | None], ...] = (
    ("Reward / accuracy", ((C.REWARD_MEAN, "reward mean"), (C.ACCURACY, "accuracy")), False, None),
    (
        "Log-prob under pi_old (per token)",
        ((C.LOGP_CORRECT, "logp correct"), (C.LOGP_INCORRECT, "logp incorrect")),
        False,
        None,
    ),
    (
        "Displacement Delta = new - old (summed)",
        ((C.DELTA_CORRECT, "Delta correct"), (C.DELTA_INCORRECT, "Delta incorrect")),
        False,
        0.0,
    ),
    (
        "Share of correct responses displaced",
        ((C.FRAC_CORRECT_DISPLACED, "share correct displaced"),),
        False,
        0.5,
    ),
    (
        "Grad norm (log scale)",
        ((C.GRAD_NORM, "grad norm"), (C.GRAD_NORM_MAX, "grad norm max")),
        True,
        None,
    ),
    ("Entropy", ((C.ENTROPY, "entropy"),), False, None),
    ("LLDS", ((C.LLDS_LOSS, "LLDS loss"), (C.LLDS_LAMBDA, "lambda")), False, None),
)

PHASE_COLORS: dict[str, str] = {
    "healthy": "rgba(46, 160, 67, 0.10)",
    "stagnation": "rgba(230, 190, 0, 0.20)",
    "decay": "rgba(240, 120, 0, 0.22)",
    "collapse": "rgba(215, 40, 40, 0.25)",
    "unknown": "rgba(140, 140, 140, 0.12)",
}
SEVERITY_COLORS: dict[str, str] = {"info": "#1f77b4", "warning": "#ff7f0e", "critical": "#d62728"}


def build_figure(df: pd.DataFrame, analysis: Any, title: str = "lld_monitor report") -> Any:
    """A plotly Figure: one panel per PANELS row over ``step``; ``analysis`` gives phases/alerts."""
    from plotly.subplots import make_subplots

    if C.STEP not in df.columns:
        raise ValueError(f"the table has no {C.STEP!r} column: load it with importers.load_table")
    steps = df[C.STEP]
    fig = make_subplots(
        rows=len(PANELS),
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.03,
        subplot_titles=[p[0] for p in PANELS],
    )
    for row, (_, series, log_y, ref) in enumerate(PANELS, start=1):
        present = [(col, label) for col, label in series if _has_values(df, col)]
        for col, label in present:
            fig.add_scatter(
                x=steps, y=df[col], mode="lines", name=label, legendgroup=str(row), row=row, col=1
            )
        if not present:
            fig.add_annotation(
                text="not logged: " + ", ".join(col for col, _ in series),
                showarrow=False,
                xref="x domain" if row == 1 else f"x{row} domain",
                yref="y domain" if row == 1 else f"y{row} domain",
                x=0.5,
                y=0.5,
                font={"color": "#888"},
            )
        if ref is not None and present:
            fig.add_hline(y=ref, line_dash="dash", line_color="#555", row=row, col=1)
        if log_y:
            fig.update_yaxes(type="log", row=row, col=1)
    for seg in getattr(analysis, "phases", []) or []:
        # closed step ranges: widen by half a step so that adjacent segments touch
        start, end = float(seg.start_step) - 0.5, float(seg.end_step) + 0.5
        fig.add_vrect(
            x0=start,
            x1=end,
            fillcolor=PHASE_COLORS.get(seg.phase, PHASE_COLORS["unknown"]),
            line_width=0,
            layer="below",
            row="all",
            exclude_empty_subplots=False,
            col=1,
        )
        fig.add_annotation(
            x=start,
            y=1.0,
            xref="x",
            yref="y domain",
            xanchor="left",
            yanchor="top",
            text=seg.phase,
            showarrow=False,
            font={"size": 10, "color": "#444"},
        )
    _add_alerts(fig, df, list(getattr(analysis, "alerts", []) or []))
    collapse = getattr(analysis, "collapse_step", None)
    if collapse is not None:
        fig.add_vline(
            x=float(collapse),
            line_color="#d62728",
            line_width=2,
            row="all",
            exclude_empty_subplots=False,
            col=1,
        )
    fig.update_layout(
        title=title,
        height=260 * len(PANELS),
        hovermode="x unified",
        template="plotly_white",
        margin={"t": 90},
    )
    fig.update_xaxes(title_text=C.STEP, row=len(PANELS), col=1)
    return fig


def _add_alerts(fig: Any, df: pd.DataFrame, alerts: Sequence[Any]) -> None:
    """Alerts as dotted vertical lines and hoverable markers on the reward panel."""
    if not alerts:
        return
    y_ref = _reward_like(df)
    for sev in SEVERITY_COLORS:
        chosen = [a for a in alerts if getattr(a, "severity", "info") == sev]
        if not chosen:
            continue
        xs = [float(a.step) for a in chosen]
        ys = [_value_at(df, y_ref, a.step) for a in chosen]
        texts = [
            html.escape(f"step {a.step}: {a.kind} ({a.severity})<br>{a.message}") for a in chosen
        ]
        fig.add_scatter(
            x=xs,
            y=ys,
            mode="markers",
            marker={"symbol": "triangle-down", "size": 12, "color": SEVERITY_COLORS[sev]},
            name=f"{sev} alerts",
            hovertext=texts,
            hoverinfo="text",
            row=1,
            col=1,
        )
        for x in xs:
            fig.add_vline(
                x=x,
                line_dash="dot",
                line_color=SEVERITY_COLORS[sev],
                line_width=1,
                row="all",
                exclude_empty_subplots=False,
                col=1,
            )


def write_report(
    df: pd.DataFrame, analysis: Any, out: str | Path, title: str = "lld_monitor report"
) -> Path:
    """Write one self-contained HTML file (plotly.js inlined) and return its path."""
    fig = build_figure(df, analysis, title=title)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    page = fig.to_html(include_plotlyjs=True, full_html=True, include_mathjax=False)
    page = page.replace("<body>", "<body>\n" + _summary_html(df, analysis), 1)
    out.write_text(page, encoding="utf-8")
    return out


def _summary_html(df: pd.DataFrame, analysis: Any) -> str:
    """A short HTML header: source, steps, collapse, signals, alerts list."""
    attrs = getattr(df, "attrs", {})
    lines = [
        f"<p>source: {html.escape(str(attrs.get('source_path', '?')))} "
        f"({html.escape(str(attrs.get('source_format', '?')))}), {len(df)} steps</p>",
        f"<p>collapse: {_collapse_text(getattr(analysis, 'collapse_step', None))}</p>",
        "<p>signals used: "
        + html.escape(", ".join(getattr(analysis, "signals_used", []) or []) or "none")
        + "<br>signals missing: "
        + html.escape(", ".join(getattr(analysis, "signals_missing", []) or []) or "none")
        + "</p>",
    ]
    alerts = list(getattr(analysis, "alerts", []) or [])
    if alerts:
        items = "".join(
            f"<li>step {a.step} [{html.escape(a.severity)}] {html.escape(a.kind)}: "
            f"{html.escape(a.message)}</li>"
            for a in alerts
        )
        lines.append(f"<ul>{items}</ul>")
    return '<div style="font-family: sans-serif; margin: 1em">' + "".join(lines) + "</div>"


def _collapse_text(step: int | None) -> str:
    """'step N', or 'none detected' (as the CLI summary says), never Python's 'None'."""
    return "none detected" if step is None else f"step {step}"


def _has_values(df: pd.DataFrame, col: str) -> bool:
    return col in df.columns and bool(df[col].notna().any())


def _reward_like(df: pd.DataFrame) -> str | None:
    for col in (C.REWARD_MEAN, C.ACCURACY):
        if _has_values(df, col):
            return col
    return None


def _value_at(df: pd.DataFrame, col: str | None, step: int) -> float:
    """The column's value at ``step`` (nearest logged step), 0 when unknown."""
    if col is None or df.empty:
        return 0.0
    idx = (df[C.STEP] - step).abs().idxmin()
    value = df.at[idx, col]
    return 0.0 if value is None or not math.isfinite(float(value)) else float(value)
