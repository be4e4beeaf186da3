"""Several runs appended to one log: each is a run of its own, never one whose steps go back.

A resumed run (the step counter continues, or repeats the steps since its checkpoint) stays one
run. Built from real writers where one exists (a real TRL GRPOTrainer's console output; verl's
console line format, as ``verl.utils.tracking``'s console logger prints it), and checked against
each run written alone.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lld_monitor import columns as C
from lld_monitor.analysis.triage import triage
from lld_monitor.importers import ImportFormatError, load_table, runs_in_file
from lld_monitor.importers.parts import run_bounds
from lld_monitor.testing import make_run

#: canonical column -> the name verl logs it under
VERL_NAMES = {
    C.REWARD_MEAN: "critic/score/mean",
    C.GRAD_NORM: "actor/grad_norm",
    C.ENTROPY: "actor/entropy",
    C.COMPLETION_LENGTH: "response_length/mean",
    C.LOSS: "actor/pg_loss",
    C.KL: "actor/kl_loss",
}


def _verl_lines(steps: pd.DataFrame, pid: int) -> list[str]:
    """verl's console logger: ``step:N - key:value - ...`` (values as numpy scalars print)."""
    lines = [f"(TaskRunner pid={pid}) Training Progress:   0%|          | 0/{len(steps)}"]
    for _, row in steps.iterrows():
        items = [
            f"{name}:np.float64({row[col]!r})"
            for col, name in VERL_NAMES.items()
            if col in row and np.isfinite(row[col])
        ]
        lines.append(f"(TaskRunner pid={pid}) step:{int(row[C.STEP])} - " + " - ".join(items))
    return lines


def test_run_bounds_by_hand():
    assert run_bounds([1, 2, 3, 1, 2, 3, 1, 2]) == [3, 6]
    # a resume: back to the checkpoint (step 50), not to the beginning: one run
    assert run_bounds([1, 2, 55, 56, 57, 51, 52, 60]) == []
    # logged every 10 steps; the next run logs from step 10 again (NaN rows: eval lines)
    assert run_bounds([10, 20, np.nan, 30, 10, 20]) == [4]
    # a new run that starts one logging interval after the first run's start is still new
    assert run_bounds([1, 2, 3, 4, 2, 3]) == [4]
    assert run_bounds([5, 5, 6]) == []  # a repeated step is merged, not a run
    assert run_bounds([]) == []


def test_three_verl_runs_in_one_console_log_have_each_their_own_verdict(tmp_path):
    kinds = [("collapse", 0), ("healthy", 1), ("collapse", 2)]
    runs = [make_run(kind, 300, seed, standard_only=True) for kind, seed in kinds]
    alone = []
    lines: list[str] = []
    for i, run in enumerate(runs):
        own = _verl_lines(run.steps, 4000 + i)
        path = tmp_path / f"alone{i}.log"
        path.write_text("\n".join(own) + "\n")
        alone.append(path)
        lines += own
    log = tmp_path / "all.log"
    log.write_text("\n".join(lines) + "\n")

    assert runs_in_file(log) == ["1", "2", "3"]
    for i, path in enumerate(alone, start=1):
        df = load_table(log, run=str(i))
        want = load_table(path)
        assert df.attrs["source_format"] == "verl_console"
        assert list(df[C.STEP]) == list(want[C.STEP]) == list(runs[i - 1].steps[C.STEP])
        for col in VERL_NAMES:
            assert df[col].to_numpy() == pytest.approx(want[col].to_numpy(), nan_ok=True)
        assert df[C.REWARD_MEAN].to_numpy() == pytest.approx(
            runs[i - 1].steps[C.REWARD_MEAN].to_numpy()
        )
        assert any(f"read run {i} (steps 0-299, 300 rows)" in n for n in df.attrs["import_notes"])
    # without --run: the latest, and a note names the others
    latest = load_table(log)
    assert latest[C.REWARD_MEAN].to_numpy() == pytest.approx(
        runs[2].steps[C.REWARD_MEAN].to_numpy()
    )
    (note,) = [n for n in latest.attrs["import_notes"] if "a log of 3 runs" in n]
    assert "run 1 (steps 0-299, 300 rows)" in note and "the latest" in note
    with pytest.raises(ImportFormatError, match=r"--run '4': this log holds 3 run\(s\)"):
        load_table(log, run="4")

    # the triage of the file: one verdict per run, each the verdict of that run alone, and
    # right (the simulated collapses collapse, the healthy run is healthy)
    verdicts = {v.name: v.verdict for v in triage(log)}
    single = [triage(path)[0].verdict for path in alone]
    assert verdicts == {f"all.log [{i}]": single[i - 1] for i in (1, 2, 3)}
    assert single == ["collapsed", "healthy", "collapsed"]


