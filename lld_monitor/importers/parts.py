"""What one log file holds apart from its training rows: the runs appended to it, its eval rows.

Pure functions on a raw metric table (foreign names, file order), used by ``load_table``:

- ``run_bounds(steps)``: where the step counter restarts. Logs that runs are appended to (a
  console log, a JSONL metrics file) hold several runs one after another; each restart of the
  counter begins a new run, never one run whose steps go backwards. A resumed run (the counter
  continues, or goes back a few steps to the checkpoint it resumed from) stays one run.
- ``split_eval(frame)``: the evaluation columns (``eval/...``, ``eval_...``, ``val/...``,
  ``val-core/...``, ``test/...``) and the rows that carry them, kept apart from the training
  rows: never analysed, never drawn as the training reward.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import pandas as pd

from lld_monitor import columns as C
from lld_monitor.importers.names import _LOOKUP

#: Column-name prefixes of evaluation metrics (TRL's eval_*, verl's val-core/ and val/,
#: a hosted service's test/, typed records of type "eval" as read: eval/<key>).
EVAL_PREFIXES: tuple[str, ...] = (
    "eval/",
    "eval_",
    "val/",
    "val-core/",
    "val-aux/",
    "validation/",
    "test/",
    "train/eval_",
)

#: Values of a record's ``type`` / ``split`` / ``mode`` field that make it an evaluation record.
EVAL_TYPES = frozenset({"eval", "evaluation", "val", "valid", "validation", "test", "testing"})


def is_eval_name(name: str) -> bool:
    """True for a column name of an evaluation metric (not one the mapping table names as a
    training metric: Open-Instruct's ``val/sequence_lengths`` is of the training rollouts)."""
    name = str(name).strip()
    return name.startswith(EVAL_PREFIXES) and name not in _LOOKUP


def step_column(frame: pd.DataFrame) -> str | None:
    """The raw column that ``canonicalize`` reads the step from (the highest-priority one
    present), or None."""
    best: tuple[int, str] | None = None
    for col in frame.columns:
        hit = _LOOKUP.get(str(col).strip())
        if hit is not None and hit[0] == C.STEP and (best is None or hit[1] < best[0]):
            best = (hit[1], col)
    return None if best is None else best[1]


def run_bounds(steps: Sequence[float] | np.ndarray) -> list[int]:
    """Row indices where a new run starts (the first run's 0 not included).

    ``steps``: the step of each row in file order, NaN where a row has none. A row starts a new
    run when its step is lower than the last known step AND no later than the current run's
    first step plus one logging interval (the smallest step increase seen in the run): the
    counter went back to a run's beginning. A drop to a later step is a resume from a checkpoint
    (the rows it repeats replace the earlier ones, as for any repeated step): the same run.
    """
    arr = np.asarray(steps, dtype=float)
    known = arr[np.isfinite(arr)]
    if len(known) < 2 or bool((known[1:] >= known[:-1]).all()):
        return []  # (the usual log: the counter never goes back)
    out: list[int] = []
    first = last = None
    interval = None
    for i, s in enumerate(arr.tolist()):
        if s != s or s in (float("inf"), float("-inf")):
            continue
        if first is None or last is None:
            first = last = s
            continue
        if s < last and s <= first + (interval if interval is not None else 0.0):
            out.append(i)
            first = last = s
            interval = None
            continue
        if s > last:
            gap = s - last
            interval = gap if interval is None else min(interval, gap)
        last = s
    return out


def split_runs(frame: pd.DataFrame) -> list[pd.DataFrame]:
    """``frame`` cut where its step counter restarts (``run_bounds``): one frame per run, in
    file order; ``[frame]`` when it holds one run or has no step column."""
    col = step_column(frame)
    if col is None or len(frame) < 2:
        return [frame]
    steps = pd.to_numeric(frame[col], errors="coerce").to_numpy(dtype=float)
    bounds = run_bounds(steps)
    if not bounds:
        return [frame]
    edges = [0, *bounds, len(frame)]
    parts = []
    for a, b in itertools.pairwise(edges):
        part = frame.iloc[a:b].reset_index(drop=True)
        part.attrs = dict(frame.attrs)
        parts.append(part)
    return parts


def split_eval(frame: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """(the training table, the evaluation table or None): the evaluation columns move to a
    table of their own with the step column and the rows that carry any of them."""
    evals = [c for c in frame.columns if is_eval_name(c)]
    if not evals:
        return frame, None
    step = step_column(frame)
    keep = [c for c in frame.columns if c not in evals]
    train = frame[keep]
    train.attrs = dict(frame.attrs)
    has = frame[evals].notna().any(axis=1)
    ev = frame.loc[has, ([step] if step is not None else []) + evals].reset_index(drop=True)
    if step is not None and step != C.STEP:
        ev = ev.rename(columns={step: C.STEP})
    return train, ev


def describe_runs(parts: Sequence[pd.DataFrame]) -> list[str]:
    """'run N (steps A-B, R rows)' for each run of a split log."""
    out = []
    for i, part in enumerate(parts, start=1):
        col = step_column(part)
        steps = (
            pd.to_numeric(part[col], errors="coerce").dropna()
            if col is not None
            else pd.Series(dtype=float)
        )
        span = f"steps {steps.min():g}-{steps.max():g}, " if len(steps) else ""
        out.append(f"run {i} ({span}{len(part)} rows)")
    return out
