"""Notebooks' training tables (importers/notebook.py): notebooks written with nbformat whose
tables transformers itself draws (``transformers.utils.notebook``: the progress bar and
``text_to_html_table``, as ``NotebookProgressCallback`` shows them) from the ``log_history`` of a
real tiny ``GRPOTrainer`` run; each is read back with its real steps and values."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from lld_monitor import columns as C
from lld_monitor.cli import main as cli_main
from lld_monitor.importers import ImportFormatError, load_table

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("IPython")
notebook = pytest.importorskip("transformers.utils.notebook")


@pytest.fixture(scope="module")
def log_history(tmp_path_factory: pytest.TempPathFactory, request: Any) -> list[dict[str, Any]]:
    """The training rows of a real 4-step GRPOTrainer run (two reward functions)."""
    pytest.importorskip("trl")
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from lld_grpo_script import make_grpo_trainer, reward_has_a, reward_length

    out = tmp_path_factory.mktemp("trl")
    trainer = make_grpo_trainer(out, max_steps=4, reward_funcs=[reward_has_a, reward_length])
    trainer.train()
    rows = [h for h in trainer.state.log_history if "reward" in h]
    assert [h["step"] for h in rows] == [1, 2, 3, 4]
    return rows


def _header(key: str) -> str:
    """A logged key as NotebookProgressCallback's table header shows it."""
    return "Training Loss" if key == "loss" else key.replace("/", " / ")


def _html(rows: list[dict[str, Any]], keys: list[str], step_offset: int = 0) -> str:
    """The progress bar and the training table, drawn by transformers' own renderer."""
    items: list[list[Any]] = [["Step", *(_header(k) for k in keys)]]
    for h in rows:
        items.append([h["step"] + step_offset, *(h.get(k, "No log") for k in keys)])
    last = rows[-1]["step"] + step_offset
    bar = notebook.html_progress_bar(last, last, f"[{last}/{last} 00:10, Epoch 1/1]", "", 300)
    return bar + notebook.text_to_html_table(items)


def _write(path: Path, tables: list[str], *, stream: str | None = None) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_markdown_cell("# GRPO on a tiny model"))
    for html in tables:
        cell = nbformat.v4.new_code_cell("trainer.train()")
        cell.outputs = [nbformat.v4.new_output("display_data", data={"text/html": html})]
        if stream:
            cell.outputs.insert(0, nbformat.v4.new_output("stream", name="stdout", text=stream))
        nb.cells.append(cell)
    nbformat.write(nb, str(path))
    return path


NEW_KEYS = [
    "loss",
    "reward",
    "reward_std",
    "rewards/reward_has_a/mean",
    "rewards/reward_length/mean",
    "completions/mean_length",
    "entropy",
    "grad_norm",
]


def _close(df, col: str, values: list[float]) -> None:
    # text_to_html_table prints floats with 6 decimals
    assert list(df[col]) == pytest.approx(values, abs=6e-7), col


def test_new_trl_columns_read_with_their_steps_and_values(tmp_path, log_history) -> None:
    path = _write(tmp_path / "grpo.ipynb", [_html(log_history, NEW_KEYS)])
    df = load_table(path)
    assert df.attrs["source_format"] == "notebook_log"
    assert list(df[C.STEP]) == [1, 2, 3, 4] and df.attrs["step_source"] == "logged"
    _close(df, C.REWARD_MEAN, [h["reward"] for h in log_history])
    _close(df, C.GRAD_NORM, [h["grad_norm"] for h in log_history])
    _close(df, C.ENTROPY, [h["entropy"] for h in log_history])
    _close(df, C.COMPLETION_LENGTH, [h["completions/mean_length"] for h in log_history])
    _close(
        df,
        C.REWARD_FN_PREFIX + "reward_length",
        [h["rewards/reward_length/mean"] for h in log_history],
    )
    notes = df.attrs["import_notes"]
    assert notes[0].startswith("read the notebook's training table 1 (Step | Training Loss")
    assert "4 rows, steps 1-4" in notes[0] and len(notes) == 1
    assert "Step column" in df.attrs["step_note"]


def test_old_trl_columns_and_no_log_cells(tmp_path, log_history) -> None:
    """Older TRL: reward | reward_std | completion_length | kl; a "No log" cell is missing."""
    old = [
        {
            "step": h["step"],
            "loss": h["loss"] if i else "No log",
            "reward": h["reward"],
            "reward_std": h["reward_std"],
            "completion_length": h["completions/mean_length"],
            "kl": 0.001 * (i + 1),
        }
        for i, h in enumerate(log_history)
    ]
    keys = ["loss", "reward", "reward_std", "completion_length", "kl"]
    path = _write(tmp_path / "old.ipynb", [_html(old, keys)])
    df = load_table(path)
    _close(df, C.REWARD_MEAN, [h["reward"] for h in log_history])
    _close(df, C.COMPLETION_LENGTH, [h["completions/mean_length"] for h in log_history])
    _close(df, C.KL, [0.001, 0.002, 0.003, 0.004])
    assert math.isnan(df[C.LOSS].iloc[0])
    _close(df.iloc[1:], C.LOSS, [h["loss"] for h in log_history[1:]])


