"""Importers: every supported format reads to the hand-checked canonical values.

Expected numbers are copied by hand from the fixture files in tests/fixtures/importers/ (or from
the tables built in the test); the mapping each relies on is named in a comment.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lld_monitor import columns as C
from lld_monitor.importers import (
    FOREIGN_NAMES,
    FORMATS,
    ImportFormatError,
    canonical_name,
    detect_format,
    load_eval_table,
    load_table,
    parse_verl_console,
    runs_in_file,
)

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "importers"


def _col(df: pd.DataFrame, col: str) -> list[float]:
    return [float(v) for v in df[col]]


def _close(actual: list[float], expected: list[float]) -> None:
    assert len(actual) == len(expected), (actual, expected)
    for a, e in zip(actual, expected, strict=True):
        if isinstance(e, float) and math.isnan(e):
            assert math.isnan(a), (actual, expected)
        else:
            assert a == pytest.approx(e, rel=1e-9, abs=1e-12), (actual, expected)


# --- fixtures, one per format -------------------------------------------------------------------


def test_canonical_csv_sorted_numeric_and_unmapped():
    df = load_table(FIX / "canonical.csv")
    assert df.attrs["source_format"] == "csv"
    # rows are written 3, 1, 2 in the file: sorted by step
    assert list(df[C.STEP]) == [1, 2, 3]
    assert df[C.STEP].dtype == np.int64
    _close(_col(df, C.REWARD_MEAN), [0.25, 0.5, 0.75])
    _close(_col(df, C.GRAD_NORM), [0.1, 0.2, 0.4])
    _close(_col(df, C.LOGP_CORRECT), [-0.1, -0.2, -0.3])
    _close(_col(df, C.FRAC_CORRECT_DISPLACED), [0.2, 0.4, 0.6])
    assert df.attrs["unmapped_columns"] == ["my_extra"]
    assert "my_extra" not in df.columns
    assert all(pd.api.types.is_numeric_dtype(df[c]) for c in df.columns if c != C.NONFINITE)
    assert list(df[C.NONFINITE]) == ["", "", ""]  # the log names no non-finite value


def test_blank_cell_is_missing_literal_nan_is_nonfinite(tmp_path):
    from lld_monitor.analysis import analyze_run

    path = tmp_path / "wandb.csv"
    path.write_text(
        "step,loss,reward,grad_norm\n"
        "1,0.5,0.1,1.0\n2,0.4,0.2,1.1\n3,,0.25,1.0\n4,0.35,0.3,0.9\n"
        "5,nan,0.3,1.0\n6,0.3,0.32,inf\n"
    )
    df = load_table(path)
    assert list(df[C.NONFINITE]) == ["", "", "", "", "loss", "grad_norm"]
    assert math.isnan(df[C.LOSS][2]) and math.isinf(df[C.GRAD_NORM][5])
    # one critical alert, for the literal nan at step 5; the blank cell at step 3 is missing
    alerts = [(a.step, a.kind) for a in analyze_run(path).alerts]
    assert alerts == [(5, "nonfinite")]
    # a NaN carried as a value by a JSON record is non-finite; an absent key is missing
    recs = tmp_path / "trainer_state.json"
    recs.write_text(
        '{"log_history": [{"step": 1, "loss": 0.5, "reward": 0.1}, {"step": 2, "reward": 0.2},'
        ' {"step": 3, "loss": NaN, "reward": 0.2}]}'
    )
    assert list(load_table(recs)[C.NONFINITE]) == ["", "", "loss"]
    assert [(a.step, a.kind) for a in analyze_run(recs).alerts] == [(3, "nonfinite")]


def test_canonical_jsonl_ignores_torn_last_line():
    df = load_table(FIX / "canonical.jsonl")
    assert df.attrs["source_format"] == "jsonl"
    # the third line is cut mid-record: ignored, not fatal
    assert list(df[C.STEP]) == [1, 2]
    _close(_col(df, C.DELTA_CORRECT), [0.5, -0.25])
    _close(_col(df, C.LLDS_LAMBDA), [0.0, 0.2])
    _close(_col(df, C.TIME), [1700000000.0, 1700000010.0])


def test_parquet_detected_by_magic_not_extension(tmp_path):
    src = pd.DataFrame(
        {C.STEP: [2, 1], C.REWARD_MEAN: [0.5, 0.25], C.ENTROPY: [0.7, 0.9], "other": ["a", "b"]}
    )
    path = tmp_path / "table.data"  # no .parquet extension
    src.to_parquet(path)
    assert detect_format(path) == "parquet"
    df = load_table(path)
    assert list(df[C.STEP]) == [1, 2]
    _close(_col(df, C.REWARD_MEAN), [0.25, 0.5])
    _close(_col(df, C.ENTROPY), [0.9, 0.7])
    assert df.attrs["unmapped_columns"] == ["other"]


def test_trl_trainer_state_keeps_training_rows_and_maps_names():
    df = load_table(FIX / "trainer_state.json")
    assert df.attrs["source_format"] == "trl_trainer_state"
    # step 20 has a training row, an eval row and the final summary row: one row survives,
    # with the training values
    assert list(df[C.STEP]) == [10, 20]
    _close(_col(df, C.REWARD_MEAN), [0.4, 0.6])  # reward
    _close(_col(df, C.REWARD_STD), [0.3, 0.2])  # reward_std
    _close(_col(df, C.ACCURACY), [0.35, 0.55])  # rewards/accuracy_reward/mean
    _close(_col(df, C.COMPLETION_LENGTH), [120.5, 130.0])  # completions/mean_length
    _close(_col(df, C.FRAC_ZERO_STD_GROUPS), [0.25, 0.5])  # frac_reward_zero_std
    _close(_col(df, C.GRAD_NORM), [0.31, 0.62])
    _close(_col(df, C.ENTROPY), [0.9, 0.8])
    _close(_col(df, C.KL), [0.001, 0.004])
    _close(_col(df, C.LOSS), [0.02, -0.01])
    _close(_col(df, C.LEARNING_RATE), [1e-6, 2e-6])
    # per-reward-function means: rewards/<fn>/mean -> reward_fn/<fn> (accuracy_reward also above)
    _close(_col(df, C.REWARD_FN_PREFIX + "accuracy_reward"), [0.35, 0.55])
    _close(_col(df, C.REWARD_FN_PREFIX + "format_reward"), [0.05, 0.05])
    unmapped = df.attrs["unmapped_columns"]
    assert "epoch" in unmapped and "train_runtime" in unmapped
    assert not any(name.startswith("rewards/") for name in unmapped)
    # the eval row is kept apart, never read as training: its reward 0.1 is not step 20's
    assert df.attrs["eval_rows"] == 1 and "eval_reward" not in unmapped
    assert any("1 evaluation row(s) kept apart" in n for n in df.attrs["import_notes"])
    ev = load_eval_table(FIX / "trainer_state.json")
    assert list(ev[C.STEP]) == [20]
    assert ev["eval_reward"].tolist() == [0.1] and ev["eval_loss"].tolist() == [0.5]


def test_log_history_list_with_string_nan():
    df = load_table(FIX / "log_history.json")
    assert df.attrs["source_format"] == "log_history"
    assert list(df[C.STEP]) == [1, 2, 3]
    _close(_col(df, C.COMPLETION_LENGTH), [200.0, 168.5, 128.25])  # older TRL completion_length
    _close(_col(df, C.REWARD_MEAN), [0.0, -0.05, 0.77])
    _close(_col(df, C.GRAD_NORM), [0.0, 0.65, float("nan")])  # "NaN" string kept as NaN
    # TRL < 0.15 logged rewards/<fn> without /mean
    _close(_col(df, C.REWARD_FN_PREFIX + "xmlcount_reward_func"), [0.0, -0.05, 0.1])


def test_trl_console_steps_from_progress_bar_and_string_values():
    df = load_table(FIX / "trl_console.log")
    assert df.attrs["source_format"] == "trl_console"
    assert df.attrs["step_source"] == "progress_bar"
    # dicts follow the bars "5/10 [" and "10/10 ["; eval and train_runtime dicts are dropped
    assert list(df[C.STEP]) == [5, 10]
    _close(_col(df, C.LOSS), [0.01234, -0.002])  # '0.01234' is a quoted string in recent TRL
    _close(_col(df, C.GRAD_NORM), [0.25, float("nan")])  # bare nan
    _close(_col(df, C.REWARD_MEAN), [0.3, 0.7])
    _close(_col(df, C.KL), [1.5e-05, 3e-05])
    _close(_col(df, C.COMPLETION_LENGTH), [88.5, 90.0])
    _close(_col(df, C.ENTROPY), [1.25, 1.0])
    assert set(df.attrs["unmapped_columns"]) == {"num_tokens", "epoch"}
    _close(_col(df, C.REWARD_FN_PREFIX + "acc"), [0.3, float("nan")])


def test_notebook_stream_log():
    df = load_table(FIX / "notebook_stream.log")
    assert df.attrs["source_format"] == "notebook_log"
    assert list(df[C.STEP]) == [2, 4]  # bars "2/4 [" and "4/4 ["
    _close(_col(df, C.REWARD_MEAN), [-1.5, -0.5])
    _close(_col(df, C.GRAD_NORM), [0.5, 1.5])
    _close(_col(df, C.COMPLETION_LENGTH), [150.0, 160.0])


def test_ipynb_stream_outputs():
    df = load_table(FIX / "notebook.ipynb")
    assert df.attrs["source_format"] == "notebook_log"
    assert list(df[C.STEP]) == [3, 6]  # bars "3/9 [" and "6/9 [" on stderr
    _close(_col(df, C.REWARD_MEAN), [0.125, 0.375])
    _close(_col(df, C.ENTROPY), [0.5, 0.45])


def test_markdown_terminal_capture():
    df = load_table(FIX / "terminal_capture.md")
    assert df.attrs["source_format"] == "trl_console"
    # "2/2 [" (checkpoint shards) comes before the training bar; the last bar before each dict wins
    assert list(df[C.STEP]) == [10, 20]
    _close(_col(df, C.GRAD_NORM), [47.75, 404.0])
    _close(_col(df, C.FRAC_ZERO_STD_GROUPS), [0.4, 1.0])


def test_printed_dicts_without_progress_bar_use_row_order(tmp_path):
    path = tmp_path / "out.txt"
    path.write_text(
        "{'loss': 0.1, 'reward': 0.5, 'epoch': 0.1}\nsome text\n{'loss': 0.2, 'reward': 0.25}\n"
    )
    df = load_table(path)
    assert df.attrs["step_source"] == "row_order"
    assert list(df[C.STEP]) == [1, 2]
    _close(_col(df, C.REWARD_MEAN), [0.5, 0.25])


def test_wandb_history_prefers_global_step_and_drops_eval_rows():
    df = load_table(FIX / "wandb_history.csv")
    assert df.attrs["source_format"] == "wandb_csv"
    # train/global_step (5, 10, 15) wins over W&B's own _step (0, 1, 3); the eval-only row is gone
    assert list(df[C.STEP]) == [5, 10, 15]
    _close(_col(df, C.REWARD_MEAN), [0.2, 0.4, 0.6])  # train/reward
    _close(_col(df, C.GRAD_NORM), [0.35, 0.45, 0.55])  # train/grad_norm
    _close(_col(df, C.COMPLETION_LENGTH), [100.0, 110.0, 120.0])  # train/completions/mean_length
    _close(_col(df, C.TIME), [1700000100.5, 1700000110.5, 1700000120.5])  # _timestamp
    assert "eval/reward" not in df.attrs["unmapped_columns"] and df.attrs["eval_rows"] == 1


def test_wandb_panel_export():
    df = load_table(FIX / "wandb_panel.csv")
    assert df.attrs["source_format"] == "wandb_csv"
    assert list(df[C.STEP]) == [1, 2, 3]
    _close(_col(df, C.REWARD_MEAN), [0.1, 0.3, 0.2])  # "<run> - train/reward"; __MIN/__MAX dropped


def _write_tb(logdir: Path, scalars: dict[str, list[tuple[int, float]]]) -> None:
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    writer = EventFileWriter(str(logdir))
    for tag, points in scalars.items():
        for step, value in points:
            summary = Summary(value=[Summary.Value(tag=tag, simple_value=value)])
            writer.add_event(Event(step=step, wall_time=1000.0 + step, summary=summary))
    writer.close()


def test_tensorboard_event_folder(tmp_path):
    run = tmp_path / "runs" / "Dec02_exp1"
    run.mkdir(parents=True)
    _write_tb(
        run,
        {
            "train/reward": [(1, 0.25), (2, 0.5)],
            "train/grad_norm": [(1, 0.125), (2, 4.0)],
            "train/entropy": [(1, 1.5), (2, 1.75)],
            "eval/reward": [(2, 0.1)],
        },
    )
    root = tmp_path / "runs"
    assert detect_format(root) == "tensorboard"
    df = load_table(root)
    assert list(df[C.STEP]) == [1, 2]
    # values are float32 in the event file; these are exact in float32
    _close(_col(df, C.REWARD_MEAN), [0.25, 0.5])
    _close(_col(df, C.GRAD_NORM), [0.125, 4.0])
    _close(_col(df, C.ENTROPY), [1.5, 1.75])
    _close(_col(df, C.TIME), [1001.0, 1002.0])


def test_verl_console_lines():
    df = load_table(FIX / "verl_console.log")
    assert df.attrs["source_format"] == "verl_console"
    # step 0 has only validation metrics: not a training row
    assert list(df[C.STEP]) == [1, 2, 3]
    _close(_col(df, C.REWARD_MEAN), [0.2, 0.3, 0.5])  # critic/score/mean (not critic/rewards/mean)
    _close(_col(df, C.GRAD_NORM), [0.31, 0.45, 2.5])  # np.float64(2.5) unwrapped
    _close(_col(df, C.ENTROPY), [0.912, 0.85, 1.25])  # actor/entropy, then actor/entropy_loss
    _close(_col(df, C.KL), [0.0001, 0.002, float("nan")])  # ppo_kl, kl_loss preferred at step 2
    _close(_col(df, C.LOSS), [-0.015, 0.004, 0.01])  # actor/pg_loss
    _close(_col(df, C.COMPLETION_LENGTH), [230.5, 240.0, 250.0])  # response_length/mean
    _close(_col(df, C.NUM_SEARCHES), [1.5, float("nan"), float("nan")])
    _close(_col(df, C.FRAC_CORRECT_DISPLACED), [float("nan"), 0.4, float("nan")])  # lld/...
    _close(_col(df, C.LOGP_CORRECT), [float("nan"), float("nan"), -0.75])  # train/lld/...


def test_verl_file_logger_jsonl():
    df = load_table(FIX / "verl_metrics.jsonl")
    assert df.attrs["source_format"] == "verl_jsonl"
    # the validation record at step 2 merges into the training row of step 2; step 1 has
    # lld/<col>, step 2 actor/lld/<col> (verl 0.9 prefixes the policy loss's metrics)
    assert list(df[C.STEP]) == [1, 2]
    _close(_col(df, C.REWARD_MEAN), [0.25, 0.5])
    _close(_col(df, C.KL), [0.001, 0.002])  # actor/kl_loss
    _close(_col(df, C.LOGP_CORRECT), [-0.5, -0.75])
    _close(_col(df, C.FRAC_CORRECT_DISPLACED), [0.25, 0.75])
    assert "timing_s/gen" in df.attrs["unmapped_columns"]


def test_lld_run_folder(tmp_path):
    from lld_monitor import runlog

    with runlog.RunWriter(tmp_path / "run") as w:
        w.log_step({C.STEP: 1, C.REWARD_MEAN: 0.25, C.LOGP_CORRECT: -0.5})
        w.log_step({C.STEP: 2, C.REWARD_MEAN: 0.5, C.LOGP_CORRECT: -0.625})
    assert detect_format(tmp_path / "run") == "lld_run"
    df = load_table(tmp_path / "run")
    assert list(df[C.STEP]) == [1, 2]
    _close(_col(df, C.REWARD_MEAN), [0.25, 0.5])
    _close(_col(df, C.LOGP_CORRECT), [-0.5, -0.625])


# --- the mapping table --------------------------------------------------------------------------


def test_mapping_names():
    assert canonical_name("critic/score/mean") == C.REWARD_MEAN
    assert canonical_name("actor/grad_norm") == C.GRAD_NORM
    assert canonical_name("actor/entropy_loss") == C.ENTROPY
    assert canonical_name("actor/ppo_kl") == C.KL
    assert canonical_name("response_length/mean") == C.COMPLETION_LENGTH
    assert canonical_name("completions/mean_length") == C.COMPLETION_LENGTH
    # TRL's share of completions cut at max_completion_length (trainer_state, W&B, TensorBoard)
    for name in ("completions/clipped_ratio", "train/completions/clipped_ratio"):
        assert canonical_name(name) == C.FRAC_TRUNCATED
    assert canonical_name("response_length/clip_ratio") == C.FRAC_TRUNCATED  # verl
    assert canonical_name("clip_ratio/low_mean") is None  # PPO ratio clipping: another thing
    assert canonical_name("train/reward") == C.REWARD_MEAN
    assert canonical_name("eval/reward") is None
    # the authors' verl fork: lambda maps; their token-diluted pos/neg log-probs map for their
    # trend (tests/importers/test_verl_authors_names.py); the reference-policy ones and the
    # lambda-weighted penalty to columns of their own
    assert canonical_name("actor/loss_noreduce_coef") == C.LLDS_LAMBDA
    assert canonical_name("actor/pos_avg_old_log_prob") == C.LOGP_CORRECT
    assert canonical_name("actor/pos_avg_ref_log_prob") == C.LOGP_REF_CORRECT
    assert canonical_name("actor/neg_avg_ref_log_prob") == C.LOGP_REF_INCORRECT
    assert canonical_name("actor/loss_noreduce") == C.LLDS_LOSS_WEIGHTED
    assert canonical_name("actor/mean_reduce_chunk") == C.LLDS_ACTIONS_GATED
    assert canonical_name("actor/lowest_prob_avg_mean") is None
    assert canonical_name("epoch") is None
    for col in C.STEP_COLUMNS:
        assert canonical_name(col) == col
        assert canonical_name(f"lld/{col}") == col
        assert canonical_name(f"train/lld/{col}") == col
        assert canonical_name(f"actor/lld/{col}") == col  # verl prefixes the loss's metrics
    assert set(FOREIGN_NAMES) <= set(C.STEP_COLUMNS)
    assert canonical_name("rewards/format_reward/mean") == C.REWARD_FN_PREFIX + "format_reward"
    assert canonical_name("train/rewards/f/mean") == C.REWARD_FN_PREFIX + "f"
    assert canonical_name("rewards/format_reward/std") is None
    assert canonical_name(C.REWARD_FN_PREFIX + "f") == C.REWARD_FN_PREFIX + "f"
    assert canonical_name("lld/" + C.REWARD_FN_PREFIX + "f") == C.REWARD_FN_PREFIX + "f"


def test_parse_verl_console_old_and_new_number_styles():
    rows = parse_verl_console(
        "step:7 - actor/grad_norm:0.310 - critic/score/mean:np.float64(0.25) - x/y:nan\n"
        "noise step:8 - not a metric line\n"
    )
    assert rows == [
        {C.STEP: 7, "actor/grad_norm": "0.310", "critic/score/mean": "0.25", "x/y": "nan"}
    ]


# --- errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, content",
    [
        ("unknown.txt", None),
        ("empty.txt", ""),
        ("binary.dat", b"\x00\x01\x02\xff" * 64),
        ("other.json", '{"name": "not a run", "values": [1, 2]}'),
        ("other.csv", "a,b\n1,2\n"),
        ("eval_only.json", '[{"eval_loss": 0.5, "step": 1}]'),
    ],
)
def test_unknown_files_raise_one_line_import_error(tmp_path, name, content):
    if content is None:
        path = FIX / name
    else:
        path = tmp_path / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    with pytest.raises(ImportFormatError) as info:
        load_table(path)
    msg = str(info.value)
    assert "\n" not in msg
    assert "expected" in msg or "found no training rows" in msg
    assert isinstance(info.value, ValueError)


def test_missing_path_and_empty_folder(tmp_path):
    with pytest.raises(ImportFormatError, match="no such file"):
        load_table(tmp_path / "nope.csv")
    with pytest.raises(ImportFormatError, match="folder holds no run log"):
        load_table(tmp_path)


def test_every_fixture_has_a_known_format():
    for path in sorted(FIX.iterdir()):
        if path.name == "unknown.txt":
            continue
        assert detect_format(path) in FORMATS, path


def test_no_torch_import():
    import subprocess
    import sys

    code = (
        "import sys; from lld_monitor.importers import load_table; "
        f"load_table({str(FIX / 'trainer_state.json')!r}); "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --- real logs published by others -------------------------------------------------------------


def test_real_runs_import(real_run_file):
    df = load_table(real_run_file)
    assert len(df) > 0
    # a reward on (nearly) every row: verl's console logs have a few steps logged without one
    assert C.REWARD_MEAN in df.columns and df[C.REWARD_MEAN].notna().mean() > 0.9
    assert df[C.STEP].is_monotonic_increasing and df[C.STEP].is_unique
    assert json.dumps(df.attrs["unmapped_columns"])  # plain JSON-able metadata


def test_docs_list_every_format_and_foreign_name():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "importers.md").read_text()
    for fmt in FORMATS:
        assert f"`{fmt}`" in doc, fmt
    for col, names in FOREIGN_NAMES.items():
        for name in names:
            assert f"`{name}`" in doc, (col, name)


def test_tensor_reprs_and_ansi_colours(tmp_path):
    # transformers 4.38-4.39 printed grad_norm as a tensor; Ray colours its log prefix
    printed = tmp_path / "console.txt"
    printed.write_text(
        "{'loss': 0.5, 'grad_norm': tensor(0.3125, device='cuda:0'), 'reward': 0.25}\n"
        "{'loss': 0.25, 'grad_norm': np.float32(2.5), 'reward': 0.75}\n"
    )
    df = load_table(printed)
    _close(_col(df, C.GRAD_NORM), [0.3125, 2.5])
    _close(_col(df, C.REWARD_MEAN), [0.25, 0.75])
    verl = tmp_path / "verl.txt"
    verl.write_text(
        "\x1b[36m(TaskRunner pid=7)\x1b[0m step:4 - critic/score/mean:0.5 - actor/grad_norm:1.0\n"
        "\x1b[36m(TaskRunner pid=7)\x1b[0mstep:5 - critic/score/mean:0.25 - actor/grad_norm:2.0\n"
    )
    df = load_table(verl)
    assert df.attrs["source_format"] == "verl_console"
    assert list(df[C.STEP]) == [4, 5]
    _close(_col(df, C.REWARD_MEAN), [0.5, 0.25])


VERL_PY = Path(__file__).resolve().parents[2] / ".venv-verl" / "bin" / "python"

_VERL_SCRIPT = """
import os, sys
import numpy as np
os.environ["VERL_FILE_LOGGER_PATH"] = sys.argv[1]
from verl.utils.tracking import Tracking
t = Tracking(project_name="p", experiment_name="e", default_backend=["console", "file"])
t.log({"critic/score/mean": np.float64(0.25), "actor/grad_norm": 0.5,
       "actor/entropy": np.float32(1.5), "response_length/mean": 100,
       "lld/frac_correct_displaced": float("nan"), "timing_s/step": 3.0}, step=1)
