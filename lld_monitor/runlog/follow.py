"""A run folder followed as it grows: what a live view (the dashboard) reads on every refresh.

``RunFollower(path).poll()`` reads only what was written since the last poll (``RunReader``) and
keeps the step rows one row a step (``one_row_per_step``, the run log's rule) in growable float
columns (``ColumnStore``: appending m rows costs O(m) amortized, not O(rows)); a step written
again (a resumed run) makes it merge the table once. The events accumulate; ``meta``,
``finished``, the skipped lines and the reader (tokens, file times) are at hand.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pandas as pd

from lld_monitor import columns as C
from lld_monitor.runlog.reader import RunReader, one_row_per_step, strictly_increasing


class ColumnStore:
    """Step rows in growable float columns: appending m rows costs O(m) amortized, not O(rows).

    ``frame()`` views the columns as a DataFrame without copying them.
    """

    def __init__(self) -> None:
        self._cols: dict[str, np.ndarray] = {}
        self._n = 0
        self._cap = 0

    def __len__(self) -> int:
        return self._n

    @property
    def last_step(self) -> float:
        """The step of the last row (-inf when empty)."""
        if self._n == 0 or C.STEP not in self._cols:
            return -math.inf
        return float(self._cols[C.STEP][self._n - 1])

    def append(self, rows: pd.DataFrame) -> None:
        """Append ``rows`` (numeric columns; others become NaN) after the current ones."""
        m = len(rows)
        if m == 0:
            return
        first = self._cap == 0
        if not first and self._n + m > self._cap:
            self._grow(max(2 * self._cap, self._n + m, 1024))
        for col in rows.columns:
            values = pd.to_numeric(rows[col], errors="coerce").to_numpy(
                dtype=float, na_value=np.nan
            )
            if first:  # the first rows' arrays become the columns (no copy; a later append
                self._cols[col] = values  # grows them into new buffers, never writes in these)
                continue
            if col not in self._cols:
                self._cols[col] = np.full(self._cap, np.nan)
            self._cols[col][self._n : self._n + m] = values
        if first:
            self._cap = m
        self._n += m

    def _grow(self, capacity: int) -> None:
        for col, arr in self._cols.items():
            new = np.full(capacity, np.nan)
            new[: self._n] = arr[: self._n]
            self._cols[col] = new
        self._cap = capacity

    def frame(self) -> pd.DataFrame:
        """The rows as a DataFrame, canonical columns first (a view: do not write to it)."""
        order = [c for c in C.STEP_COLUMNS if c in self._cols]
        order += sorted(c for c in self._cols if c not in order)
        data = {c: self._cols[c][: self._n] for c in order}
        if C.STEP in data:  # steps are integers; the one column copied
            data[C.STEP] = data[C.STEP].astype(np.int64)
        return pd.DataFrame(data, copy=False)

    def replace(self, rows: pd.DataFrame) -> None:
        """Drop every row and hold ``rows`` instead."""
        self._cols, self._n, self._cap = {}, 0, 0
        self.append(rows)


class RunFollower:
    """One run folder followed as it grows; ``poll()`` after each write (see the module
    docstring). ``steps`` is a view of the rows read so far (do not write to it; it stays valid
    after later polls)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.reader = RunReader(path)
        self.meta = dict(self.reader.meta)
        self.events = pd.DataFrame()
        self._store = ColumnStore()
        self._frame: pd.DataFrame | None = None

    def poll(self) -> int:
        """Read what was added since the last poll; the number of new step rows."""
        new_steps = self.reader.read_steps()
        new_events = self.reader.read_events()
        if len(new_events):
            frames = [f for f in (self.events, new_events) if len(f)]
            self.events = pd.concat(frames, ignore_index=True) if len(frames) > 1 else new_events
        if new_steps.empty or C.STEP not in new_steps:
            return 0
        steps = pd.to_numeric(new_steps[C.STEP], errors="coerce").to_numpy(dtype=float)
        in_order = strictly_increasing(steps) and steps[0] > self._store.last_step
        if in_order:
            self._store.append(new_steps)
        else:  # a rewritten or resumed step: one row a step, as load_run reads it
            merged = pd.concat([self.steps, new_steps], ignore_index=True)
            self._store.replace(one_row_per_step(merged).reset_index(drop=True))
        self._frame = None  # (after the store changed: the view of the merge read the old one)
        return len(new_steps)

    @property
    def steps(self) -> pd.DataFrame:
        """Every step row read so far, sorted by step, canonical columns first."""
        if self._frame is None:
            self._frame = self._store.frame()
        return self._frame

    @property
    def n_rows(self) -> int:
        return len(self._store)

    @property
    def last_step(self) -> float:
        """The last step read (-inf before any)."""
        return self._store.last_step

    @property
    def finished(self) -> bool:
        """The writer closed the run (as far as read)."""
        return bool(self.reader.finished)

    @property
    def skipped_lines(self) -> int:
        """Garbled or torn lines skipped so far, in the steps and the events."""
        return sum(self.reader.skipped_lines.values())
