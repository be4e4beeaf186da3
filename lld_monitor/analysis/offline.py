"""Post-hoc analysis of a whole run: phase segments, alerts, collapse step, signals.

Alerts come from replaying the online ``PhaseDetector`` over the rows (so offline and live
alerts agree by construction). Segment boundaries then use what only hindsight has: each
escalation is moved back from the step where the detector became sure to the change point of
the signal that drove it (least-squares two-piece linear fit: ruptures' ``Binseg`` with the
``linear`` cost against the step, reproduced in ``_change_point``), when that change point is
significant.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lld_monitor import columns as C
from lld_monitor.analysis.advice import alert_record, merge_repeats
from lld_monitor.analysis.detector import INPUT_COLUMNS, DetectorConfig, PhaseDetector
from lld_monitor.events import Alert
from lld_monitor.runlog.reader import one_row_per_step, strictly_increasing

_LLD_PHASES = ("stagnation", "decay", "collapse")
_RANK = {"unknown": 0, "healthy": 0, "stagnation": 1, "decay": 2, "collapse": 3}


@dataclass(frozen=True)
class PhaseSegment:
    """One phase over a closed range of steps, with the numbers seen in it."""

    phase: str
    start_step: int
    end_step: int
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"phase": self.phase, "start_step": self.start_step, "end_step": self.end_step}


@dataclass(frozen=True)
class Analysis:
    """The result of ``analyze_run``; ``to_dict()`` is the ``analyze --json`` schema."""

    phases: list[PhaseSegment]
    alerts: list[Alert]
    collapse_step: int | None
    signals_used: list[str]
    signals_missing: list[str]
    notes: list[str] = field(default_factory=list)  # what the missing signals rule out

    def to_dict(self) -> dict[str, Any]:
        """Exactly ``{"phases", "alerts", "collapse_step", "collapse", "signals": {"used",
        "missing"}}`` (``collapse``: ``collapse_numbers``; each alert: ``advice.alert_record``
        without its evidence, which ``analyze --json`` adds)."""
        return {
            "phases": [s.to_dict() for s in self.phases],
            "alerts": [
                {k: v for k, v in alert_record(a).items() if k != "evidence"} for a in self.alerts
            ],
            "collapse_step": self.collapse_step,
            "collapse": collapse_numbers(self),
            "signals": {"used": list(self.signals_used), "missing": list(self.signals_missing)},
        }


def collapse_numbers(analysis: Any) -> dict[str, int | None]:
    """The three steps a collapse is known by, each named for what it is:

    - ``reward_fell``: the first step of the collapse phase at which the reward (median of 5
      rows) is below half its peak so far (``Analysis.collapse_step``, the one to quote);
    - ``phase_start``: where hindsight puts the start of the collapse phase (the change point of
      the signal that drove it; usually before the reward fell);
    - ``alert``: the step of the first collapse alert, when the online detector (the same one
      that runs live) was sure.

    All None when the run shows no collapse."""
    segs = [s for s in getattr(analysis, "phases", None) or () if s.phase == "collapse"]
    alerts = [a for a in getattr(analysis, "alerts", None) or () if a.kind == "collapse"]
    return {
        "reward_fell": getattr(analysis, "collapse_step", None),
        "phase_start": int(segs[0].start_step) if segs else None,
        "alert": int(alerts[0].step) if alerts else None,
    }


def collapse_text(analysis: Any) -> str | None:
    """``collapse_numbers`` as one sentence (None when there is no collapse)."""
    n = collapse_numbers(analysis)
    if n["reward_fell"] is None and n["phase_start"] is None and n["alert"] is None:
        return None
    parts = []
    if n["reward_fell"] is not None:
        parts.append(f"the reward fell below half its peak at step {n['reward_fell']}")
    if n["phase_start"] is not None:
        parts.append(f"the collapse phase starts at step {n['phase_start']} (hindsight)")
    if n["alert"] is not None:
        parts.append(f"the first collapse alert came at step {n['alert']} (online)")
    return "; ".join(parts)


def load_steps(obj: Any) -> pd.DataFrame:
    """The step table of a ``Run``, a DataFrame, or a path (our run folder or any foreign log)."""
    if isinstance(obj, pd.DataFrame):
        return obj
    steps = getattr(obj, "steps", None)
    if isinstance(steps, pd.DataFrame):
        return steps
    if isinstance(obj, str | Path):
        from lld_monitor.runlog import is_run_dir, load_run

        if is_run_dir(obj):
            return load_run(obj).steps
        from lld_monitor.importers import load_table

        return load_table(obj)
    raise ValueError(
        f"analyze_run needs a Run, a pandas DataFrame or a path, got {type(obj).__name__}"
    )


def prepare_steps(df: pd.DataFrame) -> pd.DataFrame:
    """Rows sorted by step, one per step (``runlog.one_row_per_step``, the rule the importers
    and the run log follow, so a table gives the same analysis as a DataFrame, a CSV file or a
    run folder), numeric columns; the detector's input."""
    if C.STEP not in df.columns:
        raise ValueError(
            f"the table has no {C.STEP!r} column; give each row its optimizer step "
            f"(columns found: {list(df.columns)[:10]})"
        )
    step = pd.to_numeric(df[C.STEP], errors="coerce")
    values = step.to_numpy()  # (whole numbers as they are: no float copy of a long column)
    if values.dtype.kind not in "iu":
        values = step.to_numpy(dtype=float)
    if len(values) and strictly_increasing(values):
        # already one row a step, in order (a loaded table): no copy of the columns
        out = df.copy(deep=False)
        if out[C.STEP].dtype != np.int64:
            out[C.STEP] = step.astype(np.int64).to_numpy()
        return out.reset_index(drop=True)
    out = df.loc[step.notna()].copy()
    out[C.STEP] = step[step.notna()].astype(np.int64)
    return one_row_per_step(out).reset_index(drop=True)