def test_a_resumed_verl_run_stays_one_run(tmp_path):
    run = make_run("healthy", 100, 3, standard_only=True)
    lines = _verl_lines(run.steps, 11)
    # crashed after step 57; resumed from the checkpoint of step 50: steps 51-57 again
    first = lines[: 1 + 58]  # (steps 0-57)
    again = run.steps[run.steps[C.STEP] >= 51].copy()
    again[C.REWARD_MEAN] = again[C.REWARD_MEAN] + 0.01  # what the resumed run logged
    second = ["(TaskRunner pid=12) Resuming from global_step_50", *_verl_lines(again, 12)]
    log = tmp_path / "resumed.log"
    log.write_text("\n".join(first + second) + "\n")
    assert runs_in_file(log) == []
    df = load_table(log)
    assert list(df[C.STEP]) == list(run.steps[C.STEP])
    # the resumed values replace those of the lost steps 51-57
    want = np.where(
        run.steps[C.STEP] >= 51, run.steps[C.REWARD_MEAN] + 0.01, run.steps[C.REWARD_MEAN]
    )
    assert df[C.REWARD_MEAN].to_numpy() == pytest.approx(want)
    assert not any("runs appended" in n for n in df.attrs["import_notes"])
    with pytest.raises(ImportFormatError, match=r"holds 1 run\(s\)"):
        load_table(log, run="2")


def test_appended_jsonl_metrics_files_split_too(tmp_path):
    rows = [{"step": s, "env/all/reward/total": 0.1 * s} for s in range(5)]
    rows += [{"step": s, "env/all/reward/total": 0.5} for s in range(3)]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert runs_in_file(path) == ["1", "2"]
    assert list(load_table(path, run="1")[C.STEP]) == [0, 1, 2, 3, 4]
    assert list(load_table(path, run="2")[C.REWARD_MEAN]) == [0.5, 0.5, 0.5]


