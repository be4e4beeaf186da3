"""Sampler-vs-trainer metrics read from the trainers' own logs (issue 51, item 4): TRL's
``sampling/*`` keys (looked up in trl's grpo_trainer.py) in a trainer_state.json written by
transformers' own TrainerState, and verl's ``rollout_corr/*`` / ``training/rollout_probs_diff_*``
keys in a console log line; an IS-ratio mean of 0.57 (TRL #5814) gets the warning, 0.99 none."""

from __future__ import annotations

from pathlib import Path

import pytest

from lld_monitor import columns as C
from lld_monitor.analysis import analyze_run
from lld_monitor.importers import load_table


def _trl_state(path: Path, ratio: float, rows: int = 30) -> Path:
    from transformers import TrainerState

    state = TrainerState()
    state.global_step = rows
    state.max_steps = rows
    state.log_history = [
        {
            "step": s,
            "loss": 0.01,
            "reward": 0.3 + 0.005 * s,
            "grad_norm": 0.5,
            "sampling/sampling_logp_difference/mean": 0.02 if ratio > 0.9 else 0.4,
            "sampling/importance_sampling_ratio/min": ratio / 2,
            "sampling/importance_sampling_ratio/mean": ratio,
            "sampling/importance_sampling_ratio/max": ratio * 2,
        }
        for s in range(1, rows + 1)
    ]
    state.save_to_json(str(path))
    return path


@pytest.mark.parametrize(("ratio", "alerted"), [(0.57, True), (0.99, False)])
def test_a_trl_log_with_a_far_is_ratio_gets_the_mismatch_warning(tmp_path, ratio, alerted):
    df = load_table(_trl_state(tmp_path / "trainer_state.json", ratio))
    assert df[C.IS_RATIO_MEAN].tolist() == [ratio] * 30
    alerts = [a for a in analyze_run(df).alerts if a.kind == "sampler_mismatch"]
    assert bool(alerts) == alerted
    if alerted:
        a = alerts[0]
        assert a.step == 3 and a.severity == "warning"
        assert "engine-trainer dtype" in a.message and a.evidence[C.IS_RATIO_MEAN] == 0.57


def test_verl_rollout_correction_keys_are_mapped(tmp_path):
    lines = [
        f"step:{s} - actor/pg_loss:0.01 - critic/score/mean:{0.3 + 0.01 * s:.3f} - "
        f"rollout_corr/rollout_is_mean:{1.9 if s > 10 else 1.0} - "
        f"training/rollout_probs_diff_mean:{0.08 if s > 10 else 0.01}"
        for s in range(1, 21)
    ]
    log = tmp_path / "verl.log"
    log.write_text("\n".join(lines) + "\n")
    df = load_table(log)
    assert df[C.IS_RATIO_MEAN].iloc[-1] == 1.9 and df[C.SAMPLER_PROB_DIFF].iloc[-1] == 0.08
    alerts = [a for a in analyze_run(df).alerts if a.kind == "sampler_mismatch"]
    assert [a.step for a in alerts] == [13]
