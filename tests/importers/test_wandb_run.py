"""W&B run folders (importers/wandb_run.py) written by the real wandb library, offline: the
history read from run-*.wandb with its real steps and values, a file cut in a block, a damaged
checksum, an empty file, the fallbacks, a wandb/ folder of several runs, and a TRL GRPOTrainer
run reporting to W&B."""

from __future__ import annotations

import json
import math
import shutil
import struct
from pathlib import Path

import pytest

from lld_monitor import columns as C
from lld_monitor.cli import main as cli_main
from lld_monitor.importers import ImportFormatError, detect_format, load_table
from lld_monitor.importers.wandb_run import BLOCK_LEN, HEADER_LEN, wandb_file_of

wandb = pytest.importorskip("wandb")

N_ROWS = 300


def _reward(i: int) -> float:
    return 0.5 + 0.3 * math.sin(i / 10.0)


def _offline_env(monkeypatch: pytest.MonkeyPatch, where: Path) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(where))
    monkeypatch.setenv("WANDB_CONSOLE", "off")


@pytest.fixture(scope="module")
def wandb_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wandb/ folder holding two offline runs written by the real library."""
    root = tmp_path_factory.mktemp("wb")
    mp = pytest.MonkeyPatch()
    try:
        _offline_env(mp, root)
        for offset, run_id in ((0, "runa0000"), (1000, "runb1111")):
            run = wandb.init(project="lld-test", mode="offline", dir=str(root), id=run_id)
            for i in range(N_ROWS):
                run.log(
                    {"train/reward": _reward(i + offset), "train/grad_norm": 1.0 + i / 100.0},
                    step=i + 1,
                )
            run.finish()
    finally:
        mp.undo()
    for run_dir in (root / "wandb").glob("offline-run-*"):
        _settled(wandb_file_of(run_dir))
    return root / "wandb"


def _settled(path: Path, timeout: float = 20.0) -> None:
    """Wait until wandb's service has written the file out: wandb.finish() can return while
    the core process still holds the records (a file of only its 7-byte header)."""
    import time

    t0, last = time.monotonic(), -1
    while time.monotonic() - t0 < timeout:
        size = path.stat().st_size
        if size > 7 and size == last:
            return
        last = size
        time.sleep(0.5)


def _runs(wandb_dir: Path) -> list[Path]:
    """The two runs, the one logged with offset 0 first (their folders end in their ids)."""
    return sorted(
        (p for p in wandb_dir.glob("offline-run-*") if p.is_dir()), key=lambda p: p.name[-8:]
    )


def test_an_offline_run_folder_reads_with_its_steps_and_values(wandb_dir: Path) -> None:
    run = _runs(wandb_dir)[0]
    assert detect_format(run) == "wandb_run"
    df = load_table(run)
    assert list(df[C.STEP]) == list(range(1, N_ROWS + 1))
    assert list(df[C.REWARD_MEAN]) == pytest.approx([_reward(i) for i in range(N_ROWS)])
    assert list(df[C.GRAD_NORM]) == pytest.approx([1.0 + i / 100.0 for i in range(N_ROWS)])
    notes = df.attrs["import_notes"]
    assert notes[0].startswith("read the W&B history from run-") and f"({N_ROWS} rows)" in notes[0]
    # latest-run (a link to the newest) and the .wandb file itself read the same
    newest = load_table(wandb_dir / "latest-run")
    assert list(newest[C.STEP]) == list(range(1, N_ROWS + 1))
    direct = load_table(wandb_file_of(run))
    assert list(direct[C.REWARD_MEAN]) == list(df[C.REWARD_MEAN])


def test_a_file_cut_in_a_block_gives_the_rows_before_the_cut(wandb_dir: Path, tmp_path) -> None:
    src = wandb_file_of(_runs(wandb_dir)[0])
    data = src.read_bytes()
    assert len(data) > 2 * BLOCK_LEN
    cut = tmp_path / "run-cut.wandb"
    cut.write_bytes(data[: BLOCK_LEN + BLOCK_LEN // 2])  # in the middle of the second block
    df = load_table(cut)
    n = len(df)
    assert 10 < n < N_ROWS
    assert list(df[C.STEP]) == list(range(1, n + 1))
    assert list(df[C.REWARD_MEAN]) == pytest.approx([_reward(i) for i in range(n)])
    note = " ".join(df.attrs["import_notes"])
    assert "the file ends inside a" in note and f"the {n} rows before it were read" in note


def test_a_bad_checksum_ends_the_reading_there(wandb_dir: Path, tmp_path) -> None:
    data = bytearray(wandb_file_of(_runs(wandb_dir)[0]).read_bytes())
    # a damaged byte in the payload of the chunk that opens the second block (a block always
    # opens with a chunk header; a fixed offset could fall in a later header, whose place moves
    # with what wandb writes, and read as an unreadable chunk instead)
    _, length, _ = struct.unpack_from("<IHB", data, BLOCK_LEN)
    assert length > 0
    data[BLOCK_LEN + HEADER_LEN + length // 2] ^= 0xFF
    bad = tmp_path / "run-bad.wandb"
    bad.write_bytes(bytes(data))
    df = load_table(bad)
    assert 10 < len(df) < N_ROWS
    assert list(df[C.REWARD_MEAN]) == pytest.approx([_reward(i) for i in range(len(df))])
    assert "bad checksum" in " ".join(df.attrs["import_notes"])


def test_an_empty_or_foreign_file_is_refused_in_one_line(tmp_path) -> None:
    empty = tmp_path / "run-x.wandb"
    empty.write_bytes(b"")
    with pytest.raises(ImportFormatError, match="empty"):
        load_table(empty)
    other = tmp_path / "run-y.wandb"
    other.write_bytes(b":W&B\x00\x00\x07" + b"\x00" * 20)
    with pytest.raises(ImportFormatError, match="unknown version"):
        load_table(other)


def test_without_the_wandb_file_the_console_then_the_summary(tmp_path) -> None:
    run = tmp_path / "wandb" / "run-20251129_221801-abcd1234"
    (run / "files").mkdir(parents=True)
    (run / "files" / "wandb-metadata.json").write_text("{}")
    (run / "files" / "wandb-summary.json").write_text('{"train/reward": 0.4, "_step": 3}')
    lines = [
        f"{{'loss': 0.1, 'grad_norm': 0.5, 'reward': {0.1 * s:.1f}, 'epoch': {s / 10}}}"
        for s in range(1, 6)
    ]
    (run / "files" / "output.log").write_text("\n".join(lines) + "\n")
    df = load_table(run)
    assert list(df[C.REWARD_MEAN]) == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5])
    assert df.attrs["import_notes"][0].startswith("read the console log files/output.log")
    (run / "files" / "output.log").unlink()
    one = load_table(run)
    assert list(one[C.REWARD_MEAN]) == [0.4] and len(one) == 1
    assert "wandb-summary.json" in one.attrs["import_notes"][0]


def test_a_wandb_folder_of_two_runs_is_two_runs(wandb_dir: Path, capsys) -> None:
    assert cli_main(["analyze", str(wandb_dir), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    names = sorted(r["name"] for r in doc["runs"])
    assert names == sorted(p.name for p in _runs(wandb_dir))  # latest-run is not a third
    assert {r["format"] for r in doc["runs"]} == {"wandb_run"}
    assert {r["last_step"] for r in doc["runs"]} == {N_ROWS}


@pytest.mark.slow
def test_a_trl_grpo_run_reporting_to_wandb_offline(tmp_path, monkeypatch) -> None:
    pytest.importorskip("trl")
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1]))
    from lld_grpo_script import make_grpo_trainer, reward_has_a, reward_length

    _offline_env(monkeypatch, tmp_path)
    trainer = make_grpo_trainer(
        tmp_path / "out",
        max_steps=3,
        report_to="wandb",
        reward_funcs=[reward_has_a, reward_length],
    )
    trainer.train()
    # (wandb's settings are process-wide: after another run in this process its folder may not
    # be under tmp_path; the run says where it is)
    run_dir = Path(wandb.run.dir).parent
    wandb.finish()
    _settled(wandb_file_of(run_dir))
    train = [h for h in trainer.state.log_history if "reward" in h]
    assert run_dir.name.startswith("offline-run-")
    df = load_table(run_dir)
    assert df.attrs["source_format"] == "wandb_run"
    assert list(df[C.STEP]) == [h["step"] for h in train] == [1, 2, 3]
    assert list(df[C.REWARD_MEAN]) == pytest.approx([h["reward"] for h in train])
    assert list(df[C.GRAD_NORM]) == pytest.approx([h["grad_norm"] for h in train])
    assert list(df[C.REWARD_FN_PREFIX + "reward_length"]) == pytest.approx(
        [h["rewards/reward_length/mean"] for h in train]
    )
    shutil.rmtree(tmp_path / "out", ignore_errors=True)


def test_eval_metrics_logged_by_wandb_are_kept_apart(tmp_path, monkeypatch) -> None:
    """A run written by the real wandb library, logging eval/reward every 10 steps at the
    steps of training: W&B merges them into the training rows; load_table keeps them apart."""
    from lld_monitor.importers import load_eval_table

    _offline_env(monkeypatch, tmp_path)
    run = wandb.init(project="lld-test", mode="offline", dir=str(tmp_path), id="evalrun0")
    for i in range(1, 61):
        run.log({"train/reward": _reward(i), "train/global_step": i}, step=i, commit=False)
        if i % 10 == 0:
            run.log({"eval/reward": 0.99, "eval/accuracy": 0.97}, step=i, commit=False)
        run.log({}, step=i)
    run.finish()
    (folder,) = (tmp_path / "wandb").glob("offline-run-*evalrun0")
    _settled(wandb_file_of(folder))
    df = load_table(folder)
    assert list(df[C.STEP]) == list(range(1, 61))
    assert list(df[C.REWARD_MEAN]) == pytest.approx([_reward(i) for i in range(1, 61)])
    assert df.attrs["eval_rows"] == 6
    ev = load_eval_table(folder)
    assert list(ev[C.STEP]) == [10, 20, 30, 40, 50, 60]
    assert ev["eval/reward"].tolist() == [0.99] * 6
    assert ev["eval/accuracy"].tolist() == [0.97] * 6
