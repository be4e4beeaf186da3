"""examples/plain_loop.py: a hand-written GRPO loop with the monitor runs and logs full rows."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from lld_monitor import columns as C
from lld_monitor import load_run

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "plain_loop.py"


def _load_example() -> Any:
    spec = importlib.util.spec_from_file_location("plain_loop", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_plain_loop_writes_full_rows_with_llds(tmp_path: Any) -> None:
    example = _load_example()
    run_dir = example.main(["--run-dir", str(tmp_path / "run"), "--steps", "3", "--llds"])
    run = load_run(run_dir)
    steps = run.steps
    assert steps[C.STEP].tolist() == [0, 1, 2]
    for col in (C.REWARD_MEAN, C.ENTROPY, C.LOGP_FIRST_ACTION, C.GRAD_NORM, C.LOSS):
        assert steps[col].notna().all(), col
    # Two optimizer updates per rollout: mean and max of their pre-clip norms.
    assert (steps[C.GRAD_NORM_MAX] >= steps[C.GRAD_NORM]).all()
    # Every response with a generated token was probed after the batch's last update
    # (a random policy sometimes samples the pad token first: such a response is empty).
    measured = steps[C.N_CORRECT] + steps[C.N_INCORRECT]
    assert ((measured > 8) & (measured <= 16)).all()
    # LLDS on from the start: the second update of each batch sees a moved policy.
    assert (steps[C.LLDS_ENABLED] == 1).all()
    assert steps[C.LLDS_LAMBDA].tolist() == pytest.approx([0.2] * 3)
    assert steps[C.LLDS_LOSS].notna().all() and (steps[C.LLDS_LOSS] >= 0).all()
    assert run.meta["trainer"] == "examples/plain_loop.py" and run.finished
    tokens = run.tokens()
    top = tokens[tokens[C.TOK_SAMPLE] == "top_token"]
    assert len(tokens) > 0 and (top[C.TOK_DELTA] < 0).all()
    # Whole responses: 4 per step, one row per (step, response, position).
    whole = tokens[tokens[C.TOK_SAMPLE] == "response"]
    assert whole.groupby(C.TOK_STEP)[C.TOK_RESPONSE].nunique().tolist() == [4, 4, 4]
    assert not tokens.duplicated([C.TOK_STEP, C.TOK_RESPONSE, C.TOK_POSITION]).any()


def test_completion_mask_stops_after_eos() -> None:
    import torch

    example = _load_example()
    completion = torch.tensor([[5, 1, 7, 0], [5, 6, 7, 8]])  # eos=1, pad=0
    mask = example.completion_mask(completion, eos_id=1, pad_id=0)
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
