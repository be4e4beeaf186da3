"""``lld-monitor analyze PATH [--json] [--run N] [--html OUT] [--fail-on SEVERITY]``: post-hoc
analysis of any logged run."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np
import pandas as pd

from lld_monitor import columns as C
from lld_monitor.analysis.advice import actions, alert_record, headline
from lld_monitor.analysis.stats import plain_json
from lld_monitor.importers import FORMATS, ImportFormatError, load_table
from lld_monitor.runlog import table_story

#: ``--json``'s ``schema_version``: 2 since each alert has headline, since_step, actions, repeats.
JSON_SCHEMA_VERSION = 2
#: ``--fail-on`` choices; an alert fails the run when its severity ranks at least as high
FAIL_ON: tuple[str, ...] = ("warning", "critical")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register PATH, --json, --run, --details, --html, --fail-on and --jobs."""
    parser.add_argument(
        "path",
        help="run folder, CSV/Parquet/JSONL table, trainer_state.json, console or notebook log, "
        "W&B history CSV, TensorBoard folder, or verl console/file log; a folder of runs: one "
        "line per run, the worst first (triage)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print exactly one JSON object (the analysis)"
    )
    parser.add_argument(
        "--run",
        metavar="N",
        default=None,
        help="one run of a file that holds several: a log with runs appended one after another "
        "(1 = the first in the file; analysing the file lists them), a W&B export's run by name, "
        "or a notebook's training table by number (default there: the last with a reward)",
    )
    parser.add_argument(
        "--details",
        action="store_true",
        help="under each alert, every suggested action and the evidence behind it (the "
        "default: its one-line headline and the first thing to do)",
    )
    parser.add_argument(
        "--html", metavar="OUT", help="write a self-contained HTML report (plotly) to OUT"
    )
    parser.add_argument(
        "--fail-on",
        choices=FAIL_ON,
        default=None,
        metavar="SEVERITY",
        help="exit 1 when an alert of at least this severity (warning or critical) is found, "
        "after printing the analysis as usual (for CI); default: exit 0 whatever is found",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        metavar="N",
        help="a folder of runs: analyse them in N processes (default: the cores, at most 8; "
        "1: one process)",
    )


def run(args: argparse.Namespace) -> int:
    """Load, analyse, print (a folder of runs: the triage, one line per run, ``cli/triage.py``).
    Exit 0: done; 1: (``--fail-on``) an alert of at least that severity was found (in any run
    of a folder); 2: could not analyse (unreadable or unknown file, a table that cannot be
    analysed, a report that cannot be written, a bad option)."""
    if args.html is not None and not args.html.strip():
        print("lld-monitor analyze: --html needs a file name (got an empty one)", file=sys.stderr)
        return 2
    from pathlib import Path

    from lld_monitor.analysis.triage import folder_runs, one_run_in
    from lld_monitor.cli.triage import is_collection_of_runs, run_triage

    folder = Path(args.path)
    run = getattr(args, "run", None)
    # a folder's runs, listed once: two or more are a triage, one is that run
    entries = folder_runs(folder) if run is None and folder.is_dir() else []
    several = len(entries) > 1 if folder.is_dir() else is_collection_of_runs(folder)
    if run is None and several:
        if args.html:
            print(
                f"lld-monitor analyze: {folder} holds several runs (triage: one line per run); "
                "--html applies to one run: pass one of them (or --run NAME)",
                file=sys.stderr,
            )
            return 2
        jobs = getattr(args, "jobs", None)
        if jobs is not None and jobs < 1:
            print("lld-monitor analyze: --jobs must be >= 1", file=sys.stderr)
            return 2
        return run_triage(folder, as_json=args.json, fail_on=args.fail_on, jobs=jobs)
    return_large_frees()
    target, only = folder, one_run_in(folder, entries) if entries else None
    if only is not None:  # (a folder of one run: that run)
        target, run = only
    try:
        df = load_table(target, run=run)
    except ImportFormatError as exc:
        print(f"lld-monitor analyze: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    if only is not None:
        df.attrs["import_notes"] = [
            f"the folder holds one run: read {target.relative_to(folder).as_posix()}",
            *df.attrs.get("import_notes", []),
        ]
    from lld_monitor.analysis import analyze_run
    from lld_monitor.analysis.offline import progress_line

    try:
        # (the command owns its process: a long table's replay may use a second one)
        analysis = analyze_run(
            df, progress=progress_line(sys.stderr, "analyze", "rows analysed"), jobs=2
        )
    except ValueError as exc:  # the table was read but cannot be analysed (e.g. too few rows)
        print(
            f"lld-monitor analyze: cannot analyse {args.path}: {_one_line(str(exc))}",
            file=sys.stderr,
        )
        return 2
    if args.html:
        from lld_monitor.report import write_report

        try:
            out = write_report(df, analysis, args.html, title=f"lld_monitor: {args.path}")
        except OSError as exc:
            print(
                f"lld-monitor analyze: cannot write {args.html}: {_one_line(str(exc))}",
                file=sys.stderr,
            )
            return 2
        print(f"lld-monitor analyze: wrote {out}", file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(json_result(df, analysis)))
    else:
        print(summary_text(df, analysis, details=getattr(args, "details", False)))
    if args.fail_on is not None and failing_alerts(analysis, args.fail_on):
        return 1
    return 0


#: glibc's ``M_MMAP_THRESHOLD`` (``mallopt``) and the value ``return_large_frees`` sets.
_M_MMAP_THRESHOLD = -3
LARGE_BLOCK = 256 << 10


def return_large_frees() -> bool:
    """Have glibc map every block of ``LARGE_BLOCK`` bytes or more on its own, so that it goes
    back to the system when freed. By default glibc raises that threshold each time a big block
    is freed (up to 32 MiB), and a long table's temporaries (parser chunks, conversions) then
    stay resident after use: 15-20 MB more at the peak of a 1M-row analysis. For a process
    that reads one long table (``analyze``); True when set, False where there is no glibc."""
    try:
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, LARGE_BLOCK))


