"""The one definition of a run's charts, drawn by the HTML report and by the dashboard.

One plotly figure, one shared step axis: a compact phase strip (one lane per run: its phases as
coloured segments, its alerts, interventions and errors as markers on the lane), then one row per
``PANELS`` entry. With one run every signal has its own colour (``SIGNAL_COLORS``: the same
colour means the same thing in every panel) and the phase bands shade every row; with several
runs every run has its own colour (``RUN_COLORS``), the signals of a panel are told apart by
their dash, and each run's phases are its lane of the strip.

Display-only transforms live here (EMA smoothing for the eye, min/max decimation so that a
100k-step run sends a few thousand points to the browser, logged points of a sparse column
joined, a value repeated on consecutive steps drawn once); every number plotted is a logged
column, never recomputed. Any alert kind is drawn: markers take the kind from the event.
"""

from __future__ import annotations

import copy
import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

import numpy as np
import pandas as pd

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
#: One colour per signal when one run is shown: correct responses teal, incorrect magenta, in
#: every panel; the signals of one panel differ in hue; none of them is a phase colour (green,
#: yellow, orange, red, grey).
SIGNAL_COLORS: dict[str, str] = {
    C.REWARD_MEAN: "#1f3f8f",
    C.ACCURACY: "#7b2cbf",
    C.LOGP_CORRECT: "#138a7e",
    C.LOGP_INCORRECT: "#c2185b",
    C.DELTA_CORRECT: "#138a7e",
    C.DELTA_INCORRECT: "#c2185b",
    C.FRAC_CORRECT_DISPLACED: "#138a7e",
    C.INBATCH_FRAC_CORRECT_DISPLACED: "#1f3f8f",
    C.GRAD_NORM: "#6a3d9a",
    C.GRAD_NORM_MAX: "#17a2b8",
    C.ENTROPY: "#8c564b",
    C.LLDS_LAMBDA: "#222222",
    C.LLDS_LOSS: "#8c564b",
}
#: Columns that hold a state (LLDS on, its lambda): drawn as steps, never smoothed.
STATE_COLUMNS: frozenset[str] = frozenset({C.LLDS_ENABLED, C.LLDS_LAMBDA})
#: A smoothed line restarts at a run of this many equal values (a dead tail of zeros, a
#: constant), so that it is drawn exactly at that value from its first step.
FLAT_RUN = 8
#: Two logged points further apart than this many times the column's usual spacing are not
#: joined: the line breaks (a gap is drawn as a gap, not as a trend).
GAP_FACTOR = 3.0
PHASE_COLORS: dict[str, str] = {
    "healthy": "#2ca02c",
    "stagnation": "#f2c300",
    "decay": "#ff7f0e",
    "collapse": "#d62728",
    "unknown": "#9e9e9e",
}
SEVERITY_COLORS: dict[str, str] = {"info": "#4a90d9", "warning": "#ff9f1c", "critical": "#b00020"}
MARKER_SYMBOLS: dict[str, str] = {
    "alert": "triangle-down",
    "intervention": "star",
    "phase": "diamond",
    "error": "x",
    "lifecycle": "circle-open",
}
SEVERITY_SIZE: dict[str, int] = {"info": 8, "warning": 11, "critical": 14}
#: Line dashes of a panel's 1st, 2nd, ... signal when several runs share one colour each.
DASHES: tuple[str, ...] = ("solid", "dot", "dash")
#: Traces longer than this are decimated (min and max of each bucket kept, so spikes survive).
DEFAULT_MAX_POINTS = 1000
#: At most this many vertical event lines (critical alerts and interventions) are drawn.
MAX_EVENT_LINES = 60
STRIP_TITLE = "Phases and events per run (hover for messages)"
#: Added to the strip's title where a click opens the tokens (the dashboard, not the report).
CLICK_HINT = "; click a point for its tokens"


@dataclass(frozen=True)
class Panel:
    """One chart row: a title, the columns it plots (with their legend labels), axis options."""

    title: str
    series: tuple[tuple[str, str], ...]  # (column, label)
    log_y: bool = False
    hline: float | None = None  # a reference line, e.g. the 50% displaced line
    unit: str = ""  # of every series of the panel (in its title and in the hover)


