"""From a raw metric table to the canonical one: ``canonicalize`` and the input checks it counts.

What was dropped or changed (cells, rows, steps) is counted and said in ``import_notes``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from lld_monitor import columns as C
from lld_monitor.importers.base import ImportFormatError
from lld_monitor.importers.names import _LOOKUP, _NON_TRAINING, _reward_fn_name
from lld_monitor.importers.text import _scalar
from lld_monitor.runlog.reader import one_row_per_step, strictly_increasing


def canonicalize(frame: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Map a raw metric table to canonical columns; return it and the unmapped source names.

    Keeps rows that carry at least one training metric (drops eval/summary rows), merges rows of
    the same step (last logged value wins), sorts by step. Without a step column, step = 1, 2, ...
    """
    by_col: dict[str, list[tuple[int, str]]] = {}
    unmapped: list[str] = []
    for source in frame.columns:
        if source == C.NONFINITE:  # an lld_monitor run log's own marks: kept below
            continue
        hit = _LOOKUP.get(str(source).strip())
        fn_col = _reward_fn_name(str(source).strip())
        if hit is not None:
            by_col.setdefault(hit[0], []).append((hit[1], source))
        if fn_col is not None:
            by_col.setdefault(fn_col, []).append((0 if fn_col == source else 1, source))
        if hit is None and fn_col is None:
            unmapped.append(str(source))
    fn_cols = sorted(c for c in by_col if c.startswith(C.REWARD_FN_PREFIX))
    out = pd.DataFrame(index=frame.index)
    logged = None
    if C.NONFINITE in frame.columns:  # the run log named the values it stored as null
        logged = frame[C.NONFINITE].to_numpy(dtype=object)
    literal: list[tuple[str, np.ndarray]] = []  # (column, [n] its cells that were nan/inf)
    unreadable = 0  # cells of mapped columns that hold something other than a number
    for col in (*C.STEP_COLUMNS, *fn_cols):
        sources = [s for _, s in sorted(by_col.get(col, []), key=lambda t: t[0])]
        if not sources:
            continue
        if col == C.STEP and len(sources) == 1 and frame[sources[0]].dtype == np.int64:
            out[col] = frame[sources[0]]  # (whole numbers already: no float copy of the column)
            continue
        numbers = [_numeric(frame[s]) for s in sources]
        unreadable += sum(_unreadable_cells(frame[s], n) for s, n in zip(sources, numbers))
        series = numbers[0]
        for other in numbers[1:]:
            series = series.fillna(other)
        out[col] = series
        if col in C.IMPORTED_NONFINITE_COLUMNS:
            lit = _literal_nonfinite(frame[sources[0]]).to_numpy(dtype=bool)
            if lit.any():
                literal.append((col, lit))
    if C.STEP not in out.columns:
        out.insert(0, C.STEP, np.arange(1, len(out) + 1, dtype=float))
    # which missing values were literal nan/inf (the rest are blank cells: missing)
    # rows already one a step, in order (the usual log; floored as _checked_steps floors them):
    # nothing to merge, so the marks' blanks are written as "" now instead of filled later
    st = out[C.STEP].to_numpy()
    if st.dtype.kind == "f":
        st = np.floor(st)
    ordered = len(st) < 2 or bool((st[1:] > st[:-1]).all())
    del st
    # (categorical: a code a row, not a pointer to a string; a long clean log's marks are all
    # blank, and a bare array of strings would be converted to pandas' string dtype)
    marks = _mark_codes(len(out), logged, literal, blank="" if ordered else None)
    out[C.NONFINITE] = pd.Series(marks, index=out.index, copy=False)
    training = [c for c in out.columns if c not in _NON_TRAINING and c != C.NONFINITE]
    if not training:
        return pd.DataFrame(columns=[C.STEP]), unmapped
    has_metric = np.zeros(len(out), dtype=bool)  # (a column at a time: no 2-D mask)
    for c in training:
        has_metric |= out[c].notna().to_numpy()
    has_step = out[C.STEP].notna().to_numpy()
    notes = _row_notes(has_metric, has_step, unreadable)
    keep = pd.Series(has_metric & has_step, index=out.index)
    if not keep.all():  # (a filter copies every column: only when a row goes)
        out = out[keep]
    if out.empty:
        return pd.DataFrame(columns=list(out.columns)), unmapped
    out, step_notes, increasing = _checked_steps(out)
    if not increasing:  # (else one row a step, in order)
        out = one_row_per_step(out)
    if out[C.STEP].dtype != np.int64:
        out[C.STEP] = out[C.STEP].astype("int64")
    out = out.reset_index(drop=True)
    if not ordered:
        out[C.NONFINITE] = out[C.NONFINITE].fillna("")
    out = out[[c for c in (*C.STEP_COLUMNS, *fn_cols, C.NONFINITE) if c in out.columns]]
    out.attrs["import_notes"] = notes + step_notes
    return out, unmapped


