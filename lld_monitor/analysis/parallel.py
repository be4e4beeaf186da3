"""The replay on two cores: the checks that read only a row's own values run in a second process.

Checks that declare ``row_only`` (``checks/base.py``: they read nothing but the row's raw values,
its step and ``warm``; not ``Signals``' features, not the phase, not another check) can run
apart: the spikes, ``ModeCollapse`` and ``LevelShiftCollapse``, which is a third of the replay's
time. For a long table, ``replay`` forks a child that runs those checks
over the rows, a chunk ahead of the parent; the parent's detector holds a ``_Playback`` in their
places, which gives the phase machine each row's rank, pending alert and alerts exactly as the
check gave them (the same code on the same floats in the child: the alerts, the phases and the
final state equal the one-process replay's; ``tests/analysis/test_parallel.py`` checks it on
every sample run and shared real log). At the end the child sends its checks back, and they take
their places again in the detector.

The caller decides to fork (``replay(..., jobs=2)``; the default ``jobs=1`` never does: a
library call forks nothing behind its caller's back, and the triage's workers, whose siblings
have the other cores, keep 1); this module says where it is safe and pays (``can_fork``): at least
``MIN_ROWS`` rows, two usable cores, ``os.fork`` available, no other thread in the process (a
fork of a threaded process can deadlock); and the replay asks a fresh detector and steps
strictly increasing (every row reaches the checks). Each check's ``begin_replay`` runs in the
process that runs the check. Anything wrong in the child (it died, it raised, it sent nonsense)
makes ``replay_parallel`` return False after cleaning up, and the caller replays in one process
from the start.
"""

from __future__ import annotations

import os
import signal
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from lld_monitor.analysis.checks import NO_ALERTS
from lld_monitor.analysis.signals import INPUT_COLUMNS, warm_rows

#: Rows from which a replay is split over two processes (below it the fork costs more than it
#: saves).
MIN_ROWS = 20_000
#: Rows the child sends at a time. The parent waits for the first chunk only (the child is the
#: faster of the two), so it is short; and all are the same length (chunks that grew would have
#: the child run a longer chunk than the parent's at every step, and the parent wait each time).
CHUNK = 2048
#: Seconds without a word from the child after which it is taken for hung (a chunk takes a few
#: hundredths of a second): it is killed and the replay runs in one process.
CHILD_TIMEOUT_S = 60.0

#: The fields of the row records the child's checks read (``Check.row_only``; ``warm`` is
#: ``Signals.warm``, a function of the step and the row count: ``signals.warm_rows``).
_FIELDS = ("step", *INPUT_COLUMNS, "warm")


def chunks(n: int) -> list[tuple[int, int]]:
    """[(lo, hi)] row ranges of ``CHUNK`` rows (the last one shorter)."""
    return [(lo, min(lo + CHUNK, n)) for lo in range(0, n, CHUNK)]


def can_fork(n: int) -> bool:
    """Whether a replay of ``n`` rows may fork here: at least ``MIN_ROWS`` rows, ``os.fork``,
    two usable cores and no other thread in this process."""
    if n < MIN_ROWS or not hasattr(os, "fork"):
        return False
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return cores >= 2 and threading.active_count() == 1


def offloadable(det: Any) -> list[int]:
    """The indices in ``det.checks`` of the checks a child may run (``Check.row_only``)."""
    return [i for i, c in enumerate(det.checks) if getattr(c, "row_only", False)]


class _Playback:
    """Stands in a detector's check list for a check run in the child: each row it gives what
    the check gave on that row (its alerts, ``rank``, ``pending``), from the child's records."""

    __slots__ = (
        "_at",
        "_events",
        "_row",
        "immediate",
        "key",
        "kind",
        "pending",
        "rank",
        "recover_after",
    )

    def __init__(self, check: Any) -> None:
        self.kind, self.key = check.kind, check.key
        self.immediate = bool(getattr(check, "immediate", False))
        self.rank = check.rank
        self.recover_after = check.recover_after
        self.pending = None
        self._events: deque[tuple[int, int, Any, list]] = deque()
        self._row = 0  # the row the next update is for
        self._at = -1  # the row of the next record (-1: none yet)

    def feed(self, events: Sequence[tuple[int, int, Any, list]]) -> None:
        self._events.extend(events)
        if self._at < 0 and self._events:
            self._at = self._events[0][0]

    def update(self, s: Any) -> list:
        i = self._row
        self._row = i + 1
        if i != self._at:
            if self.pending is not None:
                self.pending = None
            return NO_ALERTS
        ev = self._events
        _, self.rank, self.pending, alerts = ev.popleft()
        self._at = ev[0][0] if ev else -1
        return alerts or NO_ALERTS


