"""The dashboard's figures: the one chart definition of ``lld_monitor.report.charts``, re-exported.

The HTML report (``lld_monitor.report``) draws the same figure; nothing about what a run's charts
are is defined here.
"""

from __future__ import annotations

from lld_monitor.report.charts import (
    DEFAULT_MAX_POINTS,
    MARKER_SYMBOLS,
    MAX_EVENT_LINES,
    PANELS,
    PHASE_COLORS,
    RUN_COLORS,
    SEVERITY_COLORS,
    SEVERITY_SIZE,
    SIGNAL_COLORS,
    Band,
    Marker,
    Panel,
    RunSeries,
    build_figure,
    decimate,
    ema,
    from_analysis,
    logged_points,
    point_step,
    run_color,
    slice_steps,
)

__all__ = [
    "DEFAULT_MAX_POINTS",
    "MARKER_SYMBOLS",
    "MAX_EVENT_LINES",
    "PANELS",
    "PHASE_COLORS",
    "RUN_COLORS",
    "SEVERITY_COLORS",
    "SEVERITY_SIZE",
    "SIGNAL_COLORS",
    "Band",
    "Marker",
    "Panel",
    "RunSeries",
    "build_figure",
    "decimate",
    "ema",
    "from_analysis",
    "logged_points",
    "point_step",
    "run_color",
    "slice_steps",
]
