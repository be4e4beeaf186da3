"""The run log's writer: ``RunWriter`` appends rows, events and token samples to a run folder,
never losing a row, never raising into the training run (docs/run-format.md)."""

from __future__ import annotations

import io
import json
import math
import os
import platform
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import pandas as pd

from lld_monitor import columns as C
from lld_monitor.runlog.common import (
    _MAX_STEPS_NAMED,
    _TOKEN_FILE_RE,
    CLOSED_FILE,
    DEFAULT_FSYNC_EVERY_S,
    DEFAULT_MAX_PENDING_BYTES,
    DEFAULT_TOKEN_BUDGET_BYTES,
    EVENTS_FILE,
    META_FILE,
    SCHEMA_VERSION,
    STEPS_FILE,
    TOKENS_DIR,
    WRITE_WARNING_EVERY_S,
    RunFormatError,
    _check_run_dir,
    _dumps,
    _package_versions,
    _plain,
    _plain_row,
    _read_meta,
    _step_ranges,
    _write_atomic,
    is_run_dir,
    logger,
)


@dataclass
class _Episode:
    """One stretch of failed writes to one file, from the first failure to the next success."""

    error: str
    started: float = field(default_factory=time.monotonic)
    n_failures: int = 1
    delayed: list[int | None] = field(default_factory=list)  # held, then written
    lost: list[int | None] = field(default_factory=list)  # dropped from the memory bound
    n_delayed: int = 0
    n_lost: int = 0

    def note(self, kind: str, step: int | None) -> None:
        names = self.delayed if kind == "delayed" else self.lost
        if len(names) < _MAX_STEPS_NAMED:
            names.append(step)
        if kind == "delayed":
            self.n_delayed += 1
        else:
            self.n_lost += 1


class _AppendLog:
    """One append-only JSON-lines file, written a whole line at a time.

    A write that fails (an OSError such as ENOSPC, or a short write the retry cannot finish) is
    cut back to the end of the last complete line, so no torn line is ever followed by another;
    the line is held in memory (at most ``max_pending_bytes``, oldest dropped first and counted as
    lost) and written before the next one. Not thread-safe: the writer holds its lock.
    """

    def __init__(self, path: Path, max_pending_bytes: int) -> None:
        self.path = path
        self.max_pending_bytes = max_pending_bytes
        self.file = open(path, "ab", buffering=0)  # unbuffered: a line is one write() call
        self.size = self.file.seek(0, os.SEEK_END)  # end of the last complete line
        self.dirty = False  # bytes past ``size`` may be on disk (cutting them back failed)
        self.pending: deque[tuple[int | None, bytes]] = deque()
        self.pending_bytes = 0
        self.episode: _Episode | None = None
        self.n_written = 0
        self.n_lost = 0

    def append(self, line: bytes, step: int | None) -> tuple[bool, _Episode | None]:
        """Queue ``line`` and write what is queued; returns (all written, episode just over)."""
        self.pending.append((step, line))
        self.pending_bytes += len(line)
        return self.flush(fresh=True)

    def flush(self, *, fresh: bool = False) -> tuple[bool, _Episode | None]:
        """Write the held lines in order; returns (all written, the episode that just ended).

        ``fresh``: the last held line is the one being appended now (written on time if it goes).
        """
        while self.pending:
            step, line = self.pending[0]
            error = self._write_line(line)
            if error is not None:
                self._failed(error)
                return False, None
            self.pending.popleft()
            self.pending_bytes -= len(line)
            self.n_written += 1
            on_time = fresh and not self.pending
            if self.episode is not None and not on_time:
                self.episode.note("delayed", step)
        ended, self.episode = self.episode, None
        return True, ended

    def _write_line(self, line: bytes) -> OSError | None:
        """Write ``line`` whole at the end of the last complete line; the error if it failed."""
        try:
            if self.dirty:
                self.file.truncate(self.size)
                self.dirty = False
            done = 0
            while done < len(line):
                n = self.file.write(line[done:])
                if not n:  # a short write that made no progress: the disk is full
                    raise OSError(28, f"wrote {done} of {len(line)} bytes", str(self.path))
                done += n
        except OSError as exc:
            self._cut_back()
            return exc
        self.size += len(line)
        return None

    def _cut_back(self) -> None:
        """Truncate a partly written line away (retried before the next write if this fails)."""
        try:
            self.file.truncate(self.size)
            self.dirty = False
        except OSError:
            self.dirty = True

    def _failed(self, error: OSError) -> None:
        if self.episode is None:
            self.episode = _Episode(error=f"{type(error).__name__}: {error}")
        else:
            self.episode.n_failures += 1
        while self.pending_bytes > self.max_pending_bytes and self.pending:
            step, line = self.pending.popleft()
            self.pending_bytes -= len(line)
            self.n_lost += 1
            self.episode.note("lost", step)

    def drop_pending(self) -> _Episode | None:
        """At close: count what is still held as lost; the open episode, if any."""
        while self.pending:
            step, _ = self.pending.popleft()
            self.n_lost += 1
            if self.episode is not None:
                self.episode.note("lost", step)
        self.pending_bytes = 0
        ended, self.episode = self.episode, None
        return ended

    def fsync(self) -> OSError | None:
        try:
            os.fsync(self.file.fileno())
        except OSError as exc:
            return exc
        return None

    def close(self) -> None:
        try:
            self.file.close()
        except OSError as exc:
            logger.warning("lld_monitor: closing %s failed: %s", self.path, exc)


