"""kill -9 in the middle of a run, then a resume from its last checkpoint: the run folder has
no torn line, no duplicate step and no missing step (``tests/kill_resume_child.py`` trains)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

CHILD = Path(__file__).resolve().parents[1] / "kill_resume_child.py"


def _steps_logged(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except OSError:
        return 0


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_killed_at_a_random_moment_and_resumed_the_log_is_whole(tmp_path: Path, seed: int) -> None:
    from kill_resume_child import STEPS

    rng = random.Random(seed)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    log = open(tmp_path / "child.log", "wb")
    child = subprocess.Popen(
        [sys.executable, str(CHILD), str(tmp_path)], env=env, stdout=log, stderr=subprocess.STDOUT
    )
    steps_file = tmp_path / "run" / "steps.jsonl"
    kill_after = rng.randint(2, STEPS - 3)  # rows logged before the kill
    deadline = time.monotonic() + 180
    while _steps_logged(steps_file) < kill_after:
        assert child.poll() is None, (tmp_path / "child.log").read_text(errors="replace")[-2000:]
        assert time.monotonic() < deadline, "the child did not reach the kill point"
        time.sleep(0.02)
    time.sleep(rng.uniform(0.0, 0.35))  # somewhere in the next step (its pause, its update)
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    killed_at = _steps_logged(steps_file)

    resumed = subprocess.run(
        [sys.executable, str(CHILD), str(tmp_path), "resume"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        timeout=300,
    )
    log.close()
    assert resumed.returncode == 0, (tmp_path / "child.log").read_text(errors="replace")[-3000:]
    lines = steps_file.read_text().splitlines()
    rows = [json.loads(line) for line in lines]  # a torn line would not parse
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1)), (killed_at, lines[-3:])
    assert (tmp_path / "run" / "closed.json").is_file()
    events = [
        json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()
    ]
    kinds = [e["kind"] for e in events]
    assert "resume" in kinds and kinds.count("end") == 1
