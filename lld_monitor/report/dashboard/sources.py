"""What the dashboard may read, and the live state of each run it shows.

Reads only through ``lld_monitor.runlog`` (our run folders, incrementally),
``lld_monitor.importers`` (foreign logs) and ``lld_monitor.analysis`` (phases, alerts). Every path
it opens is either one the user named on the command line or one found under ROOT and checked to
resolve inside it.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lld_monitor import columns as C
from lld_monitor import runlog
from lld_monitor.events import Alert
from lld_monitor.report.charts import Band, Marker
from lld_monitor.report.dashboard import service
from lld_monitor.report.dashboard.service import _stat_key
from lld_monitor.runlog import ColumnStore, RunFollower

#: Files larger than this are not read while listing (to leave out one that logs no training
#: metric); they are listed, and can be named as a RUN.
MAX_SNIFF_BYTES = 200_000_000
#: Re-run the offline analysis when the run grew by this factor since the last analysis ...
REANALYZE_GROWTH = 1.25
#: ... or when the last analysis is older than this and rows were added since (seconds).
REANALYZE_AFTER_S = 120.0


# --- command-line arguments of the app --------------------------------------------------------


@dataclass(frozen=True)
class AppArgs:
    """Arguments after ``--`` in ``streamlit run dashboard/app.py -- [ROOT | RUN ...]``."""

    paths: tuple[Path, ...]
    refresh_s: float = 3.0
    stale_s: float = 60.0


def parse_app_args(argv: Sequence[str]) -> AppArgs:
    """Parse the app's own arguments; no path means the current folder as ROOT."""
    parser = argparse.ArgumentParser(prog="dashboard/app.py", add_help=False)
    parser.add_argument("paths", nargs="*")
    parser.add_argument("--refresh", type=float, default=3.0)
    parser.add_argument("--stale", type=float, default=60.0)
    ns, _unknown = parser.parse_known_args(list(argv))
    paths = tuple(Path(p) for p in ns.paths) or (Path.cwd(),)
    return AppArgs(paths=paths, refresh_s=max(ns.refresh, 0.5), stale_s=max(ns.stale, 1.0))


# --- what may be read -------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """A run the dashboard may show: one of our run folders, or a foreign log file/folder."""

    name: str  # label shown and used in ?run=...: path relative to ROOT, or the run's name
    path: Path  # resolved, inside an allowed root
    kind: str  # "run" | "foreign"
    format: str = ""  # importers format name for foreign logs
    run: str | None = None  # one of the runs the file holds (importers.runs_in_file), or None

    @property
    def key(self) -> str:
        """What the caches know the run by: its path, and which of the file's runs."""
        return str(self.path) if self.run is None else f"{self.path}\x00{self.run}"


@dataclass(frozen=True)
class Scope:
    """The runs the user allowed: all under one ROOT, or exactly the RUNs named."""

    roots: tuple[Path, ...]  # resolved; in ROOT mode a single folder
    targets: tuple[Target, ...]
    root_mode: bool
    problems: tuple[str, ...] = ()

    def target(self, name: str) -> Target | None:
        """The target called ``name``; in ROOT mode also a path below ROOT (checked to stay in)."""
        for t in self.targets:
            if t.name == name:
                return t
        if not self.root_mode or not name:
            return None
        root = self.roots[0]
        candidate = resolve_inside(root, name)
        if candidate is None:
            return None
        if runlog.is_run_dir(candidate):
            return Target(_relative_name(candidate, root), candidate, "run")
        return None


def resolve_inside(root: Path, name: str) -> Path | None:
    """``root / name`` resolved (symlinks followed); None when it leaves ``root`` or is absent."""
    if "\x00" in name:
        return None
    try:
        candidate = (root / name).resolve(strict=True)
    except (OSError, RuntimeError):
        return None
    return candidate if candidate.is_relative_to(root) else None


def _relative_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root).as_posix()
    return rel if rel != "." else path.name


