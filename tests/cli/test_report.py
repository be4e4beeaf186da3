"""``lld-monitor report RUN`` (issue 50, item 4): the bundle's sections checked against the
run's own numbers, on a sample run, a TRL output folder, a W&B run folder and a run with token
samples."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lld_monitor import columns as C
from lld_monitor.cli import main
from lld_monitor.report.bundle import SCHEMA_VERSION, WINDOW_ROWS

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "sample_runs" / "auto" / "s1-small-32upd-lr3e-3-seed0-off"
SHAPES = ROOT / "tests" / "fixtures" / "importers" / "shapes"
PNG = b"\x89PNG\r\n\x1a\n"
KEYS = {
    *("schema_version", "source", "format", "run", "name", "rows", "first_step", "last_step"),
    *("verdict", "verdict_word", "verdict_reason", "phase_at_end", "collapse", "collapse_text"),
    *("onset", "last_healthy_step", "checkpoint", "timeline", "numbers", "numbers_collapse"),
    *("samples", "alerts", "actions", "versions", "config", "signals", "lacks", "import_notes"),
    "files",
}


def _report(path: Path, out: Path, *extra: str) -> tuple[str, dict]:
    assert main(["report", str(path), "--out", str(out), *extra]) == 0
    summary = (out / "summary.md").read_text()
    doc = json.loads((out / "report.json").read_text())
    assert set(doc) == KEYS and doc["schema_version"] == SCHEMA_VERSION
    for f in doc["files"]:
        assert (out / f).is_file(), f
    pngs = [f for f in doc["files"] if f.endswith(".png")]
    assert pngs and all((out / f).read_bytes()[:8] == PNG for f in pngs)
    assert all(f"]({f})" in summary for f in pngs)  # each image is linked from the summary
    html = (out / "report.html").read_text()
    assert "plotly" in html and ("lld-alert" in html or not doc["alerts"])
    return summary, doc


def _window_mean(steps: np.ndarray, values: np.ndarray, at: int, before: bool) -> float:
    """By hand: the mean of up to WINDOW_ROWS rows before ``at`` (or from it on)."""
    i = int(np.searchsorted(steps, at))
    w = max(1, min(WINDOW_ROWS, len(steps) // 4))
    sl = slice(max(0, i - w), i) if before else slice(i, min(len(steps), i + w))
    return float(np.nanmean(values[sl]))


def _row(summary: str, col: str) -> list[str]:
    line = next(ln for ln in summary.splitlines() if ln.startswith(f"| {col} |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_report_of_a_sample_run_against_its_own_numbers(tmp_path: Path) -> None:
    summary, doc = _report(SAMPLE, tmp_path / "r")
    steps_df = pd.read_json(SAMPLE / "steps.jsonl", lines=True).sort_values(C.STEP)
    steps = steps_df[C.STEP].to_numpy()
    reward = steps_df[C.REWARD_MEAN].to_numpy(dtype=float)
    # the verdict and the collapse, as analyze says them
    assert doc["verdict"] == "collapsed" and summary.startswith(
        "# lld_monitor report: s1-small-32upd-lr3e-3-seed0-off\n\n**Verdict: collapsed**"
    )
    assert doc["collapse"]["reward_fell"] == 73
    # the onset: the displacement warning at step 14 (the first sign); the last healthy step
    assert doc["onset"]["step"] == 14 and "displacement" in doc["onset"]["by"]
    assert doc["last_healthy_step"] == 13 and "Last healthy step: 13." in summary
    # the table's numbers are the run's own means around the onset and around the collapse
    before = _window_mean(steps, reward, 14, True)
    after = _window_mean(steps, reward, 14, False)
    assert doc["numbers"]["columns"][C.REWARD_MEAN]["before"] == pytest.approx(before)
    assert doc["numbers"]["columns"][C.REWARD_MEAN]["after"] == pytest.approx(after)
    assert _row(summary, C.REWARD_MEAN)[1:3] == [f"{before:.4g}", f"{after:.4g}"]
    fell_after = _window_mean(steps, reward, 73, False)
    assert doc["numbers_collapse"]["columns"][C.REWARD_MEAN]["after"] == pytest.approx(fell_after)
    assert "## Before and after the collapse (step 73)" in summary
    # the timeline: the alert's headline, the phase, the ending against closed.json
    assert "| 14 | alert warning | LLD indicator at step 14:" in summary
    assert "| 73 | phase | collapse (steps 73-400) |" in summary
    assert "| 400 | ending | closed (ok), 400 rows |" in summary
    # versions and config from meta.json, actions from the alerts
    meta = json.loads((SAMPLE / "meta.json").read_text())
    assert doc["versions"]["trl"] == meta["versions"]["trl"]
    assert f'"trl": "{meta["versions"]["trl"]}"' in summary
    assert doc["actions"][0].startswith("roll back to the last checkpoint saved before step 73")
    assert "Token samples" in summary and "no token samples logged" in " ".join(doc["lacks"])


def test_report_of_a_trl_output_folder_names_its_checkpoint(tmp_path: Path) -> None:
    summary, doc = _report(SHAPES / "trl_checkpoints", tmp_path / "r")
    assert doc["format"] == "trl_trainer_state"
    at = doc["onset"]["step"]
    assert at is not None and doc["checkpoint"]["step"] == 10 < at
    assert doc["checkpoint"]["path"].endswith("checkpoint-10")
    assert doc["actions"][0].startswith(f"roll back to {doc['checkpoint']['path']} (step 10")
    # its numbers from the latest complete checkpoint's own log_history (40 is cut)
    state = json.loads(
        (SHAPES / "trl_checkpoints" / "checkpoint-30" / "trainer_state.json").read_text()
    )
    hist = pd.DataFrame([h for h in state["log_history"] if "reward" in h])
    steps, reward = hist["step"].to_numpy(), hist["reward"].to_numpy(dtype=float)
    got = doc["numbers"]["columns"][C.REWARD_MEAN]
    assert got["before"] == pytest.approx(_window_mean(steps, reward, at, True))
    assert got["after"] == pytest.approx(_window_mean(steps, reward, at, False))
    lacks = " ".join(doc["lacks"])
    assert "no token samples, versions or monitor config" in lacks
    assert "## Versions and config\n\nNot in this log." in summary


def test_report_of_a_wandb_run_folder(tmp_path: Path) -> None:
    run = tmp_path / "wandb" / "run-20261207_000000-abc123"
    run.mkdir(parents=True)
    shutil.copy(SHAPES / "wandb_offline_run.wandb", run / "run-abc123.wandb")
    summary, doc = _report(run, tmp_path / "r")
    assert doc["format"] == "wandb_run" and doc["rows"] == 30
    assert doc["verdict"] == "collapsed" and doc["collapse"]["reward_fell"] == 22
    assert doc["checkpoint"] is None and "No `checkpoint-N` folder" in summary
    kinds = [a["kind"] for a in doc["alerts"]]
    assert "collapse" in kinds
    collapse = next(a for a in doc["alerts"] if a["kind"] == "collapse")
    assert f"| {collapse['step']} | alert critical | {collapse['headline']} |" in summary


def test_report_shows_token_samples_before_and_after_the_onset(tmp_path: Path) -> None:
    """The sample run's rows written again with token samples at steps 10 and 300: the one
    before the onset (step 14) and the first after it are shown, with their text and change."""
    from lld_monitor.runlog import RunWriter

    rows = pd.read_json(SAMPLE / "steps.jsonl", lines=True).sort_values(C.STEP)
    w = RunWriter(tmp_path / "run", meta={"versions": {"lld_monitor": "test"}}, fsync_every_s=0)
    for rec in rows.to_dict("records"):
        w.log_step({k: v for k, v in rec.items() if v == v})
    for step, text in ((10, "early answer"), (300, "late garbage")):
        w.log_tokens(
            [
                {
                    C.TOK_RESPONSE: 0,
                    C.TOK_POSITION: i,
                    C.TOK_TOKEN_ID: i,
                    C.TOK_TEXT: tok,
                    C.TOK_ACTION: 0,
                    C.TOK_GENERATED: 1,
                    C.TOK_LOGP_OLD: -1.0,
                    C.TOK_DELTA: -0.25,
                    C.TOK_REWARD: 1.0,
                    C.TOK_ADVANTAGE: 0.5,
                    C.TOK_CORRECT: 1,
                }
                for i, tok in enumerate(text.split(" "))
            ],
            step=step,
        )
    w.close()
    summary, doc = _report(tmp_path / "run", tmp_path / "r")
    assert doc["onset"]["step"] == 14
    labels = [(s["label"], s["step"]) for s in doc["samples"]]
    assert labels == [("before", 10), ("after", 300)]
    first = doc["samples"][0]["responses"][0]
    assert first["text"] == "earlyanswer" and first["delta_sum"] == -0.5 and first["reward"] == 1
    assert "### Step 10 (before)" in summary and "likelihood change -0.5 nats" in summary
    assert "### Step 300 (after)" in summary and "lategarbage" in summary


def test_report_refuses_what_it_cannot_report(tmp_path: Path, capsys) -> None:
    (tmp_path / "junk.txt").write_text("not a log\n")
    assert main(["report", str(tmp_path / "junk.txt"), "--out", str(tmp_path / "r")]) == 2
    assert "lld-monitor report:" in capsys.readouterr().err
    many = tmp_path / "many"
    for name in ("a", "b"):
        shutil.copytree(SAMPLE, many / name)
    assert main(["report", str(many), "--out", str(tmp_path / "r2")]) == 2
    assert "holds 2 runs" in capsys.readouterr().err


def test_report_json_on_stdout(tmp_path: Path, capsys) -> None:
    assert main(["report", str(SAMPLE), "--out", str(tmp_path / "r"), "--json"]) == 0
    out = capsys.readouterr().out
    doc = json.loads(out)
    assert doc == json.loads((tmp_path / "r" / "report.json").read_text())
