"""The run log: one folder per run, append-only JSON lines, readable while it is written.

A run folder holds ``meta.json``, ``steps.jsonl`` (one row per step), ``events.jsonl`` (alerts,
phases, interventions, lifecycle), ``tokens/*.parquet`` (bounded token samples) and, once the
writer closed, ``closed.json``. The format is documented in docs/run-format.md. No torch here.
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import math
import os
import platform
import re
import sys
import threading
import time
import warnings
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from types import TracebackType
from typing import Any

import pandas as pd

from lld_monitor import columns as C

logger = logging.getLogger("lld_monitor")

#: Version of the on-disk format this module writes and the newest one it reads.
SCHEMA_VERSION = 1

META_FILE = "meta.json"
STEPS_FILE = "steps.jsonl"
EVENTS_FILE = "events.jsonl"
TOKENS_DIR = "tokens"
CLOSED_FILE = "closed.json"

#: Default byte budget for the token samples of one run (Parquet bytes on disk).
DEFAULT_TOKEN_BUDGET_BYTES = 50_000_000
#: Default fsync cadence of the step log, in seconds (events and closing are always fsynced).
DEFAULT_FSYNC_EVERY_S = 1.0
#: Default bytes of rows and events a writer holds in memory while its files cannot be written
#: (a full disk), retried before the next write; beyond it the oldest held rows are lost.
DEFAULT_MAX_PENDING_BYTES = 8 * 1024 * 1024
#: Seconds between two warnings about write failures (every episode is reported, rate-limited).
WRITE_WARNING_EVERY_S = 60.0
#: Steps named one by one in a ``log_recovered`` event; beyond it only ranges are kept.
_MAX_STEPS_NAMED = 1000

# Packages whose versions go into meta.json (read from installed metadata, never imported).
_VERSIONED_PACKAGES = (
    "lld_monitor",
    "torch",
    "transformers",
    "trl",
    "accelerate",
    "deepspeed",
    "verl",
    "numpy",
    "pandas",
    "pyarrow",
    "wandb",
)
# Below this many bytes the line-by-line parser is faster than pyarrow's reader (its setup cost).
_FAST_PATH_MIN_BYTES = 128 * 1024
_TOKEN_FILE_RE = re.compile(r"^step(-?\d+)_(\d+)\.parquet$")
_EVENT_ORDER = (
    C.EVENT_TYPE,
    C.EVENT_STEP,
    C.EVENT_TIME,
    C.EVENT_KIND,
    C.EVENT_SEVERITY,
    C.EVENT_MESSAGE,
    C.EVENT_EVIDENCE,
)


class RunFormatError(ValueError):
    """A path that is not a readable run folder (missing, not a run, future schema, bad meta)."""


class RunSummaryError(RunFormatError):
    """A run folder kept as a summary: its metadata, events and end-of-run summary are there,
    its step log (``steps.jsonl``) was not kept. Nothing to plot or analyse, by design."""


#: Files that mark a finished run (its end-of-run record; the toy testbed's evaluation).
SUMMARY_FILES: tuple[str, ...] = ("closed.json", "toy_summary.json")


# --- plain JSON ---------------------------------------------------------------------------------


def _plain(value: Any, where: str, *, lenient: bool = False) -> Any:
    """``value`` as plain JSON: numpy/torch scalars unwrapped, non-finite floats as None.

    ``lenient`` (for meta) stores dataclasses as dicts and other unknown objects as ``str``.
    """
    if value is None or isinstance(value, str | bool):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _plain(v, f"{where}.{k}", lenient=lenient) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v, where, lenient=lenient) for v in value]
    item = getattr(value, "item", None)
    if callable(item):  # numpy scalar, 0-d array, one-element torch tensor
        try:
            return _plain(item(), where, lenient=lenient)
        except (ValueError, RuntimeError):  # more than one element: fall through to tolist
            pass
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return _plain(tolist(), where, lenient=lenient)
    if lenient:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return _plain(dataclasses.asdict(value), where, lenient=True)
        return str(value)
    raise TypeError(
        f"{where}: cannot store a {type(value).__name__} in the run log; "
        "pass numbers, strings, bools, lists or dicts"
    )


def _plain_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A step row as plain JSON values; the common types take a fast path."""
    out: dict[str, Any] = {}
    bad: list[str] = []  # non-finite loss / grad norm, stored as null, named in C.NONFINITE
    for key, value in row.items():
        kind = type(value)
        if kind is float:
            if math.isfinite(value):
                out[str(key)] = value
            else:
                out[str(key)] = None
                if key in C.NONFINITE_COLUMNS:
                    bad.append(str(key))
        elif kind is int or kind is str or value is None:
            out[str(key)] = value
        else:
            v = _plain(value, str(key))
            if v is None and key in C.NONFINITE_COLUMNS:
                bad.append(str(key))
            out[str(key)] = v
    if bad and C.NONFINITE not in out:
        out[C.NONFINITE] = ",".join(bad)
    return out


