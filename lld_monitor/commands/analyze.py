"""``lld-monitor analyze PATH [--json] [--html OUT]``: post-hoc analysis of any logged run."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import pandas as pd

from lld_monitor import columns as C
from lld_monitor.importers import FORMATS, ImportFormatError, load_table


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register PATH, --json and --html."""
    parser.add_argument(
        "path",
        help="run folder, CSV/Parquet/JSONL table, trainer_state.json, console or notebook log, "
        "W&B history CSV, TensorBoard folder, or verl console/file log",
    )
    parser.add_argument(
        "--json", action="store_true", help="print exactly one JSON object (the analysis)"
    )
    parser.add_argument(
        "--html", metavar="OUT", help="write a self-contained HTML report (plotly) to OUT"
    )


def run(args: argparse.Namespace) -> int:
    """Load, analyse, print. Exit 2: unreadable or unknown file; 1: cannot analyse or write."""
    try:
        df = load_table(args.path)
    except ImportFormatError as exc:
        print(f"lld-monitor analyze: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    from lld_monitor.analysis import analyze_run

    try:
        analysis = analyze_run(df)
    except ValueError as exc:  # the table was read but cannot be analysed (e.g. too few rows)
        print(
            f"lld-monitor analyze: cannot analyse {args.path}: {_one_line(str(exc))}",
            file=sys.stderr,
        )
        return 1
    if args.html:
        from lld_monitor.report import write_report

        try:
            out = write_report(df, analysis, args.html, title=f"lld_monitor: {args.path}")
        except OSError as exc:
            print(
                f"lld-monitor analyze: cannot write {args.html}: {_one_line(str(exc))}",
                file=sys.stderr,
            )
            return 1
        print(f"lld-monitor analyze: wrote {out}", file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(analysis.to_dict()))
    else:
        print(summary_text(df, analysis))
    return 0


def summary_text(df: pd.DataFrame, analysis: Any) -> str:
    """The human-readable summary: format, steps, phases, alerts, collapse, signals."""
    fmt = df.attrs.get("source_format", "?")
    lines = [
        f"source:   {df.attrs.get('source_path', '?')}",
        f"format:   {fmt} ({FORMATS.get(fmt, 'unknown')})",
        f"steps:    {len(df)} rows, step {int(df[C.STEP].iloc[0])} to {int(df[C.STEP].iloc[-1])}"
        f" (step from {df.attrs.get('step_source', '?')})",
        "phases:",
    ]
    phases = list(analysis.phases)
    if not phases:
        lines.append("  (none)")
    for seg in phases:
        lines.append(f"  {seg.phase:<11} steps {seg.start_step}-{seg.end_step}")
    alerts = list(analysis.alerts)
    lines.append(f"alerts:   {len(alerts)}")
    for a in alerts:
        lines.append(f"  step {a.step} [{a.severity}] {a.kind}: {a.message}")
    collapse = analysis.collapse_step
    lines.append(f"collapse: {'none detected' if collapse is None else f'step {collapse}'}")
    lines.append(f"signals used:    {', '.join(analysis.signals_used) or 'none'}")
    lines.append(f"signals missing: {', '.join(analysis.signals_missing) or 'none'}")
    for note in getattr(analysis, "notes", None) or []:
        lines.append(f"  note: {note}")
    unmapped = df.attrs.get("unmapped_columns") or []
    if unmapped:
        shown = ", ".join(unmapped[:8]) + (
            f", ... ({len(unmapped)} in all)" if len(unmapped) > 8 else ""
        )
        lines.append(f"not used (no canonical name): {shown}")
    return "\n".join(lines)


def _one_line(text: str) -> str:
    return " ".join(text.split())
