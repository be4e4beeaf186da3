"""Formats met in published GRPO logs: a hosted service's per-step metrics.jsonl, typed-record
JSONL, nested JSON records, plain training-loop prints and printed reward tensors.

Each is built from its documented shape (docs/importers.md, "Formats"); expected values are
the ones written, and evaluation rows must never reach the training columns.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from lld_monitor import columns as C
from lld_monitor.cli import main
from lld_monitor.importers import (
    ImportFormatError,
    detect_format,
    load_eval_table,
    load_table,
    runs_in_file,
)


def _jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_hosted_metrics_jsonl_reads_its_steps_and_keeps_test_metrics_apart(tmp_path):
    # the Tinker cookbook's metrics.jsonl: one flat object a step, "/" in the keys, the eval
    # ("test/...") every 5 steps in the same object as the training metrics
    records = []
    for s in range(12):
        rec = {
            "step": s,
            "progress/batch": s,
            "env/all/reward/total": 0.1 + 0.05 * s,
            "env/all/correct": 0.05 * s,
            "env/all/ac_tokens_per_turn": 200.0 - s,
            "optim/lr": 4e-5,
            "optim/entropy": 0.9 - 0.01 * s,
            "optim/kl_sample_train_v1": 0.001 * s,
            "time/total": 30.0 + s,
        }
        if s % 5 == 0:
            rec["test/env/all/reward/total"] = 0.9
            rec["test/env/all/correct"] = 0.85
        records.append(rec)
    path = _jsonl(tmp_path / "metrics.jsonl", records)
    df = load_table(path)
    assert df.attrs["source_format"] == "jsonl"
    assert list(df[C.STEP]) == list(range(12))
    assert df[C.REWARD_MEAN].tolist() == pytest.approx([0.1 + 0.05 * s for s in range(12)])
    assert df[C.ACCURACY].tolist() == pytest.approx([0.05 * s for s in range(12)])
    assert df[C.ENTROPY].tolist() == pytest.approx([0.9 - 0.01 * s for s in range(12)])
    assert df[C.KL].tolist() == pytest.approx([0.001 * s for s in range(12)])
    assert set(df[C.LEARNING_RATE]) == {4e-5}
    assert 0.9 not in df[C.REWARD_MEAN].tolist()  # the eval reward is not the training reward
    ev = load_eval_table(path)
    assert list(ev[C.STEP]) == [0, 5, 10]
    assert ev["test/env/all/reward/total"].tolist() == [0.9] * 3
    assert df.attrs["eval_rows"] == 3
    assert "env/all/ac_tokens_per_turn" in df.attrs["unmapped_columns"]


def test_nested_json_records_are_flattened(tmp_path):
    records = [
        {"step": s, "env": {"all": {"reward": {"total": 0.2 * s}}}, "optim": {"lr": 1e-5}}
        for s in (1, 2, 3)
    ]
    df = load_table(_jsonl(tmp_path / "m.jsonl", records))
    assert list(df[C.STEP]) == [1, 2, 3]
    assert df[C.REWARD_MEAN].tolist() == pytest.approx([0.2, 0.4, 0.6])
    assert set(df[C.LEARNING_RATE]) == {1e-5}


@pytest.mark.parametrize(
    ("field", "train", "evaluation"),
    [
        ("type", "train", "eval"),
        ("split", "train", "validation"),
        ("mode", "rollout", "test"),
        ("event", "train_step", "eval_end"),
        ("kind", "training", "val-step"),
    ],
)
def test_typed_records_never_mix_train_and_eval(tmp_path, field, train, evaluation):
    records = []
    for s in range(1, 31):
        records.append({field: train, "step": s, "reward": 0.01 * s, "accuracy": 0.02 * s})
        if s % 10 == 0:
            records.append({field: evaluation, "step": s, "reward": 0.99, "accuracy": 0.97})
    records.append({field: "config", "lr": 1e-6})  # no training metric: not a row
    path = _jsonl(tmp_path / "log.jsonl", records)
    df = load_table(path)
    assert list(df[C.STEP]) == list(range(1, 31))
    assert df[C.REWARD_MEAN].tolist() == pytest.approx([0.01 * s for s in range(1, 31)])
    assert df[C.ACCURACY].tolist() == pytest.approx([0.02 * s for s in range(1, 31)])
    ev = load_eval_table(path)
    assert list(ev[C.STEP]) == [10, 20, 30]
    assert ev["eval/reward"].tolist() == [0.99] * 3
    assert ev["eval/accuracy"].tolist() == [0.97] * 3
    assert any("3 evaluation row(s) kept apart" in n for n in df.attrs["import_notes"])


def test_a_log_of_eval_records_only_says_so(tmp_path):
    path = _jsonl(
        tmp_path / "evals.jsonl", [{"type": "eval", "step": s, "reward": 0.5} for s in (1, 2)]
    )
    with pytest.raises(ImportFormatError, match="only evaluation rows"):
        load_table(path)


PLAIN = """\
Loading model Qwen2.5-0.5B ... done
lr: 1e-06 (config, before any step: not a metric row)
[rollout] step 1 | loss 0.512 | reward 0.10 | acc 0.10 | kl 0.0001
[eval] step 1 | acc 0.55 | reward 0.60
[rollout] step 2 | loss 0.498 | reward 0.20 | acc 0.20 | kl 0.0002
Step 3/100: loss=0.41, reward=0.30, acc=30.0%, grad_norm=0.8
Eval at step 3: accuracy=0.57, reward=0.61
step 4 | rollout acc 0.40 | eval acc 0.58 | reward 0.4
=== Step 5 ===
  reward: 0.5
  acc: 0.45
  val_acc: 0.59