# --- input checks: what was dropped or changed is counted and said ------------------------------

#: Cell texts that mean "no value" (not counted as unreadable).
_MISSING_TEXTS = frozenset({"", "nan", "none", "null", "n/a", "na", "-", "inf", "-inf", "+inf"})


#: Steps beyond this are not optimizer steps (and lose integer precision as floats).
MAX_STEP = 2**53


def _unreadable_cells(raw: pd.Series, numbers: pd.Series) -> int:
    """Cells holding something (not a missing-value text) that is not a number."""
    lost = raw.notna().to_numpy() & numbers.isna().to_numpy()
    if not lost.any():
        return 0
    texts = raw[lost].astype(str).str.strip().str.lower()
    return int((~texts.isin(_MISSING_TEXTS)).sum())


def _row_notes(has_metric: np.ndarray, has_step: np.ndarray, unreadable: int) -> list[str]:
    """Notes on cells that are not numbers and rows without a readable step (``has_metric``,
    ``has_step``: [n] the rows with a training metric, with a step)."""
    notes = []
    if unreadable:
        notes.append(
            f"{unreadable} cell(s) of known metrics were not numbers and are read as missing"
        )
    no_step = int((has_metric & ~has_step).sum())
    if no_step:
        notes.append(f"{no_step} row(s) with metrics but no readable step were dropped")
    return notes


def _checked_steps(out: pd.DataFrame) -> tuple[pd.DataFrame, list[str], bool]:
    """Steps beyond ``MAX_STEP`` refused; fractional steps floored, and counted; duplicates
    counted (``canonicalize`` merges them). Also returns whether the steps strictly increase
    (nothing to merge or sort). Whole-number steps are checked as they are (no float copy of
    a long column)."""
    step = out[C.STEP].to_numpy()
    if step.dtype.kind not in "iu":
        step = out[C.STEP].to_numpy(dtype=float)
    whole_numbers = step.dtype.kind in "iu"
    bad = np.abs(step) > MAX_STEP
    if not whole_numbers:
        bad |= ~np.isfinite(step)
    if bad.any():
        worse = np.abs(np.nan_to_num(step[bad].astype(float), posinf=1e308))
        worst = step[bad][np.argmax(worse)]
        raise ImportFormatError(
            f"{int(bad.sum())} row(s) have step values such as {worst:g}, beyond 2**53: not "
            "optimizer steps (is the step column the right one?)"
        )
    notes = []
    whole = step
    if not whole_numbers:
        whole = np.floor(step)
        fractional = int((whole != step).sum())
        if fractional:
            example = step[whole != step][0]
            notes.append(
                f"{fractional} row(s) had a fractional step (e.g. {example:g}): taken as its "
                "whole part"
            )
            out = out.assign(**{C.STEP: whole})
    increasing = len(whole) < 2 or strictly_increasing(whole)
    if not increasing:
        # counted by a sort: a hash table of a million steps costs five times the column
        duplicates = len(whole) - len(np.unique(whole))
        if duplicates:
            notes.append(
                f"{duplicates} row(s) repeat the step of an earlier row: merged into it (the "
                "last value of each column wins)"
            )
    return out, notes, increasing