def build_scope(paths: Sequence[Path]) -> Scope:
    """ROOT mode for a single folder that is not itself a run; otherwise each path is a RUN."""
    problems: list[str] = []
    resolved: list[Path] = []
    for p in paths:
        try:
            resolved.append(Path(p).resolve(strict=True))
        except (OSError, RuntimeError):
            problems.append(f"{p}: no such file or folder")

    from lld_monitor.importers.catalog import entries_of, is_our_run

    if len(resolved) == 1 and resolved[0].is_dir() and not is_our_run(resolved[0]):
        root = resolved[0]
        targets, found_problems = discover(root)
        return Scope((root,), tuple(targets), True, tuple(problems + found_problems))
    targets = []
    seen: set[str] = set()
    for p in resolved:
        name = p.name
        if name in seen:  # two runs with the same folder name: use parent/name
            name = f"{p.parent.name}/{p.name}"
        seen.add(name)
        targets += [Target(e.name, p, e.kind, "", e.run) for e in entries_of(p, name)]
    return Scope(tuple(resolved), tuple(targets), False, tuple(problems))


def discover(root: Path) -> tuple[list[Target], list[str]]:
    """The runs under ``root``, named as ``lld-monitor analyze ROOT`` names them (the one run
    catalog, ``importers.catalog``), less the loose files that read but log no training metric
    (the triage's ``skipped`` line); a link out of ROOT is not followed."""
    from lld_monitor.importers.catalog import catalog

    entries, problems = catalog(root)
    targets: list[Target] = []
    for entry in entries:
        resolved = resolve_inside(root, entry.path.relative_to(root).as_posix())
        if resolved is None or resolved == root:
            continue
        if entry.kind == "foreign" and resolved.is_file() and _no_rows(resolved, entry.run):
            continue
        targets.append(Target(entry.name, resolved, entry.kind, "", entry.run))
    return targets, problems


_NO_ROWS_CACHE: dict[tuple[str, str | None, float, int], bool] = {}


def _no_rows(path: Path, run: str | None) -> bool:
    """True for a file that reads but logs no training metric (a config, a timing file).

    Cached by (path, run, mtime, size): a log is imported again only when it changed; a file
    over ``MAX_SNIFF_BYTES`` is listed without looking."""
    from lld_monitor import importers
    from lld_monitor.importers.load import NO_ROWS

    try:
        st = path.stat()
    except OSError:
        return False
    if st.st_size > MAX_SNIFF_BYTES:
        return False
    key = (str(path), run, st.st_mtime, st.st_size)
    if key not in _NO_ROWS_CACHE:
        try:
            importers.load_table(path, run=run)
            _NO_ROWS_CACHE[key] = False
        except (ValueError, OSError) as exc:  # importers.ImportFormatError among them
            _NO_ROWS_CACHE[key] = NO_ROWS in str(exc)
    return _NO_ROWS_CACHE[key]


# --- the live state of one run ------------------------------------------------------------------


@dataclass
class Header:
    """The facts of a run's header line, ready to print."""

    phase: str
    phase_source: str
    last_alert: str  # the most severe alert, the latest of those (the header's "Worst alert")
    llds: str
    steps_seen: str
    last_update: str
    status: str
    simulated: bool
    source: str
    signals_missing: tuple[str, ...] = ()
    latest_alert: str = ""  # the latest alert, when it is not the worst one
    collapse: str = ""  # the collapse numbers, each named (analysis.offline.collapse_text)
    alert_actions: tuple[str, ...] = ()  # the worst alert's "what to do now"
    alert_evidence: str = ""  # the worst alert's message: the numbers behind it, in words
    story: tuple[str, ...] = ()  # the run's own story (runlog.run_story); () for a foreign log


