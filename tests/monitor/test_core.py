"""LLDMonitor's trainer-agnostic core: hand-computed rows, LLDS switch, failure policy, actions."""

from __future__ import annotations

import math
import threading
import warnings
from typing import Any

import pytest
import torch

from lld_monitor import LLDMonitor, LLDSConfig, load_run
from lld_monitor import columns as C
from lld_monitor.events import Alert
from lld_monitor.monitor.correctness import ThresholdWatch


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
    monitor = LLDMonitor(
        tmp_path / "run",
        detector=None,
        strict=True,
        token_samples_per_step=2,
        response_samples_per_step=0,  # top tokens only (whole responses: tests below)
    )
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
        C.FRAC_CORRECT_DISPLACED: 0.0,  # summed change 0 is not < 0: not displaced
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
    assert tokens[C.TOK_SAMPLE].tolist() == ["top_token"]
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


def test_auto_llds_on_chooses_the_trigger_kinds(tmp_path: Any) -> None:
    # default triggers: the early signals, the paper's displacement indicator, collapse last
    collapse = Alert(3, "collapse", "critical", "reward halved", {})
    displacement = Alert(2, "displacement", "warning", "0.8 of correct displaced", {})
    nonfinite = Alert(2, "nonfinite", "critical", "loss=nan", {})
    default = LLDMonitor(tmp_path / "a", detector=None, auto_llds=True, strict=True)
    assert default.auto_llds_on == ("stagnation", "decay", "displacement", "collapse")
    assert default.decide(displacement) == [
        ("llds_enable", "auto_llds on a displacement alert at step 2")
    ]
    assert default.decide(collapse) == [("llds_enable", "auto_llds on a collapse alert at step 3")]
    assert default.decide(nonfinite) == []
    narrow = LLDMonitor(
        tmp_path / "b",
        detector=_ScriptedDetector({2: [displacement], 3: [collapse]}),
        auto_llds=True,
        auto_llds_on=("stagnation", "decay"),
        strict=True,
    )
    assert narrow.decide(collapse) == [] and narrow.decide(displacement) == []
    narrow.end_step(step=2)
    narrow.end_step(step=3)
    assert not narrow.llds.enabled
    wide = LLDMonitor(
        tmp_path / "c",
        detector=_ScriptedDetector({2: [displacement]}),
        auto_llds=True,
        auto_llds_on=("displacement",),
        strict=True,
    )
    wide.end_step(step=1)
    assert not wide.llds.enabled
    wide.end_step(step=2)
    assert wide.llds.enabled and wide.llds.lam == pytest.approx(0.2)
    for m in (default, narrow, wide):
        m.close()
    with pytest.raises(ValueError, match="auto_llds_on"):
        LLDMonitor(tmp_path / "d", auto_llds_on="collapse")
    with pytest.raises(ValueError, match=r"auto_llds_on.*displacement"):
        LLDMonitor(tmp_path / "e", auto_llds_on=("nonfinite",))


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
    with pytest.raises(ValueError, match="response_samples_per_step must be >= 0"):
        LLDMonitor(tmp_path / "r", response_samples_per_step=-1)


# --- token samples: whole responses and most displaced tokens ---------------------------------

WORDS = "zero one two three four five six seven eight nine ten eleven twelve".split()


class _CountingTokenizer:
    """A real tiny tokenizer that counts its decode calls (decoding must be one call per step)."""

    def __init__(self) -> None:
        from lld_monitor.toy.tiny import build_tokenizer

        self.tok = build_tokenizer([" ".join(WORDS)], vocab_size=64)
        self.batch_calls = 0

    def id(self, word: str) -> int:
        return int(self.tok.convert_tokens_to_ids(word))

    def batch_decode(self, ids: Any, **kw: Any) -> list[str]:
        self.batch_calls += 1
        return self.tok.batch_decode(ids, **kw)