t.log({"critic/score/mean": 0.5, "actor/grad_norm": np.float64(2.0), "actor/entropy": 1.25,
       "response_length/mean": np.int64(120), "actor/lld/frac_correct_displaced": 0.75}, step=2)
"""


@pytest.mark.verl
@pytest.mark.skipif(not VERL_PY.exists(), reason="no .venv-verl with verl installed")
def test_verl_own_console_and_file_logger_output(tmp_path):
    """verl's own Tracking (console + file backends) writes the files; both import the same."""
    import subprocess

    jsonl = tmp_path / "metrics.jsonl"
    proc = subprocess.run(
        [str(VERL_PY), "-c", _VERL_SCRIPT, str(jsonl)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    console = tmp_path / "console.log"
    console.write_text(proc.stdout + proc.stderr)
    assert "np.float64(0.25)" in proc.stdout  # verl pprints numpy scalars
    for path, fmt in ((console, "verl_console"), (jsonl, "verl_jsonl")):
        df = load_table(path)
        assert df.attrs["source_format"] == fmt
        assert list(df[C.STEP]) == [1, 2]
        _close(_col(df, C.REWARD_MEAN), [0.25, 0.5])
        _close(_col(df, C.GRAD_NORM), [0.5, 2.0])
        _close(_col(df, C.ENTROPY), [1.5, 1.25])
        _close(_col(df, C.COMPLETION_LENGTH), [100.0, 120.0])
        _close(_col(df, C.FRAC_CORRECT_DISPLACED), [float("nan"), 0.75])  # orjson writes null


@pytest.mark.slow
def test_real_grpo_trainer_outputs_import(tmp_path, capfd, monkeypatch):
    """A real 3-step TRL GRPOTrainer run on a tiny model writes trainer_state.json, TensorBoard
    events and console dicts; each imports to the trainer's own log_history."""
    pytest.importorskip("trl")
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1]))
    from lld_grpo_script import make_grpo_trainer, reward_has_a, reward_length

    out = tmp_path / "trl"
    trainer = make_grpo_trainer(
        out, max_steps=3, report_to="tensorboard", reward_funcs=[reward_has_a, reward_length]
    )
    trainer.train()
    trainer.state.save_to_json(str(out / "trainer_state.json"))
    captured = capfd.readouterr()
    console = tmp_path / "console.log"
    console.write_text(captured.out + captured.err)
    train = [h for h in trainer.state.log_history if "reward" in h]
    assert [h["step"] for h in train] == [1, 2, 3]
    expected = {
        C.REWARD_MEAN: [h["reward"] for h in train],
        C.GRAD_NORM: [h["grad_norm"] for h in train],
        C.ENTROPY: [h["entropy"] for h in train],
        C.COMPLETION_LENGTH: [h["completions/mean_length"] for h in train],
        C.REWARD_FN_PREFIX + "reward_length": [h["rewards/reward_length/mean"] for h in train],
    }
    # trainer_state.json: exact; TensorBoard: float32; console: printed with 4 significant digits
    for path, fmt, rel in (
        (out / "trainer_state.json", "trl_trainer_state", 1e-12),
        (out, "tensorboard", 1e-6),
        (console, "trl_console", 1e-3),
    ):
        df = load_table(path)
        assert df.attrs["source_format"] == fmt
        assert list(df[C.STEP]) == [1, 2, 3], fmt
        for col, values in expected.items():
            assert _col(df, col) == pytest.approx(values, rel=rel, abs=1e-6), (fmt, col)
    # the output folder holds both logs: the analysis says which it read and what else is there
    df = load_table(out)
    assert df.attrs["source_format"] == "tensorboard"
    assert df.attrs["other_sources"] == [f"TRL's trainer_state.json: {out / 'trainer_state.json'}"]
    assert load_table(out / "trainer_state.json").attrs["other_sources"] == []  # a file
    from lld_monitor.cli import main

    capfd.readouterr()
    assert main(["analyze", str(out)]) == 0
    text = capfd.readouterr().out
    assert "format:   tensorboard" in text
    assert f"not read: TRL's trainer_state.json: {out / 'trainer_state.json'}" in text
    assert main(["analyze", str(out), "--json"]) == 0
    doc = json.loads(capfd.readouterr().out)
    assert doc["other_sources"] == [f"TRL's trainer_state.json: {out / 'trainer_state.json'}"]


