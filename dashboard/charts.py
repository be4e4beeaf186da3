"""Plotly figures of the dashboard: one figure, one shared step axis, one row per panel.

Display-only transforms live here (EMA smoothing for the eye, min/max decimation so that a
100k-step run sends a few thousand points to the browser); every number plotted is a logged
column, never recomputed.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

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
DEFAULT_MAX_POINTS = 1000
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


@functools.cache
def _subplot_layout() -> dict[str, Any]:
    """The rows' axes, domains and titles as a layout dict (built once: make_subplots is slow)."""
    fig = make_subplots(
        rows=1 + len(PANELS),
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.035,
        row_heights=[0.5] + [1.0] * len(PANELS),
        subplot_titles=["Events (hover for messages)"] + [p.title for p in PANELS],
    )
    return fig.layout.to_plotly_json()


def _axis(row: int) -> str:
    return "" if row == 1 else str(row)


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

    ``bands_for``: index of the run whose phase bands are shaded (None: none). Traces, shapes and
    annotations are assembled as plain dicts and validated once, which keeps a render cheap.
    """
    n_rows = 1 + len(PANELS)
    layout = copy.deepcopy(_subplot_layout())
    traces: list[dict[str, Any]] = []
    shapes: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = list(layout.get("annotations", []))
    for i, run in enumerate(runs):
        traces += _run_traces(run, i, ema_weight, show_raw, step_range, max_points)
        traces += _marker_traces(run, i, step_range, shapes)
    if bands_for is not None and 0 <= bands_for < len(runs):
        _bands(runs[bands_for], step_range, shapes, annotations)
    for row, panel in enumerate(PANELS, start=2):
        yaxis = layout[f"yaxis{row}"]
        if panel.log_y:
            yaxis["type"] = "log"
        if panel.hline is not None:
            shapes.append(
                {
                    "type": "line",
                    "xref": "paper",
                    "x0": 0,
                    "x1": 1,
                    "yref": f"y{row}",
                    "y0": panel.hline,
                    "y1": panel.hline,
                    "line": {"dash": "dot", "color": "#555", "width": 1},
                }
            )
        if not any(_has_data(r.steps, col) for r in runs for col, _ in panel.series):
            y0, y1 = yaxis["domain"]  # paper coordinates of this row
            annotations.append(
                {
                    "text": "not logged by the selected run(s)",
                    "showarrow": False,
                    "xref": "paper",
                    "yref": "paper",
                    "x": 0.5,
                    "y": (y0 + y1) / 2,
                    "font": {"color": "#888"},
                }
            )
    layout["yaxis"]["visible"] = False
    layout[f"xaxis{n_rows}"]["title"] = {"text": C.STEP}
    if step_range is not None:
        for row in range(1, n_rows + 1):
            layout[f"xaxis{_axis(row)}"]["range"] = list(step_range)
    layout.update(
        shapes=shapes,
        annotations=annotations,
        height=210 * len(PANELS) + 120,
        margin={"l": 60, "r": 10, "t": 40, "b": 40},
        hovermode="x unified",
        legend={"orientation": "v", "yanchor": "top", "y": 1.0, "x": 1.01, "xanchor": "left"},
        uirevision="lld-dashboard",  # keep zoom and legend toggles across live refreshes
    )
    return go.Figure(data=traces, layout=layout)


def _has_data(steps: pd.DataFrame, column: str) -> bool:
    return column in steps and bool(steps[column].notna().any())


def _run_traces(
    run: RunSeries,
    index: int,
    ema_weight: float,
    show_raw: bool,
    step_range: tuple[float, float] | None,
    max_points: int,
) -> list[dict[str, Any]]:
    steps = slice_steps(run.steps, step_range)
    x_all = steps[C.STEP].to_numpy(dtype=float) if C.STEP in steps else np.array([])
    color = run.color or RUN_COLORS[index % len(RUN_COLORS)]
    smooth = ema_weight > 0.0
    out: list[dict[str, Any]] = []
    for row, panel in enumerate(PANELS, start=2):
        for column, dash in panel.series:
            if not _has_data(steps, column):
                continue
            y_col = steps[column].to_numpy(dtype=float)
            # a column logged on some steps only (the probe runs once per rollout batch) would
            # draw nothing as a line broken by NaN: plot its logged points, joined
            logged = ~np.isnan(y_col)
            x_col, y_all = x_all[logged], y_col[logged]
            common = {
                "type": "scatter",
                "mode": "lines",
                "legendgroup": run.name,
                "legendgrouptitle": {"text": run.name},
                "xaxis": f"x{row}",
                "yaxis": f"y{row}",
            }
            name = f"{run.name} · {column}"
            if show_raw or not smooth:
                x, y = decimate(x_col, y_all, max_points)
                out.append(
                    {
                        **common,
                        "x": x,
                        "y": y,
                        "name": name + (" (raw)" if smooth else ""),
                        "line": {"color": color, "dash": dash, "width": 1},
                        "opacity": 0.35 if smooth else 1.0,
                        "showlegend": not smooth,
                    }
                )
            if smooth:
                x, y = decimate(x_col, ema(y_all, ema_weight), max_points)
                out.append(
                    {
                        **common,
                        "x": x,
                        "y": y,
                        "name": name,
                        "line": {"color": color, "dash": dash, "width": 2},
                    }
                )
    return out


def _marker_traces(
    run: RunSeries,
    index: int,
    step_range: tuple[float, float] | None,
    shapes: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """The run's events on the top strip (hover: message); critical ones also as a line."""
    markers = [
        m for m in run.markers if step_range is None or step_range[0] <= m.step <= step_range[1]
    ]
    if not markers:
        return []
    color = run.color or RUN_COLORS[index % len(RUN_COLORS)]
    lines = [m for m in markers if m.type == "intervention" or m.severity == "critical"]
    for m in lines[-MAX_EVENT_LINES:]:
        shapes.append(
            {
                "type": "line",
                "xref": "x",
                "yref": "paper",
                "x0": m.step,
                "x1": m.step,
                "y0": 0,
                "y1": 1,
                "line": {"dash": "dot", "width": 1, "color": color},
            }
        )
    return [
        {
            "type": "scatter",
            "x": [m.step for m in markers],
            "y": [index] * len(markers),
            "mode": "markers",
            "name": f"{run.name} · events",
            "legendgroup": run.name,
            "xaxis": "x",
            "yaxis": "y",
            "marker": {
                "color": color,
                "symbol": [MARKER_SYMBOLS.get(m.type, "circle") for m in markers],
                "size": [SEVERITY_SIZE.get(m.severity, 9) for m in markers],
                "line": {"width": 1, "color": "#333"},
            },
            "text": [_marker_text(m, run.name) for m in markers],
            "hovertemplate": "%{text}<extra></extra>",
        }
    ]


def _bands(
    run: RunSeries,
    step_range: tuple[float, float] | None,
    shapes: list[dict[str, Any]],
    annotations: list[dict[str, Any]],
) -> None:
    """Shade each phase segment across every row (one paper-high rectangle per segment)."""
    for band in run.bands:
        if step_range is not None and (
            band.end_step < step_range[0] or band.start_step > step_range[1]
        ):
            continue
        color = PHASE_COLORS.get(band.phase, PHASE_COLORS["unknown"])
        shapes.append(
            {
                "type": "rect",
                "xref": "x",
                "yref": "paper",
                "x0": band.start_step,
                "x1": band.end_step,
                "y0": 0,
                "y1": 1,
                "fillcolor": color,
                "opacity": 0.12,
                "line": {"width": 0},
                "layer": "below",
            }
        )
        annotations.append(
            {
                "x": band.start_step,
                "y": 1.0,
                "xref": "x",
                "yref": "paper",
                "text": band.phase,
                "showarrow": False,
                "xanchor": "left",
                "yanchor": "top",
                "font": {"size": 10, "color": color},
            }
        )