PANELS: tuple[Panel, ...] = (
    Panel(
        "Reward (mean per response, 0-1)",
        ((C.REWARD_MEAN, "reward"), (C.ACCURACY, "accuracy")),
    ),
    Panel(
        "Log-prob of responses (nats per token)",
        ((C.LOGP_CORRECT, "correct"), (C.LOGP_INCORRECT, "incorrect")),
        unit="nats/token",
    ),
    Panel(
        "Change after update (summed nats per response)",
        ((C.DELTA_CORRECT, "correct"), (C.DELTA_INCORRECT, "incorrect")),
        hline=0.0,
        unit="nats/response",
    ),
    Panel(
        "Share of correct responses displaced (0-1; 50% line)",
        (
            (C.FRAC_CORRECT_DISPLACED, "share displaced"),
            (C.INBATCH_FRAC_CORRECT_DISPLACED, "in batch, before its last update"),
        ),
        hline=0.5,
    ),
    Panel(
        "Grad norm, pre-clip (L2, log scale; 0 drawn at the floor, marked x)",
        ((C.GRAD_NORM, "grad norm"), (C.GRAD_NORM_MAX, "max")),
        log_y=True,
    ),
    Panel("Entropy (nats per token)", ((C.ENTROPY, "entropy"),), unit="nats/token"),
    Panel("LLDS (lambda; loss)", ((C.LLDS_LAMBDA, "lambda"), (C.LLDS_LOSS, "loss"))),
)


@dataclass(frozen=True)
class Band:
    """A phase segment to shade: phase name and its first and last step (inclusive)."""

    phase: str
    start_step: float
    end_step: float


@dataclass(frozen=True)
class Marker:
    """An event to mark: an alert (of any kind), an intervention, a phase change, an error."""

    step: float
    type: str
    kind: str
    severity: str
    message: str
    source: str = "run log"  # "run log" (fired live) or "analyzer" (post hoc)
    headline: str = ""  # an alert's one line (analysis.advice.headline); "" for other events
    actions: tuple[str, ...] = ()  # an alert's "what to do now" (analysis.advice.actions)


@dataclass(frozen=True)
class RunSeries:
    """What one run adds to the figure; ``steps`` holds canonical columns, ``C.STEP`` included."""

    name: str
    steps: pd.DataFrame
    bands: tuple[Band, ...] = ()
    markers: tuple[Marker, ...] = ()
    color: str | None = None


def from_analysis(
    name: str, steps: pd.DataFrame, analysis: Any, color: str | None = None
) -> RunSeries:
    """A run's series from its step table and an ``analyze_run`` result (phases, alerts)."""
    bands = tuple(
        Band(str(s.phase), float(s.start_step), float(s.end_step))
        for s in getattr(analysis, "phases", None) or ()
    )
    from lld_monitor.analysis.advice import actions, headline

    markers = tuple(
        Marker(
            float(a.step),
            "alert",
            str(a.kind),
            str(a.severity),
            str(a.message),
            "analyzer",
            headline(a),
            actions(a),
        )
        for a in getattr(analysis, "alerts", None) or ()
    )
    return RunSeries(name, steps, bands, markers, color)


# --- display-only transforms -------------------------------------------------------------------


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
    yf = np.asarray(y, dtype=float)
    if np.isnan(yf).any():  # NaN never wins a bucket
        lo, hi = np.where(np.isnan(yf), np.inf, yf), np.where(np.isnan(yf), -np.inf, yf)
    else:
        lo = hi = yf
    full = n // width  # whole buckets; the rest (fewer than ``width`` rows) is one more
    base = np.arange(full) * width
    parts = [
        base + lo[: full * width].reshape(full, width).argmin(axis=1),  # [full]
        base + hi[: full * width].reshape(full, width).argmax(axis=1),  # [full]
        [0, n - 1],
    ]
    if full * width < n:
        parts.append([full * width + lo[full * width :].argmin()])
        parts.append([full * width + hi[full * width :].argmax()])
    idx = np.unique(np.concatenate(parts))
    return np.asarray(x)[idx], yf[idx]