def _inflate(src: Path, dst: Path, min_bytes: int) -> None:
    """A copy of fixture ``src`` in the same format, padded past ``min_bytes`` with its own rows."""
    text = src.read_text()
    if src.suffix in (".json", ".ipynb") or src.name == "notebook_stream.log":
        doc = json.loads(text)
        if isinstance(doc, list):
            items = doc
        elif "log_history" in doc:
            items = doc["log_history"]
        else:
            items = doc["cells"]
        while len(json.dumps(doc)) < min_bytes:
            items.extend(list(items))
        dst.write_text(json.dumps(doc, indent=1))
        return
    lines = [ln for ln in text.splitlines() if ln.strip()]
    header, body = (lines[:1], lines[1:]) if src.suffix == ".csv" else ([], lines)
    body = [ln for ln in body if not ln.rstrip().endswith('"llds_en')]  # drop the torn line
    out = list(header)
    size = 0
    while size < min_bytes:
        out.extend(body)
        size += sum(len(ln) + 1 for ln in body)
    dst.write_text("\n".join(out) + "\n")


def test_detect_format_of_large_files_from_their_head(tmp_path):
    from lld_monitor.importers import SNIFF_BYTES

    for src in sorted(FIX.iterdir()):
        if src.name == "unknown.txt" or not src.is_file():
            continue
        big = tmp_path / src.name
        _inflate(src, big, SNIFF_BYTES + 1024)
        assert big.stat().st_size > SNIFF_BYTES
        head_fmt = detect_format(big)  # from the first MiB
        assert head_fmt == detect_format(src), src.name
        assert load_table(big).attrs["source_format"] == head_fmt, src.name
    junk = tmp_path / "junk.txt"
    junk.write_text("nothing to see here\n" * 60_000)
    with pytest.raises(ImportFormatError, match="first MiB"):
        detect_format(junk)