def test_run_is_refused_on_a_one_run_format(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("step,reward_mean\n1,0.5\n2,0.6\n")
    with pytest.raises(ImportFormatError, match="one run"):
        load_table(path, run="2")
    # its one run is "1" (Format.runs): --run 1 reads it
    assert load_table(path, run="1")["reward_mean"].tolist() == [0.5, 0.6]


def _trl_run(tmp: Path, capfd, max_steps: int, seed: int, **config):
    """A real GRPOTrainer run and its console output as a terminal (or ``2>&1``, unbuffered)
    shows it: the printed dicts and tqdm's progress bar in the order they were written."""
    from lld_grpo_script import make_grpo_trainer
    from transformers import TrainerCallback

    class Slow(TrainerCallback):
        # tqdm redraws its bar at most every 0.1 s: a real GRPO step takes longer than that, a
        # tiny one does not, and the bar would lag a step behind the printed dicts
        def on_step_begin(self, args, state, control, **kwargs):
            time.sleep(0.11)

    train_kwargs = config.pop("train_kwargs", {})
    trainer = make_grpo_trainer(tmp, max_steps=max_steps, seed=seed, callbacks=[Slow()], **config)
    with contextlib.redirect_stdout(sys.stderr):
        trainer.train(**train_kwargs)
    captured = capfd.readouterr()
    train = [h for h in trainer.state.log_history if "reward" in h]
    return captured.out + captured.err, train


def test_real_trl_runs_appended_to_one_console_log(tmp_path, capfd, monkeypatch):
    """Three real GRPOTrainer runs (3, 2 and 4 steps) printed into one log: three runs, each
    with its own steps and the values its trainer logged."""
    pytest.importorskip("trl")
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1]))
    capfd.readouterr()
    texts, histories = [], []
    for i, steps in enumerate((3, 2, 4)):
        text, train = _trl_run(tmp_path / f"out{i}", capfd, steps, seed=i)
        texts.append(text)
        histories.append(train)
    log = tmp_path / "console.log"
    log.write_text("".join(texts))
    assert runs_in_file(log) == ["1", "2", "3"]
    for i, train in enumerate(histories, start=1):
        df = load_table(log, run=str(i))
        assert df.attrs["source_format"] == "trl_console"
        assert df.attrs["step_source"] == "progress_bar"
        assert list(df[C.STEP]) == [h["step"] for h in train]
        assert df[C.REWARD_MEAN].tolist() == pytest.approx(
            [h["reward"] for h in train], rel=1e-3, abs=1e-6
        )
        assert df[C.GRAD_NORM].tolist() == pytest.approx(
            [h["grad_norm"] for h in train], rel=1e-3, abs=1e-6
        )


def test_real_trl_run_resumed_from_its_checkpoint_is_one_run(tmp_path, capfd, monkeypatch):
    """A real run saved at step 2 and resumed from that checkpoint (the bar goes on from 2/4):
    one run of steps 1-4."""
    pytest.importorskip("trl")
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1]))
    capfd.readouterr()
    out = tmp_path / "out"
    first, _ = _trl_run(out, capfd, 4, 0, save_strategy="steps", save_steps=2)
    second, train = _trl_run(
        out,
        capfd,
        4,
        0,
        save_strategy="steps",
        save_steps=2,
        train_kwargs={"resume_from_checkpoint": str(out / "checkpoint-2")},
    )
    log = tmp_path / "console.log"
    log.write_text(first + second)
    Path("/tmp/resume.log").write_text(first + second)
    assert runs_in_file(log) == []
    df = load_table(log)
    assert list(df[C.STEP]) == [1, 2, 3, 4]
    assert df.attrs["step_source"] == "progress_bar"
    # (the resumed trainer's history holds the checkpoint's steps 1-2 and its own 3-4)
    assert [h["step"] for h in train] == [1, 2, 3, 4]
    assert df[C.REWARD_MEAN].tolist() == pytest.approx(
        [h["reward"] for h in train], rel=1e-3, abs=1e-6
    )
    assert "Continuing training from checkpoint" in second or "3/4 [" in second


def test_listing_the_runs_and_reading_them_parses_the_log_once(tmp_path, monkeypatch):
    from lld_monitor.importers import load

    one = "".join(f"step {s} | reward {0.01 * s:.2f} | acc 0.25\n" for s in range(1, 31))
    path = tmp_path / "runs.log"
    path.write_text(one + one + one)
    full: list[Path] = []
    real = load.detect

    def counting(p, *, complete=True):
        if complete:
            full.append(Path(p))
        return real(p, complete=complete)

    monkeypatch.setattr(load, "detect", counting)
    monkeypatch.setattr(load, "_RUNS_CACHE", {})
    monkeypatch.setattr(load, "_TABLES", {})
    assert runs_in_file(path) == ["1", "2", "3"]
    for run in ("1", "2", "3"):
        assert list(load_table(path, run=run)[C.STEP]) == list(range(1, 31))
    assert full == [path]  # detected (and parsed) whole once
    path.write_text(one + one)  # changed: read again
    assert runs_in_file(path) == ["1", "2"]
    assert full == [path, path]
