"""Triage of a folder of many runs: one verdict per run, the worst first (``lld-monitor analyze
DIR`` prints it, ``cli/triage.py``; the dashboard's run picker shows it).

"Which of my 40 runs are in trouble, and since when?" Every run under the folder (our run folders,
TRL output folders, W&B / TensorBoard / trainer_state / console logs, notebooks, mixed) is loaded
and analysed on its own; each gets a verdict (``collapsed``: a critical collapse alert or a
collapse step; ``critical`` / ``warning``: its worst alert; ``cant_tell``: no alert, but the run
lacks what a verdict needs, with the reason; ``healthy``; ``unreadable``: with its error, which
never stops the rest), its worst alert with the step, its phase at the end, its last
step and format. Sorted by verdict, then by the step of the worst alert's first sighting (the
latest first), then by name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from lld_monitor import columns as C
from lld_monitor.importers.catalog import (
    LOG_SUFFIXES,
    MAYBE_LOG_SUFFIXES,
    candidates,
    entry_name,
    is_folder_of_runs,
)
from lld_monitor.importers.load import NO_ROWS as _NO_ROWS  # (load_table's message)

__all__ = [
    "LOG_SUFFIXES",
    "MAYBE_LOG_SUFFIXES",
    "VERDICTS",
    "RunVerdict",
    "analyse_one",
    "candidates",
    "cant_tell",
    "folder_runs",
    "is_collection_of_runs",
    "is_folder_of_runs",
    "one_run_in",
    "sort_key",
    "triage",
    "triage_file",
    "triage_one",
    "verdict_of",
    "verdict_word",
    "worst_alert",
]

#: Verdicts, worst first (the sort order of the table).
VERDICTS: tuple[str, ...] = (
    "collapsed",
    "critical",
    "warning",
    "cant_tell",
    "healthy",
    "unreadable",
    "summary",
    "skipped",
)


def verdict_word(verdict: str) -> str:
    """A verdict as people read it (``cant_tell``: "can't tell"; the rest as they are): the
    triage's text and the dashboard's picker say the same word."""
    return "can't tell" if verdict == "cant_tell" else verdict


@dataclass
class RunVerdict:
    """One run's line of the triage table."""

    name: str
    path: str
    verdict: str
    format: str | None = None
    rows: int = 0
    last_step: int | None = None
    phase: str | None = None
    worst: dict[str, Any] | None = None  # {"kind", "severity", "step", "message"}
    error: str | None = None
    alert_severities: list[str] = field(default_factory=list)
    reason: str | None = None  # why "cant_tell": what the run lacks for a verdict

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": self.path,
            "verdict": self.verdict,
            "format": self.format,
            "rows": self.rows,
            "last_step": self.last_step,
            "phase": self.phase,
            "worst_alert": self.worst,
            "alerts": len(self.alert_severities),
            "error": self.error,
            "reason": self.reason,
        }


def is_collection_of_runs(path: Path) -> bool:
    """A folder of two or more runs, or one file that holds several runs (runs appended to one
    log, a W&B export of several runs). A folder of one run is that run (``one_run_in``)."""
    if path.is_file():
        from lld_monitor.importers.load import runs_in_file

        return len(runs_in_file(path)) > 1
    return len(folder_runs(path)) > 1


def folder_runs(path: Path) -> list[Any]:
    """The catalog's entries (``importers.catalog.CatalogEntry``) of a folder that is not itself
    one run but holds runs; [] for anything else. Two or more: a triage; one: that run."""
    if not is_folder_of_runs(path):
        return []
    from lld_monitor.importers.catalog import catalog

    return catalog(path)[0]


def one_run_in(path: Path, entries: list[Any] | None = None) -> tuple[Path, str | None] | None:
    """(path, run) of the one run a folder holds when it holds exactly one and is not itself
    one run (a folder of one log file, a log dir whose one run lies in ``runs/NAME/``), else
    None: ``lld-monitor analyze`` analyses such a folder as that run; the triage is for two or
    more. ``entries``: ``folder_runs(path)`` when the caller has it (not listed again)."""
    entries = folder_runs(path) if entries is None else entries
    if len(entries) != 1:
        return None
    return entries[0].path, entries[0].run


def triage_one(path: Path, root: Path, run: str | None = None, *, jobs: int = 1) -> RunVerdict:
    """Load and analyse one run (``run``: one of the runs a file holds); never raises (an
    unreadable run gets its error). ``jobs``: ``analyze_run``'s (1 in the pool's workers)."""
    return analyse_one(path, root, run, jobs=jobs)[0]