# --- console logs: real training steps ------------------------------------------------------------


def _dicts(*rows: str) -> str:
    return "\n".join(rows) + "\n"


def test_console_steps_ignore_a_checkpoint_bar_right_before_a_dict(tmp_path):
    # the shard-loading bar "2/2 [" is the last bar before the first dict: the training bar
    # (total 100, the one most dicts follow) gives the steps, not it
    path = tmp_path / "train.log"
    path.write_text(
        _dicts(
            "  5%|5         | 5/100 [00:10<03:10,  2.0s/it]",
            "Loading checkpoint shards: 100%|##########| 2/2 [00:01<00:00,  1.9it/s]",
            "{'loss': 0.1, 'reward': 0.2, 'epoch': 0.05}",
            " 10%|#         | 10/100 [00:20<03:00,  2.0s/it]",
            "{'loss': 0.2, 'reward': 0.3, 'epoch': 0.1}",
            " 15%|#5        | 15/100 [00:30<02:50,  2.0s/it]",
            "{'loss': 0.3, 'reward': 0.4, 'epoch': 0.15}",
        )
    )
    df = load_table(path)
    assert df.attrs["step_source"] == "progress_bar"
    assert list(df[C.STEP]) == [5, 10, 15]
    assert "N/100" in df.attrs["step_note"]


