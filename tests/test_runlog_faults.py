"""The run log under a full disk: no row lost after the disk recovers, every loss said.

The disk is a shim (:class:`FakeDisk`) put in place of the ``open`` the run log uses: the files it
opens for writing share a byte budget; a raw (unbuffered) write beyond it writes what fits and
returns the short count, as the kernel does on ENOSPC, the next one raises ENOSPC; a buffered
write that does not fit writes what fits and raises; ``truncate`` gives the bytes back. No mount,
no root. Each test names the promise it checks in its docstring.
"""

from __future__ import annotations

import builtins
import errno
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import pytest

from lld_monitor import columns as C
from lld_monitor import runlog
from lld_monitor.runlog import CLOSED_FILE, EVENTS_FILE, STEPS_FILE, TOKENS_DIR, RunWriter, load_run


class _DiskFile:
    """A file on a :class:`FakeDisk`: writes take from the disk's free bytes."""

    def __init__(self, f: Any, disk: FakeDisk, raw: bool) -> None:
        self._f = f
        self._disk = disk
        self._raw = raw

    def write(self, data: bytes) -> int:
        data = bytes(data)
        free = self._disk.free
        if free is None or free >= len(data):
            n = self._f.write(data)
            if free is not None:
                self._disk.free = free - n
            return n
        if free <= 0:
            self._disk.n_enospc += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = self._f.write(data[:free])
        self._disk.free = 0
        self._disk.n_short += 1
        if self._raw:
            return n  # the kernel's short write: the caller must check the count
        self._f.flush()  # a buffered file pushes what fits, then fails
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def truncate(self, size: int | None = None) -> int:
        before = os.fstat(self._f.fileno()).st_size
        result = self._f.truncate(size)
        after = os.fstat(self._f.fileno()).st_size
        if self._disk.free is not None:
            self._disk.free += max(0, before - after)
        return result

    def __enter__(self) -> _DiskFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._f.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)