def analyse_one(
    path: Path, root: Path, run: str | None = None, table: Any = None, *, jobs: int = 1
) -> tuple[RunVerdict, Any]:
    """``triage_one``'s verdict and the analysis behind it (None when the run did not read or
    analyse): a caller that also shows the run (the dashboard) needs not analyse it again.
    ``table``: the run's step table when the caller has read it already (not read again).
    ``jobs``: ``analyze_run``'s (2: a long run's replay may use a second process)."""
    from lld_monitor.analysis import analyze_run
    from lld_monitor.importers import load_table

    name = entry_name(path, root, run)
    try:
        df = load_table(path, run=run) if table is None else table
        analysis = analyze_run(df, jobs=jobs)
    except Exception as exc:  # one bad run never stops the triage: its line says why
        message = " ".join(str(exc).split()) or type(exc).__name__
        from lld_monitor.runlog import RunSummaryError

        cause: BaseException | None = exc
        while cause is not None and not isinstance(cause, RunSummaryError):
            cause = cause.__cause__
        if cause is not None:  # kept without its step rows, on purpose
            return RunVerdict(name, str(path), "summary", error=str(cause)), None
        if path.is_file() and _NO_ROWS in message:
            # a loose file that reads but logs no training metric (a config, a timing file)
            return RunVerdict(name, str(path), "skipped", error=message), None
        return RunVerdict(name, str(path), "unreadable", error=message), None
    return verdict_of(name, path, df, analysis), analysis


def worst_alert(alerts: Sequence[Any]) -> Any | None:
    """The worst of ``alerts`` (anything with ``severity`` and ``step``: ``Alert``s, the
    dashboard's markers): the highest severity, and of those the first sighting (the smallest
    step; the first given on a tie). The one rule of the triage's "worst alert", the picker's and
    the dashboard header's; None for no alert."""
    rank = {s: i for i, s in enumerate(C.SEVERITIES)}
    if not alerts:
        return None
    top = max(rank.get(a.severity, 0) for a in alerts)
    return min((a for a in alerts if rank.get(a.severity, 0) == top), key=lambda a: a.step)


def verdict_of(name: str, path: Path, df: Any, analysis: Any) -> RunVerdict:
    """The verdict of a run already read (``df``) and analysed: the one rule the triage, the
    picker and the dashboard's header use."""
    alerts = list(analysis.alerts)
    first = worst_alert([a for a in alerts if a.severity in ("warning", "critical")])
    worst = None
    if first is not None:
        worst = {
            "kind": first.kind,
            "severity": first.severity,
            "step": int(first.step),
            "message": first.message,
        }
    collapsed = analysis.collapse_step is not None or any(
        a.kind == "collapse" and a.severity == "critical" for a in alerts
    )
    verdict = "collapsed" if collapsed else (worst["severity"] if worst is not None else "healthy")
    reason = cant_tell(path, df) if verdict == "healthy" else None
    if reason is not None:
        verdict = "cant_tell"
    phases = list(analysis.phases)
    result = RunVerdict(
        name,
        str(path),
        verdict,
        format=df.attrs.get("source_format"),
        rows=len(df),
        last_step=int(df[C.STEP].iloc[-1]) if len(df) else None,
        phase=phases[-1].phase if phases else None,
        worst=worst,
        alert_severities=[a.severity for a in alerts],
        reason=reason,
    )
    return result


def cant_tell(path: Path, df: Any) -> str | None:
    """Why a run with no alert cannot be called healthy, or None when it can: no reward
    logged; too few rows with a reward (the collapse test judges from the row after
    ``stats.GLR_MIN_REF`` differences, so a run of fewer than twice that many rows was mostly
    not judged); an lld_monitor run folder never closed (no ``closed.json``: still running,
    crashed or killed)."""
    from lld_monitor.analysis.stats import GLR_MIN_REF

    n = int(df[C.REWARD_MEAN].notna().sum()) if C.REWARD_MEAN in df.columns else 0
    if n == 0:
        return "no reward logged: the collapse test has nothing to judge"
    if n < 2 * GLR_MIN_REF:
        return (
            f"too short: {n} rows with a reward (the collapse test judges rows from the "
            f"{GLR_MIN_REF + 1}th, with the run's own noise: {2 * GLR_MIN_REF} rows at the "
            "least for it to have judged most of the run)"
        )
    if df.attrs.get("source_format") == "lld_run" and path.is_dir():
        from lld_monitor.runlog import CLOSED_FILE

        if not (path / CLOSED_FILE).is_file():
            return f"not closed: still running, crashed or killed (no {CLOSED_FILE})"
    return None