@dataclass
class LiveRun:
    """One run as the dashboard follows it: rows read so far, events, analysis, status."""

    target: Target
    clock: Callable[[], float] = time.time
    meta: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    events: pd.DataFrame = field(default_factory=pd.DataFrame)
    analysis: Any = None
    analysis_error: str | None = None
    closed: bool = False
    _store: ColumnStore = field(default_factory=ColumnStore)  # (a foreign log's rows)
    _follower: RunFollower | None = None  # (our run folder's)
    _run: Any = None
    _foreign_key: tuple[float, int] | None = None
    _token_summaries: dict[int, tuple[int, int, int]] = field(default_factory=dict)
    _analysis_rows: int = 0
    _analysis_time: float = 0.0
    _frame: pd.DataFrame | None = None
    _pending: concurrent.futures.Future | None = None

    @property
    def steps(self) -> pd.DataFrame:
        """Every step row read so far, sorted by step (canonical columns first)."""
        if self._follower is not None:
            return self._follower.steps
        if self._frame is None:
            self._frame = self._store.frame()
        return self._frame

    @property
    def n_rows(self) -> int:
        return self._follower.n_rows if self._follower is not None else len(self._store)

    @property
    def last_step(self) -> float:
        """The last step read (-inf before any)."""
        return self._follower.last_step if self._follower is not None else self._store.last_step

    def refresh(self) -> int:
        """Read what was added since the last call; returns the number of new step rows."""
        try:
            if self.target.kind == "run":
                added = self._refresh_run()
            else:
                added = self._refresh_foreign()
        except (ValueError, OSError) as exc:  # RunFormatError / ImportFormatError are ValueErrors
            self.error = _one_line(exc)
            return 0
        except Exception as exc:  # a reader bug must not take the page down: shown, not hidden
            self.error = f"unexpected {type(exc).__name__} while reading: {_one_line(exc)}"
            return 0
        self.error = None
        return added

    def _refresh_run(self) -> int:
        if self._follower is None:
            self._follower = runlog.RunFollower(self.target.path)
            self.meta = dict(self._follower.meta)
            # tokens and file times come from the reader too: no re-read of the steps
            self._run = self._follower.reader
        follower = self._follower
        added = follower.poll()
        self.events = follower.events
        self.closed = follower.finished
        skipped = follower.skipped_lines
        self.notes = (
            [f"skipped {skipped} garbled or torn line(s) in the run log"] if skipped else []
        )
        return added

    def _refresh_foreign(self) -> int:
        from lld_monitor import importers

        key = _stat_key(self.target.path)
        if key == self._foreign_key:
            return 0
        table = importers.load_table(self.target.path, run=self.target.run)
        self._foreign_key = key
        self.meta = {
            "source_format": table.attrs.get("source_format", self.target.format),
            "unmapped_columns": list(table.attrs.get("unmapped_columns", [])),
        }
        # how the steps were found and what the importer dropped: shown under the header
        self.notes = (
            [str(table.attrs.get("step_note") or "")] if table.attrs.get("step_note") else []
        )
        self.notes += [str(n) for n in table.attrs.get("import_notes") or []]
        before = self._store.last_step
        self._store.replace(table)
        self._frame = None
        steps = table[C.STEP].to_numpy(dtype=float) if C.STEP in table else np.array([])
        return int((steps > before).sum()) if len(self._store) else 0

    # --- status ----------------------------------------------------------------------------

    def last_write_time(self) -> float | None:
        """UNIX time of the last write to the run's step log (or foreign log file)."""
        try:
            if self._run is not None:
                return float(self._run.last_modified)
            return _stat_key(self.target.path)[0]
        except OSError:
            return None

    def status(self, stale_s: float) -> str:
        """``live``, ``finished`` (the writer closed the run) or ``finished (stopped growing)``."""
        if self.closed:
            return "finished"
        last = self.last_write_time()
        if last is not None and self.clock() - last > stale_s:
            return "finished (stopped growing)"
        return "live"

    # --- analysis --------------------------------------------------------------------------

    def ensure_analysis(self, *, force: bool = False, finished: bool = False) -> None:
        """Run ``analyze_run`` when missing, forced, much grown, old, or the run just finished.

        The first analysis runs at once (the first render is complete); later ones run in a
        background thread and are picked up by a later refresh, so no refresh waits for an
        O(run length) analysis. Between analyses the run's own event log (alerts and phases
        the live monitor wrote) covers the new rows.
        """
        self._collect_analysis()
        n = self.n_rows
        if n == 0 or self._pending is not None:
            return
        grown = n >= self._analysis_rows * REANALYZE_GROWTH
        old = n > self._analysis_rows and self.clock() - self._analysis_time > REANALYZE_AFTER_S
        done = finished and n != self._analysis_rows
        first = self._analysis_time == 0.0
        if not (force or first or grown or old or done):
            return
        self._analysis_rows = n
        self._analysis_time = self.clock()
        if first:
            pending = service.verdict_future(self.target)
            if pending is not None:  # a long run: the picker's analysis is on its way
                self._pending = pending
                return
            if self.target.key in service._DEFERRED:  # ... or will be (start_background)
                return
            handed = service.take_verdict_analysis(self.target, n, self.last_step)
            if handed is not None:  # the picker's verdict analysed these very rows
                self.analysis, self.analysis_error = handed, None
            else:
                self._take_analysis(_analyze, self.steps)
        else:  # rows are only ever appended past the view, so the frame is safe to share
            self._pending = _analysis_executor().submit(_analyze, self.steps)

    @property
    def analysis_pending(self) -> bool:
        """True while a background analysis is running."""
        return self._pending is not None and not self._pending.done()

    @property
    def awaiting_first_analysis(self) -> bool:
        """True while a long run's first analysis is in the worker or about to go there."""
        if self.analysis is not None or self.analysis_error is not None:
            return False
        return self.analysis_pending or self.target.key in service._DEFERRED

    def wait_analysis(self, timeout: float | None = None) -> None:
        """Block until a background analysis is done and take its result (tests, benchmarks)."""
        if self._pending is not None:
            concurrent.futures.wait([self._pending], timeout=timeout)
        self._collect_analysis()

    def _collect_analysis(self) -> None:
        if self._pending is not None and self._pending.done():
            future, self._pending = self._pending, None
            self._take_analysis(_analysis_of, future)

    def _take_analysis(self, fn: Callable[..., Any], *args: Any) -> None:
        try:
            self.analysis = fn(*args)
            self.analysis_error = None
        except ImportError as exc:
            self.analysis_error = f"the analyzer is not available ({_one_line(exc)})"
        except (ValueError, KeyError, TypeError) as exc:
            self.analysis_error = f"analysis failed: {_one_line(exc)}"
        except Exception as exc:  # an analyzer bug: shown in the header, the charts still draw
            self.analysis_error = f"analysis failed ({type(exc).__name__}): {_one_line(exc)}"

    # --- what to draw ----------------------------------------------------------------------

    def bands(self) -> tuple[Band, ...]:
        """Phase segments of the offline analysis (``charts.from_analysis``), extended by phase
        events logged after it."""
        out = list(self._analysed().bands)
        covered = max((b.end_step for b in out), default=-math.inf)
        last_step = self.last_step
        later = [e for e in self._event_records("phase") if e["step"] > covered]
        for i, ev in enumerate(later):
            end = later[i + 1]["step"] if i + 1 < len(later) else last_step
            out.append(Band(ev["kind"], ev["step"], max(end, ev["step"])))
        return tuple(out)

    def markers(self) -> tuple[Marker, ...]:
        """Logged events (alerts, interventions, phases, errors) plus the analyzer's alerts
        (``charts.from_analysis``) that were not logged."""
        from lld_monitor.analysis.advice import actions, headline

        logged = []
        for e in self._event_records(None):
            if e["type"] == "lifecycle":
                continue
            m = Marker(e["step"], e["type"], e["kind"], e["severity"], e["message"], "run log")
            if e["type"] == "alert":
                a = Alert(int(e["step"]), m.kind, m.severity, m.message, e["evidence"])
                m = replace(m, headline=headline(a), actions=actions(a))
            logged.append(m)
        seen = {(m.step, m.kind) for m in logged if m.type == "alert"}
        logged += [m for m in self._analysed().markers if (m.step, m.kind) not in seen]
        return tuple(sorted(logged, key=lambda m: m.step))

    def _analysed(self) -> Any:
        """The analysis as the chart module turns it into bands and markers (no rows needed)."""
        from lld_monitor.report.charts import from_analysis

        return from_analysis(self.target.name, pd.DataFrame(), self.analysis)

    def _event_records(self, event_type: str | None) -> list[dict[str, Any]]:
        ev = self.events
        if ev.empty or C.EVENT_TYPE not in ev or C.EVENT_STEP not in ev:
            return []
        if event_type is not None:
            ev = ev[ev[C.EVENT_TYPE] == event_type]
        out = []
        for rec in ev.to_dict("records"):
            step = rec.get(C.EVENT_STEP)
            if step is None or pd.isna(step):
                continue
            out.append(
                {
                    "step": float(step),
                    "type": str(rec.get(C.EVENT_TYPE, "")),
                    "kind": str(rec.get(C.EVENT_KIND, "")),
                    "severity": str(rec.get(C.EVENT_SEVERITY) or "info"),
                    "message": str(rec.get(C.EVENT_MESSAGE) or ""),
                    "evidence": ev_dict
                    if isinstance(ev_dict := rec.get(C.EVENT_EVIDENCE), dict)
                    else {},
                }
            )
        return out

    def header(self, stale_s: float) -> Header:
        """The run's header facts (phase, last alert, LLDS, steps, last update, status)."""
        phase, phase_source = "unknown", "no analysis yet"
        segs = getattr(self.analysis, "phases", None) or ()
        if segs:
            phase, phase_source = str(segs[-1].phase), "offline analysis"
        covered = float(segs[-1].end_step) if segs else -math.inf
        live_phases = [e for e in self._event_records("phase") if e["step"] > covered]
        if live_phases:
            phase, phase_source = live_phases[-1]["kind"], "run log"
        if self.analysis_error:
            phase_source = self.analysis_error
        elif self.analysis_pending:
            phase_source += " (updating)"
        alerts = [m for m in self.markers() if m.type == "alert"]
        last_alert, latest_alert = "none", ""
        todo: tuple[str, ...] = ()
        why = ""
        from lld_monitor.analysis import triage

        worst = triage.worst_alert(alerts)  # (the picker's rule: first sighting of the worst)
        if worst is not None:
            said = worst.headline or worst.message
            last_alert = f"{worst.kind} ({worst.severity}) at step {worst.step:g}: {said}"
            todo, why = worst.actions, worst.message
            latest = max(alerts, key=lambda m: m.step)
            if latest is not worst:
                latest_alert = f"{latest.kind} ({latest.severity}) at step {latest.step:g}"
        from lld_monitor.analysis.offline import collapse_text

        collapse = (collapse_text(self.analysis) or "") if self.analysis is not None else ""
        steps = self.steps
        n = len(steps)
        steps_seen = f"{n} rows" + (f", last step {int(steps[C.STEP].iloc[-1])}" if n else "")
        last = self.last_write_time()
        last_update = "never" if last is None else _format_time(last, self.clock())
        fmt = self.meta.get("source_format") or self.target.format or "imported"
        source = "lld_monitor run" if self.target.kind == "run" else f"foreign log ({fmt})"
        return Header(
            phase=phase,
            phase_source=phase_source,
            last_alert=last_alert,
            llds=self._llds_text(),
            steps_seen=steps_seen,
            last_update=last_update,
            status=self.status(stale_s),
            simulated=bool(self.meta.get("simulated")),
            source=source,
            signals_missing=tuple(getattr(self.analysis, "signals_missing", None) or ()),
            latest_alert=latest_alert,
            collapse=collapse,
            alert_actions=todo,
            alert_evidence=why,
            story=tuple(self.story()),
        )

    def verdict_text(self) -> str:
        """``✖ collapsed (collapse at step 73)``: the run's verdict by the triage's rule
        (``triage.verdict_of``) on the rows and analysis shown, in the picker's words; while
        the analysis is under way, the picker's verdict (``service.run_verdict``)."""
        from lld_monitor.analysis import triage

        if self.analysis is None or not self.n_rows:
            return header_verdict(service.run_verdict(self.target))
        table = self.steps.copy(deep=False)
        table.attrs["source_format"] = self.meta.get("source_format", "lld_run")
        try:
            v = triage.verdict_of(self.target.name, self.target.path, table, self.analysis)
        except Exception:  # (never takes the header down: the picker's verdict instead)
            return header_verdict(service.run_verdict(self.target))
        return header_verdict(v)

    def story(self) -> list[str]:
        """The run's own story (interventions, warnings, resumes, its ending:
        ``runlog.run_story``) for an lld_monitor run; [] for a foreign log or none read."""
        if self._run is None:
            return []
        from lld_monitor.runlog import run_story

        try:
            return run_story(self._run, self.events, self.n_rows)
        except (OSError, ValueError) as exc:
            return [f"the run's events could not be read: {_one_line(exc)}"]

    def _llds_text(self) -> str:
        steps = self.steps
        if C.LLDS_ENABLED not in steps or steps[C.LLDS_ENABLED].notna().sum() == 0:
            return "not logged"
        enabled = steps[C.LLDS_ENABLED].dropna().iloc[-1]
        config = self.meta.get("config") if isinstance(self.meta.get("config"), dict) else {}
        if not enabled:
            if config.get("auto_llds"):
                kinds = ", ".join(config.get("auto_llds_on") or ()) or "an alert"
                return f"off, armed (auto_llds: on at {kinds})"
            return "off"
        lam = steps[C.LLDS_LAMBDA].dropna() if C.LLDS_LAMBDA in steps else pd.Series(dtype=float)
        on = f"on, λ = {lam.iloc[-1]:g}" if len(lam) else "on"
        switched = [
            e
            for e in self._event_records("intervention")
            if e["kind"] in ("llds_enable", "llds_disable")
        ]
        if switched and switched[-1]["kind"] == "llds_enable":
            on += f" (switched on at step {switched[-1]['step']:g})"
        return on

    # --- drill-down ------------------------------------------------------------------------

    def token_steps(self) -> list[int]:
        """Steps with token samples (our runs only)."""
        if self._run is None:
            return []
        return list(self._run.token_steps())

    def token_summary(self, step: int) -> tuple[int, int, int]:
        """(responses, correct, correct displaced) of ``step``'s token samples (cached: a
        step's samples are written once)."""
        cache = self._token_summaries
        if step not in cache:
            from lld_monitor.report.dashboard import tokens as tok

            try:
                cache[step] = tok.step_summary(self.tokens(step))
            except (OSError, ValueError):
                return (0, 0, 0)
        return cache[step]

    def tokens(self, step: int) -> pd.DataFrame:
        """The token samples of ``step`` (columns.TOKEN_COLUMNS)."""
        if self._run is None:
            return pd.DataFrame(columns=list(C.TOKEN_COLUMNS))
        return self._run.tokens(step)


