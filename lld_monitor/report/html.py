"""Self-contained HTML report of an analysed run: plotly panels, phases shaded, alerts marked.

The HTML inlines plotly.js (no CDN, no network), so the file opens anywhere, offline.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import pandas as pd

from lld_monitor import columns as C

#: Points per trace at most in the report (min/max decimation keeps spikes; a file stays small).
REPORT_MAX_POINTS = 5000


def build_figure(df: pd.DataFrame, analysis: Any, title: str = "lld_monitor report") -> Any:
    """The run's figure as ``report.charts`` defines it (the dashboard draws the same one).

    Raw values (no smoothing), phases shaded, alerts on the phase strip, collapse as a red line.
    """
    from lld_monitor.report import charts

    if C.STEP not in df.columns:
        raise ValueError(f"the table has no {C.STEP!r} column: load it with importers.load_table")
    name = str(getattr(df, "attrs", {}).get("source_path", "run"))
    name = Path(name).name or name
    series = charts.from_analysis(name, df, analysis)
    logged = _logged_markers(df)
    if logged:  # (an lld_monitor run: its interventions as stars, its errors, on the strip)
        markers = sorted((*series.markers, *logged), key=lambda m: m.step)
        series = charts.RunSeries(series.name, series.steps, series.bands, tuple(markers))
    return charts.build_figure(
        [series],
        ema_weight=0.0,
        max_points=REPORT_MAX_POINTS,
        title=title,
        collapse_steps=[getattr(analysis, "collapse_step", None)],
    )


def _logged_markers(df: pd.DataFrame) -> list[Any]:
    """The interventions and errors an lld_monitor run folder logged (``events.jsonl``), as the
    dashboard marks them; [] for a foreign log or a run whose events cannot be read."""
    from lld_monitor.report.charts import Marker
    from lld_monitor.runlog import load_run

    path = Path(str(df.attrs.get("source_path", "")))
    if df.attrs.get("source_format") != "lld_run" or not path.is_dir():
        return []
    try:
        ev = load_run(path, warn=False).events
    except (OSError, ValueError):
        return []
    out = []
    for rec in ev.to_dict("records") if len(ev) else []:
        step, typ = rec.get(C.EVENT_STEP), str(rec.get(C.EVENT_TYPE))
        if typ in ("intervention", "error") and step is not None and step == step:
            sev = str(rec.get(C.EVENT_SEVERITY) or "info")
            out.append(
                Marker(
                    float(step),
                    typ,
                    str(rec.get(C.EVENT_KIND)),
                    sev,
                    str(rec.get(C.EVENT_MESSAGE) or ""),
                    "run log",
                )
            )
    return out


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
        f"({html.escape(str(attrs.get('source_format', '?')))}), {len(df)} steps; "
        f"{html.escape(str(attrs.get('step_note') or 'step as given'))}</p>",
        f"<p>collapse: {html.escape(_collapse_text(analysis))}</p>",
        "<p>signals used: "
        + html.escape(", ".join(getattr(analysis, "signals_used", []) or []) or "none")
        + "<br>signals missing: "
        + html.escape(", ".join(getattr(analysis, "signals_missing", []) or []) or "none")
        + "</p>",
    ]
    from lld_monitor.runlog import table_story

    told = table_story(df) if isinstance(df, pd.DataFrame) else []
    if told:  # (an lld_monitor run: interventions, warnings, errors, resumes, its ending)
        lines.append(
            '<p class="lld-story">story:<br>'
            + "<br>".join(html.escape(str(t)) for t in told)
            + "</p>"
        )
    notes = [*(attrs.get("import_notes") or []), *(getattr(analysis, "notes", None) or [])]
    if notes:
        lines.append("<p>notes:<br>" + "<br>".join(html.escape(str(n)) for n in notes) + "</p>")
    alerts = list(getattr(analysis, "alerts", []) or [])
    if alerts:
        from lld_monitor.analysis.advice import actions, headline

        items = "".join(
            f'<li class="lld-alert">step {a.step} [{html.escape(a.severity)}] '
            f"{html.escape(a.kind)}: {html.escape(headline(a))}"
            "<details><summary>what to do now, and the evidence</summary><ol>"
            + "".join(f"<li>{html.escape(t)}</li>" for t in actions(a))
            + f"</ol><p>{html.escape(a.message)}</p></details></li>"
            for a in alerts
        )
        lines.append(f"<ul>{items}</ul>")
    return '<div style="font-family: sans-serif; margin: 1em">' + "".join(lines) + "</div>"


def _collapse_text(analysis: Any) -> str:
    """'step N (what each collapse number means)', or 'none detected' (as the CLI summary says),
    never Python's 'None'."""
    from lld_monitor.analysis.offline import collapse_text

    step = getattr(analysis, "collapse_step", None)
    if step is None:
        return "none detected"
    said = collapse_text(analysis)
    return f"step {step}" + (f" ({said})" if said else "")
