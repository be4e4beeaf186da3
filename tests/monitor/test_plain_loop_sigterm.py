"""A plain loop records its ending on SIGTERM (issue 51, item 6): ``with LLDMonitor(...)`` and
``start()`` ... no ``close()`` both leave the end event and closed.json, the process still ends
(status 143), and a handler of the user's still gets the signal."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import signal, sys, time
from pathlib import Path
from lld_monitor import LLDMonitor

run, mode, ready = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
if mode == "own_handler":
    def mine(signum, frame):
        (run.parent / "mine.txt").write_text("called")
        sys.exit(7)
    signal.signal(signal.SIGTERM, mine)

def loop(m):
    for step in range(1, 1000):
        m.end_step(step=step, reward_mean=0.1 * (step % 3), grad_norm=1.0)
        if step == 3:
            ready.write_text("3")
        time.sleep(0.05)

if mode in ("with", "own_handler"):
    with LLDMonitor(run, detector=None) as m:
        loop(m)
else:  # start() and no close(): the loop is killed before it would close
    m = LLDMonitor(run, detector=None)
    m.start()
    loop(m)
"""


def _kill_child(tmp_path: Path, mode: str) -> tuple[int, Path]:
    run, ready = tmp_path / "run", tmp_path / "ready"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(run), mode, str(ready)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 120
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
            proc.kill()
            pytest.fail(f"the child did not reach step 3 (exit {proc.poll()}):\n{out[-3000:]}")
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("the child did not end after SIGTERM")
    return rc, run


@pytest.mark.parametrize("mode", ["with", "start"])
def test_sigterm_closes_the_run_log_of_a_plain_loop(tmp_path: Path, mode: str) -> None:
    rc, run = _kill_child(tmp_path, mode)
    assert rc == 143  # 128 + SIGTERM, as the signal's default action would end it
    closed = json.loads((run / "closed.json").read_text())
    assert closed["closed"] is True and closed["outcome"] == "error", closed
    events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    end = [e for e in events if e["type"] == "lifecycle" and e["kind"] == "end"]
    assert end and "terminated by SIGTERM" in end[-1]["message"], end
    rows = (run / "steps.jsonl").read_text().splitlines()
    assert len(rows) >= 3 and closed.get("n_steps") == len(rows)


def test_a_users_own_handler_still_gets_the_signal(tmp_path: Path) -> None:
    rc, run = _kill_child(tmp_path, "own_handler")
    assert (tmp_path / "mine.txt").read_text() == "called"
    assert rc == 7  # the user's handler decided how the process ends
    closed = json.loads((run / "closed.json").read_text())
    assert closed["closed"] is True  # and the run log still closed on the way out
