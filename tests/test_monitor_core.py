"""LLDMonitor's trainer-agnostic core: hand-computed rows, LLDS switch, failure policy, actions."""

from __future__ import annotations

import math
import threading
from typing import Any

import pytest
import torch

from lld_monitor import LLDMonitor, LLDSConfig, load_run
from lld_monitor import columns as C
from lld_monitor.events import Alert


def _batch() -> dict[str, torch.Tensor]:
    # Two responses: 0 is correct (reward 1) with 3 generated tokens, 1 is incorrect with 2.
    return {
        "logp_old": torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -1.5, 0.0]]),  # [2, 3]
        "logp_new": torch.tensor([[-0.5, -2.5, -3.0], [-0.5, -1.0, 0.0]]),  # [2, 3]
        "mask": torch.tensor([[1, 1, 1], [1, 1, 0]]),  # [2, 3]
        "rewards": torch.tensor([1.0, 0.0]),  # [2]
        "entropy": torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 9.0]]),  # [2, 3] (9 is padding)
        "token_ids": torch.tensor([[5, 6, 7], [8, 9, 0]]),  # [2, 3]
    }


def test_row_from_the_plain_methods_is_hand_computed(tmp_path: Any) -> None:
    b = _batch()
    monitor = LLDMonitor(tmp_path / "run", detector=None, strict=True, token_samples_per_step=2)
    monitor.observe_rollout(
        b["logp_old"],
        b["mask"],
        rewards=b["rewards"],
        token_ids=b["token_ids"],
        entropy=b["entropy"],
        num_searches=torch.tensor([2.0, 1.0]),
    )
    monitor.observe_update(grad_norm=torch.tensor(2.0), loss=0.3)
    monitor.observe_update(grad_norm=4.0, loss=torch.tensor(0.5))
    monitor.observe_post_update(b["logp_new"])
    row = monitor.end_step(step=7, custom=1.5)
    monitor.close()

    expected = {
        C.STEP: 7,
        C.REWARD_MEAN: 0.5,  # (1 + 0) / 2
        C.REWARD_STD: math.sqrt(0.5),  # sample std: ((0.5^2 + 0.5^2) / 1) ** 0.5
        C.ACCURACY: 0.5,  # 1 of 2 reach reward >= 1.0
        C.COMPLETION_LENGTH: 2.5,  # (3 + 2) / 2 generated tokens
        C.ENTROPY: 1.4,  # (1+1+1 + 2+2) / 5 masked tokens
        C.NUM_SEARCHES: 1.5,
        C.GRAD_NORM: 3.0,  # mean of 2 and 4
        C.GRAD_NORM_MAX: 4.0,
        C.LOSS: 0.4,  # mean of 0.3 and 0.5
        C.LOGP_CORRECT: -2.0,  # mean(-1, -2, -3)
        C.LOGP_INCORRECT: -1.0,  # mean(-0.5, -1.5)
        C.DELTA_CORRECT: 0.0,  # +0.5 - 0.5 + 0
        C.DELTA_INCORRECT: 0.5,  # 0 + 0.5
        C.DELTA_CORRECT_PER_TOKEN: 0.0,
        C.DELTA_INCORRECT_PER_TOKEN: 0.25,
        C.FRAC_CORRECT_DISPLACED: 1.0,  # summed change 0 <= 0 counts as displaced
        C.FRAC_TOKENS_DISPLACED: 1 / 3,  # one of the correct response's 3 tokens fell
        C.N_CORRECT: 1.0,
        C.N_INCORRECT: 1.0,
        C.LLDS_ENABLED: 0,
        C.LLDS_LAMBDA: 0.0,
        "custom": 1.5,
    }
    for key, value in expected.items():
        assert row[key] == pytest.approx(value, abs=1e-6), key
    assert monitor.step == 8  # the next end_step() without a step writes step 8

    run = load_run(tmp_path / "run")
    assert len(run.steps) == 1
    assert run.steps.iloc[0][C.DELTA_INCORRECT] == pytest.approx(0.5)
    assert run.meta["trainer"] == "custom"
    tokens = run.tokens()
    # Only the correct response's tokens are candidates; only one of them fell (-0.5 at pos 1).
    assert tokens[[C.TOK_RESPONSE, C.TOK_POSITION, C.TOK_TOKEN_ID]].values.tolist() == [[0, 1, 6]]
    assert tokens[C.TOK_DELTA].tolist() == pytest.approx([-0.5])
    assert list(run.events[C.EVENT_KIND]) == ["start", "attach", "end"]


def test_llds_term_hand_value_gradient_and_columns(tmp_path: Any) -> None:
    monitor = LLDMonitor(tmp_path / "run", llds=LLDSConfig(lam=0.2), detector=None, strict=True)
    logp_old = torch.tensor([[-1.0, -1.0]])  # [1, 2], one action
    logp_new = torch.tensor([[-1.5, -0.9]], requires_grad=True)
    mask = torch.ones(1, 2)
    term, out = monitor.llds_term(logp_new, logp_old, torch.tensor([1.0]), mask)
    # d = old - new = [0.5, -0.1]; action sum 0.4 > 0 gates it on;
    # L = (1 / n_i) * sum max(0, d) = 0.5 / 2 = 0.25; lam * L = 0.05.
    assert out.loss.item() == pytest.approx(0.25)
    assert term.item() == pytest.approx(0.05)
    term.backward()
    # d(0.2 * max(0, old - new) / 2) / d new = -0.1 on token 0, 0 on token 1 (d < 0 there).
    torch.testing.assert_close(logp_new.grad, torch.tensor([[-0.1, 0.0]]))
    row = monitor.end_step()
    assert row[C.LLDS_ENABLED] == 1 and row[C.LLDS_LAMBDA] == pytest.approx(0.2)
    assert row[C.LLDS_LOSS] == pytest.approx(0.25) and row[C.LLDS_FRAC_GATED] == pytest.approx(1.0)

    monitor.llds.disable()
    term, out = monitor.llds_term(logp_new, logp_old, torch.tensor([1.0]), mask)
    assert out is None and term.item() == 0.0  # no loss change while off
    row = monitor.end_step()
    assert row[C.LLDS_ENABLED] == 0 and row[C.LLDS_LAMBDA] == 0.0 and C.LLDS_LOSS not in row
    monitor.close()