def compress_repeats(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Of a value repeated on consecutive steps keep only the first and the last step: the line
    between them is flat, so nothing changes in the drawing (a rollout batch's value copied onto
    each of its updates, a dead tail of zeros, a constant lambda). ``x``, ``y``: [N] -> [M]."""
    if len(y) <= 2:
        return x, y
    same_prev = np.zeros(len(y), dtype=bool)
    same_prev[1:] = (y[1:] == y[:-1]) & (np.diff(x) == 1.0)
    same_next = np.zeros(len(y), dtype=bool)
    same_next[:-1] = same_prev[1:]
    interior = same_prev & same_next  # neither the first nor the last of its repeat
    if not interior.any():
        return x, y
    return x[~interior], y[~interior]


def logged_points(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The points of a column to draw: NaN rows dropped, repeats compressed
    (``compress_repeats``). ``x`` (steps), ``y``: [N] -> [M].

    A column logged on some steps only (the probe runs once per rollout batch) would draw
    nothing as a NaN-broken line, so its logged points are kept and joined; the drawing breaks
    the line only at gaps (``gap_starts``).
    """
    logged = ~np.isnan(y)
    return compress_repeats(x[logged], y[logged])


def gap_starts(x: np.ndarray) -> np.ndarray:
    """Indices i where the step from x[i-1] to x[i] is a gap: more than ``GAP_FACTOR`` times
    the column's usual (median) spacing and more than one step. ``x``: [N] sorted steps."""
    if len(x) < 3:
        return np.array([], dtype=int)
    dx = np.diff(x)
    usual = float(np.median(dx))
    return np.flatnonzero((dx > GAP_FACTOR * usual) & (dx > 1.0)) + 1


def smooth(
    x: np.ndarray, y: np.ndarray, weight: float, gaps: np.ndarray | None = None
) -> np.ndarray:
    """The EMA of a column's logged points (``x`` steps, ``y`` values, no NaN: [N] -> [N]),
    restarted at each gap and at each run of ``FLAT_RUN`` or more equal values, so that a
    constant, a dead tail of zeros and the level after a switch are drawn exactly, and no
    smoothing carries a value across steps that were not measured. ``gaps``: ``gap_starts(x)``
    when the caller has it."""
    n = len(y)
    if weight == 0.0 or n == 0:
        return np.array(y, dtype=float)
    starts = set((gap_starts(x) if gaps is None else gaps).tolist())
    yy = np.asarray(y, dtype=float)
    # the first index of each long run of equal values
    edges = np.concatenate(([0], np.flatnonzero(yy[1:] != yy[:-1]) + 1, [n]))  # run bounds
    long_runs = edges[:-1][np.diff(edges) >= FLAT_RUN]
    starts.update(long_runs.tolist())
    bounds = sorted({0, *starts, n})
    out = np.empty(n, dtype=float)
    for a, b in itertools.pairwise(bounds):
        out[a:b] = ema(y[a:b], weight)
    return out


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


# --- the figure ----------------------------------------------------------------------------------


def _marker_text(m: Marker, run: str) -> str:
    return (
        f"<b>{escape(run)}</b> · step {m.step:g}<br>{escape(m.type)}: {escape(m.kind)}"
        f" [{escape(m.severity)}] ({escape(m.source)})<br>{escape(_wrap(m.message))}"
    )


def _wrap(text: str, width: int = 80) -> str:
    import textwrap

    return "<br>".join(textwrap.wrap(text, width)) if text else ""


@functools.cache
def _subplot_layout(strip_weight: float) -> dict[str, Any]:
    """The rows' axes, domains and titles as a layout dict (built once: make_subplots is slow)."""
    from plotly.subplots import make_subplots

    fig = make_subplots(
        rows=1 + len(PANELS),
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.035,
        row_heights=[strip_weight] + [1.0] * len(PANELS),
        subplot_titles=[STRIP_TITLE] + [p.title for p in PANELS],
    )
    return fig.layout.to_plotly_json()


def _axis(row: int) -> str:
    return "" if row == 1 else str(row)


def run_color(run: RunSeries, index: int) -> str:
    """The run's colour: its own, else the ``index``-th of ``RUN_COLORS``."""
    return run.color or RUN_COLORS[index % len(RUN_COLORS)]


def _panel_title(panel: Panel, single: bool) -> str:
    if single:
        keys = [
            f'<span style="color:{SIGNAL_COLORS.get(col, "#333")}">━ {escape(label)}</span>'
            for col, label in panel.series
        ]
    else:
        keys = [
            f"{escape(label)} ({DASHES[i % len(DASHES)]})"
            for i, (_, label) in enumerate(panel.series)
        ]
    return f"<b>{escape(panel.title)}</b>   " + "   ".join(keys)


def build_figure(
    runs: Sequence[RunSeries],
    *,
    ema_weight: float = 0.6,
    show_raw: bool = True,
    step_range: tuple[float, float] | None = None,
    max_points: int = DEFAULT_MAX_POINTS,
    title: str | None = None,
    collapse_steps: Sequence[float | None] = (),
    clickable: bool = False,
) -> Any:
    """One figure: a phase strip (one lane per run) + ``PANELS``, x = step shared by every row.

    One run: per-signal colours, no legend (the panel titles name the colours), its phase bands
    shaded through every row. Several runs: per-run colours, a legend of runs, phases per lane.
    ``collapse_steps[i]``: a solid red line at run i's collapse step (None: none); ``clickable``:
    the strip's title says that a click opens the tokens (the dashboard). Traces, shapes
    and annotations are assembled as plain dicts and validated once, which keeps a render cheap.
    """
    import plotly.graph_objects as go

    single = len(runs) == 1
    n_rows = 1 + len(PANELS)
    layout = copy.deepcopy(_subplot_layout(max(0.35, 0.2 * len(runs))))
    traces: list[dict[str, Any]] = []
    shapes: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = list(layout.get("annotations", []))
    if clickable:
        annotations[0]["text"] = STRIP_TITLE[:-1] + CLICK_HINT + ")"
    for i, panel in enumerate(PANELS, start=1):
        annotations[i]["text"] = _panel_title(panel, single)
    floors = {
        row: log_floor(
            [
                slice_steps(r.steps, step_range)[col].to_numpy(dtype=float)
                for r in runs
                for col, _ in panel.series
                if _has_data(r.steps, col)
            ]
        )
        for row, panel in enumerate(PANELS, start=2)
        if panel.log_y
    }
    for i, run in enumerate(runs):
        if not single:  # one legend entry per run; clicking it hides the run everywhere
            traces.append(_legend_entry(run, i))
        traces += _run_traces(run, i, single, ema_weight, show_raw, step_range, max_points, floors)
        traces += _strip_traces(run, i, single, step_range, shapes)
    if single and runs:
        _bands(runs[0], step_range, shapes)
    for i, step in enumerate(collapse_steps):
        if step is not None and i < len(runs):
            shapes.append(_vline(float(step), "#d62728", "solid", 2))
    for row, panel in enumerate(PANELS, start=2):
        yaxis = layout[f"yaxis{row}"]
        if panel.log_y:
            yaxis.update(type="log", dtick=1)  # one label per decade (minor ticks crowd a row)
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
                    "text": "not logged: " + ", ".join(col for col, _ in panel.series),
                    "showarrow": False,
                    "xref": "paper",
                    "yref": "paper",
                    "x": 0.5,
                    "y": (y0 + y1) / 2,
                    "font": {"color": "#888"},
                }
            )
    layout["yaxis"].update(
        tickmode="array",
        tickvals=list(range(len(runs))),
        ticktext=[_lane_label(r.name) for r in runs],
        range=[len(runs) - 0.5, -0.5],  # first run on top
        showgrid=False,
        zeroline=False,
        fixedrange=True,
    )
    layout[f"xaxis{n_rows}"]["title"] = {"text": C.STEP}
    if step_range is not None:
        for row in range(1, n_rows + 1):
            layout[f"xaxis{_axis(row)}"]["range"] = list(step_range)
    for ann in annotations[:n_rows]:  # the row titles: left-aligned, small
        ann.update(x=0.0, xanchor="left", font={"size": 12})
    layout.update(
        shapes=shapes,
        annotations=annotations,
        height=200 * len(PANELS) + 90 + 40 * len(runs) + (40 if title else 0),
        # (several runs: room above the strip for the legend's rows of run names)
        margin={
            "l": _lane_margin(runs),
            "r": 10,
            "t": (70 if title else 40) + (0 if single else 22 * math.ceil(len(runs) / 3)),
            "b": 40,
        },
        hovermode="x unified",
        barmode="overlay",
        showlegend=not single,
        # runs' legend top right, above the strip; the row titles are left-aligned
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.0, "x": 1.0, "xanchor": "right"},
        template="plotly_white",
        uirevision="lld-dashboard",  # keep zoom and legend toggles across live refreshes
    )
    if title:
        layout["title"] = {"text": escape(title), "x": 0.0, "xanchor": "left"}
    return go.Figure(data=traces, layout=layout)


