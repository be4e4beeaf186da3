"""Views of a run: the one chart definition (``charts``) and the HTML report (``html``).

The dashboard draws the same figure as the report; neither recomputes a metric. No torch here.
"""

from __future__ import annotations

from lld_monitor.report.html import REPORT_MAX_POINTS, build_figure, write_report

__all__ = ["REPORT_MAX_POINTS", "build_figure", "write_report"]
