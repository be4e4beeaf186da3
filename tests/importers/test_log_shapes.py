"""Log shapes that read wrong, or not at all, before: each reads with its real steps and values.

The fixtures are in ``tests/fixtures/importers/shapes`` (``make_shapes.py`` writes them with the
tool that writes each shape: pandas, torch's SummaryWriter, transformers' TrainerState, tqdm):
30 logged steps, the reward rising to ~0.7 and falling from the 20th step on.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from lld_monitor import columns as C
from lld_monitor.analysis.triage import is_collection_of_runs, one_run_in, triage
from lld_monitor.importers import ImportFormatError, load_eval_table, load_table
from lld_monitor.importers.text import console_steps

SHAPES = Path(__file__).resolve().parents[1] / "fixtures" / "importers" / "shapes"
N = 30


def _reward(step: int) -> float:
    import sys

    sys.path.insert(0, str(SHAPES))
    try:
        from make_shapes import reward
    finally:
        sys.path.pop(0)
    return reward(step)


def test_pandas_index_column_is_dropped():
    df = load_table(SHAPES / "pandas_index.csv")
    assert df.attrs["source_format"] == "wandb_csv"
    assert df[C.STEP].tolist() == list(range(1, N + 1))
    assert df[C.REWARD_MEAN].tolist() == pytest.approx([_reward(s) for s in range(1, N + 1)])
    assert not any("Unnamed" in c for c in df.columns)
    assert any("index" in n for n in df.attrs["import_notes"])


def test_pandas_index_of_a_canonical_table(tmp_path):
    import pandas as pd

    pd.DataFrame({"step": [1, 2, 3], "reward_mean": [0.1, 0.2, 0.3]}).to_csv(tmp_path / "t.csv")
    df = load_table(tmp_path / "t.csv")
    assert df.attrs["source_format"] == "csv"
    assert df[C.STEP].tolist() == [1, 2, 3]
    # read back with pandas and saved again: the index column is "Unnamed: 0"
    pd.read_csv(tmp_path / "t.csv").to_csv(tmp_path / "u.csv", index=False)
    assert load_table(tmp_path / "u.csv")[C.REWARD_MEAN].tolist() == [0.1, 0.2, 0.3]


def test_log_dir_of_one_run_is_that_run():
    path = SHAPES / "tb_logdir"
    assert not is_collection_of_runs(path)
    df = load_table(path)
    assert df.attrs["source_format"] == "tensorboard"
    assert df[C.STEP].tolist() == list(range(1, N + 1))


def test_folder_of_one_log_file_is_that_run(tmp_path, capsys):
    from lld_monitor.cli import main

    shutil.copy(SHAPES / "pandas_index.csv", tmp_path / "history.csv")
    assert not is_collection_of_runs(tmp_path)
    assert one_run_in(tmp_path) == (tmp_path / "history.csv", None)
    assert main(["analyze", str(tmp_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "runs" not in out  # the analysis of the run, not a one-line triage
    assert out["rows"] == N
    assert any("holds one run: read history.csv" in n for n in out["notes"])
    shutil.copy(SHAPES / "hosted_metrics.jsonl", tmp_path / "metrics.jsonl")
    assert is_collection_of_runs(tmp_path) and one_run_in(tmp_path) is None  # two: the triage


def test_checkpoint_folder_is_one_run_from_its_latest_complete_checkpoint():
    path = SHAPES / "trl_checkpoints"
    assert not is_collection_of_runs(path)
    df = load_table(path)
    assert df[C.STEP].tolist() == list(range(1, N + 1))  # checkpoint-30, not -10, not cut -40
    notes = " ".join(df.attrs["import_notes"])
    assert "checkpoint-30, the latest complete of 3 checkpoints" in notes
    assert "checkpoint-40/trainer_state.json: invalid JSON (cut off?)" in notes


def test_checkpoint_folders_in_a_sweep_are_one_run_each(tmp_path):
    for name in ("a", "b"):
        shutil.copytree(SHAPES / "trl_checkpoints", tmp_path / name)
    verdicts = triage(tmp_path, jobs=1)
    assert sorted(v.name for v in verdicts) == ["a", "b"]
    assert all(v.rows == N for v in verdicts)


def test_truncated_trainer_state_says_cut_off(tmp_path):
    with pytest.raises(ImportFormatError, match=r"invalid JSON \(cut off\?"):
        load_table(SHAPES / "truncated_trainer_state.json")
    (tmp_path / "out").mkdir()
    shutil.copy(SHAPES / "truncated_trainer_state.json", tmp_path / "out" / "trainer_state.json")
    shutil.copy(SHAPES / "pandas_index.csv", tmp_path / "other.csv")
    verdicts = triage(tmp_path, jobs=1)
    assert sorted(v.name for v in verdicts) == ["other.csv", "out"]
    bad = [v for v in verdicts if v.name == "out"]
    assert [v.verdict for v in bad] == ["unreadable"]
    assert "invalid JSON (cut off?" in bad[0].error


def test_split_streams_step_from_epoch_not_the_last_bar():
    df = load_table(SHAPES / "trl_split_streams.log")
    assert df.attrs["step_source"] == "epoch"
    assert df[C.STEP].tolist() == [2 * s for s in range(1, N + 1)]
    assert "does not advance with the metric dicts" in df.attrs["step_note"]
    assert df[C.REWARD_MEAN].tolist() == pytest.approx([_reward(s) for s in range(1, N + 1)])


def test_interleaved_bars_still_give_the_step():
    text = "".join(
        f"\r{i * 10}%|###| {i}/10 [00:0{i}<00:00]\n{{'reward': '0.{i}', 'epoch': '0.{i}'}}\n"
        for i in range(1, 10)
    )
    training = [(text.index("{", text.index(f"{i}/10")), {"reward": 0.1}) for i in range(1, 10)]
    steps, source, _ = console_steps(text, training)
    assert source == "progress_bar" and steps == list(range(1, 10))


def test_generation_engine_bars_never_give_the_step():
    df = load_table(SHAPES / "vllm_bars.log")
    assert df[C.STEP].tolist() == list(range(1, N + 1))  # not one row at step 64
    assert df.attrs["step_source"] == "row_order"


def test_typed_records_one_row_per_training_step_eval_apart():
    df = load_table(SHAPES / "typed_records.jsonl")
    assert df[C.STEP].tolist() == list(range(1, N + 1))
    assert df[C.REWARD_MEAN].notna().all() and df[C.GRAD_NORM].notna().all()
    assert df[C.REWARD_MEAN].tolist() == pytest.approx([_reward(s) for s in range(1, N + 1)])
    evals = load_eval_table(SHAPES / "typed_records.jsonl")
    assert evals[C.STEP].tolist() == [5, 10, 15, 20, 25, 30]
    assert evals["eval/reward_mean"].tolist() == [0.5] * 6


def test_hosted_cookbook_metrics_jsonl():
    df = load_table(SHAPES / "hosted_metrics.jsonl")
    assert df[C.STEP].tolist() == list(range(N))
    assert df[C.REWARD_MEAN].tolist() == pytest.approx([_reward(s) for s in range(1, N + 1)])
    for col in (C.ENTROPY, C.KL, C.REWARD_STD, C.LEARNING_RATE):
        assert df[col].notna().all(), col


def test_plain_iteration_prints_one_row_per_iteration_eval_apart():
    df = load_table(SHAPES / "plain_iterations.log")
    assert len(df) == N
    assert df[C.STEP].tolist() == list(range(1, N + 1))
    assert df[C.ACCURACY].tolist() == pytest.approx([round(_reward(s), 2) for s in range(1, N + 1)])
    assert df[C.LOSS].tolist() == pytest.approx([round(0.01 * s, 4) for s in range(1, N + 1)])
    evals = load_eval_table(SHAPES / "plain_iterations.log")
    assert evals["eval/accuracy"].tolist() == [0.5, 0.5, 0.5]


# --- each framework's own logs (their shapes from each logger's source: make_shapes.py) ------

#: fixture -> (format, first step, the canonical columns its logger's keys give)
FRAMEWORK_LOGS = {
    "fw_openrlhf_console.log": (
        "trl_console",
        1,
        {C.GRAD_NORM, C.ENTROPY, C.KL, C.COMPLETION_LENGTH, C.REWARD_STD, C.FRAC_TRUNCATED},
    ),
    "fw_slime_console.log": (
        "trl_console",
        0,
        {C.GRAD_NORM, C.ENTROPY, C.KL, C.COMPLETION_LENGTH, C.LOSS, C.FRAC_TRUNCATED},
    ),
    "fw_skyrl_console.log": (
        "trl_console",
        1,
        {C.GRAD_NORM, C.ENTROPY, C.COMPLETION_LENGTH, C.LOSS, C.LEARNING_RATE},
    ),
    "fw_nemo_rl_console.log": ("plain_console", 1, {C.LOSS, C.COMPLETION_LENGTH}),
    "fw_areal_console.log": (
        "plain_console",
        1,
        {C.GRAD_NORM, C.ENTROPY, C.KL, C.COMPLETION_LENGTH, C.FRAC_TRUNCATED},
    ),
    "fw_prime_rl_orchestrator.log": ("plain_console", 0, {C.FRAC_TRUNCATED}),
    "fw_roll_console.log": (
        "console_json",
        0,
        {C.GRAD_NORM, C.ENTROPY, C.KL, C.COMPLETION_LENGTH, C.LOSS},
    ),
    "fw_open_instruct_wandb.csv": (
        "wandb_csv",
        1,
        {C.GRAD_NORM, C.ENTROPY, C.KL, C.COMPLETION_LENGTH, C.LOSS, C.LEARNING_RATE},
    ),
    "fw_art_wandb.csv": ("wandb_csv", 1, {C.GRAD_NORM, C.REWARD_STD, C.LOSS}),
}


@pytest.mark.parametrize("name", sorted(FRAMEWORK_LOGS))
def test_framework_log_reads_with_its_steps_and_values(name):
    fmt, first, columns = FRAMEWORK_LOGS[name]
    df = load_table(SHAPES / name)
    assert df.attrs["source_format"] == fmt
    assert df[C.STEP].tolist() == list(range(first, first + N))
    # the reward of each step, as the fixture's logger wrote it (4 decimals where it rounds)
    want = [_reward(s) for s in range(1, N + 1)]
    assert df[C.REWARD_MEAN].tolist() == pytest.approx(want, abs=1e-4)
    missing = {c for c in columns if c not in df.columns or df[c].isna().any()}
    assert not missing, missing


def test_areal_train_step_not_the_epochs_step():
    df = load_table(SHAPES / "fw_areal_console.log")  # "Epoch 2/2 Step 1/15 Train step 16/30"
    assert df[C.STEP].tolist() == list(range(1, N + 1))


def test_open_instruct_val_lengths_are_training_metrics():
    df = load_table(SHAPES / "fw_open_instruct_wandb.csv")
    assert df[C.COMPLETION_LENGTH].notna().all()
    assert load_eval_table(SHAPES / "fw_open_instruct_wandb.csv").columns.tolist() == [C.STEP]


def test_a_framework_log_without_metric_lines_says_which_and_what_is_missing(tmp_path):
    path = tmp_path / "train.log"
    path.write_text(
        "[INFO] launching openrlhf.cli.train_ppo_ray\nloading model ...\nvLLM engines ready\n"
    )
    with pytest.raises(ImportFormatError, match=r"looks like a log of OpenRLHF .*Global step N"):
        load_table(path)