def _tool_batch(tok: _CountingTokenizer) -> dict[str, torch.Tensor]:
    """Four responses of 5 positions: generated (mask 1), tool feedback, padding.

    r0 correct: gen gen tool tool gen   deltas -0.5, 0, (tool), (tool), -0.25  -> sum -0.75
    r1 correct: gen gen gen pad pad     deltas 0, -1, 0                        -> sum -1.0
    r2 wrong:   gen tool gen pad pad    deltas -2, (tool), 0                   -> sum -2.0
    r3 correct: gen gen pad pad pad     deltas -1.5, +2                        -> sum +0.5
    Tool-feedback positions get a large logp change that must never reach a delta.
    """
    w = [[tok.id(x) for x in ws] for ws in (WORDS[0:5], WORDS[5:8], WORDS[8:11], WORDS[11:13])]
    ids = [row + [tok.tok.pad_token_id] * (5 - len(row)) for row in w]
    return {
        "token_ids": torch.tensor(ids),  # [4, 5]
        "mask": torch.tensor(
            [[1, 1, 0, 0, 1], [1, 1, 1, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 0, 0]]
        ),  # [4, 5] generated tokens
        "completion_mask": torch.tensor(
            [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 0, 0], [1, 1, 0, 0, 0]]
        ),  # [4, 5] every completion position (tool feedback included)
        "logp_old": torch.tensor(
            [
                [-1.0, -2.0, -3.0, -4.0, -5.0],
                [-0.5, -0.5, -0.5, 0.0, 0.0],
                [-1.0, -1.0, -1.0, 0.0, 0.0],
                [-1.0, -3.0, 0.0, 0.0, 0.0],
            ]
        ),  # [4, 5]
        "logp_new": torch.tensor(
            [
                [-1.5, -2.0, -9.0, -9.0, -5.25],
                [-0.5, -1.5, -0.5, 0.0, 0.0],
                [-3.0, -9.0, -1.0, 0.0, 0.0],
                [-2.5, -1.0, 0.0, 0.0, 0.0],
            ]
        ),  # [4, 5]
        "rewards": torch.tensor([1.0, 1.0, 0.0, 1.0]),  # [4]
        "advantages": torch.tensor([0.5, 0.5, -1.5, 0.5]),  # [4]
    }


def _token_run(
    tmp_path: Any, name: str, probes: list[torch.Tensor | None], **kw: Any
) -> tuple[Any, _CountingTokenizer]:
    """One step through the plain API, probed in the given row subsets; the stored samples."""
    tok = _CountingTokenizer()
    b = _tool_batch(tok)
    monitor = LLDMonitor(tmp_path / name, detector=None, strict=True, **kw)
    monitor.observe_rollout(
        b["logp_old"],
        b["mask"],
        rewards=b["rewards"],
        advantages=b["advantages"],
        token_ids=b["token_ids"],
        completion_mask=b["completion_mask"],
    )
    for rows in probes:
        new = b["logp_new"] if rows is None else b["logp_new"][rows]
        monitor.observe_post_update(new, rows=rows, tokenizer=tok)
    monitor.end_step(step=3)
    monitor.close()
    return load_run(tmp_path / name).tokens(3), tok


def _keys(tokens: Any) -> list[tuple[Any, ...]]:
    cols = [C.TOK_SAMPLE, C.TOK_RESPONSE, C.TOK_POSITION, C.TOK_GENERATED, C.TOK_ACTION]
    return [tuple(r) for r in tokens[cols].itertuples(index=False)]


def test_whole_responses_every_position_tool_feedback_and_top_tokens(tmp_path: Any) -> None:
    tokens, tok = _token_run(
        tmp_path, "run", [None], response_samples_per_step=2, token_samples_per_step=2
    )
    # Picked: correct responses by summed change ascending: r1 (-1.0), r0 (-0.75); r3 (+0.5)
    # and the wrong r2 (-2.0, most displaced of all, but not correct) are left out.
    # Top-2 displaced tokens of correct responses: r3@0 (-1.5), r1@1 (-1.0); r1@1 is already a
    # row of the picked r1, so it is not repeated. Padding positions never appear.
    assert _keys(tokens) == [
        ("response", 1, 0, 1, 0),
        ("response", 1, 1, 1, 0),
        ("response", 1, 2, 1, 0),
        ("response", 0, 0, 1, 0),
        ("response", 0, 1, 1, 0),
        ("response", 0, 2, 0, -1),  # tool feedback: not generated, no action
        ("response", 0, 3, 0, -1),
        ("response", 0, 4, 1, 1),  # second action after the tool output
        ("top_token", 3, 0, 1, 0),
    ]
    delta = tokens[C.TOK_DELTA].tolist()
    expected = [0.0, -1.0, 0.0, -0.5, 0.0, math.nan, math.nan, -0.25, -1.5]
    assert delta == pytest.approx(expected, nan_ok=True)
    old = [-0.5, -0.5, -0.5, -1.0, -2.0, math.nan, math.nan, -5.0, -1.0]  # NaN on tool feedback
    assert tokens[C.TOK_LOGP_OLD].tolist() == pytest.approx(old, nan_ok=True)
    words = [*WORDS[5:8], *WORDS[0:5], WORDS[11]]
    assert tokens[C.TOK_TEXT].tolist() == words
    assert tokens[C.TOK_TOKEN_ID].tolist() == [tok.id(w) for w in words]
    assert tokens[C.TOK_REWARD].tolist() == [1.0] * 9
    assert tokens[C.TOK_ADVANTAGE].tolist() == [0.5] * 9
    assert tokens[C.TOK_CORRECT].tolist() == [1] * 9
    assert tok.batch_calls == 1  # one batched decode for the whole step
    # One row per (response, position); generated deltas sum to each response's change.
    assert not tokens.duplicated([C.TOK_RESPONSE, C.TOK_POSITION]).any()
    whole = tokens[tokens[C.TOK_SAMPLE] == "response"]
    sums = whole.groupby(C.TOK_RESPONSE)[C.TOK_DELTA].sum()  # NaN (tool feedback) skipped
    assert sums.to_dict() == pytest.approx({0: -0.75, 1: -1.0})