def _child(
    conn: Any, checks: list[Any], arrays: list, steps: np.ndarray, warm: np.ndarray, n: int
) -> None:
    """Run ``checks`` over the rows; send ``(hi, records)`` per chunk, then ``("done",
    checks)``. A record ``(row, rank, pending, alerts)`` is kept where the row raised alerts,
    left a pending alert or changed the rank."""
    import math
    from collections import namedtuple

    row_type = namedtuple("_RowValues", _FIELDS)  # type: ignore[misc]
    make = row_type._make
    has_pending = [hasattr(c, "pending") for c in checks]
    last = [c.rank for c in checks]
    updates = [c.update for c in checks]
    k = range(len(checks))
    for lo, hi in chunks(n):
        nan_col = [math.nan] * (hi - lo)
        cols = [nan_col if a is None else a[lo:hi].tolist() for a in arrays]
        records: list[list] = [[] for _ in k]
        rows = zip(steps[lo:hi].astype(float, copy=False).tolist(), *cols, warm[lo:hi].tolist())
        for i, row in enumerate(map(make, rows), lo):
            for j in k:
                out = updates[j](row)
                c = checks[j]
                p = c.pending if has_pending[j] else None
                r = c.rank
                if out or p is not None or r != last[j]:
                    records[j].append((i, r, p, list(out)))
                    last[j] = r
        conn.send((hi, records))
    for c in checks:
        c.end_replay()  # (what begin_replay kept is the replay's, and large: not sent back)
    conn.send(("done", checks))


def replay_parallel(
    det: Any,
    index: list[int],
    arrays: list,
    steps: np.ndarray,
    run_rows: Callable[[int, int], None],
    columns: Mapping[str, Any] | None = None,
) -> bool:
    """Replay with the checks ``det.checks[index]`` in a forked child; ``run_rows(lo, hi)``
    feeds the parent's rows (the caller's loop). ``columns``: the table's input columns for
    the checks' ``begin_replay``, each check's run in the process that runs it (the level-shift
    bound is never held by the parent); None: none is called. True when done; False when the
    child failed (cleaned up: the caller resets the detector and replays in one process)."""
    from multiprocessing import Pipe

    n = len(steps)
    originals = [det.checks[i] for i in index]
    reader, writer = Pipe(duplex=False)
    try:
        pid = os.fork()
    except OSError:  # (no process to be had: EAGAIN, ENOMEM) the caller replays in this one
        reader.close()
        writer.close()
        return False
    if pid == 0:  # the child: never returns
        code = 1
        try:
            reader.close()
            if columns is not None:
                for c in originals:
                    c.begin_replay(columns)
                    c.horizon(columns)
            _child(writer, originals, arrays, steps, warm_rows(steps, det.config), n)
            code = 0
        finally:
            os._exit(code)
    writer.close()
    plays = [_Playback(c) for c in originals]
    ok = False
    try:
        for i, p in zip(index, plays):
            det.checks[i] = p
        det.refresh()
        if columns is not None:
            det.begin_replay(columns, skip=index)
        for lo, hi in chunks(n):
            if not reader.poll(CHILD_TIMEOUT_S):
                return False
            got_hi, records = reader.recv()
            if got_hi != hi:
                return False
            for p, rec in zip(plays, records):
                p.feed(rec)
            run_rows(lo, hi)
        if not reader.poll(CHILD_TIMEOUT_S):
            return False
        tag, back = reader.recv()
        if tag != "done" or [type(c) for c in back] != [type(c) for c in originals]:
            return False
        originals = back
        ok = True
        return True
    except (EOFError, OSError, ValueError, TypeError):
        return False
    finally:
        for i, c in zip(index, originals):
            det.checks[i] = c
        det.refresh()
        reader.close()
        if not ok:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
