"""The dashboard's analysis service: the run picker's verdicts and the worker that analyses long
runs, shared by every browser session of the server.

Each session runs its page in a thread of its own; the state they share (the verdicts, the
worker's futures, what each long run cost, the runs waiting for the worker) is behind one lock,
``_STATE_LOCK``. A target is a ``sources.Target`` (its ``key`` names it in the caches), a live
run a ``sources.LiveRun``. Nothing here draws.
"""

from __future__ import annotations

import concurrent.futures
import functools
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: A run whose files changed keeps its verdict this long before it is analysed again (a live
#: run grows every few seconds; its header and charts have their own, newer analysis).
VERDICT_REFRESH_S = 30.0
#: Guards the shared state below (_VERDICTS, _BACKGROUND, _VERDICT_COST, _DEFERRED): every
#: browser session of the server runs its page in a thread of its own.
_STATE_LOCK = threading.RLock()
#: path -> (stat, time, verdict, the analysis behind it until a LiveRun takes it, or None)
_VERDICTS: dict[str, tuple[tuple[float, int], float, Any, Any]] = {}


def run_verdict(target: Any) -> Any:
    """The triage verdict of ``target`` (``lld_monitor.analysis.triage.RunVerdict``, named as the
    picker names it), the same one ``lld-monitor analyze DIR`` prints; cached until the run's
    files change, and then for at least ``VERDICT_REFRESH_S``. Never raises."""
    from lld_monitor.analysis import triage

    try:
        key = _stat_key(target.path)
    except OSError:
        key = (0.0, -1)
    now = time.monotonic()
    path = target.key
    with _STATE_LOCK:  # (every browser session runs in its own thread of the server)
        pending = _BACKGROUND.get(path)
        hit = _VERDICTS.get(path)
        if pending is not None:
            if not pending[1].done():  # the verdict before, while a new one is being made
                return hit[2] if hit is not None else _pending_verdict(target)
            del _BACKGROUND[path]
            _VERDICT_COST[path] = now - pending[2]
            try:
                verdict, analysis = pending[1].result()
            except Exception as exc:  # the worker process died (out of memory): said, not raised
                verdict = triage.RunVerdict(
                    target.name,
                    str(target.path),
                    "unreadable",
                    error=f"background analysis failed: {exc}",
                )
                analysis = None
            verdict.name = target.name
            _VERDICTS[path] = (pending[0], now, verdict, analysis)
            return verdict
        # a run that grows is analysed again at most every VERDICT_REFRESH_S, and a long one at
        # most every VERDICT_COST_FACTOR times its last analysis (the worker busy 10% at most)
        refresh = max(VERDICT_REFRESH_S, VERDICT_COST_FACTOR * _VERDICT_COST.get(path, 0.0))
        if hit is not None and (hit[0] == key or now - hit[1] < refresh):
            return hit[2]
        if key[1] >= BACKGROUND_BYTES:  # a long run: the page draws while a worker analyses it
            _DEFERRED[path] = (key, target)  # (handed to the worker by start_background)
            return hit[2] if hit is not None else _pending_verdict(target)
    # a short run: analysed here, outside the lock (another session may do the same meanwhile;
    # the last to finish is kept, both the same verdict)
    verdict, analysis = triage.analyse_one(target.path, target.path.parent, target.run)
    verdict.name = target.name
    with _STATE_LOCK:
        _VERDICTS[path] = (key, now, verdict, analysis)
    return verdict


#: A run whose files are at least this large is analysed in a worker process: the page draws
#: its charts at once and the phases, alerts and verdict follow (about 60k rows of 20 columns
#: a second on one core; 100k rows take 2-3 s).
BACKGROUND_BYTES = 8 << 20
#: Run path -> (its file key, the future of ``triage.analyse_one``, when it was started).
_BACKGROUND: dict[str, tuple[tuple[float, int], concurrent.futures.Future, float]] = {}
#: A long run's verdict is made again at most every this many times its last analysis took.
VERDICT_COST_FACTOR = 10.0
#: Run path -> seconds its last background analysis took (queue included).
_VERDICT_COST: dict[str, float] = {}
#: Long runs whose verdict was asked for and whose analysis is not started yet: path -> (key,
#: target).
_DEFERRED: dict[str, tuple[tuple[float, int], Any]] = {}


def start_background(lives: Sequence[Any]) -> None:
    """Hand the long runs the picker asked verdicts for to the worker process: a run on the page
    with the rows its follower has just read (the worker does not read the files again, nor
    compete with the page for the disk and cores while it reads them), any other from its
    files. Each shown run then waits for that one analysis (it serves the picker too)."""
    if not _DEFERRED:
        return
    with _STATE_LOCK:
        _start_deferred(lives)


def _start_deferred(lives: Sequence[Any]) -> None:
    from lld_monitor.analysis import triage

    shown = {live.target.key: live for live in lives}
    for path, (key, target) in list(_DEFERRED.items()):
        live = shown.get(path)
        args: tuple[Any, ...] = (target.path, target.path.parent, target.run)
        if live is not None and live.n_rows and live.error is None:
            table = live.steps.copy(deep=False)  # (its own attrs; the data is shared)
            table.attrs["source_format"] = live.meta.get("source_format", "lld_run")
            args += (table,)
        for _ in range(2):  # a broken pool (its worker died): once more, on a new one
            try:
                # (the worker is a clean single-threaded process of its own: it may fork)
                future = _background_pool().submit(triage.analyse_one, *args, jobs=2)
                break
            except Exception:
                _background_pool.cache_clear()
        else:  # (no worker can start: tried again on the next call)
            return
        del _DEFERRED[path]
        _BACKGROUND[path] = (key, future, time.monotonic())
        if live is not None and live._pending is None and live.analysis is None:
            live._pending = future


@functools.cache
def _background_pool() -> concurrent.futures.ProcessPoolExecutor:
    """One worker process for the first analyses of long runs, shared by every session of
    the server. Started by a fork server (a clean single-threaded process with the analyzer
    imported), never forked from the threaded server itself."""
    import multiprocessing as mp

    methods = mp.get_all_start_methods()
    ctx = mp.get_context("forkserver" if "forkserver" in methods else "spawn")
    if "forkserver" in methods:
        ctx.set_forkserver_preload(["lld_monitor.analysis.triage"])
    pool = concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=ctx)
    _stop_at_exit(pool)
    return pool