def _dumps(obj: Mapping[str, Any]) -> bytes:
    return (json.dumps(obj, allow_nan=False, separators=(",", ":")) + "\n").encode("utf-8")


def _package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in _VERSIONED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def _write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one.

    On failure (a full disk) the temporary file is removed before the error propagates.
    """
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink(missing_ok=True)
        except OSError as exc:
            logger.warning("lld_monitor: could not remove %s (%s); delete it by hand", tmp, exc)
        raise


def _step_ranges(steps: list[int]) -> str:
    """``[3, 4, 5, 9]`` as ``"3-5, 9"`` (sorted, repeats merged)."""
    parts: list[str] = []
    ordered = sorted(set(steps))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ", ".join(parts)


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


# --- checks shared by reader and writer ---------------------------------------------------------


def is_run_dir(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` is a folder holding ``meta.json`` and ``steps.jsonl``."""
    p = Path(path)
    return (p / META_FILE).is_file() and (p / STEPS_FILE).is_file()


def find_runs(root: str | os.PathLike[str]) -> list[Path]:
    """Run folders at or under ``root`` (recursive, hidden folders skipped), sorted by path."""
    root_path = Path(root)
    if not root_path.is_dir():
        what = "is a file, not a folder" if root_path.exists() else "no such folder"
        raise RunFormatError(f"{root_path}: {what}; pass a run folder or a folder of runs")
    found: list[Path] = []
    for dirpath, dirnames, _ in os.walk(root_path):
        if is_run_dir(dirpath):
            found.append(Path(dirpath))
            dirnames[:] = []  # a run does not contain runs
            continue
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and d != "__pycache__"]
    return sorted(found)


def _check_run_dir(path: Path) -> None:
    if not path.exists():
        raise RunFormatError(f"{path}: no such run folder")
    if not path.is_dir():
        raise RunFormatError(
            f"{path} is a file, not a run folder (a folder with {META_FILE} and {STEPS_FILE}); "
            "for a foreign log (CSV, trainer_state.json, ...) use lld_monitor.load_table"
        )
    missing = [name for name in (META_FILE, STEPS_FILE) if not (path / name).is_file()]
    if missing == [STEPS_FILE] and any((path / f).is_file() for f in SUMMARY_FILES):
        kept = [f for f in (META_FILE, EVENTS_FILE, *SUMMARY_FILES) if (path / f).is_file()]
        raise RunSummaryError(
            f"{path} is a run summary, not a run log: it keeps {', '.join(kept)}, missing "
            f"{STEPS_FILE} (the step rows were not kept, or were deleted), so there is nothing "
            "to plot or analyse; its events and summary can be read as files"
        )
    if missing:
        hint = ""
        below = find_runs(path)
        if below:
            hint = f"; it contains {len(below)} run(s), e.g. {below[0]}"
        raise RunFormatError(
            f"{path} is not a run folder: expected {META_FILE} and {STEPS_FILE}, "
            f"missing {', '.join(missing)}{hint}"
        )