def _analyze(steps: pd.DataFrame) -> Any:
    """``analysis.analyze_run`` on a step table (imported here: the analyzer may be absent)."""
    from lld_monitor.analysis import analyze_run

    return analyze_run(steps)


def _analysis_of(future: concurrent.futures.Future) -> Any:
    """The analysis a future brings: ``_analyze``'s, or the second of ``triage.analyse_one``'s
    (verdict, analysis) pair (None when the run did not analyse: its verdict says why)."""
    out = future.result()
    if isinstance(out, tuple):
        verdict, analysis = out
        if analysis is None:
            raise ValueError(verdict.error or f"the run is {verdict.verdict}")
        return analysis
    return out


@functools.cache
def _analysis_executor() -> concurrent.futures.ThreadPoolExecutor:
    """One background thread for re-analyses, shared by every session of the server."""
    return concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="lld-analysis")


# --- the run picker's verdicts ------------------------------------------------------------------

#: The run picker's badge per triage verdict (``lld-monitor analyze DIR``), worst first: plain
#: text symbols that DejaVu Sans (the usual fallback font of a Linux server) draws, not emoji,
#: which show as empty boxes where no emoji font is installed.
VERDICT_BADGE: dict[str, str] = {
    "collapsed": "✖",
    "critical": "▲",
    "warning": "△",
    "cant_tell": "?",
    "healthy": "✓",
    "analysing": "…",
    "unreadable": "○",
    "skipped": "○",
}