def test_switch_is_thread_safe_and_every_change_is_an_event(tmp_path: Any) -> None:
    monitor = LLDMonitor(tmp_path / "run", detector=None, strict=True)
    monitor.start()
    assert not monitor.llds.enabled
    threads = [threading.Thread(target=monitor.llds.enable, args=(0.3,)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert monitor.llds.enabled and monitor.llds.lam == pytest.approx(0.3)
    monitor.llds.disable(reason="analyst")
    assert not monitor.llds.enabled and monitor.llds.lam == pytest.approx(0.3)
    with pytest.raises(ValueError, match="lambda must be a finite number"):
        monitor.llds.enable(-1.0)
    monitor.close()
    events = load_run(tmp_path / "run").events
    inter = events[events[C.EVENT_TYPE] == "intervention"]
    assert inter[C.EVENT_KIND].tolist() == ["llds_enable"] * 4 + ["llds_disable"]
    assert inter[C.EVENT_EVIDENCE].iloc[-1]["reason"] == "analyst"


def test_errors_reported_once_unless_strict(tmp_path: Any) -> None:
    monitor = LLDMonitor(tmp_path / "run", detector=None)
    monitor.start()
    bad = torch.zeros(2, 3)
    for _ in range(3):
        monitor.observe_rollout(bad, torch.ones(2, 4))  # shape mismatch: reported, not raised
    row = monitor.end_step()
    assert row[C.STEP] == 0 and C.REWARD_MEAN not in row  # the step still gets its row
    monitor.close()
    events = load_run(tmp_path / "run").events
    errors = events[events[C.EVENT_TYPE] == "error"]
    assert errors[C.EVENT_KIND].tolist() == ["observe_rollout"]  # once, not three times
    assert "must both be [B, L]" in errors[C.EVENT_MESSAGE].iloc[0]

    strict = LLDMonitor(tmp_path / "run2", detector=None, strict=True)
    with pytest.raises(ValueError, match="must both be"):
        strict.observe_rollout(bad, torch.ones(2, 4))


class _ScriptedDetector:
    def __init__(self, script: dict[int, list[Alert]]) -> None:
        self.script, self.phase = script, "healthy"

    def update(self, row: dict[str, Any]) -> list[Alert]:
        return self.script.get(int(row[C.STEP]), [])


def test_alerts_drive_actions_with_reasons(tmp_path: Any) -> None:
    decay = Alert(1, "decay", "warning", "correct likelihood falling", {"slope": -0.1})
    collapse = Alert(2, "collapse", "critical", "grad norm surge", {})
    monitor = LLDMonitor(
        tmp_path / "run",
        detector=_ScriptedDetector({1: [decay], 2: [collapse]}),
        auto_llds=True,
        stop_on_collapse=True,
        strict=True,
    )
    assert monitor.decide(decay) == [("llds_enable", "auto_llds on a decay alert at step 1")]
    monitor.end_step(step=0)
    assert not monitor.llds.enabled
    monitor.end_step(step=1)
    assert monitor.llds.enabled and monitor.llds.lam == pytest.approx(0.2)
    assert monitor.last_alerts == [decay] and not monitor.should_stop
    monitor.end_step(step=2)
    assert monitor.should_stop and not monitor.should_save
    monitor.close()
    events = load_run(tmp_path / "run").events
    kinds = list(zip(events[C.EVENT_TYPE], events[C.EVENT_KIND], strict=True))
    assert kinds[2:] == [
        ("alert", "decay"),
        ("intervention", "llds_enable"),
        ("alert", "collapse"),
        ("intervention", "stop"),
        ("lifecycle", "end"),
    ]


def test_correct_fn_and_advantage_fallback(tmp_path: Any) -> None:
    b = _batch()
    monitor = LLDMonitor(tmp_path / "run", detector=None, strict=True)
    # Without rewards, correct = advantage > 0: response 1 becomes the correct one.
    monitor.observe_rollout(b["logp_old"], b["mask"], advantages=torch.tensor([-1.0, 1.0]))
    row = monitor.end_step()
    assert row[C.LOGP_CORRECT] == pytest.approx(-1.0) and C.REWARD_MEAN not in row
    # A user's correct_fn decides: everything correct.
    monitor.correct_fn = lambda rewards, advantages: torch.ones(2, dtype=torch.bool)
    monitor.observe_rollout(b["logp_old"], b["mask"], rewards=b["rewards"])
    row = monitor.end_step()
    assert row[C.ACCURACY] == 1.0 and math.isnan(row[C.LOGP_INCORRECT])
    monitor.close()


def test_constructor_validates_arguments(tmp_path: Any) -> None:
    with pytest.raises(ValueError, match="probe_fraction"):
        LLDMonitor(tmp_path / "r", probe_fraction=1.5)
    with pytest.raises(ValueError, match="LLDSConfig"):
        LLDMonitor(tmp_path / "r", llds={"lam": 0.2})
    with pytest.raises(ValueError, match="detector"):
        LLDMonitor(tmp_path / "r", detector=3)