def _mark_codes(
    n: int,
    logged: np.ndarray | None,
    literal: Sequence[tuple[str, np.ndarray]],
    blank: str | None = None,
) -> pd.Categorical:
    """[n] the ``C.NONFINITE`` cell of each row, as a categorical: the run log's own marks
    (text), then each column whose cell was a literal nan/inf, comma-joined; ``blank`` where
    there are none (None: a missing cell). "" is always the first category, so that a blank
    filled with "" later needs no new one. Strings are built only for the rows that have a mark
    (a long clean log makes none), and no array of every cell is."""
    rows = np.zeros(n, dtype=bool)
    if logged is not None:
        rows |= np.fromiter((isinstance(v, str) for v in logged), dtype=bool, count=n)
    for _, lit in literal:
        rows |= lit
    categories: dict[str, int] = {"": 0}
    codes = np.full(n, 0 if blank == "" else -1, dtype=np.int8)
    for i in np.flatnonzero(rows):
        mark = logged[i] if logged is not None and isinstance(logged[i], str) else ""
        for col, lit in literal:
            if lit[i]:
                mark = mark + "," + col
        mark = mark.strip(",") or blank
        if mark is None:
            continue
        code = categories.setdefault(mark, len(categories))
        if code > np.iinfo(codes.dtype).max:  # (many distinct marks: wider codes)
            codes = codes.astype(np.int32)
        codes[i] = code
    return pd.Categorical.from_codes(codes, categories=list(categories))


def _skipped_lines_note(records: Any) -> list[str]:
    skipped = getattr(records, "skipped", ())
    if not skipped:
        return []
    shown = ", ".join(map(str, skipped[:5])) + (", ..." if len(skipped) > 5 else "")
    return [f"{len(skipped)} line(s) that are not JSON objects were skipped (line {shown})"]


# --- helpers ------------------------------------------------------------------------------------

_NONFINITE_TEXT = frozenset({"nan", "-nan", "inf", "+inf", "-inf", "infinity", "-infinity"})


def _literal_nonfinite(series: pd.Series) -> pd.Series:
    """True where a raw cell is a literal non-finite value ('nan', 'inf', a float inf, or a
    NaN that a JSON record carried as a value: ``_frame`` keeps those as 'nan'); a blank cell
    or an absent key is not."""
    if series.dtype == object or pd.api.types.is_string_dtype(series):

        def lit(v: Any) -> bool:
            if isinstance(v, str):
                return v.strip().lower() in _NONFINITE_TEXT
            return isinstance(v, float) and math.isinf(v)  # a float NaN here is a blank cell

        return series.map(lit).astype(bool)
    if pd.api.types.is_float_dtype(series):
        return pd.Series(np.isinf(series.to_numpy()), index=series.index)
    return pd.Series(False, index=series.index)


def _frame(records: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    # a NaN a record carries as a value was logged (an absent key is missing): keep it as text
    rows = [
        {k: ("nan" if isinstance(v, float) and v != v else v) for k, v in r.items()}
        for r in records
        if isinstance(r, Mapping)
    ]
    return pd.DataFrame.from_records(rows) if rows else pd.DataFrame()


def _numeric(series: pd.Series) -> pd.Series:
    if series.dtype == np.float64:
        return series  # (already numbers: no copy of a long column)
    if series.dtype == bool:
        return series.astype(float)
    if series.dtype == object or pd.api.types.is_string_dtype(series):
        series = series.astype(object).map(_scalar)
    return pd.to_numeric(series, errors="coerce").astype(float)