def test_incorrect_responses_follow_correct_ones_and_split_probes_agree(tmp_path: Any) -> None:
    # Room for all four: correct r1, r0, r3 (change ascending), then the incorrect r2.
    tokens, _ = _token_run(
        tmp_path, "all", [None], response_samples_per_step=4, token_samples_per_step=3
    )
    order = list(dict.fromkeys(tokens[C.TOK_RESPONSE]))
    assert order == [1, 0, 3, 2]
    assert (tokens[C.TOK_SAMPLE] == "response").all()  # every top token lies in a response
    r2 = tokens[tokens[C.TOK_RESPONSE] == 2]
    assert r2[C.TOK_POSITION].tolist() == [0, 1, 2] and r2[C.TOK_GENERATED].tolist() == [1, 0, 1]
    assert r2[C.TOK_CORRECT].tolist() == [0] * 3 and r2[C.TOK_REWARD].tolist() == [0.0] * 3
    assert r2[C.TOK_ADVANTAGE].tolist() == [-1.5] * 3
    assert len(tokens) == 3 + 5 + 2 + 3
    # The same step probed in two calls (rows [0, 1], then [2, 3]): the responses are numbered
    # across the step's probes, and the step's selection is the same as with one probe.
    split, tok = _token_run(
        tmp_path,
        "split",
        [torch.tensor([0, 1]), torch.tensor([2, 3])],
        response_samples_per_step=4,
        token_samples_per_step=3,
    )
    assert _keys(split) == _keys(tokens)
    assert split[C.TOK_DELTA].tolist() == pytest.approx(tokens[C.TOK_DELTA].tolist(), nan_ok=True)
    assert tok.batch_calls == 1
    # Nothing sampled at all: no token file.
    none, tok = _token_run(
        tmp_path, "none", [None], response_samples_per_step=0, token_samples_per_step=0
    )
    assert none.empty and tok.batch_calls == 0


def test_without_completion_mask_or_correct_responses(tmp_path: Any) -> None:
    tok = _CountingTokenizer()
    b = _tool_batch(tok)
    monitor = LLDMonitor(
        tmp_path / "run",
        detector=None,
        strict=True,
        response_samples_per_step=1,
        token_samples_per_step=1,
    )
    # No completion mask: only generated positions can be told from padding. No reward reaches
    # 1.0 (threshold): every response is incorrect, the most displaced one is picked (r2, -2).
    monitor.observe_rollout(b["logp_old"], b["mask"], rewards=torch.zeros(4))
    monitor.observe_post_update(b["logp_new"])  # no tokenizer, no token ids
    monitor.end_step(step=0)
    monitor.close()
    tokens = load_run(tmp_path / "run").tokens(0)
    # r2's generated positions 0 and 2; its tool feedback at 1 is unknown without the mask. The
    # top token overall is r2@0 (-2.0), already in r2: not repeated.
    assert _keys(tokens) == [("response", 2, 0, 1, 0), ("response", 2, 2, 1, 1)]
    assert tokens[C.TOK_DELTA].tolist() == pytest.approx([-2.0, 0.0])
    assert tokens[C.TOK_TEXT].tolist() == ["", ""] and tokens[C.TOK_TOKEN_ID].tolist() == [-1, -1]
    assert tokens[C.TOK_CORRECT].tolist() == [0, 0]
    assert tokens[C.TOK_REWARD].tolist() == [0.0, 0.0] and C.TOK_ADVANTAGE not in tokens


