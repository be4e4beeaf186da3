"""The replay on two cores (``analysis/parallel.py``) gives the one-process replay's answer.

The comparison runs in a fresh interpreter: the fork is refused in a process with other threads,
and a test run may leave some behind (a browser test's server, a monitor's writer).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

from lld_monitor.analysis import parallel
from lld_monitor.analysis.detector import PhaseDetector
from lld_monitor.analysis.offline import prepare_steps, replay
from lld_monitor.testing import make_run

ROOT = Path(__file__).resolve().parents[2]
REAL_RUNS = ROOT.parent / "shared" / "real_runs"

needs_fork = pytest.mark.skipif(
    not hasattr(os, "fork") or len(os.sched_getaffinity(0)) < 2, reason="needs fork and 2 cores"
)

# (run in a fresh interpreter) every sample run, every shared real log and simulated runs, each
# replayed in one process and on two (MIN_ROWS 0: every table forks); one JSON line per input
_COMPARE = textwrap.dedent(
    """
    import hashlib, json, sys
    from pathlib import Path
    from lld_monitor.analysis import parallel
    from lld_monitor.analysis.offline import load_steps, prepare_steps, replay
    from lld_monitor.testing import make_run

    root, real = Path(sys.argv[1]), Path(sys.argv[2])
    inputs = [(str(p.parent.relative_to(root)), p.parent)
              for p in sorted((root / "sample_runs").glob("**/steps.jsonl"))]
    if real.is_dir():
        inputs += [(p.name, p) for p in sorted(real.iterdir())
                   if p.suffix not in (".tsv", ".md") and not p.name.startswith(".")]
    inputs += [(f"make_run:{k}", make_run(k, n_steps=2500, seed=5).steps)
               for k in ("collapse", "healthy", "grad_spikes", "dip", "nonfinite", "small_batch")]
    forked = []
    real_parallel = parallel.replay_parallel
    def spy(*a, **k):
        forked.append(real_parallel(*a, **k))
        return forked[-1]
    parallel.replay_parallel = spy

    def digest(df):
        alerts, phases, det = replay(df, jobs=2)
        return {
            "alerts": [a.to_dict() for a in alerts],
            "phases": hashlib.sha1("|".join(phases).encode()).hexdigest(),
            "state": json.dumps(det.state_dict(), sort_keys=True),
        }
    for name, src in inputs:
        df = prepare_steps(load_steps(src))
        parallel.MIN_ROWS = 10**12
        one = digest(df)
        parallel.MIN_ROWS = 0
        forked.clear()
        two = digest(df)
        print(json.dumps({"name": name, "rows": len(df), "one": one, "two": two,
                          "forked": list(forked)}))
    """
)


@needs_fork
def test_two_cores_give_the_one_process_replay_row_for_row():
    proc = subprocess.run(
        [sys.executable, "-c", _COMPARE, str(ROOT), str(REAL_RUNS)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(rows) >= 10
    with_shift = with_mode = with_spike = 0
    for r in rows:
        name = r["name"]
        if r["rows"] >= 2:  # (a table of one row has no strictly increasing steps to test)
            assert r["forked"] == [True], name  # the child ran and its records were used
        assert r["two"]["alerts"] == r["one"]["alerts"], name
        assert r["two"]["phases"] == r["one"]["phases"], name
        assert r["two"]["state"] == r["one"]["state"], name
        with_shift += any(
            a["evidence"].get("detector") == "level_shift" for a in r["one"]["alerts"]
        )
        with_mode += any(a["kind"] == "mode_collapse" for a in r["one"]["alerts"])
        with_spike += any(a["kind"] == "spike" for a in r["one"]["alerts"])
    # (inputs where the offloaded checks do raise alerts)
    assert with_shift >= 3 and with_mode >= 1 and with_spike >= 3, (
        with_shift,
        with_mode,
        with_spike,
    )


def _one_process(df):
    saved = parallel.MIN_ROWS
    parallel.MIN_ROWS = 10**12
    try:
        return replay(df)
    finally:
        parallel.MIN_ROWS = saved


def _same(a, b):
    assert [x.to_dict() for x in a[0]] == [x.to_dict() for x in b[0]]
    assert a[1] == b[1]
    assert a[2].state_dict() == b[2].state_dict()


def _child_exits_at_once(conn, *args):
    os._exit(3)


def _child_raises_after_a_chunk(conn, checks, arrays, steps, warm, n):
    _, hi = parallel.chunks(n)[0]
    conn.send((hi, [[] for _ in checks]))
    raise RuntimeError("the child fails")


def _child_sends_the_wrong_rows(conn, checks, arrays, steps, warm, n):
    conn.send((-1, [[] for _ in checks]))


def _child_hangs(conn, *args):
    import time

    time.sleep(30)


@needs_fork
@pytest.mark.parametrize(
    "broken",
    [_child_exits_at_once, _child_raises_after_a_chunk, _child_sends_the_wrong_rows, _child_hangs],
)
def test_a_failed_child_means_the_replay_runs_again_in_one_process(monkeypatch, broken):
    if threading.active_count() != 1:
        pytest.skip("another thread runs in this test process: the fork is refused")
    df = prepare_steps(make_run("collapse", n_steps=2500, seed=5).steps)
    expected = _one_process(df)
    monkeypatch.setattr(parallel, "MIN_ROWS", 0)
    monkeypatch.setattr(parallel, "_child", broken)
    monkeypatch.setattr(parallel, "CHILD_TIMEOUT_S", 0.5)  # (a hung child: killed after it)
    results = []
    real = parallel.replay_parallel
    monkeypatch.setattr(
        parallel, "replay_parallel", lambda *a: results.append(real(*a)) or results[-1]
    )
    got = replay(df, jobs=2)
    assert results == [False]  # the fork was tried and failed ...
    _same(got, expected)  # ... and the answer is still the one-process replay's
    assert any(a.evidence.get("detector") == "level_shift" for a in got[0])
    with pytest.raises(ChildProcessError):
        os.waitpid(-1, os.WNOHANG)  # (no child left behind: reaped)


def test_the_fork_is_only_for_long_fresh_tables_in_a_process_without_threads(monkeypatch):
    df = prepare_steps(make_run("healthy", n_steps=300, seed=1).steps)
    det = PhaseDetector()
    monkeypatch.setattr(parallel, "MIN_ROWS", 100)
    # the checks that declare row_only, in the detector's order
    assert [type(det.checks[i]).__name__ for i in parallel.offloadable(det)] == [
        "NoUpdate",
        "ZeroGrad",
        "SamplerMismatch",
        "LldsInert",
        "KlSpike",
        "GradSpike",
        "ModeCollapse",
        "LevelShiftCollapse",
    ]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    if threading.active_count() == 1 and cores >= 2 and hasattr(os, "fork"):
        assert parallel.can_fork(len(df))
    assert not parallel.can_fork(99)  # too few rows
    forked = []
    real = parallel.replay_parallel
    monkeypatch.setattr(parallel, "replay_parallel", lambda *a: forked.append(1) or real(*a))
    monkeypatch.setattr(parallel, "can_fork", lambda n: True)
    shuffled = df.iloc[::-1].reset_index(drop=True)
    replay(shuffled, jobs=2)  # steps not increasing: no fork
    busy = PhaseDetector()
    busy.update({"step": -1, "reward_mean": 0.5})
    replay(df, busy, jobs=2)  # not a fresh detector: no fork
    replay(df)  # the caller did not ask (jobs=1, the default)
    assert forked == []
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, daemon=True)
    t.start()
    try:
        monkeypatch.undo()
        monkeypatch.setattr(parallel, "MIN_ROWS", 100)
        assert not parallel.can_fork(len(df))  # another thread is running
    finally:
        stop.set()
        t.join()


def test_chunks_cover_the_rows_once_in_order():
    for n in (0, 1, 2047, 2048, 2049, 5000, 200_000):
        spans = parallel.chunks(n)
        assert [lo for lo, _ in spans] == [0, *(hi for _, hi in spans[:-1])][: len(spans)]
        assert (spans[-1][1] if spans else 0) == n
        assert all(0 < hi - lo <= parallel.CHUNK for lo, hi in spans)
    assert parallel.chunks(5000) == [(0, 2048), (2048, 4096), (4096, 5000)]


@needs_fork
def test_a_triage_worker_replays_in_its_own_process(tmp_path, monkeypatch):
    # the triage's workers (forked: they inherit this process's patches) are told jobs=1: a
    # replay that forked there would raise, and the run would be 'unreadable'
    from lld_monitor.analysis import triage as triage_mod

    for i in range(triage_mod.PARALLEL_MIN_RUNS):
        make_run("healthy", n_steps=120, seed=i).steps.to_csv(tmp_path / f"r{i}.csv", index=False)

    def refuse(*a, **k):
        raise AssertionError("a triage worker forked a replay")

    monkeypatch.setattr(parallel, "MIN_ROWS", 0)
    monkeypatch.setattr(parallel, "can_fork", lambda n: True)
    monkeypatch.setattr(parallel, "replay_parallel", refuse)
    verdicts = triage_mod.triage(tmp_path, jobs=2)
    assert len(verdicts) == triage_mod.PARALLEL_MIN_RUNS
    assert all(v.verdict != "unreadable" for v in verdicts), [v.error for v in verdicts]
    # ... while the same patches do reach a run analysed with jobs=2 (the test can fail)
    forked = triage_mod.triage_one(tmp_path / "r0.csv", tmp_path, jobs=2)
    assert forked.verdict == "unreadable" and "forked a replay" in forked.error
    assert triage_mod.triage_one(tmp_path / "r0.csv", tmp_path).verdict != "unreadable"


def test_a_library_call_forks_no_process_unless_asked(monkeypatch):
    """analyze_run on a 25k-row table with os.fork made to raise: the default (jobs=1) never
    forks; jobs=2 tries (and falls back to one process when the fork fails: the same answer)."""
    df = make_run("collapse", n_steps=25_000, seed=5).steps
    assert len(df) >= 25_000
    calls = []

    def no_fork():
        calls.append(1)
        raise OSError("os.fork is refused by this test")

    monkeypatch.setattr(os, "fork", no_fork)
    from lld_monitor.analysis import analyze_run

    one = analyze_run(df)
    assert calls == []
    with pytest.raises(ValueError, match="jobs must be an int >= 1"):
        analyze_run(df, jobs=0)
    if parallel.can_fork(len(df)):  # (two cores, no other thread: jobs=2 does try)
        two = analyze_run(df, jobs=2)
        assert calls and [a.to_dict() for a in two.alerts] == [a.to_dict() for a in one.alerts]


def test_warm_rows_is_the_warm_flag_signals_keeps_row_by_row():
    from lld_monitor.analysis.signals import warm_rows

    rng = np.random.default_rng(4)
    steps = np.cumsum(rng.integers(1, 9, 400))  # irregular logging
    det = PhaseDetector()
    flags = []
    for s in steps.tolist():
        det.update({"step": s, "reward_mean": 0.5})
        flags.append(det.signals.warm)
    assert warm_rows(steps, det.config).tolist() == flags
    assert 0 < sum(flags) < len(flags)  # (both sides of the warm-up are in the test)