class _RateLimitedWarnings:
    """``logger.warning`` at most once per ``every_s``; the next one says how many were held."""

    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self._last = -math.inf
        self._held = 0

    def warn(self, msg: str, *args: Any) -> None:
        now = time.monotonic()
        if now - self._last < self.every_s:
            self._held += 1
            return
        if self._held:
            msg += f" ({self._held} more write warning(s) held back in the last {self.every_s:g} s)"
            self._held = 0
        self._last = now
        logger.warning(msg, *args)


# --- the writer ---------------------------------------------------------------------------------


def _token_parquet(rows: pd.DataFrame | list[dict[str, Any]], step: int) -> bytes | None:
    """Token rows as Parquet bytes, token columns first, ``step`` set; None when empty.

    A list of dicts goes straight to Arrow (no pandas frame: this runs once per probed step).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    if isinstance(rows, pd.DataFrame):
        if rows.empty:
            return None
        frame = rows.copy()
        frame[C.TOK_STEP] = step
        table = pa.Table.from_pandas(frame, preserve_index=False)
    else:
        rows = list(rows)
        if not rows:
            return None
        keys = dict.fromkeys(k for r in rows for k in r)
        keys[C.TOK_STEP] = None
        columns = {k: [r.get(k) for r in rows] for k in keys}
        columns[C.TOK_STEP] = [step] * len(rows)
        table = pa.table(columns)
    ordered = [c for c in C.TOKEN_COLUMNS if c in table.column_names]
    table = table.select(ordered + [c for c in table.column_names if c not in ordered])
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


class RunWriter:
    """Append-only writer of one run folder; thread-safe; one writer per folder (rank 0).

    A full or failing disk never raises from ``log_step``/``log_event``/``log_tokens``: a row is
    written whole or not at all, rows that cannot be written are held in memory (at most
    ``max_pending_bytes``) and written before the next one, and once writing works again a
    ``log_recovered`` event says which steps were written late and which were lost. Every failure
    episode is logged as a warning (at most one per ``WRITE_WARNING_EVERY_S``).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        meta: Mapping[str, Any] | None = None,
        *,
        resume: bool = False,
        fsync_every_s: float = DEFAULT_FSYNC_EVERY_S,
        token_budget_bytes: int = DEFAULT_TOKEN_BUDGET_BYTES,
        max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
    ) -> None:
        if max_pending_bytes < 0:
            raise ValueError(
                f"max_pending_bytes must be >= 0 (0 = drop a row that cannot be written), "
                f"got {max_pending_bytes}"
            )
        if fsync_every_s < 0:
            raise ValueError(f"fsync_every_s must be >= 0 (0 = every row), got {fsync_every_s}")
        if token_budget_bytes < 0:
            raise ValueError(f"token_budget_bytes must be >= 0, got {token_budget_bytes}")
        self.path = Path(path)
        self.fsync_every_s = float(fsync_every_s)
        self.token_budget_bytes = int(token_budget_bytes)
        self._lock = threading.Lock()
        self._closed = False
        self._budget_event_logged = False
        self._last_step: int | None = None
        self.max_pending_bytes = int(max_pending_bytes)
        self._fail_warnings = _RateLimitedWarnings(WRITE_WARNING_EVERY_S)
        self._recover_warnings = _RateLimitedWarnings(WRITE_WARNING_EVERY_S)
        self.n_token_files_failed = 0  # token samples that could not be written (disk full)

        if self.path.exists() and not self.path.is_dir():
            raise RunFormatError(f"{self.path} is a file; RunWriter needs a folder path")
        resuming = is_run_dir(self.path)
        if resuming and not resume:
            raise FileExistsError(
                f"{self.path} already holds a run; pass resume=True to append to it, "
                "or choose a new folder"
            )
        if not resuming and (self.path / META_FILE).exists():
            _check_run_dir(self.path)  # meta without steps: refuse to overwrite someone's meta
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / TOKENS_DIR).mkdir(exist_ok=True)

        torn_bytes = 0
        if resuming:
            self.meta = _read_meta(self.path)
            torn_bytes = self._drop_torn_tail(self.path / STEPS_FILE)
            torn_bytes += self._drop_torn_tail(self.path / EVENTS_FILE)
            (self.path / CLOSED_FILE).unlink(missing_ok=True)
        else:
            extra = _plain(dict(meta or {}), "meta", lenient=True)
            self.meta = {
                "schema_version": SCHEMA_VERSION,
                "created": time.time(),
                "created_iso": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "versions": _package_versions(),
                "host": platform.node(),
                "argv": list(sys.argv),
                "config": {},
                "trainer": None,
                **extra,
            }
            self.meta["schema_version"] = SCHEMA_VERSION
            (self.path / STEPS_FILE).touch()
            (self.path / EVENTS_FILE).touch()
            _write_atomic(self.path / META_FILE, _dumps(self.meta))

        # Unbuffered: each row is one write() call, visible to readers at once.
        self._steps = _AppendLog(self.path / STEPS_FILE, self.max_pending_bytes)
        self._events = _AppendLog(self.path / EVENTS_FILE, self.max_pending_bytes)
        self._last_fsync = time.monotonic()
        self._token_bytes = sum(
            f.stat().st_size for f in (self.path / TOKENS_DIR).glob("*.parquet") if f.is_file()
        )
        self._token_seq = 1 + max(
            (
                int(m.group(2))
                for f in (self.path / TOKENS_DIR).iterdir()
                if (m := _TOKEN_FILE_RE.match(f.name))
            ),
            default=-1,
        )
        if resuming:
            msg = "run resumed"
            if torn_bytes:
                msg += f"; dropped a torn last line of {torn_bytes} bytes left by the last writer"
            self.log_event(
                {C.EVENT_TYPE: "lifecycle", C.EVENT_KIND: "resume", C.EVENT_MESSAGE: msg}
            )
        else:
            self.log_event(
                {C.EVENT_TYPE: "lifecycle", C.EVENT_KIND: "start", C.EVENT_MESSAGE: "run started"}
            )

    @staticmethod
    def _drop_torn_tail(file: Path) -> int:
        """Truncate an incomplete last line (a crash mid-write) so appends start on a fresh line."""
        if not file.is_file():
            file.touch()
            return 0
        with open(file, "rb+") as f:
            size = f.seek(0, os.SEEK_END)
            if size == 0:
                return 0
            f.seek(max(0, size - 65536))
            tail = f.read()
            if tail.endswith(b"\n"):
                return 0
            cut = tail.rfind(b"\n")
            if cut < 0 and size > len(tail):
                return 0  # a single line longer than 64 KiB: leave it to the reader to skip
            try:
                complete = isinstance(json.loads(tail[cut + 1 :]), dict)
            except (json.JSONDecodeError, UnicodeDecodeError):
                complete = False
            if complete:  # a whole record that only lacks its newline: keep it
                f.write(b"\n")
                return 0
            keep = size - len(tail) + cut + 1
            f.truncate(keep)
            return size - keep

    # -- public API --------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def n_steps(self) -> int:
        """Step rows this writer wrote whole to the file (not rows held in memory, lost ones,
        or rows from before a resume)."""
        return self._steps.n_written

    @property
    def rows_lost(self) -> int:
        """Step rows that could not be written (disk full beyond ``max_pending_bytes``)."""
        return self._steps.n_lost

    @property
    def rows_pending(self) -> int:
        """Step rows held in memory, waiting for the disk to take them."""
        return len(self._steps.pending)

    @property
    def token_bytes(self) -> int:
        """Bytes of token samples in the folder, counted against ``token_budget_bytes``."""
        return self._token_bytes

    def log_step(self, row: Mapping[str, Any]) -> None:
        """Append one step row: needs ``step``; adds ``time`` if absent; NaN/inf stored as null."""
        if C.STEP not in row:
            raise ValueError(
                f"log_step needs a {C.STEP!r} key (the optimizer step); got keys {sorted(row)[:8]}"
            )
        record = _plain_row(row)
        record[C.STEP] = _as_step(record[C.STEP])
        if record.get(C.TIME) is None:
            record[C.TIME] = time.time()
        line = _dumps(record)
        with self._lock:
            self._require_open()
            self._last_step = record[C.STEP]
            ok, ended = self._steps.append(line, record[C.STEP])
            self._report(self._steps, ok, ended)
            now = time.monotonic()
            if ok and now - self._last_fsync >= self.fsync_every_s:
                self._fsync(self._steps)
                self._last_fsync = now

    def log_event(self, event: Mapping[str, Any]) -> None:
        """Append one event (see ``events.make_event``); fsynced at once, events are rare."""
        line = _event_line(event)
        with self._lock:
            self._require_open()
            self._write_event(line)

    def _write_event(self, line: bytes) -> None:
        ok, ended = self._events.append(line, None)
        self._report(self._events, ok, ended)
        if ok:
            self._fsync(self._events)

    def _fsync(self, log: _AppendLog) -> None:
        error = log.fsync()
        if error is not None:
            self._fail_warnings.warn(
                "lld_monitor: fsync of %s failed (%s); its last rows may not be on disk yet",
                log.path,
                error,
            )

    def _report(self, log: _AppendLog, ok: bool, ended: _Episode | None) -> None:
        """Warn when a failure episode starts; record the end of one (the lock is held)."""
        if not ok and log.episode is not None and log.episode.n_failures == 1:
            self._fail_warnings.warn(
                "lld_monitor: cannot write %s (%s); training continues: up to %d bytes of rows "
                "are held in memory and written when the disk takes them again (free space on "
                "that disk), older ones are lost and counted in a log_recovered event",
                log.path,
                log.episode.error,
                log.max_pending_bytes,
            )
        if ended is not None:
            self._log_recovered(log, ended, recovered=True)

    def _log_recovered(self, log: _AppendLog, ep: _Episode, *, recovered: bool) -> None:
        """The ``log_recovered`` event of a failure episode: steps written late, steps lost."""
        what = "rows" if log is self._steps else "events"
        lost = _step_ranges([s for s in ep.lost if s is not None])
        delayed = _step_ranges([s for s in ep.delayed if s is not None])
        seconds = time.monotonic() - ep.started
        head = (
            f"{log.path.name} is written again after {seconds:.1f} s of failed writes"
            if recovered
            else f"{log.path.name} still failed at close after {seconds:.1f} s"
        )
        message = (
            f"{head} ({ep.error}): {ep.n_lost} {what} lost"
            + (f" (steps {lost})" if lost else "")
            + f", {ep.n_delayed} held in memory and written late"
            + (f" (steps {delayed})" if delayed else "")
        )
        evidence = {
            "file": log.path.name,
            "error": ep.error,
            "seconds": round(seconds, 3),
            "n_failed_writes": ep.n_failures,
            f"{what}_lost": ep.n_lost,
            "steps_lost": lost,
            f"{what}_delayed": ep.n_delayed,
            "steps_delayed": delayed,
        }
        self._recover_warnings.warn("lld_monitor: %s", message)
        line = _event_line(
            {
                C.EVENT_TYPE: "lifecycle",
                C.EVENT_STEP: self._last_step,
                C.EVENT_KIND: "log_recovered" if recovered else "log_failed",
                C.EVENT_SEVERITY: "warning" if ep.n_lost or not recovered else "info",
                C.EVENT_MESSAGE: message,
                C.EVENT_EVIDENCE: evidence,
            }
        )
        ok, ended = self._events.append(line, None)
        if ended is not None:  # the events file itself recovered with this very line
            self._log_recovered(self._events, ended, recovered=True)
        elif not ok and self._events.episode is not None and self._events.episode.n_failures == 1:
            self._report(self._events, ok, None)

    def log_tokens(self, rows: pd.DataFrame | list[dict[str, Any]], step: int) -> bool:
        """Store token rows of ``step`` as one Parquet file; False if dropped (budget) or empty."""
        step = _as_step(step)
        data = _token_parquet(rows, step)
        if data is None:
            return False
        with self._lock:
            self._require_open()
            if self._token_bytes + len(data) > self.token_budget_bytes:
                log_budget = not self._budget_event_logged
                self._budget_event_logged = True
            else:
                log_budget = False
                name = f"step{step:09d}_{self._token_seq:06d}.parquet"
                self._token_seq += 1
                try:
                    _write_atomic(self.path / TOKENS_DIR / name, data)
                except OSError as exc:
                    self.n_token_files_failed += 1
                    self._fail_warnings.warn(
                        "lld_monitor: token samples of step %d not written (%s); the step row "
                        "is kept (%d token sample file(s) lost so far)",
                        step,
                        exc,
                        self.n_token_files_failed,
                    )
                    return False
                self._token_bytes += len(data)
                return True
        if log_budget:
            self.log_event(
                {
                    C.EVENT_TYPE: "lifecycle",
                    C.EVENT_STEP: step,
                    C.EVENT_KIND: "token_budget_reached",
                    C.EVENT_SEVERITY: "warning",
                    C.EVENT_MESSAGE: (
                        f"token samples reached the budget of {self.token_budget_bytes} bytes "
                        f"({self._token_bytes} stored); later token samples are dropped, "
                        "step rows are kept"
                    ),
                    C.EVENT_EVIDENCE: {
                        "token_bytes": self._token_bytes,
                        "token_budget_bytes": self.token_budget_bytes,
                        "rejected_bytes": len(data),
                    },
                }
            )
        return False

    def close(self, *, error: BaseException | None = None) -> None:
        """Fsync, write the end event and ``closed.json``; idempotent."""
        message = "run closed" if error is None else f"run ended by {type(error).__name__}: {error}"
        line = _event_line(
            {
                C.EVENT_TYPE: "lifecycle",
                C.EVENT_STEP: self._last_step,
                C.EVENT_KIND: "end",
                C.EVENT_SEVERITY: "info" if error is None else "critical",
                C.EVENT_MESSAGE: message,
            }
        )
        with self._lock:
            if self._closed:
                return
            self._closed = True
            ok, ended = self._steps.flush()  # a last try for rows held in memory
            self._report(self._steps, ok, ended)
            open_episode = self._steps.drop_pending()
            if open_episode is not None:
                self._log_recovered(self._steps, open_episode, recovered=False)
            self._write_event(line)
            self._fsync(self._steps)
            events_episode = self._events.drop_pending()
            if events_episode is not None:
                logger.warning(
                    "lld_monitor: %d event(s) could not be written to %s before close (%s)",
                    events_episode.n_lost,
                    self._events.path,
                    events_episode.error,
                )
            self._steps.close()
            self._events.close()
            closed = {
                "closed": True,
                "end_time": time.time(),
                "outcome": "ok" if error is None else "error",
                "n_steps": self._steps.n_written,
                "last_step": self._last_step,
                "rows_lost": self._steps.n_lost,
            }
            try:
                _write_atomic(self.path / CLOSED_FILE, _dumps(closed))
            except OSError as exc:
                logger.warning(
                    "lld_monitor: could not write %s (%s): readers will take the run for a "
                    "live or crashed one; free space and write it with RunWriter(%r, "
                    "resume=True).close()",
                    self.path / CLOSED_FILE,
                    exc,
                    str(self.path),
                )

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(error=exc)

    def _require_open(self) -> None:
        if self._closed:
            raise ValueError(
                f"RunWriter for {self.path} is closed; open a new one with resume=True"
            )


