"""The replay on two cores: the checks that read only a row's own values run in a second process.

Checks that declare ``row_only`` (``checks/base.py``: they read nothing but the row's raw values,
its step and ``warm``; not ``Signals``' features, not the phase, not another check) can run apart:
the spikes, ``ModeCollapse`` and ``LevelShiftCollapse``, which is a third of the replay's time. For
a long table, ``replay`` forks a child that runs those checks over the rows, a chunk ahead of the
parent; the parent's detector holds a stand-in in their places (``Playback``, a ``Check``), which
gives the phase machine each row's rank, pending alert and alerts exactly as the check gave them
(the same code on the same floats in the child: the alerts, the phases and the final state equal
the one-process replay's; ``tests/analysis/test_parallel.py`` checks it on every sample run and
shared real log). At the end the child sends its checks back, and they take their places again in
the detector.

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
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from lld_monitor.analysis.checks import NO_ALERTS, Check
from lld_monitor.analysis.signals import INPUT_COLUMNS, warm_rows
from lld_monitor.analysis.stats import plain_json
from lld_monitor.events import Alert

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
    return [i for i, c in enumerate(det.checks) if c.row_only]


#: One row's record of a check run apart: (row index, rank, pending alert, alerts). Kept where
#: the row raised alerts, left a pending alert or changed the rank.
Record = tuple[int, int, "Alert | None", list["Alert"]]


def record_rows(checks: Sequence[Check], rows: Iterable[Any], first: int = 0) -> list[list[Record]]:
    """Feed ``rows`` (row records, the row index of the first being ``first``) to ``checks``;
    each check's records (``Record``) of these rows. The child calls it per chunk, and
    carries ``checks`` (their state, and the rank each last recorded) from chunk to chunk."""
    last = [c.rank for c in checks]
    out: list[list[Record]] = [[] for _ in checks]
    updates = [c.update for c in checks]
    k = range(len(checks))
    for i, row in enumerate(rows, first):
        for j in k:
            alerts = updates[j](row)
            c = checks[j]
            p, r = c.pending, c.rank
            if alerts or p is not None or r != last[j]:
                out[j].append((i, r, p, list(alerts)))
                last[j] = r
    return out


class Playback(Check):
    """Stands in a detector's check list for a check run in the child: each row it gives what
    the check gave on that row (its alerts, ``rank``, ``pending``), from the check's records
    (``record_rows``, handed in by ``feed``). A ``Check`` like the others: its name, key,
    alert kinds, ``immediate`` and ``recover_after`` are the check's, and its state (the row
    it is at and the records not yet played) is plain JSON (the contract tests run over it).
    It reads nothing of the row it is given."""

    __slots__ = (
        "_at",
        "_events",
        "_key",
        "_row",
        "immediate",
        "kind",
        "kinds",
        "pending",
        "rank",
        "recover_after",
    )

    def __init__(self, check: Check) -> None:
        self.kind, self.kinds, self._key = check.kind, check.kinds, check.key  # type: ignore[misc]
        self.immediate = check.immediate  # type: ignore[misc]
        self.recover_after = check.recover_after
        super().__init__(check.config)

    @property
    def key(self) -> str:
        return self._key

    def reset(self) -> None:
        self.rank = 0
        self.pending = None
        self._events: deque[Record] = deque()
        self._row = 0  # the row the next update is for
        self._at = -1  # the row of the next record (-1: none yet)

    def feed(self, records: Sequence[Record]) -> None:
        """Append the check's records of the next rows (in row order)."""
        self._events.extend(records)
        if self._at < 0 and self._events:
            self._at = self._events[0][0]

    def update(self, s: Any) -> list[Alert]:
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

    def state_dict(self) -> dict[str, Any]:
        def alert(a: Alert | None) -> dict[str, Any] | None:
            return None if a is None else plain_json(a.to_dict())

        return {
            "row": self._row,
            "rank": self.rank,
            "pending": alert(self.pending),
            "records": [[i, r, alert(p), [alert(a) for a in al]] for i, r, p, al in self._events],
        }

    def load_state_dict(self, d: Mapping[str, Any]) -> None:
        def alert(a: Mapping[str, Any] | None) -> Alert | None:
            return None if a is None else Alert(**a)

        self.reset()
        self._row, self.rank = int(d["row"]), int(d["rank"])
        self.pending = alert(d["pending"])
        recs = d["records"]
        self.feed([(int(i), int(r), alert(p), [alert(a) for a in al]) for i, r, p, al in recs])


def _child(
    conn: Any, checks: list[Check], arrays: list, steps: np.ndarray, warm: np.ndarray, n: int
) -> None:
    """Run ``checks`` over the rows; send ``(hi, records)`` per chunk (``record_rows``), then
    ``("done", checks)``."""
    import math
    from collections import namedtuple

    row_type = namedtuple("_RowValues", _FIELDS)  # type: ignore[misc]
    make = row_type._make
    for lo, hi in chunks(n):
        nan_col = [math.nan] * (hi - lo)
        cols = [nan_col if a is None else a[lo:hi].tolist() for a in arrays]
        rows = zip(steps[lo:hi].astype(float, copy=False).tolist(), *cols, warm[lo:hi].tolist())
        conn.send((hi, record_rows(checks, map(make, rows), lo)))
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
    plays = [Playback(c) for c in originals]
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