class FakeDisk:
    """A tmpfs stand-in: ``free`` bytes left for writing (None = unlimited)."""

    def __init__(self) -> None:
        self.free: int | None = None
        self.n_short = 0
        self.n_enospc = 0

    def open(self, file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        f = builtins.open(file, mode, *args, **kwargs)
        if any(c in mode for c in "wa+"):
            raw = kwargs.get("buffering", args[0] if args else -1) == 0
            return _DiskFile(f, self, raw)
        return f


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> FakeDisk:
    d = FakeDisk()
    # (the writer's appends, and the atomic writes of meta.json / closed.json)
    monkeypatch.setattr(runlog.writer, "open", d.open, raising=False)
    monkeypatch.setattr(runlog.common, "open", d.open, raising=False)
    return d


def _row(step: int) -> dict[str, Any]:
    return {C.STEP: step, C.REWARD_MEAN: step / 10, C.DELTA_CORRECT: -step / 100, "pad": "x" * 40}


def _lines(path: Path) -> list[dict[str, Any]]:
    """Every line of a JSON-lines file parsed: a garbled line fails the test here."""
    data = path.read_bytes()
    assert data == b"" or data.endswith(b"\n"), f"torn last line in {path.name}: {data[-80:]!r}"
    return [json.loads(line) for line in data.splitlines()]


def _events(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    return [e for e in _lines(run_dir / EVENTS_FILE) if e[C.EVENT_KIND] == kind]


def test_rows_held_while_the_disk_is_full_are_written_after_it_recovers(
    tmp_path: Path, disk: FakeDisk
) -> None:
    """Promise: a row is written whole or not at all; rows that met a full disk are held and
    written once it takes them again; the reader sees every row from before, during and after,
    no garbled line; a ``log_recovered`` event names the steps written late; ``n_steps`` counts
    readable rows only."""
    run = tmp_path / "run"
    w = RunWriter(run, fsync_every_s=0)
    for step in range(5):
        w.log_step(_row(step))
    disk.free = 30  # less than a row: the next write is short, the ones after raise ENOSPC
    for step in range(5, 10):
        w.log_step(_row(step))  # never raises: training goes on
        assert w.n_steps == 5
    assert disk.n_short >= 1 and disk.n_enospc >= 1  # short writes, then ENOSPC
    assert [r[C.STEP] for r in _lines(run / STEPS_FILE)] == list(range(5))  # cut back whole
    assert w.rows_pending == 5
    disk.free = None  # space is back
    for step in range(10, 15):
        w.log_step(_row(step))
    assert w.n_steps == 15 and w.rows_pending == 0 and w.rows_lost == 0
    w.close()

    rows = _lines(run / STEPS_FILE)
    assert sorted(r[C.STEP] for r in rows) == list(range(15))
    loaded = load_run(run)
    assert loaded.steps[C.STEP].tolist() == list(range(15))
    assert loaded.skipped_lines == {STEPS_FILE: 0, EVENTS_FILE: 0}
    (event,) = _events(run, "log_recovered")
    assert event[C.EVENT_EVIDENCE]["steps_delayed"] == "5-9"
    assert event[C.EVENT_EVIDENCE]["rows_delayed"] == 5
    assert event[C.EVENT_EVIDENCE]["rows_lost"] == 0
    assert "No space left on device" in event[C.EVENT_EVIDENCE]["error"]
    assert json.loads((run / CLOSED_FILE).read_text())["n_steps"] == 15


def test_rows_beyond_the_memory_bound_are_lost_counted_and_named(
    tmp_path: Path, disk: FakeDisk
) -> None:
    """Promise: the rows held in memory are bounded (``max_pending_bytes``); the oldest beyond it
    are dropped, counted (``rows_lost``, ``closed.json``) and named in the ``log_recovered`` event;
    with a bound of 0 a row that meets a full disk is cut back and lost at once, and the next row
    still starts on a fresh line."""
    row_bytes = len(runlog._dumps({**_row(10), C.TIME: time.time()}))
    run = tmp_path / "run"
    w = RunWriter(run, max_pending_bytes=3 * row_bytes + row_bytes // 2)
    for step in range(3):
        w.log_step(_row(step))
    disk.free = 0
    for step in range(3, 13):  # 10 rows meet the full disk; the last 3 fit in memory
        w.log_step(_row(step))
    assert w.rows_pending == 3 and w.rows_lost == 7
    disk.free = None
    w.log_step(_row(13))
    w.close()

    assert sorted(r[C.STEP] for r in _lines(run / STEPS_FILE)) == [0, 1, 2, 10, 11, 12, 13]
    (event,) = _events(run, "log_recovered")
    ev = event[C.EVENT_EVIDENCE]
    assert (ev["rows_lost"], ev["steps_lost"]) == (7, "3-9")
    assert (ev["rows_delayed"], ev["steps_delayed"]) == (3, "10-12")
    assert event[C.EVENT_SEVERITY] == "warning" and "7 rows lost (steps 3-9)" in event["message"]
    closed = json.loads((run / CLOSED_FILE).read_text())
    assert closed["rows_lost"] == 7 and closed["n_steps"] == 7

    run0 = tmp_path / "run0"
    w0 = RunWriter(run0, max_pending_bytes=0)
    w0.log_step(_row(0))
    disk.free = 25  # a short write: cut back, nothing held
    w0.log_step(_row(1))
    disk.free = None
    w0.log_step(_row(2))
    w0.close()
    assert [r[C.STEP] for r in _lines(run0 / STEPS_FILE)] == [0, 2]
    (event,) = _events(run0, "log_recovered")
    assert event[C.EVENT_EVIDENCE]["steps_lost"] == "1"


def test_every_failure_episode_is_reported_and_the_warnings_are_rate_limited(
    tmp_path: Path,
    disk: FakeDisk,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Promise: each failure episode (full, then recovered) gets its own ``log_recovered``
    event, not only the first one of the run; the warnings in the log are rate-limited
    (one per ``WRITE_WARNING_EVERY_S``, the next one saying how many were held back), and with
    no limit each episode warns."""

    def three_episodes(path: Path) -> None:
        w = RunWriter(path)
        step = 0
        for _ in range(3):
            w.log_step(_row(step))
            disk.free = 0
            w.log_step(_row(step + 1))
            disk.free = None
            w.log_step(_row(step + 2))
            step += 3
        w.close()

    with caplog.at_level(logging.WARNING, logger="lld_monitor"):
        three_episodes(tmp_path / "limited")
    recovered = _events(tmp_path / "limited", "log_recovered")
    assert [e[C.EVENT_EVIDENCE]["steps_delayed"] for e in recovered] == ["1", "4", "7"]
    cannot = [r for r in caplog.records if "cannot write" in r.getMessage()]
    assert len(cannot) == 1, [r.getMessage() for r in caplog.records]
    assert str(tmp_path / "limited" / STEPS_FILE) in cannot[0].getMessage()

    caplog.clear()
    monkeypatch.setattr(runlog.writer, "WRITE_WARNING_EVERY_S", 0.0)
    with caplog.at_level(logging.WARNING, logger="lld_monitor"):
        three_episodes(tmp_path / "unlimited")
    cannot = [r for r in caplog.records if "cannot write" in r.getMessage()]
    assert len(cannot) == 3
    assert len([r for r in caplog.records if "is written again" in r.getMessage()]) == 3


def test_failed_atomic_writes_leave_no_tmp_files(
    tmp_path: Path, disk: FakeDisk, caplog: pytest.LogCaptureFixture
) -> None:
    """Promise: a token sample or ``closed.json`` that meets a full disk is dropped without
    raising and leaves no ``.tmp`` file behind (it would eat the scarce space); the failure is
    logged; once space is back, resuming and closing writes ``closed.json``."""
    pytest.importorskip("pyarrow")
    run = tmp_path / "run"
    w = RunWriter(run)
    w.log_step(_row(0))
    token_rows = [{C.TOK_RESPONSE: 0, C.TOK_POSITION: i, C.TOK_DELTA: -0.5} for i in range(50)]
    assert w.log_tokens(token_rows, 0)
    disk.free = 100  # part of a Parquet file fits, then ENOSPC
    with caplog.at_level(logging.WARNING, logger="lld_monitor"):
        assert not w.log_tokens(token_rows, 1)
        assert w.n_token_files_failed == 1
        disk.free = 10
        w.close()  # the end event and closed.json cannot be written: logged, no raise
    assert sorted(p.name for p in (run / TOKENS_DIR).iterdir()) == ["step000000000_000000.parquet"]
    assert not [p for p in run.rglob("*") if p.name.endswith(".tmp")]
    assert not (run / CLOSED_FILE).exists()
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "token samples of step 1 not written" in messages and CLOSED_FILE in messages

    disk.free = None
    RunWriter(run, resume=True).close()
    assert load_run(run).finished


def test_monitor_on_a_disk_that_fills_and_empties_loses_no_row(
    tmp_path: Path, disk: FakeDisk
) -> None:
    """Promise (issue 20): a monitored run on a disk that fills and empties keeps every row
    written before and after, says in its events which steps were delayed, and
    ``monitor.rows_written`` counts only the rows a reader can read."""
    pytest.importorskip("torch")
    from lld_monitor import LLDMonitor

    run = tmp_path / "run"
    monitor = LLDMonitor(run, probe_fraction=0.0)
    for step in range(4):
        monitor.end_step(step, custom=float(step))
    disk.free = 20
    for step in range(4, 8):
        monitor.end_step(step, custom=float(step))
    assert monitor.rows_written == 4
    disk.free = None
    for step in range(8, 12):
        monitor.end_step(step, custom=float(step))
    assert monitor.rows_written == 12
    monitor.close()

    loaded = load_run(run)
    assert loaded.steps[C.STEP].tolist() == list(range(12))
    assert loaded.steps["custom"].tolist() == [float(s) for s in range(12)]
    assert loaded.skipped_lines == {STEPS_FILE: 0, EVENTS_FILE: 0}
    assert [e[C.EVENT_EVIDENCE]["steps_delayed"] for e in _events(run, "log_recovered")] == ["4-7"]
    assert loaded.finished