def _event_line(event: Mapping[str, Any]) -> bytes:
    """One validated event as a JSON line (missing fields filled, time added)."""
    etype = event.get(C.EVENT_TYPE)
    if etype not in C.EVENT_TYPES:
        raise ValueError(
            f"event {C.EVENT_TYPE!r} must be one of {C.EVENT_TYPES}, got {etype!r}; "
            "build events with lld_monitor.make_event or Alert.to_event()"
        )
    severity = event.get(C.EVENT_SEVERITY, "info")
    if severity not in C.SEVERITIES:
        raise ValueError(f"event severity must be one of {C.SEVERITIES}, got {severity!r}")
    record = {
        C.EVENT_TYPE: etype,
        C.EVENT_STEP: None,
        C.EVENT_TIME: None,
        C.EVENT_KIND: "",
        C.EVENT_SEVERITY: severity,
        C.EVENT_MESSAGE: "",
        C.EVENT_EVIDENCE: {},
    }
    record.update({str(k): _plain(v, str(k)) for k, v in event.items()})
    if record[C.EVENT_STEP] is not None:
        record[C.EVENT_STEP] = _as_step(record[C.EVENT_STEP])
    if record[C.EVENT_TIME] is None:
        record[C.EVENT_TIME] = time.time()
    return _dumps(record)


def _as_step(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{C.STEP!r} must be an integer, got {value!r}")
    if isinstance(value, float) and not value.is_integer():
        raise ValueError(f"{C.STEP!r} must be an integer, got {value!r}")
    return int(value)