def _stop_at_exit(pool: concurrent.futures.ProcessPoolExecutor) -> None:
    """When the server stops, its worker stops too, at once: an analysis under way is dropped
    (the executor's own exit handler would wait for it, up to a minute on a long run, and a
    server killed alone would leave it running). Registered as the executor registers its own
    handler, which then finds nothing to wait for (it runs after this one)."""
    import atexit
    import contextlib
    import threading

    def stop() -> None:
        for proc in list((getattr(pool, "_processes", None) or {}).values()):
            with contextlib.suppress(Exception):
                proc.terminate()
        with contextlib.suppress(Exception):
            pool.shutdown(wait=False, cancel_futures=True)

    register = getattr(threading, "_register_atexit", None)  # (before interpreter shutdown)
    try:
        (register or atexit.register)(stop)
    except RuntimeError:  # (the interpreter is already shutting down)
        stop()


def _pending_verdict(target: Any) -> Any:
    """The picker's stand-in verdict of a run being analysed in the background."""
    from lld_monitor.analysis import triage

    return triage.RunVerdict(target.name, str(target.path), "analysing")


def verdict_future(target: Any) -> concurrent.futures.Future | None:
    """The background analysis of ``target`` still under way, or None."""
    with _STATE_LOCK:
        pending = _BACKGROUND.get(target.key)
    return pending[1] if pending is not None and not pending[1].done() else None


def background_pending() -> int:
    """How many background analyses are under way or waiting to start (the page polls until
    none is)."""
    with _STATE_LOCK:
        return len(_DEFERRED) + sum(not p[1].done() for p in _BACKGROUND.values())


def take_verdict_analysis(target: Any, rows: int, last_step: float) -> Any:
    """The analysis behind ``target``'s picker verdict when it was made on the same rows
    (``rows`` rows up to ``last_step``: what the run's follower has read), else None; handed
    over once (the first render analyses a run once, not for the picker and again for the
    charts)."""
    path = target.key
    with _STATE_LOCK:
        hit = _VERDICTS.get(path)
        if hit is None or hit[3] is None:
            return None
        _VERDICTS[path] = (*hit[:3], None)
    verdict = hit[2]
    if verdict.rows != rows or verdict.last_step is None or verdict.last_step != last_step:
        return None
    return hit[3]


def _stat_key(path: Path) -> tuple[float, int]:
    """(latest mtime, total size) of a file, or of the files in a folder (TensorBoard)."""
    if path.is_dir():
        stats = [p.stat() for p in path.rglob("*") if p.is_file()]
        return (max((s.st_mtime for s in stats), default=0.0), sum(s.st_size for s in stats))
    st = path.stat()
    return st.st_mtime, st.st_size
