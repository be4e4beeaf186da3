"""Missing stays missing: a batch with neither rewards nor advantages says nothing about which
responses are correct, so every column computed from correctness is NaN in the row, never 0."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from lld_monitor import LLDMonitor, load_run
from lld_monitor import columns as C

#: Every column that the correctness rule feeds (the other columns stay measured).
FROM_CORRECTNESS = (
    C.ACCURACY,
    C.LOGP_CORRECT,
    C.LOGP_INCORRECT,
    C.DELTA_CORRECT,
    C.DELTA_INCORRECT,
    C.DELTA_CORRECT_PER_TOKEN,
    C.DELTA_INCORRECT_PER_TOKEN,
    C.FRAC_CORRECT_DISPLACED,
    C.FRAC_TOKENS_DISPLACED,
    C.N_CORRECT,
    C.N_INCORRECT,
)


def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    logp_old = -torch.rand(8, 5, generator=g) * 3  # [8, 5]
    mask = torch.ones(8, 5)  # [8, 5]
    logp_new = logp_old - 0.1  # [8, 5] every token lost likelihood
    return logp_old, mask, logp_new


def _run(path: Path, **known: torch.Tensor) -> dict:
    logp_old, mask, logp_new = _batch()
    monitor = LLDMonitor(path, strict=True)
    monitor.observe_rollout(logp_old, mask, **known)
    monitor.observe_post_update(logp_new)
    monitor.end_step(0)
    monitor.close()
    (row,) = load_run(path).steps.to_dict("records")
    return row


def test_unknown_correctness_gives_nan_not_zero(tmp_path: Path) -> None:
    """Promise (issue 20): rewards=None and advantages=None (no correct_fn) give NaN for
    accuracy, both likelihood groups, every displacement column and n_correct / n_incorrect
    (the old row said accuracy 0.0 and n_incorrect 8: all 8 responses 'incorrect'); columns
    that do not depend on correctness (completion length) are still measured, and the same
    batch with advantages still fills every column."""
    row = _run(tmp_path / "unknown")
    filled = {c: row.get(c) for c in FROM_CORRECTNESS if not _missing(row.get(c))}
    assert filled == {}
    assert row[C.COMPLETION_LENGTH] == pytest.approx(5.0)

    # The contrast: the same batch with advantages (4 > 0) judges all 8 responses, so the
    # columns are numbers: accuracy 0.5, 4 correct and 4 incorrect, all displaced by -0.1/token.
    row = _run(tmp_path / "known", advantages=torch.tensor([1.0, -1.0] * 4))
    assert row[C.ACCURACY] == pytest.approx(0.5)
    assert (row[C.N_CORRECT], row[C.N_INCORRECT]) == (4, 4)
    assert row[C.DELTA_CORRECT_PER_TOKEN] == pytest.approx(-0.1, abs=1e-6)
    assert row[C.FRAC_CORRECT_DISPLACED] == pytest.approx(1.0)


def _missing(value: object) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))
