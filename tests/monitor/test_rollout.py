"""rollout.py: a rollout batch folded into the step's sums, and its post-update measurement."""

from __future__ import annotations

import math

import pytest
import torch

from lld_monitor import columns as C
from lld_monitor.monitor.correctness import CorrectnessRule
from lld_monitor.monitor.rollout import Rollout, measure_displacement, observe_rollout
from lld_monitor.monitor.step_metrics import FIELD_INDEX, StepMetrics, row_from_sums

CPU = torch.device("cpu")


def _row(acc: StepMetrics) -> dict:
    return row_from_sums(acc.pack(CPU, []).tolist(), [])


def test_observe_rollout_judges_and_folds_the_batch() -> None:
    acc = StepMetrics()
    logp_old = torch.tensor([[-1.0, -3.0], [-2.0, -2.0], [-4.0, 0.0]])  # [3, 2]
    mask = torch.tensor([[1, 1], [1, 1], [1, 0]])  # row 2 has one generated token
    ro = observe_rollout(
        acc, CorrectnessRule(None, 1.0), logp_old, mask, rewards=[1.0, 0.0, float("nan")]
    )
    assert ro.correct.tolist() == [True, False, False]  # NaN = unscored: never correct
    assert ro.rewards.dtype == torch.float32
    assert ro.completion_mask is None
    row = _row(acc)
    # scored rewards 1 and 0: mean 0.5, sample std sqrt(0.5); accuracy over the 2 judged
    assert row[C.REWARD_MEAN] == pytest.approx(0.5)
    assert row[C.REWARD_STD] == pytest.approx(math.sqrt(0.5))
    assert row[C.ACCURACY] == pytest.approx(0.5)
    assert row[C.COMPLETION_LENGTH] == pytest.approx(5 / 3)  # 5 generated tokens, 3 responses
    # per-token mean logp_old: correct row 0 -> -2, incorrect row 1 -> -2 (row 2 unscored)
    assert row[C.LOGP_CORRECT] == pytest.approx(-2.0)
    assert row[C.LOGP_INCORRECT] == pytest.approx(-2.0)


def test_observe_rollout_rejects_mismatched_shapes() -> None:
    rule = CorrectnessRule(None, 1.0)
    with pytest.raises(ValueError, match=r"must both be \[B, L\], got \(2, 3\) and \(2, 4\)"):
        observe_rollout(StepMetrics(), rule, torch.zeros(2, 3), torch.ones(2, 4))
    with pytest.raises(ValueError, match=r"completion_mask must be \[B, L\] = \[2, 3\]"):
        observe_rollout(
            StepMetrics(), rule, torch.zeros(2, 3), torch.ones(2, 3), completion_mask=torch.ones(2)
        )


def test_rollout_pick_takes_rows_and_keeps_absent_fields_absent() -> None:
    ro = Rollout(
        logp_old=torch.tensor([[0.0], [1.0], [2.0]]),
        mask=torch.ones(3, 1),
        rewards=torch.tensor([0.0, 1.0, 2.0]),
        advantages=None,
        token_ids=None,
        correct=torch.tensor([False, True, True]),
        completion_mask=None,
    )
    assert ro.pick(None) is ro
    sub = ro.pick(torch.tensor([2, 0]))
    assert sub.logp_old.tolist() == [[2.0], [0.0]]
    assert sub.rewards.tolist() == [2.0, 0.0]
    assert sub.correct.tolist() == [True, False]
    assert sub.advantages is None and sub.token_ids is None and sub.completion_mask is None


def test_measure_displacement_folds_the_change_and_returns_the_record() -> None:
    acc = StepMetrics()
    logp_old = torch.tensor([[-1.0, -1.0], [-2.0, -2.0]])  # [2, 2]
    logp_new = torch.tensor([[-0.5, -1.0], [-2.0, -3.0]])
    mask = torch.ones(2, 2)
    correct = torch.tensor([True, False])
    rec = measure_displacement(acc, 9, logp_old, logp_new, mask, correct)
    assert rec.step == 9
    assert rec.delta.tolist() == [0.5, -1.0]  # summed change per response
    row = _row(acc)
    assert row[C.DELTA_CORRECT] == pytest.approx(0.5)
    assert row[C.DELTA_INCORRECT] == pytest.approx(-1.0)
    assert row[C.DELTA_CORRECT_PER_TOKEN] == pytest.approx(0.25)
    vec = acc.pack(CPU, [])
    assert vec[FIELD_INDEX["n_probe"]] == 1 and vec[FIELD_INDEX["n_probe_still"]] == 0


def test_measure_displacement_leaves_out_unscored_responses() -> None:
    acc = StepMetrics()
    logp_old = torch.tensor([[-1.0], [-1.0], [-1.0]])
    logp_new = torch.tensor([[-0.5], [-3.0], [-2.0]])
    correct = torch.tensor([True, False, False])
    rewards = torch.tensor([1.0, 0.0, float("nan")])  # row 2 unscored: in neither group
    measure_displacement(acc, 0, logp_old, logp_new, torch.ones(3, 1), correct, rewards=rewards)
    row = _row(acc)
    assert row[C.DELTA_INCORRECT] == pytest.approx(-2.0)  # row 1 only, not (-2 - 1) / 2
    assert row[C.N_INCORRECT] == 1


@pytest.mark.parametrize("still", ["unchanged", "not_stepped"])
def test_measure_displacement_without_a_step_is_a_still_probe(still: str) -> None:
    acc = StepMetrics()
    logp_old = torch.tensor([[-1.0, -1.0]])
    logp_new = logp_old.clone() if still == "unchanged" else logp_old - 1.0
    stepped = False if still == "not_stepped" else None
    measure_displacement(
        acc, 0, logp_old, logp_new, torch.ones(1, 2), torch.tensor([True]), stepped=stepped
    )
    vec = acc.pack(CPU, [])
    assert vec[FIELD_INDEX["n_probe"]] == 0 and vec[FIELD_INDEX["n_probe_still"]] == 1
    assert C.DELTA_CORRECT not in _row(acc)  # no evidence of displacement: column left out


def test_measure_displacement_rejects_other_rows() -> None:
    with pytest.raises(ValueError, match=r"logp_new \(1, 2\) must match the rollout's logp_old"):
        measure_displacement(
            StepMetrics(),
            0,
            torch.zeros(2, 2),
            torch.zeros(1, 2),
            torch.ones(2, 2),
            torch.tensor([True, False]),
        )