def test_console_steps_from_epoch_and_the_trainer_banner(tmp_path):
    # no progress bar (a log without stderr): epoch x (total steps / epochs) = 0.125 x 40 = 5
    path = tmp_path / "train.log"
    path.write_text(
        _dicts(
            "   \\\\   /|    Num examples = 300 | Num Epochs = 2 | Total steps = 80",
            "{'loss': 0.1, 'reward': '0.2', 'epoch': '0.125'}",
            "{'loss': 0.2, 'reward': '0.3', 'epoch': '0.25'}",
            "{'loss': 0.3, 'reward': '0.5', 'epoch': '0.375'}",
        )
    )
    df = load_table(path)
    assert df.attrs["step_source"] == "epoch"
    assert list(df[C.STEP]) == [5, 10, 15]
    _close(_col(df, C.REWARD_MEAN), [0.2, 0.3, 0.5])  # values stored as strings
    assert "40 steps per epoch" in df.attrs["step_note"]


def test_console_steps_from_logging_steps_in_a_config_line(tmp_path):
    path = tmp_path / "train.log"
    path.write_text(
        _dicts(
            "GRPOConfig(output_dir='out', logging_steps=5, learning_rate=1e-06)",
            "{'loss': 0.1, 'reward': 0.2}",
            "{'loss': 0.2, 'reward': 0.3}",
            "{'loss': 0.3, 'reward': 0.4}",
        )
    )
    df = load_table(path)
    assert df.attrs["step_source"] == "logging_steps"
    assert list(df[C.STEP]) == [5, 10, 15]
    assert "logging_steps = 5" in df.attrs["step_note"]