"""


def test_plain_loop_prints_keep_eval_and_rollout_accuracy_apart(tmp_path):
    path = tmp_path / "train.log"
    path.write_text(PLAIN)
    assert detect_format(path) == "plain_console"
    df = load_table(path)
    assert df.attrs["step_source"] == "logged"
    assert list(df[C.STEP]) == [1, 2, 3, 4, 5]
    assert df[C.REWARD_MEAN].tolist() == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5])
    assert df[C.ACCURACY].tolist() == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.45])  # 30.0% = 0.3
    assert df[C.LOSS].tolist()[:3] == pytest.approx([0.512, 0.498, 0.41])
    assert df[C.GRAD_NORM].tolist()[2] == pytest.approx(0.8)
    ev = load_eval_table(path)
    assert list(ev[C.STEP]) == [1, 3, 4, 5]
    assert ev["eval/acc"].tolist()[0] == 0.55 and ev["eval/accuracy"].tolist()[1] == 0.57
    assert ev["eval/acc"].tolist()[2:] == [0.58, 0.59]


def test_plain_prints_with_words_for_names(tmp_path):
    # capitalised names, a qualifier joined to its key, rollout/ and eval/ prefixes
    path = tmp_path / "loop.log"
    path.write_text(
        "Epoch 1 | Step 10 | Train Acc: 0.40 | Val Acc: 0.55 | Grad Norm: 0.8 | "
        "Learning Rate: 1e-6\n"
        "Epoch 1 | Step 20 | Train Acc: 0.45 | Val Acc: 0.56 | Grad Norm: 0.9 | "
        "Learning Rate: 1e-6\n"
        "[Step 30] rollout/accuracy: 0.50 | rollout/reward: 0.52\n"
        "[Step 30] eval/accuracy: 0.60\n"
        "step=40 acc=0.55 val_acc=0.61 Reward=0.6\n"
    )
    df = load_table(path)
    assert list(df[C.STEP]) == [10, 20, 30, 40]
    assert df[C.ACCURACY].tolist() == [0.40, 0.45, 0.50, 0.55]
    assert df[C.GRAD_NORM].tolist()[:2] == [0.8, 0.9]
    assert df[C.LEARNING_RATE].tolist()[:2] == [1e-6, 1e-6]
    assert df[C.REWARD_MEAN].tolist()[2:] == [0.52, 0.6]
    ev = load_eval_table(path)
    assert list(ev[C.STEP]) == [10, 20, 30, 40]
    assert ev["eval/acc"].tolist()[:2] == [0.55, 0.56] and ev["eval/acc"].tolist()[3] == 0.61
    assert ev["eval/accuracy"].tolist()[2] == 0.60


def test_plain_logs_appended_are_runs(tmp_path):
    one = "".join(f"step {s} | reward {0.1 * s:.2f} | acc {0.05 * s:.2f}\n" for s in range(1, 6))
    path = tmp_path / "two.log"
    path.write_text(one + "restarting with a new seed\n" + one)
    assert runs_in_file(path) == ["1", "2"]
    assert list(load_table(path, run="1")[C.STEP]) == [1, 2, 3, 4, 5]


def test_printed_reward_tensors(tmp_path):
    text = (
        "=== Step 1 ===\n"
        "rewards: tensor([1., 0., 0., 1.])\n"
        "rewards: tensor([0., 0., 0., 1.])\n"
        "=== Step 2 ===\n"
        "rewards: tensor([1., 1., 0., 1., 0., 1., 1., 1.,\n"
        "        0., 1.], device='cuda:0')\n"
        "=== Step 3 ===\n"
        "rewards = [1.0, 1.0, 1.0, 0.5]\n"
    )
    path = tmp_path / "rewards.log"
    path.write_text(text)
    df = load_table(path)
    assert df.attrs["source_format"] == "plain_console"
    assert list(df[C.STEP]) == [1, 2, 3]
    batches = [[1, 0, 0, 1, 0, 0, 0, 1], [1, 1, 0, 1, 0, 1, 1, 1, 0, 1], [1, 1, 1, 0.5]]
    assert df[C.REWARD_MEAN].tolist() == pytest.approx([np.mean(b) for b in batches])
    assert df[C.REWARD_STD].tolist() == pytest.approx([np.std(b, ddof=1) for b in batches])
    # no step named anywhere: one row per printed batch, numbered
    path2 = tmp_path / "batches.log"
    path2.write_text(
        "rewards: tensor([1., 0.])\n"
        "batch reward tensor: tensor([1., 1.], device='cuda:0')\n"
        "reward functions: [accuracy, format]\n"  # (not numbers: not a batch)
        "scores = array([0.5, 0.25])\n"
    )
    df2 = load_table(path2)
    assert df2.attrs["step_source"] == "row_order"
    assert df2[C.REWARD_MEAN].tolist() == [0.5, 1.0, 0.375]


def test_a_file_that_is_none_of_these_is_refused_clearly(tmp_path, capsys):
    path = tmp_path / "notes.txt"
    path.write_text("We trained for a while.\nThe reward went up, then down.\n")
    with pytest.raises(ImportFormatError, match="unknown format"):
        load_table(path)
    assert main(["analyze", str(path)]) == 2
    err = capsys.readouterr().err
    assert "unknown format" in err and len(err.strip().splitlines()) == 1


def test_analyze_lists_the_runs_of_an_appended_log_and_reads_one(tmp_path, capsys):
    one = "".join(f"step {s} | reward {0.5:.2f} | acc {0.05:.2f}\n" for s in range(1, 31))
    path = tmp_path / "runs.log"
    path.write_text(one * 3)
    assert main(["analyze", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert sorted(r["name"] for r in doc["runs"]) == [f"runs.log [{i}]" for i in (1, 2, 3)]
    assert main(["analyze", str(path), "--run", "2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["rows"] == 30 and doc["first_step"] == 1 and doc["last_step"] == 30
    assert any("read run 2 (steps 1-30, 30 rows), as asked" in n for n in doc["notes"])