#: Rows converted to Python floats at a time by ``replay`` (a long table is never held as
#: Python objects whole: ~24 bytes a value, 10x its float64 array).
REPLAY_CHUNK = 8192


def replay(
    df: pd.DataFrame,
    detector: PhaseDetector | None = None,
    progress: Callable[[int, int], None] | None = None,
    *,
    phase_runs: bool = False,
    jobs: int = 1,
) -> tuple[list[Alert], list[Any], PhaseDetector]:
    """Feed the (prepared) rows to a detector: (alerts, phase after each row, the detector).
    ``progress(rows done, rows)`` is called after every ``REPLAY_CHUNK`` rows and at the end.
    ``phase_runs``: instead of a phase per row, ``[(row, phase)]`` at the first row and at
    every row whose phase differs from the row before (a long table's phases in a few entries).
    ``jobs``: the processes the replay may use; 1 (the default) keeps it in this process, no
    second process unless the caller asks; 2: a long table's row-only checks may run in a
    forked child where that is safe (``analysis/parallel.py``). Either way the answer is the
    same."""
    jobs = check_jobs(jobs)
    det = detector if detector is not None else PhaseDetector()
    n = len(df)
    arrays = [_floats(df[c]) if c in df.columns else None for c in INPUT_COLUMNS]
    # (whole-number steps as they are, made floats a chunk at a time: no float copy of the
    # column)
    step_arr = df[C.STEP].to_numpy()
    if step_arr.dtype.kind not in "iuf":
        step_arr = df[C.STEP].to_numpy(dtype=float)
    mark_col = df[C.NONFINITE] if C.NONFINITE in df.columns else None
    mark_codes = split = None
    if mark_col is not None and isinstance(mark_col.dtype, pd.CategoricalDtype):
        # (the importers' categorical marks: each category split once, read by code; the
        # lists are only read)
        split = [c.split(",") if isinstance(c, str) else None for c in mark_col.cat.categories]
        split.append(None)  # (code -1: no mark)
        mark_codes = mark_col.cat.codes.to_numpy()
    alerts: list[Alert] = []
    phases: list[str] = []

    def run_rows(lo: int, hi: int) -> None:
        """Feed rows [lo, hi) to ``det``, as Python floats (a chunk at a time)."""
        update = det.update_values
        add_phase = phases.append
        machine = det.machine
        for a in range(lo, hi, REPLAY_CHUNK):
            b = min(a + REPLAY_CHUNK, hi)
            nan_col = [math.nan] * (b - a)
            cols = [nan_col if x is None else x[a:b].tolist() for x in arrays]
            steps = step_arr[a:b].astype(float, copy=False).tolist()
            # which missing values the log names non-finite (C.NONFINITE; a blank cell is
            # missing)
            marks: Any = (
                [split[c] for c in mark_codes[a:b].tolist()]
                if mark_codes is not None
                else [m.split(",") if isinstance(m, str) else None for m in mark_col.iloc[a:b]]
                if mark_col is not None
                else itertools.repeat(None)
            )
            if phase_runs:
                last = phases[-1][1] if phases else None
                for i, (step, values, mark) in enumerate(zip(steps, zip(*cols), marks), a):
                    new = update(step, values, mark)
                    if new:
                        alerts.extend(new)
                    if machine.phase != last:
                        last = machine.phase
                        add_phase((i, last))
            else:
                for step, values, mark in zip(steps, zip(*cols), marks):
                    new = update(step, values, mark)
                    if new:
                        alerts.extend(new)
                    add_phase(machine.phase)
            if progress is not None:
                progress(b, n)

    from lld_monitor.analysis import parallel

    # every row reaches the checks (steps strictly increasing) of a fresh detector: the checks
    # may precompute from the table (begin_replay), and the row-only ones may run in a child
    whole = det.fresh and (n < 2 or strictly_increasing(step_arr))
    columns = {c: a for c, a in zip(INPUT_COLUMNS, arrays) if a is not None}
    try:
        index = parallel.offloadable(det) if jobs >= 2 and whole and parallel.can_fork(n) else []
        if index and parallel.replay_parallel(det, index, arrays, step_arr, run_rows, columns):
            return alerts, phases, det
        if index:  # (the child failed: again, in this process; reset drops what it kept)
            alerts.clear()
            phases.clear()
            det.reset()
        if whole:
            det.begin_replay(columns)
        run_rows(0, n)
    finally:
        det.end_replay()
    return alerts, phases, det