def test_a_folder_that_holds_a_run_is_refused_at_construction(tmp_path: Any) -> None:
    # a monitor writing into an existing run would fail at every step (and, non-strict, record
    # nothing): refuse it up front with a message that says what to do
    first = LLDMonitor(tmp_path / "run", detector=None, strict=True)
    first.end_step(step=0)
    first.close()
    with pytest.raises(FileExistsError, match="already holds a run"):
        LLDMonitor(tmp_path / "run")


def _three() -> dict[str, torch.Tensor]:
    # Three responses of 2 generated tokens each; accuracy reward 1, 0, 1 and a format reward 1.
    return {
        "logp_old": torch.tensor([[-1.0, -1.0], [-2.0, -2.0], [-3.0, -3.0]]),  # [3, 2]
        "mask": torch.ones(3, 2),
        "acc": torch.tensor([1.0, 0.0, 1.0]),
        "fmt": torch.tensor([1.0, 1.0, 1.0]),
    }


def test_correct_reward_names_the_function_and_the_rule_is_in_meta(tmp_path: Any) -> None:
    b = _three()
    total = b["acc"] + b["fmt"]  # 2, 1, 2: every response reaches the default threshold 1.0
    per_func = {"acc": b["acc"], "fmt": b["fmt"]}
    summed = LLDMonitor(tmp_path / "sum", detector=None, strict=True)
    summed.observe_rollout(b["logp_old"], b["mask"], rewards=total, rewards_per_func=per_func)
    assert summed.end_step()[C.ACCURACY] == 1.0  # the silent trap the rule fixes
    summed.close()

    monitor = LLDMonitor(tmp_path / "run", detector=None, strict=True, correct_reward="acc")
    monitor.observe_rollout(b["logp_old"], b["mask"], rewards=total, rewards_per_func=per_func)
    row = monitor.end_step()
    monitor.close()
    assert row[C.ACCURACY] == pytest.approx(2 / 3)
    assert row[C.LOGP_CORRECT] == pytest.approx(-2.0)  # mean of -1, -1, -3, -3
    assert row[C.LOGP_INCORRECT] == pytest.approx(-2.0)
    assert row[C.REWARD_FN_PREFIX + "acc"] == pytest.approx(2 / 3)
    assert row[C.REWARD_FN_PREFIX + "fmt"] == 1.0
    rule = load_run(tmp_path / "run").meta["config"]["correctness"]
    assert rule["rule"] == "reward_fn/acc >= 1" and rule["correct_reward"] == "acc"

    bad = LLDMonitor(tmp_path / "bad", detector=None, strict=True, correct_reward="acc")
    with pytest.raises(ValueError, match=r"correct_reward='acc' needs that function's rewards"):
        bad.observe_rollout(b["logp_old"], b["mask"], rewards=total)
    with pytest.raises(ValueError, match="correct_reward must be the name"):
        LLDMonitor(tmp_path / "bad2", correct_reward=3)


def test_correct_fn_gets_the_per_function_rewards(tmp_path: Any) -> None:
    b = _three()
    got: dict[str, Any] = {}

    def acc_only(rewards: Any, advantages: Any, rewards_per_func: Any) -> torch.Tensor:
        got.update(rewards_per_func)
        return rewards_per_func["acc"] > 0.5

    monitor = LLDMonitor(tmp_path / "run", detector=None, strict=True, correct_fn=acc_only)
    per_func = {"acc": b["acc"], "fmt": b["fmt"]}
    monitor.observe_rollout(b["logp_old"], b["mask"], rewards=b["acc"], rewards_per_func=per_func)
    assert monitor.end_step()[C.ACCURACY] == pytest.approx(2 / 3)
    assert sorted(got) == ["acc", "fmt"] and got["fmt"].tolist() == [1.0, 1.0, 1.0]
    monitor.close()
    meta = load_run(tmp_path / "run").meta["config"]["correctness"]
    assert meta["correct_fn"] == "acc_only"