#: Characters per line of a run's name in its lane (longer names wrap; never cut).
LANE_WIDTH = 28


def _lane_label(name: str) -> str:
    """A run's full name for its lane, wrapped at ``LANE_WIDTH`` characters (on ``-``, ``_``,
    ``/`` when it can)."""
    import re

    parts = re.findall(r"[^-_/]+[-_/]?|[-_/]", name) or [name]
    lines, line = [], ""
    for part in parts:
        while len(part) > LANE_WIDTH:  # one long word: hard breaks
            if line:
                lines.append(line)
                line = ""
            lines.append(part[:LANE_WIDTH])
            part = part[LANE_WIDTH:]
        if len(line) + len(part) > LANE_WIDTH and line:
            lines.append(line)
            line = ""
        line += part
    if line:
        lines.append(line)
    return "<br>".join(escape(x) for x in lines)


def _lane_margin(runs: Sequence[RunSeries]) -> int:
    """Left margin (px) that holds the longest line of the lanes' names."""
    longest = max(
        (len(line) for r in runs for line in _lane_label(r.name).split("<br>")), default=8
    )
    return int(min(max(90, 7 * longest + 16), 16 + 7 * LANE_WIDTH))


def _has_data(steps: pd.DataFrame, column: str) -> bool:
    return column in steps and bool(steps[column].notna().any())