def check_jobs(jobs: int) -> int:
    """``jobs`` as an int >= 1 (a ValueError naming it otherwise)."""
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be an int >= 1 (1: this process only), got {jobs!r}")
    return jobs


def _floats(series: pd.Series) -> np.ndarray:
    """[n] a column as float64, unreadable cells NaN (a float64 column as it is: no copy)."""
    if series.dtype == np.float64:
        return series.to_numpy()
    return pd.to_numeric(series, errors="coerce").to_numpy(dtype=float)


#: Seconds of work before ``progress_line`` shows anything.
PROGRESS_AFTER_S = 1.0


def progress_line(stream: Any, prefix: str, what: str) -> Callable[[int, int], None]:
    """A ``progress(done, total)`` callback that writes ``prefix: done/total what`` to
    ``stream`` once the work has taken ``PROGRESS_AFTER_S``: rewritten in place on a terminal,
    else its first and last line only (a log stays short). ``stream`` None: silent."""
    import time

    t0 = time.monotonic()
    tty = bool(getattr(stream, "isatty", lambda: False)())
    shown = [False]

    def tick(done: int, total: int) -> None:
        if stream is None or time.monotonic() - t0 < PROGRESS_AFTER_S:
            return
        if tty or done >= total or not shown[0]:
            end = "\r" if tty and done < total else "\n"
            stream.write(f"{prefix}: {done:,}/{total:,} {what}{end}")
            stream.flush()
            shown[0] = True

    return tick