def test_unscored_completions_are_left_out(tmp_path: Any) -> None:
    b = _three()
    rewards = torch.tensor([1.0, float("nan"), 0.0])  # response 1 unscored (reward None)
    monitor = LLDMonitor(tmp_path / "run", detector=None, strict=True)
    monitor.observe_rollout(b["logp_old"], b["mask"], rewards=rewards)
    logp_new = b["logp_old"] + torch.tensor([[0.5], [9.0], [-0.5]])  # [3, 2]
    monitor.observe_post_update(logp_new)
    row = monitor.end_step()
    monitor.close()
    assert row[C.REWARD_MEAN] == 0.5  # (1 + 0) / 2 scored
    assert row[C.ACCURACY] == 0.5  # 1 of 2 scored, not 1 of 3
    assert row[C.N_CORRECT] == 1 and row[C.N_INCORRECT] == 1  # the unscored one in neither
    assert row[C.LOGP_INCORRECT] == pytest.approx(-3.0)  # response 2 only
    assert row[C.DELTA_INCORRECT] == pytest.approx(-1.0)  # 2 tokens x -0.5, not response 1's
    assert row[C.COMPLETION_LENGTH] == 2.0  # length counts every response


def test_warning_when_rewards_vary_but_none_reaches_the_threshold(tmp_path: Any) -> None:
    b = _three()
    monitor = LLDMonitor(tmp_path / "run", detector=None, strict=True)
    rewards = torch.tensor([0.5, 0.0, 0.25])  # a 0.5-valued correct answer: never >= 1.0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(ThresholdWatch.STEPS - 1):
            monitor.observe_rollout(b["logp_old"], b["mask"], rewards=rewards)
            monitor.end_step()
        assert not [w for w in caught if "correct_threshold" in str(w.message)]
        for _ in range(2):
            monitor.observe_rollout(b["logp_old"], b["mask"], rewards=rewards)
            monitor.end_step()
    found = [w for w in caught if "no response has reached correct_threshold=1" in str(w.message)]
    assert len(found) == 1 and "at most 0.5" in str(found[0].message)  # once
    monitor.close()
    events = load_run(tmp_path / "run").events
    assert (events[C.EVENT_KIND] == "no_correct_responses").sum() == 1

    ok = LLDMonitor(tmp_path / "ok", detector=None, strict=True, correct_threshold=0.5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(ThresholdWatch.STEPS + 1):
            ok.observe_rollout(b["logp_old"], b["mask"], rewards=rewards)
            ok.end_step()
    assert not [w for w in caught if "correct_threshold" in str(w.message)]
    ok.close()


def test_likelihood_displacement_takes_the_loss_tensor_with_grad() -> None:
    from lld_monitor import likelihood_displacement

    b = _batch()
    new = b["logp_new"].clone().requires_grad_(True)  # as the README passes it to llds_loss too
    stats = likelihood_displacement(
        logp_old=b["logp_old"], logp_new=new, mask=b["mask"], rewards=b["rewards"]
    )
    assert stats.delta_correct == pytest.approx(0.0) and stats.delta_incorrect == pytest.approx(0.5)


def test_step_metrics_reduce_by_declared_rule() -> None:
    """sum for counts, NaN-ignoring max for grad_norm_max, rank 0's value for the switch."""
    from lld_monitor.monitor.step_metrics import FIELD_INDEX, StepMetrics

    rows = torch.zeros(3, StepMetrics.length(1), dtype=torch.float64)  # 3 ranks, 1 reward fn
    i = FIELD_INDEX
    rows[:, i["n_resp"]] = torch.tensor([4.0, 4.0, 0.0])
    rows[:, i["grad_max"]] = torch.tensor([2.0, math.nan, 5.0])  # rank 1 had no update
    rows[:, i["rule_reward_max"]] = math.nan  # no rank had a value
    rows[:, i["llds_on"]] = torch.tensor([1.0, 0.0, 0.0])
    rows[:, i["llds_lam"]] = torch.tensor([0.2, 9.0, 9.0])
    rows[:, -2:] = torch.tensor([[1.0, 2.0], [3.0, 2.0], [0.0, 0.0]])  # (sum, count) per rank
    out = StepMetrics.reduce(rows)
    assert out[i["n_resp"]] == 8.0 and out[i["grad_max"]] == 5.0
    assert math.isnan(out[i["rule_reward_max"]])
    assert out[i["llds_on"]] == 1.0 and out[i["llds_lam"]] == pytest.approx(0.2)
    assert out[-2:].tolist() == [4.0, 4.0]
    failed = StepMetrics.failed(torch.device("cpu"), 1)
    assert failed[i["n_failed"]] == 1.0 and failed[i["n_resp"]] == 0.0
    assert math.isnan(failed[i["grad_max"]]) and math.isnan(failed[i["llds_on"]])


def test_probe_where_nothing_moved_carries_no_displacement_evidence(tmp_path: Any) -> None:
    b = _batch()
    monitor = LLDMonitor(tmp_path / "run", detector=None, strict=True, token_samples_per_step=0)
    # Step 1: a no-op update (logp_new == logp_old): no displacement columns, one info note.
    monitor.observe_rollout(b["logp_old"], b["mask"], rewards=b["rewards"])
    monitor.observe_post_update(b["logp_old"].clone())
    row1 = monitor.end_step(step=1)
    # Step 2: the same again: still no columns, and no second note.
    monitor.observe_rollout(b["logp_old"], b["mask"], rewards=b["rewards"])
    monitor.observe_post_update(b["logp_old"].clone())
    row2 = monitor.end_step(step=2)
    # Step 3: a no-op probe and a moving one: only the moving one counts (as in the hand row).
    monitor.observe_rollout(b["logp_old"], b["mask"], rewards=b["rewards"])
    monitor.observe_post_update(b["logp_old"].clone())
    monitor.observe_post_update(b["logp_new"])
    row3 = monitor.end_step(step=3)
    # Step 4: the adapter says the optimizer did not step (lr 0): left out although it moved.
    monitor.observe_rollout(b["logp_old"], b["mask"], rewards=b["rewards"])
    monitor.measure_displacement(
        b["logp_old"], b["logp_new"], b["mask"], torch.tensor([True, False]), stepped=False
    )
    row4 = monitor.end_step(step=4)
    monitor.close()
    for row in (row1, row2, row4):
        assert not set(C.DISPLACEMENT_COLUMNS) & set(row)
        assert row[C.LOGP_CORRECT] == pytest.approx(-2.0)  # confidence is still measured
    assert row3[C.N_CORRECT] == 1.0 and row3[C.N_INCORRECT] == 1.0  # not 2 and 2
    assert row3[C.DELTA_INCORRECT] == pytest.approx(0.5)
    assert row3[C.FRAC_CORRECT_DISPLACED] == 0.0 and row3[C.FRAC_TOKENS_DISPLACED] == pytest.approx(
        1 / 3
    )
    events = load_run(tmp_path / "run").events
    notes = events[events[C.EVENT_KIND] == "no_step_probe"]
    assert notes[C.EVENT_STEP].tolist() == [1]
    assert notes[C.EVENT_SEVERITY].tolist() == ["info"]
    assert "optimizer did not step" in notes[C.EVENT_MESSAGE].iloc[0]
    steps = load_run(tmp_path / "run").steps.set_index(C.STEP)
    assert steps[C.FRAC_CORRECT_DISPLACED].isna().tolist() == [True, True, False, True]


def test_zero_variance_groups_warn_once_and_only_when_llds_may_act(tmp_path: Any) -> None:
    b = _batch()

    def two_steps(monitor: LLDMonitor) -> None:
        # 6 of 8 groups (0.75), then 8 of 8: a streak of 6 rows (the warning waits for 5)
        for step, zero in ((1, 6.0), (2, 8.0), (3, 8.0), (4, 6.0), (5, 7.0), (6, 8.0)):
            monitor.observe_rollout(b["logp_old"], b["mask"], rewards=b["rewards"])
            monitor.observe_groups(zero, 8)
            monitor.end_step(step=step)
        monitor.close()

    quiet = LLDMonitor(tmp_path / "off", detector=None, strict=True)  # LLDS off, no auto
    two_steps(quiet)
    assert "llds_check_zero_std" not in set(load_run(tmp_path / "off").events[C.EVENT_KIND])
    auto = LLDMonitor(tmp_path / "auto", detector=None, strict=True, auto_llds=True)
    with pytest.warns(UserWarning, match=r"88% of the prompt groups .* at step 5 .* 5 rows in a"):
        two_steps(auto)
    events = load_run(tmp_path / "auto").events
    notes = events[events[C.EVENT_KIND] == "llds_check_zero_std"]
    assert notes[C.EVENT_STEP].tolist() == [5]  # once, after 5 rows in a row; not again at 6
    assert notes[C.EVENT_EVIDENCE].iloc[0][C.FRAC_ZERO_STD_GROUPS] == 0.875
    # one row of it (a run that starts at accuracy 0) says nothing
    first = LLDMonitor(tmp_path / "first", detector=None, strict=True, auto_llds=True)
    for step, zero in ((1, 8.0), (2, 2.0), (3, 8.0)):
        first.observe_rollout(b["logp_old"], b["mask"], rewards=b["rewards"])
        first.observe_groups(zero, 8)
        first.end_step(step=step)
    first.close()
    assert "llds_check_zero_std" not in set(load_run(tmp_path / "first").events[C.EVENT_KIND])
    assert notes[C.EVENT_SEVERITY].tolist() == ["warning"]
    below = LLDMonitor(tmp_path / "below", detector=None, strict=True, llds=LLDSConfig())
    below.observe_rollout(b["logp_old"], b["mask"], rewards=b["rewards"])
    below.observe_groups(5.0, 8)  # 0.625 < 0.75: no warning
    below.end_step(step=1)
    below.close()
    assert "llds_check_zero_std" not in set(load_run(tmp_path / "below").events[C.EVENT_KIND])


def test_adapters_take_the_monitor_s_requests_through_methods(tmp_path: Any) -> None:
    collapse = Alert(1, "collapse", "critical", "grad norm surge", {})
    monitor = LLDMonitor(
        tmp_path / "run",
        detector=_ScriptedDetector({1: [collapse]}),
        checkpoint_on_collapse=True,
        strict=True,
    )
    assert not monitor.take_save_request()
    monitor.end_step(step=0)
    monitor.end_step(step=1)
    assert monitor.take_save_request() and not monitor.take_save_request()  # once per request
    monitor.set_llds_reuse_problem("num_iterations=1: every update sees a fresh batch")
    with pytest.warns(UserWarning, match="fresh batch"):
        monitor.llds.enable(0.2, reason="test")
    monitor.close()


def test_nonfinite_rewards_and_logprobs_are_named_and_unknown_not_averaged_away(
    tmp_path: Any,
) -> None:
    """A batch of 8 rewards with one +inf (the issue's plain-loop case): reward_mean is NaN,
    not the mean of the seven finite ones, and a critical nonfinite alert names the reward
    function; a NaN post-update log-prob makes the displacement columns NaN (not "not
    displaced") and is named too. Once per episode."""
    logp = torch.full((8, 3), -1.0)
    mask = torch.ones(8, 3)
    acc = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, float("inf")])
    monitor = LLDMonitor(tmp_path / "run", detector=None, strict=True, probe_fraction=1.0)
    for step in (1, 2, 3):
        rewards = acc if step < 3 else torch.tensor([1.0, 0.0] * 4)
        monitor.observe_rollout(logp, mask, rewards=rewards, rewards_per_func={"acc": rewards})
        new = logp - 0.1
        if step == 2:
            new[0, 1] = float("nan")
        monitor.observe_post_update(new)
        monitor.end_step(step=step)
    monitor.close()
    run = load_run(tmp_path / "run")
    rows = run.steps.set_index(C.STEP)
    assert math.isnan(rows.loc[1, C.REWARD_MEAN]) and math.isnan(rows.loc[2, C.REWARD_MEAN])
    assert math.isnan(rows.loc[1, C.REWARD_FN_PREFIX + "acc"])
    assert rows.loc[3, C.REWARD_MEAN] == pytest.approx(0.5)  # finite again
    assert not math.isnan(rows.loc[1, C.FRAC_CORRECT_DISPLACED])  # step 1's log-probs finite
    assert math.isnan(rows.loc[2, C.FRAC_CORRECT_DISPLACED])  # NaN, not "not displaced"
    alerts = run.events[(run.events[C.EVENT_TYPE] == "alert")]
    assert alerts[C.EVENT_KIND].tolist() == ["nonfinite", "nonfinite"]
    assert alerts[C.EVENT_STEP].tolist() == [1, 2]
    first, second = alerts[C.EVENT_MESSAGE].tolist()
    assert "reward function 'acc'" in first and "reward (1 responses)" in first
    assert "log-probs after the update (probe) (1 responses)" in second
    assert "reward function 'acc'" not in second  # its episode goes on: not said again
    assert set(alerts[C.EVENT_SEVERITY]) == {"critical"}
