"""Plotly figures of the dashboard: one figure, one shared step axis, one row per panel.

Display-only transforms live here (EMA smoothing for the eye, min/max decimation so that a
100k-step run sends a few thousand points to the browser); every number plotted is a logged
column, never recomputed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from lld_monitor import columns as C

#: One colour per overlaid run (plotly's qualitative "Plotly" palette).
RUN_COLORS: tuple[str, ...] = (
    "#636EFA",
    "#EF553B",
    "#00CC96",
    "#AB63FA",
    "#FFA15A",
    "#19D3F3",
    "#FF6692",
    "#B6E880",
)
PHASE_COLORS: dict[str, str] = {
    "healthy": "#2ca02c",
    "stagnation": "#f2c300",
    "decay": "#ff7f0e",
    "collapse": "#d62728",
    "unknown": "#9e9e9e",
}
MARKER_SYMBOLS: dict[str, str] = {
    "alert": "triangle-down",
    "intervention": "star",
    "phase": "diamond",
    "error": "x",
    "lifecycle": "circle-open",
}
SEVERITY_SIZE: dict[str, int] = {"info": 8, "warning": 11, "critical": 14}
#: Traces longer than this are decimated (min and max of each bucket kept, so spikes survive).
DEFAULT_MAX_POINTS = 2000
#: At most this many vertical event lines (critical alerts and interventions) are drawn.
MAX_EVENT_LINES = 60


@dataclass(frozen=True)
class Panel:
    """One chart row: a title, the columns it plots (with their line dash), and axis options."""

    title: str
    series: tuple[tuple[str, str], ...]  # (column, dash)
    log_y: bool = False
    hline: float | None = None  # a reference line, e.g. the 50% displaced line


PANELS: tuple[Panel, ...] = (
    Panel("Reward (solid) & accuracy (dotted)", ((C.REWARD_MEAN, "solid"), (C.ACCURACY, "dot"))),
    Panel(
        "Log-prob of correct (solid) vs incorrect (dashed) responses",
        ((C.LOGP_CORRECT, "solid"), (C.LOGP_INCORRECT, "dash")),
    ),
    Panel(
        "Change after update: correct (solid) vs incorrect (dashed)",
        ((C.DELTA_CORRECT, "solid"), (C.DELTA_INCORRECT, "dash")),
        hline=0.0,
    ),
    Panel(
        "Share of correct responses displaced (50% line)",
        ((C.FRAC_CORRECT_DISPLACED, "solid"),),
        hline=0.5,
    ),
    Panel(
        "Grad norm, pre-clip (log scale; max dotted)",
        ((C.GRAD_NORM, "solid"), (C.GRAD_NORM_MAX, "dot")),
        log_y=True,
    ),
    Panel("Entropy", ((C.ENTROPY, "solid"),)),
    Panel("LLDS lambda (solid) & loss (dashed)", ((C.LLDS_LAMBDA, "solid"), (C.LLDS_LOSS, "dash"))),
)


@dataclass(frozen=True)
class Band:
    """A phase segment to shade: phase name and its first and last step (inclusive)."""

    phase: str
    start_step: float
    end_step: float


@dataclass(frozen=True)
class Marker:
    """An event to mark: an alert, an intervention, a phase change, an error."""

    step: float
    type: str
    kind: str
    severity: str
    message: str
    source: str = "run log"  # "run log" (fired live) or "analyzer" (post hoc)


@dataclass(frozen=True)
class RunSeries:
    """What one run adds to the figure; ``steps`` holds canonical columns, ``C.STEP`` included."""

    name: str
    steps: pd.DataFrame
    bands: tuple[Band, ...] = ()
    markers: tuple[Marker, ...] = ()
    color: str = RUN_COLORS[0]


def ema(values: np.ndarray, weight: float) -> np.ndarray:
    """TensorBoard-style smoothing of a 1-D series: ``s_t = w*s_{t-1} + (1-w)*x_t``, NaN skipped.

    ``values``: [N]; returns [N] (NaN where the input is NaN). ``weight`` in [0, 1).
    """
    if not 0.0 <= weight < 1.0:
        raise ValueError(f"EMA weight must be in [0, 1), got {weight}")
    raw = np.array(values, dtype=float)  # a copy: callers may pass read-only views
    if weight == 0.0 or raw.size == 0:
        return raw
    smoothed = pd.Series(raw).ewm(alpha=1.0 - weight, adjust=False, ignore_na=True).mean()
    out = smoothed.to_numpy(dtype=float, copy=True)
    out[np.isnan(raw)] = np.nan
    return out


def decimate(x: np.ndarray, y: np.ndarray, max_points: int) -> tuple[np.ndarray, np.ndarray]:
    """Keep at most about ``max_points`` points of a trace: the min and max of equal buckets.

    ``x``, ``y``: [N] -> [M], M <= max_points (+2); spikes and dips survive, order is kept.
    """
    n = len(y)
    if n <= max_points or max_points < 4:
        return x, y
    n_buckets = max_points // 2
    width = -(-n // n_buckets)  # ceil
    pad = n_buckets * width - n
    yf = np.asarray(y, dtype=float)
    lo = np.pad(np.where(np.isnan(yf), np.inf, yf), (0, pad), constant_values=np.inf)
    hi = np.pad(np.where(np.isnan(yf), -np.inf, yf), (0, pad), constant_values=-np.inf)
    base = np.arange(n_buckets) * width
    i_min = base + lo.reshape(n_buckets, width).argmin(axis=1)  # [n_buckets]
    i_max = base + hi.reshape(n_buckets, width).argmax(axis=1)  # [n_buckets]
    idx = np.unique(np.concatenate([i_min, i_max, [0, n - 1]]))
    idx = idx[idx < n]
    return np.asarray(x)[idx], yf[idx]


def slice_steps(steps: pd.DataFrame, step_range: tuple[float, float] | None) -> pd.DataFrame:
    """The rows whose step lies in ``step_range`` (inclusive); all rows when it is None."""
    if step_range is None or steps.empty or C.STEP not in steps:
        return steps
    s = steps[C.STEP].to_numpy()
    if len(s) > 1 and bool(np.all(s[1:] >= s[:-1])):  # sorted (the usual case): binary search
        i0 = np.searchsorted(s, step_range[0], "left")
        i1 = np.searchsorted(s, step_range[1], "right")
        return steps.iloc[i0:i1]
    return steps[(s >= step_range[0]) & (s <= step_range[1])]


def _marker_text(m: Marker, run: str) -> str:
    from html import escape

    return (
        f"<b>{escape(run)}</b> · step {m.step:g}<br>{escape(m.type)}: {escape(m.kind)}"
        f" [{escape(m.severity)}] ({escape(m.source)})<br>{escape(_wrap(m.message))}"
    )


def _wrap(text: str, width: int = 80) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width)) if text else ""


def build_figure(
    runs: Sequence[RunSeries],
    *,
    ema_weight: float = 0.6,
    show_raw: bool = True,
    step_range: tuple[float, float] | None = None,
    max_points: int = DEFAULT_MAX_POINTS,
    bands_for: int | None = 0,
) -> go.Figure:
    """One figure, rows = an event strip + ``PANELS``, x = step shared by every row.

    ``bands_for``: index of the run whose phase bands are shaded (None: none).
    """
    n_rows = 1 + len(PANELS)
    fig = make_subplots(
        rows=n_rows,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.025,
        row_heights=[0.5] + [1.0] * len(PANELS),
        subplot_titles=["Events (hover for messages)"] + [p.title for p in PANELS],
    )
    for i, run in enumerate(runs):
        _add_run_traces(fig, run, i, ema_weight, show_raw, step_range, max_points)
    if bands_for is not None and 0 <= bands_for < len(runs):
        _add_bands(fig, runs[bands_for], step_range)
    for row, panel in enumerate(PANELS, start=2):
        if panel.log_y:
            fig.update_yaxes(type="log", row=row, col=1)
        if panel.hline is not None:
            fig.add_hline(y=panel.hline, line_dash="dot", line_color="#555", row=row, col=1)
        if not any(_has_data(r.steps, col) for r in runs for col, _ in panel.series):
            y_domain = fig.layout[f"yaxis{row}"].domain  # paper coordinates of this row
            fig.add_annotation(
                text="not logged by the selected run(s)",
                showarrow=False,
                xref="paper",
                yref="paper",
                x=0.5,
                y=(y_domain[0] + y_domain[1]) / 2,
                font={"color": "#888"},
            )
    fig.update_yaxes(visible=False, row=1, col=1)
    fig.update_xaxes(title_text=C.STEP, row=n_rows, col=1)
    if step_range is not None:
        fig.update_xaxes(range=list(step_range))
    fig.update_layout(
        height=210 * len(PANELS) + 120,
        margin={"l": 60, "r": 10, "t": 40, "b": 40},
        hovermode="x unified",
        legend={"orientation": "v", "yanchor": "top", "y": 1.0, "x": 1.01, "xanchor": "left"},
        uirevision="lld-dashboard",  # keep zoom and legend toggles across live refreshes
    )
    return fig


def _has_data(steps: pd.DataFrame, column: str) -> bool:
    return column in steps and bool(steps[column].notna().any())


def _add_run_traces(
    fig: go.Figure,
    run: RunSeries,
    index: int,
    ema_weight: float,
    show_raw: bool,
    step_range: tuple[float, float] | None,
    max_points: int,
) -> None:
    steps = slice_steps(run.steps, step_range)
    x_all = steps[C.STEP].to_numpy(dtype=float) if C.STEP in steps else np.array([])
    color = run.color or RUN_COLORS[index % len(RUN_COLORS)]
    for row, panel in enumerate(PANELS, start=2):
        for column, dash in panel.series:
            if not _has_data(steps, column):
                continue
            y_all = steps[column].to_numpy(dtype=float)
            smooth = ema_weight > 0.0
            name = f"{run.name} · {column}"
            if show_raw or not smooth:
                x, y = decimate(x_all, y_all, max_points)
                fig.add_trace(
                    go.Scattergl(
                        x=x,
                        y=y,
                        mode="lines",
                        name=name + (" (raw)" if smooth else ""),
                        legendgroup=run.name,
                        legendgrouptitle_text=run.name,
                        line={"color": color, "dash": dash, "width": 1},
                        opacity=0.35 if smooth else 1.0,
                        showlegend=not smooth,
                    ),
                    row=row,
                    col=1,
                )
            if smooth:
                x, y = decimate(x_all, ema(y_all, ema_weight), max_points)
                fig.add_trace(
                    go.Scattergl(
                        x=x,
                        y=y,
                        mode="lines",
                        name=name,
                        legendgroup=run.name,
                        legendgrouptitle_text=run.name,
                        line={"color": color, "dash": dash, "width": 2},
                    ),
                    row=row,
                    col=1,
                )
    _add_markers(fig, run, index, color, step_range)


def _add_markers(
    fig: go.Figure,
    run: RunSeries,
    index: int,
    color: str,
    step_range: tuple[float, float] | None,
) -> None:
    markers = [
        m for m in run.markers if step_range is None or step_range[0] <= m.step <= step_range[1]
    ]
    if not markers:
        return
    fig.add_trace(
        go.Scatter(
            x=[m.step for m in markers],
            y=[index] * len(markers),
            mode="markers",
            name=f"{run.name} · events",
            legendgroup=run.name,
            marker={
                "color": color,
                "symbol": [MARKER_SYMBOLS.get(m.type, "circle") for m in markers],
                "size": [SEVERITY_SIZE.get(m.severity, 9) for m in markers],
                "line": {"width": 1, "color": "#333"},
            },
            text=[_marker_text(m, run.name) for m in markers],
            hovertemplate="%{text}<extra></extra>",
        ),
        row=1,
        col=1,
    )
    lines = [m for m in markers if m.type == "intervention" or m.severity == "critical"]
    for m in lines[-MAX_EVENT_LINES:]:
        fig.add_shape(
            type="line",
            xref="x",
            yref="paper",
            x0=m.step,
            x1=m.step,
            y0=0,
            y1=1,
            line={"dash": "dot", "width": 1, "color": color},
        )


def _add_bands(fig: go.Figure, run: RunSeries, step_range: tuple[float, float] | None) -> None:
    """Shade each phase segment across every row (one paper-high rectangle per segment)."""
    for band in run.bands:
        if step_range is not None and (
            band.end_step < step_range[0] or band.start_step > step_range[1]
        ):
            continue
        color = PHASE_COLORS.get(band.phase, PHASE_COLORS["unknown"])
        fig.add_shape(
            type="rect",
            xref="x",
            yref="paper",
            x0=band.start_step,
            x1=band.end_step,
            y0=0,
            y1=1,
            fillcolor=color,
            opacity=0.12,
            line_width=0,
            layer="below",
        )
        fig.add_annotation(
            x=band.start_step,
            y=1.0,
            xref="x",
            yref="paper",
            text=band.phase,
            showarrow=False,
            xanchor="left",
            yanchor="top",
            font={"size": 10, "color": color},
        )