MAX_REFINEMENTS = 100  # change-point fits per run (~7 ms each); later boundaries stay as detected


def analyze_run(
    obj: Any,
    *,
    config: DetectorConfig | None = None,
    refine: bool = True,
    progress: Callable[[int, int], None] | None = None,
    jobs: int = 1,
) -> Analysis:
    """Analyse a whole run: ``Run``, DataFrame (canonical columns) or path.

    ``refine=False`` keeps the segment boundaries where the online detector became sure; with
    refinement, at most ``MAX_REFINEMENTS`` escalations get a change-point boundary.
    ``progress(rows done, rows)``: called as the rows are replayed (``replay``). ``jobs``:
    ``replay``'s (1, the default: no second process; 2: a long table may use one; the same
    answer). The alerts are the replay's
    with repeats of one kind merged (``advice.merge_repeats``: a count, no step lost).
    """
    df = prepare_steps(load_steps(obj))
    det = PhaseDetector(config)
    if df.empty:
        return Analysis([], [], None, [], list(INPUT_COLUMNS), det.limitations())
    alerts, runs, det = replay(df, det, progress, phase_runs=True, jobs=jobs)
    steps = df[C.STEP].to_numpy(dtype=np.int64)
    segments = _segments(runs, steps)
    notes = det.limitations()
    if refine:
        segments, capped = _refine(segments, df, det)
        if capped:
            notes.append(
                f"more than {MAX_REFINEMENTS} phase escalations: boundaries after the first "
                f"{MAX_REFINEMENTS} are where the detector became sure, not change points"
            )
    columns = {c: _floats(df[c]) for c in _EVIDENCE_COLUMNS if c in df.columns}
    segs = [
        PhaseSegment(p, int(a), int(b), {**_segment_evidence(steps, columns, int(a), int(b)), **ev})
        for p, a, b, ev in segments
    ]
    return Analysis(
        phases=segs,
        alerts=merge_repeats(alerts),
        collapse_step=_collapse_step(df, segs),
        signals_used=det.signals_used,
        signals_missing=det.signals_missing,
        notes=notes,
    )


# --- segments ---------------------------------------------------------------------------------


def _segments(runs: Sequence[tuple[int, str]], steps: np.ndarray) -> list[list[Any]]:
    """Runs of equal phase (``replay(..., phase_runs=True)``): [phase, start_step, end_step,
    evidence]."""
    out: list[list[Any]] = []
    ends = [row - 1 for row, _ in runs[1:]] + [len(steps) - 1]
    for (row, p), end in zip(runs, ends):
        start = int(steps[row])
        out.append([p, start, int(steps[end]), {"detected_at": start}])
    return out


def _refine(
    segs: list[list[Any]], df: pd.DataFrame, det: PhaseDetector
) -> tuple[list[list[Any]], bool]:
    """Move each escalation back to the change point of its driving signal, when significant.

    Returns the segments and whether ``MAX_REFINEMENTS`` cut the refinement short."""
    has_lp = C.LOGP_CORRECT in det.signals_used
    # the warm-up is 'unknown' only for lack of rows: with the LLD signal, hindsight gives it
    # to the first confirmed phase when that phase is healthy or stagnation
    if (
        len(segs) > 1
        and segs[0][0] == "unknown"
        and has_lp
        and segs[1][0] in ("healthy", "stagnation")
    ):
        segs[1][1] = segs[0][1]
        segs[1][3] = {**segs[1][3], "warmup_merged": True}
        segs = segs[1:]
    steps = df[C.STEP].to_numpy(dtype=float)
    window = det.config.window_steps
    done = 0
    capped = False
    for i in range(1, len(segs)):
        prev, cur = segs[i - 1], segs[i]
        if cur[0] not in _LLD_PHASES or _RANK[cur[0]] <= _RANK[prev[0]]:
            continue
        if done >= MAX_REFINEMENTS:
            capped = True
            break
        done += 1
        col = C.LOGP_CORRECT if has_lp else C.REWARD_MEAN
        if col not in df.columns:
            continue
        hi = cur[1]
        lo = max(prev[1], hi - 4 * window)
        sel = (steps >= lo) & (steps <= hi)
        y = pd.to_numeric(df.loc[sel, col], errors="coerce").to_numpy(dtype=float)
        x = steps[sel]
        ok = np.isfinite(y)
        cp = _change_point(x[ok], y[ok])
        if cp is not None and prev[1] < cp < hi:
            prev[2] = int(steps[steps < cp].max())
            cur[1] = int(cp)
            cur[3] = {**cur[3], "boundary": f"change point of {col} (binary segmentation, linear)"}
        elif cp is None and cur[0] == "stagnation" and _RANK[prev[0]] == 0 and ok.sum() >= 5:
            # no change in the driving signal over [lo, hi]: the regime that fired held there
            if lo <= prev[1]:
                prev[2] = -1  # swallowed whole
                cur[1] = prev[1]
            else:
                prev[2] = int(steps[steps < lo].max())
                cur[1] = int(lo)
            cur[3] = {**cur[3], "boundary": f"no change point of {col} in the window before"}
    return [s for s in segs if s[2] >= s[1]], capped