def _read_meta(path: Path) -> dict[str, Any]:
    meta_path = path / META_FILE
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RunFormatError(f"{meta_path}: unreadable run metadata ({exc})") from exc
    if not isinstance(meta, dict):
        raise RunFormatError(f"{meta_path}: expected a JSON object, got {type(meta).__name__}")
    version = meta.get("schema_version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise RunFormatError(f"{meta_path}: missing or non-integer schema_version ({version!r})")
    if version > SCHEMA_VERSION:
        raise RunFormatError(
            f"{path} uses run-format schema version {version}, but this lld_monitor reads up to "
            f"version {SCHEMA_VERSION}: upgrade lld_monitor to read it"
        )
    if version < 1:
        raise RunFormatError(f"{meta_path}: invalid schema_version {version} (must be >= 1)")
    return meta


def _read_closed(path: Path) -> dict[str, Any] | None:
    try:
        closed = json.loads((path / CLOSED_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None  # written atomically, so only a foreign hand could garble it
    return closed if isinstance(closed, dict) else None


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


# --- reading ------------------------------------------------------------------------------------


def _parse_lines(data: bytes, *, final: bool) -> tuple[list[dict[str, Any]], int, int]:
    """Parse JSON lines; returns (records, garbled middle lines, bytes consumed).

    With ``final`` the text after the last newline is parsed too (ignored if torn); without it
    that partial line is left unconsumed for the next read.
    """
    end = data.rfind(b"\n") + 1
    lines = data[:end].split(b"\n")[:-1] if end else []
    records: list[dict[str, Any]] = []
    garbled = 0
    loads = json.loads
    for line in lines:
        if not line.strip():
            continue
        try:
            obj = loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            garbled += 1
            continue
        if isinstance(obj, dict):
            records.append(obj)
        else:
            garbled += 1
    consumed = end
    if final and end < len(data):
        tail = data[end:]
        try:
            obj = loads(tail)
        except (json.JSONDecodeError, UnicodeDecodeError):
            obj = None  # torn last line: a crash or a racing writer; never fatal
        if isinstance(obj, dict):
            records.append(obj)
        consumed = len(data)
    return records, garbled, consumed


#: pyarrow's JSON block size for the step log (see ``_fast_steps``).
_ARROW_BLOCK_BYTES = 16 << 20


def _fast_steps(data: bytes) -> pd.DataFrame | None:
    """Parse whole step lines with pyarrow's JSON reader; None when the careful path is needed.

    Falls back (None) on any garbled line, a complete last line without newline, a missing or
    non-integer step, or nested values, so both paths give the same frame.
    """
    end = data.rfind(b"\n") + 1
    if end == 0 or data[end:].strip():
        return None
    import pyarrow as pa
    import pyarrow.json as pa_json

    try:
        # (16 MB blocks: a 660 MB log of 1M rows parses in 1.8 s, against 2.8 s with pyarrow's
        # default 1 MB; a longer line than a block fails the parse and takes the careful path)
        options = pa_json.ReadOptions(block_size=_ARROW_BLOCK_BYTES)
        source = pa.BufferReader(memoryview(data)[:end])  # (no copy of the bytes)
        table = pa_json.read_json(source, read_options=options)
    except pa.ArrowInvalid:
        return None
    if C.STEP not in table.column_names:
        return None
    step = table.column(C.STEP)
    if step.type != pa.int64() or step.null_count:
        return None
    if any(pa.types.is_nested(f.type) for f in table.schema):
        return None
    return table.select(_column_order(table.column_names)).to_pandas()  # (ordered: no copy)


def _column_order(names: Sequence[str]) -> list[str]:
    """``names`` with the canonical step columns first, in their order, then the others."""
    ordered = [c for c in C.STEP_COLUMNS if c in names]
    return ordered + [c for c in names if c not in ordered]


def _numeric_columns(frame: pd.DataFrame) -> pd.DataFrame:
    """Turn all-number object columns (numbers mixed with nulls) into floats with NaN."""
    for col in frame.columns:
        if frame[col].dtype == object:
            try:
                frame[col] = pd.to_numeric(frame[col])
            except (ValueError, TypeError):
                continue
    return frame


def _steps_frame(records: list[dict[str, Any]] | pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """Step records as a DataFrame (canonical columns first); returns (frame, rows without step)."""
    if isinstance(records, pd.DataFrame):
        good, n_bad = records, 0
    else:
        kept = [r for r in records if _valid_step(r.get(C.STEP))]
        good, n_bad = kept, len(records) - len(kept)
    if len(good) == 0:
        return pd.DataFrame({C.STEP: pd.Series([], dtype="int64")}), n_bad
    frame = good if isinstance(good, pd.DataFrame) else pd.DataFrame.from_records(good)
    frame = _numeric_columns(frame)
    frame[C.STEP] = frame[C.STEP].astype("int64")
    order = _column_order(list(frame.columns))
    if order != list(frame.columns):
        frame = frame[order]
    return frame, n_bad


def _valid_step(value: Any) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool)) or (
        isinstance(value, float) and value.is_integer()
    )


def _events_frame(records: list[dict[str, Any]]) -> pd.DataFrame:
    frame = pd.DataFrame.from_records(records) if records else pd.DataFrame()
    for col in _EVENT_ORDER:
        if col not in frame.columns:
            frame[col] = pd.Series([], dtype=object) if frame.empty else None
    frame[C.EVENT_STEP] = pd.to_numeric(frame[C.EVENT_STEP], errors="coerce").astype("Int64")
    frame[C.EVENT_TIME] = pd.to_numeric(frame[C.EVENT_TIME], errors="coerce").astype("float64")
    return frame[list(_EVENT_ORDER) + [c for c in frame.columns if c not in _EVENT_ORDER]]


def _token_files(path: Path) -> Iterator[tuple[int, Path]]:
    folder = path / TOKENS_DIR
    if not folder.is_dir():
        return
    for f in sorted(folder.iterdir()):
        m = _TOKEN_FILE_RE.match(f.name)
        if m:
            yield int(m.group(1)), f


def _read_tokens(path: Path, step: int | None) -> pd.DataFrame:
    frames = [pd.read_parquet(f) for s, f in _token_files(path) if step is None or s == step]
    if not frames:
        return pd.DataFrame({c: pd.Series([], dtype=object) for c in C.TOKEN_COLUMNS})
    return pd.concat(frames, ignore_index=True)


class _RunFiles:
    """What both a loaded ``Run`` and a live ``RunReader`` read straight from the folder."""

    path: Path

    @property
    def last_modified(self) -> float:
        """UNIX time of the last write to the step log (tells a live run from a stale one)."""
        return (self.path / STEPS_FILE).stat().st_mtime

    def tokens(self, step: int | None = None) -> pd.DataFrame:
        """Token samples (columns.TOKEN_COLUMNS), all of them or those of one ``step``."""
        return _read_tokens(self.path, step)

    def token_steps(self) -> list[int]:
        """Steps that have token samples, ascending."""
        return sorted({s for s, _ in _token_files(self.path)})


@dataclass(frozen=True, eq=False)
class Run(_RunFiles):
    """A run folder loaded in full: meta, steps (sorted by step), events; tokens on demand."""

    path: Path
    meta: dict[str, Any]
    steps: pd.DataFrame
    events: pd.DataFrame
    closed_info: dict[str, Any] | None = None
    skipped_lines: dict[str, int] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        """True once the writer closed (``closed.json``); False while running or after a crash."""
        return bool(self.closed_info and self.closed_info.get("closed"))

    @property
    def name(self) -> str:
        return self.path.name

    def __repr__(self) -> str:
        state = "finished" if self.finished else "running or crashed"
        return (
            f"Run({str(self.path)!r}, {len(self.steps)} steps, {len(self.events)} events, {state})"
        )


def _read_jsonl(file: Path) -> tuple[list[dict[str, Any]], int]:
    try:
        data = file.read_bytes()
    except FileNotFoundError:
        return [], 0
    records, garbled, _ = _parse_lines(data, final=True)
    return records, garbled


def _parse_steps(data: bytes, *, final: bool) -> tuple[pd.DataFrame, int, int]:
    """Step lines as a frame: (frame, skipped lines, bytes consumed); fast path when clean."""
    end = data.rfind(b"\n") + 1
    clean_tail = not final or not data[end:].strip()
    fast = _fast_steps(data[:end]) if end > _FAST_PATH_MIN_BYTES and clean_tail else None
    if fast is not None:
        frame, _ = _steps_frame(fast)
        return frame, 0, end if not final else len(data)
    records, garbled, consumed = _parse_lines(data, final=final)
    frame, no_step = _steps_frame(records)
    return frame, garbled + no_step, consumed


def load_run(path: str | os.PathLike[str] | Run) -> Run:
    """Load a run folder; torn/garbled lines are skipped; a repeated step keeps its last row."""
    if isinstance(path, Run):
        return path
    run_path = Path(path)
    _check_run_dir(run_path)
    meta = _read_meta(run_path)
    closed = _read_closed(run_path)  # read before the steps: closed + steps => all steps seen
    steps, steps_skipped, _ = _parse_steps((run_path / STEPS_FILE).read_bytes(), final=True)
    if len(steps):
        steps = steps.drop_duplicates(subset=C.STEP, keep="last")
        steps = steps.sort_values(C.STEP, kind="stable").reset_index(drop=True)
    event_records, events_garbled = _read_jsonl(run_path / EVENTS_FILE)
    events = _events_frame(event_records)
    skipped = {STEPS_FILE: steps_skipped, EVENTS_FILE: events_garbled}
    _warn_skipped(run_path, skipped)
    return Run(run_path, meta, steps, events, closed, skipped)


def _warn_skipped(path: Path, skipped: Mapping[str, int]) -> None:
    bad = {k: v for k, v in skipped.items() if v}
    if bad:
        detail = ", ".join(f"{n} in {k}" for k, v in bad.items() for n in [v])
        warnings.warn(
            f"{path}: skipped {sum(bad.values())} garbled line(s) ({detail})",
            RuntimeWarning,
            stacklevel=3,
        )


class RunReader(_RunFiles):
    """Incremental reader of a live run: each read returns only rows appended since the last."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        _check_run_dir(self.path)
        self.meta = _read_meta(self.path)
        self._offsets = {STEPS_FILE: 0, EVENTS_FILE: 0}
        self._inodes: dict[str, int] = {}
        self.skipped_lines = {STEPS_FILE: 0, EVENTS_FILE: 0}

    @property
    def finished(self) -> bool:
        """True once the writer closed (``closed.json`` present)."""
        closed = _read_closed(self.path)
        return bool(closed and closed.get("closed"))

    def _read_new(self, name: str) -> tuple[bytes, int]:
        """Bytes appended to ``name`` since the last read, and the offset they start at."""
        file = self.path / name
        try:
            st = file.stat()
        except FileNotFoundError:
            return b"", 0
        offset = self._offsets[name]
        if self._inodes.get(name, st.st_ino) != st.st_ino or st.st_size < offset:
            warnings.warn(f"{file} was replaced; reading it from the start", RuntimeWarning, 2)
            offset = 0
        self._inodes[name] = st.st_ino
        if st.st_size == offset:
            return b"", offset
        with open(file, "rb") as f:
            f.seek(offset)
            return f.read(), offset

    def read_steps(self) -> pd.DataFrame:
        """Step rows appended since the last call, in write order (empty frame when none)."""
        data, offset = self._read_new(STEPS_FILE)
        if not data:
            return pd.DataFrame({C.STEP: pd.Series([], dtype="int64")})
        frame, skipped, consumed = _parse_steps(data, final=False)
        self._offsets[STEPS_FILE] = offset + consumed
        self.skipped_lines[STEPS_FILE] += skipped
        return frame.reset_index(drop=True)

    def read_events(self) -> pd.DataFrame:
        """Events appended since the last call, in write order."""
        data, offset = self._read_new(EVENTS_FILE)
        records, garbled, consumed = _parse_lines(data, final=False)
        self._offsets[EVENTS_FILE] = offset + consumed
        self.skipped_lines[EVENTS_FILE] += garbled
        return _events_frame(records)