def test_sft_then_grpo_reads_the_grpo_table_and_lists_the_other(tmp_path, log_history) -> None:
    sft = [{"step": s, "loss": 2.0 - 0.1 * s} for s in (10, 20, 30)]
    path = _write(
        tmp_path / "two.ipynb",
        [_html(sft, ["loss"]), _html(log_history, NEW_KEYS, step_offset=30)],
    )
    df = load_table(path)
    assert list(df[C.STEP]) == [31, 32, 33, 34]
    _close(df, C.REWARD_MEAN, [h["reward"] for h in log_history])
    notes = df.attrs["import_notes"]
    assert notes[0].startswith("read the notebook's training table 2 ") and "reward" in notes[0]
    assert "also in the notebook: table 1 (Step | Training Loss: 3 rows, steps 10-30" in notes[1]
    sft_df = load_table(path, run="1")
    assert list(sft_df[C.STEP]) == [10, 20, 30]
    _close(sft_df, C.LOSS, [2.0 - 0.1 * s for s in (10, 20, 30)])
    with pytest.raises(ImportFormatError, match="numbered 1-2"):
        load_table(path, run="3")


def test_a_resumed_run_keeps_its_real_steps(tmp_path, log_history) -> None:
    path = _write(tmp_path / "resumed.ipynb", [_html(log_history, NEW_KEYS, step_offset=50)])
    df = load_table(path)
    assert list(df[C.STEP]) == [51, 52, 53, 54]
    assert "steps 51-54" in df.attrs["import_notes"][0]


def test_bad_notebooks_get_clear_errors(tmp_path, log_history) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_code_cell("trainer.train()"))  # saved without outputs
    empty = tmp_path / "cleared.ipynb"
    nbformat.write(nb, str(empty))
    with pytest.raises(ImportFormatError, match="saved without outputs"):
        load_table(empty)
    good = _write(tmp_path / "good.ipynb", [_html(log_history, NEW_KEYS)])
    cut = tmp_path / "cut.ipynb"
    cut.write_text(good.read_text()[:2000])
    with pytest.raises(ImportFormatError, match="not valid JSON"):
        load_table(cut)
    unknown = _write(
        tmp_path / "unknown.ipynb",
        [notebook.text_to_html_table([["Step", "Foo", "Bar"], [1, 0.5, 0.25], [2, 0.5, 0.25]])],
    )
    with pytest.raises(ImportFormatError, match="no training rows with a known metric"):
        load_table(unknown)
    csv = tmp_path / "run.csv"
    csv.write_text("step,reward_mean\n1,0.1\n2,0.2\n")
    with pytest.raises(ImportFormatError, match="--run picks one training table"):
        load_table(csv, run="2")


def test_printed_dict_notebooks_keep_working(tmp_path) -> None:
    text = "".join(
        f"{{'loss': 0.1, 'grad_norm': 0.5, 'reward': {0.1 * s:.1f}, 'epoch': {s / 10}}}\n"
        for s in range(1, 4)
    )
    path = _write(tmp_path / "printed.ipynb", [], stream=None)
    doc = json.loads(path.read_text())
    doc["cells"].append(
        {
            "cell_type": "code",
            "execution_count": 1,
            "metadata": {},
            "source": "trainer.train()",
            "outputs": [{"output_type": "stream", "name": "stdout", "text": text}],
        }
    )
    path.write_text(json.dumps(doc))
    df = load_table(path)
    assert list(df[C.REWARD_MEAN]) == pytest.approx([0.1, 0.2, 0.3])


def test_analyze_says_which_table_it_read(tmp_path, log_history, capsys) -> None:
    sft = [{"step": s, "loss": 2.0 - 0.1 * s} for s in (10, 20, 30)]
    path = _write(
        tmp_path / "two.ipynb",
        [_html(sft, ["loss"]), _html(log_history, NEW_KEYS, step_offset=30)],
    )
    assert cli_main(["analyze", str(path)]) == 0
    out = capsys.readouterr().out
    assert "note: read the notebook's training table 2" in out
    assert "steps:    4 rows, step 31 to 34" in out
    assert "(logged: step from the Step column of the notebook's training table 2)" in out
    assert cli_main(["analyze", str(path), "--run", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["first_step"], doc["last_step"], doc["rows"]) == (10, 30, 3)
    assert doc["notes"][0].endswith(": as asked")
    assert cli_main(["analyze", str(path), "--run", "7"]) == 2
    assert "numbered 1-2" in capsys.readouterr().err