def _change_point(x: np.ndarray, y: np.ndarray, *, min_size: int = 8, f_min: float = 25.0):
    """Step of the best single break of a two-piece linear fit of y on x, or None if weak.

    The break is ruptures' ``Binseg(model="linear", min_size, jump=1)`` with one breakpoint,
    reproduced (ruptures imports scipy.stats, 0.5-0.9 s of every ``analyze``; a test checks
    the two agree): the row index bk in [min_size, n - min_size] with the largest gain
    RSS(0, n) - RSS(0, bk) - RSS(bk, n) of least-squares lines in x (ties: the larger bk), the
    RSS of every candidate from running sums and the near-best ones again by ``lstsq``, as
    ruptures computes them. Significance: the F-like ratio of the RSS saved by the break to
    the residual variance after it must reach ``f_min``.
    """
    n = len(y)
    if n < 3 * min_size:
        return None
    t = np.asarray(x, dtype=float) - x[0]
    y = np.asarray(y, dtype=float)
    rss0 = _rss(t, y)
    bk = _best_break(t, y, min_size, rss0)
    rss1 = _rss(t[:bk], y[:bk]) + _rss(t[bk:], y[bk:])
    dof = n - 4
    if rss1 <= 0.0:
        return int(x[bk]) if rss0 > 0.0 else None
    f = (rss0 - rss1) / (rss1 / dof)
    return int(x[bk]) if f >= f_min else None


def _rss(t: np.ndarray, y: np.ndarray) -> float:
    """The residual sum of squares of the least-squares line of y on t (ruptures' linear cost:
    ``lstsq`` of y on [1, t]; 0.0 where lstsq reports none, a rank-deficient segment)."""
    design = np.column_stack([np.ones(len(t)), t])
    _, residual, _, _ = np.linalg.lstsq(design, y.reshape(-1, 1), rcond=None)
    return float(residual.sum())


