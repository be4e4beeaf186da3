"""``lld-monitor analyze DIR`` on a folder of many runs: one line per run, the worst first.

The verdicts come from ``lld_monitor.analysis.triage`` (the dashboard's run picker shows the same);
this module prints them: a table, or ``--json``, and ``--fail-on`` over all runs.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from lld_monitor import columns as C
from lld_monitor.analysis.triage import (
    LOG_SUFFIXES,
    MAYBE_LOG_SUFFIXES,
    VERDICTS,
    RunVerdict,
    candidates,
    is_collection_of_runs,
    is_folder_of_runs,
    sort_key,
    triage,
    triage_one,
    verdict_word,
)

__all__ = [
    "LOG_SUFFIXES",
    "MAYBE_LOG_SUFFIXES",
    "VERDICTS",
    "RunVerdict",
    "candidates",
    "is_collection_of_runs",
    "is_folder_of_runs",
    "run_triage",
    "sort_key",
    "table_text",
    "triage",
    "triage_one",
]


def table_text(root: Path, verdicts: Sequence[RunVerdict]) -> str:
    """The triage as text: a count line, one line per run, then the skipped files."""
    runs = [v for v in verdicts if v.verdict not in ("skipped", "summary")]
    counts = {k: sum(v.verdict == k for v in runs) for k in VERDICTS}
    head = ", ".join(f"{n} {verdict_word(k)}" for k, n in counts.items() if n)
    lines = [f"{root}: {len(runs)} runs ({head or 'none'})"]
    width = max((len(v.name) for v in runs), default=4)
    lines.append(
        f"  {'verdict':<10} {'run':<{width}}  {'worst alert':<28} {'phase':<11} "
        f"{'last step':>9}  format"
    )
    for v in runs:
        if v.verdict == "unreadable":
            lines.append(f"  {v.verdict:<10} {v.name:<{width}}  {v.error}")
            continue
        worst = f"{v.worst['kind']} at step {v.worst['step']}" if v.worst else "-"
        last = "-" if v.last_step is None else str(v.last_step)
        lines.append(
            f"  {verdict_word(v.verdict):<10} {v.name:<{width}}  {worst:<28} "
            f"{v.phase or '-':<11} {last:>9}  {v.format}" + (f"  ({v.reason})" if v.reason else "")
        )
    summaries = [v.name for v in verdicts if v.verdict == "summary"]
    if summaries:
        lines.append(
            "  summaries (meta, events and end-of-run summary kept, no step rows): "
            + ", ".join(summaries)
        )
    skipped = [v.name for v in verdicts if v.verdict == "skipped"]
    if skipped:
        lines.append(f"  skipped (they read, but log no training metric): {', '.join(skipped)}")
    return "\n".join(lines)


def run_triage(path: Path, *, as_json: bool, fail_on: str | None, jobs: int | None = None) -> int:
    """Print the triage of a folder of runs. Exit 0; 1 with ``fail_on`` when some run has an
    alert of at least that severity."""
    import json

    verdicts = triage(
        path, progress=sys.stderr if not os.environ.get("LLD_NO_PROGRESS") else None, jobs=jobs
    )
    if as_json:
        print(
            json.dumps(
                {
                    "folder": str(path),
                    "runs": [v.to_dict() for v in verdicts if v.verdict != "skipped"],
                    "skipped": [v.name for v in verdicts if v.verdict == "skipped"],
                    "counts": {k: sum(v.verdict == k for v in verdicts) for k in VERDICTS[:-1]},
                }
            )
        )
    else:
        print(table_text(path, verdicts))
    if fail_on is not None:
        rank = {s: i for i, s in enumerate(C.SEVERITIES)}
        least = rank[fail_on]
        if any(rank.get(s, -1) >= least for v in verdicts for s in v.alert_severities):
            return 1
    return 0