def test_plain_json_list_of_step_dicts_with_string_values(tmp_path):
    path = tmp_path / "metrics.json"
    rows = [{"step": 2 * i, "reward": f"{0.1 * i:.2f}", "grad_norm": "0.5"} for i in range(1, 4)]
    path.write_text(json.dumps(rows))
    df = load_table(path)
    assert list(df[C.STEP]) == [2, 4, 6] and df.attrs["step_source"] == "logged"
    _close(_col(df, C.REWARD_MEAN), [0.1, 0.2, 0.3])
    assert df.attrs["import_notes"] == []


def test_every_real_console_log_gets_real_training_steps(real_runs):
    from lld_monitor.importers.formats import detect
    from lld_monitor.importers.text import (
        _printed_dicts_at,
        _steps_per_epoch,
        _training_bar_total,
    )

    consoles = [p for p in conftest_files(real_runs) if detect_format(p) in CONSOLE_FORMATS]
    assert len(consoles) >= 4  # the TRL terminal capture and the notebook stream logs
    for path in consoles:
        df = load_table(path)
        assert df.attrs["step_source"] != "row_order", (path.name, df.attrs["step_note"])
        steps = df[C.STEP].to_numpy()
        assert (np.diff(steps) > 0).all() and steps[0] > 1  # logged every few steps, not 1, 2, 3
        # cross-check against a second source the log holds: epoch x steps per epoch
        fmt, head = detect(path)
        text = fmt.text(head)
        found = [d for _, d in _printed_dicts_at(text) if "epoch" in d and "loss" in d]
        per_epoch, _ = _steps_per_epoch(text, _training_bar_total(text, [0]))
        if per_epoch is not None:
            epochs = np.array([float(d["epoch"]) for d in found[: len(steps)]])
            assert np.abs(steps / per_epoch - epochs).max() < 0.002, path.name
        else:  # the bar's total is the run's length: every step lies within it
            total = _training_bar_total(text, [pos for pos, _ in _printed_dicts_at(text)])
            assert total is not None and steps[-1] <= total, path.name