def _best_break(t: np.ndarray, y: np.ndarray, min_size: int, rss0: float | None = None) -> int:
    """The row index of the break with the largest gain (see ``_change_point``; ``rss0``:
    ``_rss(t, y)`` when the caller has it)."""
    n = len(y)
    # running sums of centred values (smaller sums, less cancellation), a candidate a column
    tc, yc = t - t.mean(), y - y.mean()
    one = np.arange(n + 1, dtype=float)
    st, sy = np.r_[0.0, np.cumsum(tc)], np.r_[0.0, np.cumsum(yc)]
    stt, sty, syy = (np.r_[0.0, np.cumsum(v)] for v in (tc * tc, tc * yc, yc * yc))

    def rss(a: np.ndarray | int, b: np.ndarray | int) -> np.ndarray:
        m = one[b] - one[a]
        sx, s_y = st[b] - st[a], sy[b] - sy[a]
        vxx = (stt[b] - stt[a]) - sx * sx / m
        vxy = (sty[b] - sty[a]) - sx * s_y / m
        vyy = (syy[b] - syy[a]) - s_y * s_y / m
        with np.errstate(divide="ignore", invalid="ignore"):
            out = vyy - np.where(vxx > 0.0, vxy * vxy / vxx, 0.0)
        return np.maximum(out, 0.0)

    bks = np.arange(min_size, n - min_size + 1)
    total = float(rss(0, n))
    gains = total - rss(0, bks) - rss(bks, n)
    # the near-best again, exactly as ruptures computes them (the running sums differ from
    # lstsq in the last digits): the largest (gain, bk), ties to the larger bk
    tol = 1e-9 * max(total, float(np.abs(gains).max()), 1e-300)
    near = bks[gains >= gains.max() - tol]
    if len(near) == 1:
        return int(near[0])
    exact_total = _rss(t, y) if rss0 is None else rss0
    return max((exact_total - _rss(t[:b], y[:b]) - _rss(t[b:], y[b:]), int(b)) for b in near)[1]


_EVIDENCE_COLUMNS = (
    C.REWARD_MEAN,
    C.LOGP_CORRECT,
    C.GRAD_NORM,
    C.ENTROPY,
    C.FRAC_CORRECT_DISPLACED,
)


def _segment_evidence(
    steps: np.ndarray, columns: dict[str, np.ndarray], start: int, end: int
) -> dict[str, Any]:
    """Robust start/end levels of the main signals inside a segment (medians of the first and
    last 5 values that are not NaN). ``steps``: [n] sorted; ``columns``: [n] float arrays. The
    segment's rows are a slice (a segment of a long run is never copied)."""
    i0 = int(np.searchsorted(steps, start, side="left"))
    i1 = int(np.searchsorted(steps, end, side="right"))
    ev: dict[str, Any] = {"rows": i1 - i0}
    for col in _EVIDENCE_COLUMNS:
        if col not in columns:
            continue
        vals = columns[col][i0:i1]  # (a view)
        head = _valid(vals, 5)
        if not head.size:
            continue
        ev[f"{col}_start"] = float(np.median(head))
        ev[f"{col}_end"] = float(np.median(_valid(vals[::-1], 5)[::-1]))
    return ev


def _valid(vals: np.ndarray, k: int) -> np.ndarray:
    """The first ``k`` values that are not NaN, in order (read a window at a time: a long
    slice is not scanned whole)."""
    out: list[np.ndarray] = []
    got, lo, width = 0, 0, 16
    while got < k and lo < len(vals):
        part = vals[lo : lo + width]
        part = part[~np.isnan(part)]
        out.append(part[: k - got])
        got += len(out[-1])
        lo, width = lo + width, width * 4
    return np.concatenate(out) if out else vals[:0]


def _collapse_step(df: pd.DataFrame, segs: Sequence[PhaseSegment]) -> int | None:
    """First step in a collapse segment where the reward (median of 5 rows) is below half its
    peak so far; the collapse segment's start when the reward is absent or never halved."""
    col_segs = [s for s in segs if s.phase == "collapse"]
    if not col_segs:
        return None
    first = col_segs[0]
    if C.REWARD_MEAN not in df.columns:
        return first.start_step
    r = pd.to_numeric(df[C.REWARD_MEAN], errors="coerce")
    smooth = r.rolling(5, center=True, min_periods=1).median().to_numpy(dtype=float)
    steps = df[C.STEP].to_numpy(dtype=np.int64)
    peak = np.fmax.accumulate(np.where(np.isfinite(smooth), smooth, -np.inf))
    halved = (steps >= first.start_step) & (smooth < 0.5 * peak) & (peak > 0)
    idx = np.flatnonzero(halved)
    return int(steps[idx[0]]) if idx.size else first.start_step