def verdict_order(names: Sequence[str], verdicts: dict[str, Any]) -> list[str]:
    """``names`` sorted as the triage table sorts runs: worst verdict first, then the latest
    worst alert, then by name; runs still being analysed (their verdict unknown) first."""
    from lld_monitor.analysis import triage

    def key(n: str) -> tuple[int, int, str]:
        v = verdicts[n]
        return (-1, 0, v.name) if v.verdict == "analysing" else triage.sort_key(v)

    return sorted(names, key=key)


def verdict_text(verdict: Any) -> str:
    """``collapsed (collapse at step 73)``: the verdict as the picker and the header say it."""
    from lld_monitor.analysis.triage import verdict_word

    text = verdict_word(verdict.verdict)
    if verdict.worst:
        text += f" ({verdict.worst['kind']} at step {verdict.worst['step']})"
    elif verdict.reason:
        text += f" ({verdict.reason})"
    return text


def picker_label(name: str, verdict: Any) -> str:
    """``✖ run · collapsed (collapse at step 73)``: a run's label in the picker."""
    badge = VERDICT_BADGE.get(verdict.verdict, "○")
    return f"{badge} {name} · {verdict_text(verdict)}"


def header_verdict(verdict: Any) -> str:
    """``✖ collapsed (collapse at step 73)``: the header's verdict, the picker's words."""
    return f"{VERDICT_BADGE.get(verdict.verdict, '○')} {verdict_text(verdict)}"


def _format_time(t: float, now: float) -> str:
    ago = max(now - t, 0.0)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
    if ago < 120:
        return f"{stamp} ({ago:.0f} s ago)"
    if ago < 7200:
        return f"{stamp} ({ago / 60:.0f} min ago)"
    return f"{stamp} ({ago / 3600:.1f} h ago)"


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