CONSOLE_FORMATS = ("trl_console", "notebook_log")


def conftest_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.name not in ("README.md", "verdicts.tsv"))


_VERL_RUN_SCRIPT = """
import sys
from verl.utils.tracking import Tracking
base = float(sys.argv[1])
t = Tracking(project_name="p", experiment_name="e", default_backend=["console"])
t.log({"val-core/nq/reward/mean@1": base}, step=0)  # verl validates before training
for step in range(1, 6):
    metrics = {"critic/score/mean": base + 0.01 * step, "actor/grad_norm": 0.5}
    if step == 5:
        metrics["val-core/nq/reward/mean@1"] = 0.9  # validation merged into the step's metrics
    t.log(metrics, step=step)
"""


@pytest.mark.verl
@pytest.mark.skipif(not VERL_PY.exists(), reason="no .venv-verl with verl installed")
def test_verl_own_console_of_two_runs_appended(tmp_path):
    """Two runs of verl's own console logger appended to one log (``>> train.log``): two runs,
    each its own values; the validation rows are kept apart from the training reward."""
    import subprocess

    out = []
    for base in ("0.1", "0.5"):
        proc = subprocess.run(
            [str(VERL_PY), "-c", _VERL_RUN_SCRIPT, base],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=tmp_path,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        out.append(proc.stdout + proc.stderr)
    log = tmp_path / "train.log"
    log.write_text("".join(out))
    assert runs_in_file(log) == ["1", "2"]
    for run, base in (("1", 0.1), ("2", 0.5)):
        df = load_table(log, run=run)
        assert df.attrs["source_format"] == "verl_console"
        assert list(df[C.STEP]) == [1, 2, 3, 4, 5]
        _close(_col(df, C.REWARD_MEAN), [base + 0.01 * s for s in range(1, 6)])
        ev = load_eval_table(log, run=run)
        assert list(ev[C.STEP]) == [0, 5]
        _close(list(ev["val-core/nq/reward/mean@1"]), [base, 0.9])