def failing_alerts(analysis: Any, fail_on: str) -> list[Any]:
    """The alerts whose severity ranks at least ``fail_on`` (info < warning < critical)."""
    rank = {s: i for i, s in enumerate(C.SEVERITIES)}
    least = rank[fail_on]
    return [a for a in analysis.alerts if rank.get(a.severity, -1) >= least]


def summary_text(df: pd.DataFrame, analysis: Any, *, details: bool = False) -> str:
    """The human-readable summary: format, steps, phases, alerts, collapse, signals. Each alert
    is its headline and the first thing to do; ``details``: every action and the evidence."""
    fmt = df.attrs.get("source_format", "?")
    lines = [
        f"source:   {df.attrs.get('source_path', '?')}",
        f"format:   {fmt} ({FORMATS.get(fmt, 'unknown')})",
        *(
            f"not read: {other} (analyze that path to read it)"
            for other in df.attrs.get("other_sources") or []
        ),
        f"steps:    {len(df)} rows, step {int(df[C.STEP].iloc[0])} to {int(df[C.STEP].iloc[-1])}"
        f" ({df.attrs.get('step_source', '?')}: {df.attrs.get('step_note') or '?'})",
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
        lines.append(f"  step {a.step} [{a.severity}] {a.kind}: {headline(a)}")
        todo = actions(a)
        if todo:
            lines.append(f"    do now: {todo[0]}")
        if details:
            lines += [f"    then:   {t}" for t in todo[1:]]
            lines.append(f"    why:    {a.message}")
    lines.append(f"collapse: {collapse_line(analysis)}")
    lines.append(f"signals used:    {', '.join(analysis.signals_used) or 'none'}")
    lines.append(f"signals missing: {', '.join(analysis.signals_missing) or 'none'}")
    told = table_story(df)
    if told:
        lines.append("story:")
        lines += [f"  {line}" for line in told]
    for note in all_notes(df, analysis):
        lines.append(f"  note: {note}")
    unmapped = df.attrs.get("unmapped_columns") or []
    if unmapped:
        shown = ", ".join(unmapped[:8]) + (
            f", ... ({len(unmapped)} in all)" if len(unmapped) > 8 else ""
        )
        lines.append(f"not used (no canonical name): {shown}")
    return "\n".join(lines)


def json_result(df: pd.DataFrame, analysis: Any) -> dict[str, Any]:
    """The ``--json`` object: the analysis plus what the text says about the input."""
    out = analysis.to_dict()
    # every alert with the numbers behind it (a CI script need not parse the message)
    out["alerts"] = [plain_json(alert_record(a)) for a in analysis.alerts]
    return {
        "schema_version": JSON_SCHEMA_VERSION,
        **out,
        "source": str(df.attrs.get("source_path", "")),
        "format": df.attrs.get("source_format"),
        "other_sources": list(df.attrs.get("other_sources") or []),
        "rows": len(df),
        "first_step": int(df[C.STEP].iloc[0]) if len(df) else None,
        "last_step": int(df[C.STEP].iloc[-1]) if len(df) else None,
        "step_source": df.attrs.get("step_source"),
        "step_note": df.attrs.get("step_note"),
        "notes": all_notes(df, analysis),
        "story": table_story(df),
        "unmapped_columns": list(df.attrs.get("unmapped_columns") or []),
    }


def all_notes(df: pd.DataFrame, analysis: Any) -> list[str]:
    """The importer's notes (what was dropped or changed), a warm-up note, the analyzer's notes."""
    notes = list(df.attrs.get("import_notes") or [])
    warm = warmup_note(analysis, df)
    if warm:
        notes.append(warm)
    return notes + list(getattr(analysis, "notes", None) or [])


def warmup_note(analysis: Any, df: pd.DataFrame) -> str | None:
    """What a leading 'unknown' phase means when the detector's warm-up explains it, else None."""
    phases = list(getattr(analysis, "phases", None) or [])
    if not phases or phases[0].phase != "unknown" or df.empty:
        return None
    from lld_monitor.analysis.detector import DetectorConfig

    cfg = DetectorConfig()
    steps = df[C.STEP].to_numpy()  # (sorted: the importers sort them)
    # the first row with warmup_steps steps since the first and warmup_rows rows (a search:
    # no mask as long as the run)
    first = max(
        int(np.searchsorted(steps, steps[0] + cfg.warmup_steps, side="left")),
        cfg.warmup_rows - 1,
    )
    rule = f"{cfg.warmup_steps} steps and {cfg.warmup_rows} rows"
    seg = phases[0]
    # the reward's collapse test is not held back by the warm-up: it says so, with its reach
    from lld_monitor.analysis.stats import GLR_MIN_REF

    judged = (
        f"the reward's collapse test judged every row from the {GLR_MIN_REF + 1}th (a level "
        "change needs 8 row differences for the run's own noise)"
    )
    if first >= len(steps):
        return (
            f"this run ({len(df)} rows, steps {steps[0]}-{steps[-1]}) is shorter than the "
            f"trend detector's warm-up ({rule}): the LLD phases (stagnation, decay) would take "
            f"logp_correct over steps {steps[0]}-{steps[0] + cfg.warmup_steps + cfg.window_steps}"
            f"; {judged}"
        )
    end = int(steps[first])  # the first step the detector judges
    if seg.end_step <= end + cfg.window_steps:
        return (
            f"'unknown' at steps {seg.start_step}-{seg.end_step} is the trend detector's "
            f"warm-up ({rule}, then a {cfg.window_steps}-step trend window); {judged}"
        )
    return (
        f"steps {seg.start_step}-{end} are the detector's warm-up ({rule}); 'unknown' after "
        "it means the logged signals do not decide a phase (see the notes on missing signals)"
    )


def _one_line(text: str) -> str:
    return " ".join(text.split())


#: Alerts of a run that failed outright without a collapse of the reward (not LLD).
FAILED_KINDS: tuple[str, ...] = ("mode_collapse", "nonfinite")


def collapse_line(analysis: Any) -> str:
    """The ``collapse:`` line: the step, or what else failed outright, or that none was seen
    (a mode collapse can hold the reward while the run is dead: it is named here too)."""
    if analysis.collapse_step is not None:
        from lld_monitor.analysis.offline import collapse_text

        return f"step {analysis.collapse_step} ({collapse_text(analysis)})"
    failed = [a for a in analysis.alerts if a.kind in FAILED_KINDS]
    if failed:
        first = failed[0]
        return f"none in the reward; {first.kind} at step {first.step} ({first.severity}, not LLD)"
    return "none detected"