def sort_key(v: RunVerdict) -> tuple[int, int, str]:
    step = v.worst["step"] if v.worst else -1
    return (VERDICTS.index(v.verdict), -step, v.name)


#: Fewer runs than this are analysed in this process (a worker's start costs about a second).
PARALLEL_MIN_RUNS = 4


def default_jobs() -> int:
    """Worker processes for a triage: the cores this process may use (at most 8)."""
    import os

    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(cores, 8))


def triage(
    root: Path, *, progress: TextIO | None = None, jobs: int | None = None
) -> list[RunVerdict]:
    """Every run under ``root`` (a folder, or a file that holds several runs: a W&B export of
    several runs), analysed and sorted worst first (loose files that read but log
    no training metric, a config or a timing file, come last as ``skipped``). ``progress``: a
    stream that gets a progress line once the triage has taken more than a second. ``jobs``:
    worker processes (default: the cores, ``default_jobs``); runs are analysed in parallel
    from ``PARALLEL_MIN_RUNS`` runs on, each read and parsed once, in its worker."""
    from lld_monitor.importers.catalog import catalog
    from lld_monitor.importers.load import runs_in_file

    entries: list[tuple[Path, str | None]] = []
    if root.is_dir():
        entries = [(e.path, e.run) for e in catalog(root)[0]]
    else:
        entries = [(root, r) for r in runs_in_file(root)] or [(root, None)]
    base = root if root.is_dir() else root.parent
    jobs = default_jobs() if jobs is None else max(1, int(jobs))
    from lld_monitor.analysis.offline import progress_line

    line = progress_line(progress, "triage", "runs analysed")

    def tick(i: int) -> None:
        line(i, len(entries))

    # the runs of one file go together: the file is parsed once for all of them (load_runs)
    groups: dict[Path, list[str | None]] = {}
    for path, run in entries:
        groups.setdefault(path, []).append(run)
    out: list[RunVerdict] = []
    if jobs > 1 and len(entries) >= PARALLEL_MIN_RUNS:
        out = _triage_parallel(list(groups.items()), base, jobs, tick)
    else:
        # (one run at a time here: a long one's replay may use a second of the jobs)
        for path, runs in groups.items():
            out += triage_file(path, base, runs, jobs=min(jobs, 2))
            tick(len(out))
    return sorted(out, key=sort_key)


def triage_file(
    path: Path, base: Path, runs: list[str | None], *, jobs: int = 1
) -> list[RunVerdict]:
    """``triage_one`` of each of ``runs`` of one file; a file of several runs is read once for
    all of them (``load.load_runs``); if that fails each run is read on its own, so that each
    line says what is wrong with it."""
    if len(runs) < 2 or None in runs:
        return [triage_one(path, base, run, jobs=jobs) for run in runs]
    from lld_monitor.importers.load import load_runs

    try:
        tables = dict(load_runs(path))
    except Exception:  # (each run's own reading says why)
        tables = {}
    return [analyse_one(path, base, run, tables.get(str(run)), jobs=jobs)[0] for run in runs]


def _triage_parallel(
    entries: list[tuple[Path, list[str | None]]], base: Path, jobs: int, tick: Any
) -> list[RunVerdict]:
    """``triage_file`` of every file (its runs) in ``jobs`` worker processes; a worker that
    dies (out of memory) leaves its runs ``unreadable`` with the reason, never stops the rest."""
    import concurrent.futures as cf
    import multiprocessing as mp

    method = "fork" if "fork" in mp.get_all_start_methods() else None
    ctx = mp.get_context(method) if method else None
    out: list[RunVerdict] = []
    workers = min(jobs, len(entries))
    # (a worker per core already: a long run's replay stays in its worker, jobs=1)
    with cf.ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        futures = {pool.submit(triage_file, p, base, rs, jobs=1): (p, rs) for p, rs in entries}
        for fut in cf.as_completed(futures):
            path, runs = futures[fut]
            try:
                out += fut.result()
            except Exception as exc:  # the worker process itself failed
                for run in runs:
                    name = entry_name(path, base, run)
                    out.append(
                        RunVerdict(name, str(path), "unreadable", error=f"worker failed: {exc}")
                    )
            tick(len(out))
    return out