def _legend_entry(run: RunSeries, index: int) -> dict[str, Any]:
    return {
        "type": "scatter",
        "x": [None],
        "y": [None],
        "mode": "lines",
        "name": run.name,
        "legendgroup": run.name,
        "line": {"color": run_color(run, index), "width": 3},
        "xaxis": "x2",
        "yaxis": "y2",
        "hoverinfo": "skip",
    }


def log_floor(values: Sequence[np.ndarray]) -> float:
    """Where a log axis draws zeros and negatives: one decade below the decade of the smallest
    positive value (1e-3 when none is positive)."""
    positive = [float(np.min(v[v > 0])) for v in values if np.any(v > 0)]
    if not positive:
        return 1e-3
    return float(10.0 ** (math.floor(math.log10(min(positive))) - 1))


def _segments(
    x: np.ndarray, y: np.ndarray, max_points: int, gaps: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The points to draw of a column's logged rows (``x``, ``y`` without NaN): the line is broken
    at each gap (``gap_starts`` on the logged steps, or ``gaps`` when the caller has them),
    repeats are compressed and each stretch is decimated on its own."""
    bounds = [0, *(gap_starts(x) if gaps is None else gaps).tolist(), len(x)]
    xs: list[np.ndarray] = []
    ys: list[np.ndarray] = []
    for a, b in itertools.pairwise(bounds):
        cx, cy = compress_repeats(x[a:b], y[a:b])
        budget = max(4, int(max_points * (b - a) / max(len(x), 1)))
        sx, sy = decimate(cx, cy, budget)
        if xs:  # the break: one NaN point between the stretches
            xs.append(np.array([(xs[-1][-1] + sx[0]) / 2.0]))
            ys.append(np.array([np.nan]))
        xs.append(np.asarray(sx, dtype=float))
        ys.append(np.asarray(sy, dtype=float))
    if not xs:
        return np.array([]), np.array([])
    return np.concatenate(xs), np.concatenate(ys)


#: A curve with at most this many points drawn shows its markers.
MARKER_POINTS = 60


def _few_points(x: np.ndarray, y: np.ndarray) -> bool:
    """``len(compress_repeats(x, y)[0]) <= MARKER_POINTS``, cheaply for a long column: every
    change of value keeps a point, so MARKER_POINTS changes or more settle it."""
    if len(y) <= MARKER_POINTS:
        return True
    if np.count_nonzero(y[1:] != y[:-1]) >= MARKER_POINTS:
        return False
    return len(compress_repeats(x, y)[0]) <= MARKER_POINTS


def _hover(run: str, label: str, unit: str) -> str:
    unit = f" {escape(unit)}" if unit else ""
    return f"<b>{escape(run)}</b> · {escape(label)}: %{{y:.4g}}{unit} (step %{{x}})<extra></extra>"


def _run_traces(
    run: RunSeries,
    index: int,
    single: bool,
    ema_weight: float,
    show_raw: bool,
    step_range: tuple[float, float] | None,
    max_points: int,
    floors: dict[int, float],
) -> list[dict[str, Any]]:
    steps = slice_steps(run.steps, step_range)
    x_all = steps[C.STEP].to_numpy(dtype=float) if C.STEP in steps else np.array([])
    out: list[dict[str, Any]] = []
    for row, panel in enumerate(PANELS, start=2):
        for k, (column, label) in enumerate(panel.series):
            if not _has_data(steps, column):
                continue
            y_raw = steps[column].to_numpy(dtype=float)
            logged = ~np.isnan(y_raw)
            x_col, y_all = x_all[logged], y_raw[logged]
            if single:
                color, dash = SIGNAL_COLORS.get(column, run_color(run, index)), "solid"
            else:
                color, dash = run_color(run, index), DASHES[k % len(DASHES)]
            state = column in STATE_COLUMNS
            smoothed = ema_weight > 0.0 and not state
            common = {
                "type": "scatter",
                # every curve carries its points (invisible on a dense one): a click anywhere on
                # it selects a step, whose tokens the dashboard then shows
                "mode": "lines+markers",
                "marker": {"size": 4} if _few_points(x_col, y_all) else {"size": 6, "opacity": 0.0},
                "legendgroup": run.name,
                "showlegend": False,
                "xaxis": f"x{row}",
                "yaxis": f"y{row}",
                "meta": run.name,
                "hovertemplate": _hover(run.name, label, panel.unit),
            }
            if state:  # a switch is drawn as a step, at its exact values
                common["line_shape"] = "hv"
            name = f"{run.name} · {column}"
            floor = floors.get(row)
            if floor is not None and np.any(y_all <= 0):  # zeros on a log axis: at the floor
                zero = y_all <= 0
                out.append(
                    {
                        **common,
                        "mode": "markers",
                        "x": x_col[zero],
                        "y": np.full(int(zero.sum()), floor),
                        "name": name + " (<= 0, drawn at the floor)",
                        "marker": {"symbol": "x", "size": 6, "color": color},
                        "hovertemplate": f"<b>{escape(run.name)}</b> · {escape(label)}: "
                        "0 or below (drawn at the axis floor; step %{x})<extra></extra>",
                    }
                )
                y_all = np.where(zero, floor, y_all)
            gaps = gap_starts(x_col)  # (once per column: the raw and smoothed lines share it)
            if show_raw or not smoothed:
                x, y = _segments(x_col, y_all, max_points, gaps)
                out.append(
                    {
                        **common,
                        "x": x,
                        "y": y,
                        "name": name + (" (raw)" if smoothed else ""),
                        "line": {"color": color, "dash": dash, "width": 1 if smoothed else 1.6},
                        "opacity": 0.35 if smoothed else 1.0,
                    }
                )
            if smoothed:
                x, y = _segments(x_col, smooth(x_col, y_all, ema_weight, gaps), max_points, gaps)
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


def _vline(x: float, color: str, dash: str, width: float) -> dict[str, Any]:
    return {
        "type": "line",
        "xref": "x",
        "yref": "paper",
        "x0": x,
        "x1": x,
        "y0": 0,
        "y1": 1,
        "line": {"dash": dash, "width": width, "color": color},
    }


def _strip_traces(
    run: RunSeries,
    index: int,
    single: bool,
    step_range: tuple[float, float] | None,
    shapes: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """The run's lane of the strip: its phases as segments, its events as markers (hover: text)."""
    out: list[dict[str, Any]] = []
    spans = band_spans(run.bands)
    kept = [
        i
        for i, b in enumerate(run.bands)
        if step_range is None or not (b.end_step < step_range[0] or b.start_step > step_range[1])
    ]
    bands = [run.bands[i] for i in kept]
    if bands:
        out.append(
            {
                "type": "bar",
                "orientation": "h",
                "y": [index] * len(bands),
                "base": [spans[i][0] for i in kept],
                "x": [spans[i][1] - spans[i][0] for i in kept],
                "width": 0.55,
                "marker": {
                    "color": [PHASE_COLORS.get(b.phase, PHASE_COLORS["unknown"]) for b in bands],
                    "line": {"width": 0},
                },
                "opacity": 0.75,
                "name": f"{run.name} · phases",
                "legendgroup": run.name,
                "showlegend": False,
                "text": [
                    f"<b>{escape(run.name)}</b> · {escape(b.phase)}: steps "
                    f"{b.start_step:g}-{b.end_step:g}"
                    for b in bands
                ],
                "hovertemplate": "%{text}<extra></extra>",
                "textposition": "none",
                "xaxis": "x",
                "yaxis": "y",
            }
        )
    markers = [
        m for m in run.markers if step_range is None or step_range[0] <= m.step <= step_range[1]
    ]
    if not markers:
        return out
    color = run_color(run, index)
    lines = [m for m in markers if m.type == "intervention" or m.severity == "critical"]
    for m in lines[-MAX_EVENT_LINES:]:
        line_color = SEVERITY_COLORS.get(m.severity, color) if single else color
        shapes.append(_vline(m.step, line_color, "dot", 1))
    out.append(
        {
            "type": "scatter",
            "x": [m.step for m in markers],
            "y": [index] * len(markers),
            "mode": "markers",
            "name": f"{run.name} · events",
            "legendgroup": run.name,
            "showlegend": False,
            "xaxis": "x",
            "yaxis": "y",
            "meta": run.name,
            "marker": {
                "color": [SEVERITY_COLORS.get(m.severity, "#777") for m in markers],
                "symbol": [MARKER_SYMBOLS.get(m.type, "circle") for m in markers],
                "size": [SEVERITY_SIZE.get(m.severity, 9) for m in markers],
                "line": {"width": 1.5, "color": "#222" if single else color},
            },
            "text": [_marker_text(m, run.name) for m in markers],
            "hovertemplate": "%{text}<extra></extra>",
        }
    )
    return out


def band_spans(bands: Sequence[Band]) -> list[tuple[float, float]]:
    """x extents of phase segments (closed step ranges) that touch: a boundary lies halfway
    between one segment's last step and the next one's first (sparse logs leave gaps of several
    steps); the outer edges are widened by half a step."""
    spans: list[tuple[float, float]] = []
    for i, band in enumerate(bands):
        x0 = spans[-1][1] if spans else band.start_step - 0.5
        if i + 1 < len(bands):
            x1 = (band.end_step + bands[i + 1].start_step) / 2.0
        else:
            x1 = band.end_step + 0.5
        spans.append((x0, max(x1, x0)))
    return spans


def _bands(
    run: RunSeries, step_range: tuple[float, float] | None, shapes: list[dict[str, Any]]
) -> None:
    """Shade each phase segment across every row (one paper-high rectangle per segment)."""
    for band, (x0, x1) in zip(run.bands, band_spans(run.bands)):
        if step_range is not None and (
            band.end_step < step_range[0] or band.start_step > step_range[1]
        ):
            continue
        shapes.append(
            {
                "type": "rect",
                "xref": "x",
                "yref": "paper",
                "x0": x0,
                "x1": x1,
                "y0": 0,
                "y1": 1,
                "fillcolor": PHASE_COLORS.get(band.phase, PHASE_COLORS["unknown"]),
                "opacity": 0.10,
                "line": {"width": 0},
                "layer": "below",
            }
        )


def point_step(fig: Any, point: dict[str, Any]) -> tuple[str, float] | None:
    """(run name, step) of a selected point of ``build_figure``'s figure, or None.

    ``point``: one entry of a plotly selection (``curve_number`` and ``x``), as Streamlit's
    ``on_select`` returns it.
    """
    try:
        trace = fig.data[int(point["curve_number"])]
        x = float(point["x"])
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    run = trace.meta if isinstance(trace.meta, str) else None
    if run is None or not math.isfinite(x):
        return None
    return run, x
