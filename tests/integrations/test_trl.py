"""LLDMonitor on a real TRL GRPOTrainer (tiny Qwen2 from a config, offline, CPU)."""

from __future__ import annotations

import copy
import math
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from lld_grpo_script import build_tokenizer, make_grpo_trainer, reward_length
from transformers import TrainerCallback

from lld_monitor import LLDMonitor, LLDSConfig, load_run
from lld_monitor import columns as C
from lld_monitor.events import Alert
from lld_monitor.integrations import trl as trl_adapter
from lld_monitor.toy.tiny import build_tiny_model


def test_trl_internals_unchanged() -> None:
    """Fails loudly when the installed TRL moves a GRPOTrainer internal the adapter wraps."""
    from trl import GRPOTrainer

    assert trl_adapter.check_grpo_internals(GRPOTrainer) == []
    assert trl_adapter.check_trl_version() >= trl_adapter.TRL_MIN
    for name in trl_adapter.WRAPPED_GRPO_METHODS:
        assert callable(getattr(GRPOTrainer, name)), name
    # TRL gives back the old log-probs only under this condition; the adapter relies on it.
    import inspect

    src = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    assert "self.args.gradient_accumulation_steps % generate_every != 0" in src
    assert 'output["old_per_token_logps"]' in src
    src = inspect.getsource(GRPOTrainer._compute_loss)
    assert "self._get_per_token_logps_and_entropies(" in src


@pytest.mark.parametrize("version", ["1.15.2", "1.17.0", "2.0.0"])
def test_version_outside_tested_range_is_refused(
    version: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(trl_adapter.ALLOW_UNTESTED_TRL_ENV, raising=False)
    with pytest.raises(
        ValueError, match=r"tested with trl>=1.16,<1.17.*LLD_MONITOR_ALLOW_UNTESTED"
    ):
        trl_adapter.check_trl_version(version)


def test_an_untested_version_can_be_tried_at_ones_own_risk(monkeypatch: pytest.MonkeyPatch) -> None:
    """LLD_MONITOR_ALLOW_UNTESTED_TRL=1: a warning naming the version, not a refusal."""
    monkeypatch.setenv(trl_adapter.ALLOW_UNTESTED_TRL_ENV, "1")
    with pytest.warns(UserWarning, match=r"found trl 1\.17\.0; attaching anyway"):
        assert str(trl_adapter.check_trl_version("1.17.0")) == "1.17.0"
    monkeypatch.setenv(trl_adapter.ALLOW_UNTESTED_TRL_ENV, "0")
    with pytest.raises(ValueError):
        trl_adapter.check_trl_version("1.17.0")


def _token_logps(
    model: Any, input_ids: torch.Tensor, attention: torch.Tensor, t: int
) -> torch.Tensor:
    """Independent recomputation: [B, t] log-probs of the last t tokens by a plain forward."""
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention).logits  # [B, P+T, V]
    logp = torch.log_softmax(logits[:, :-1].double(), -1)  # [B, P+T-1, V]
    tok = logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1)  # [B, P+T-1]
    return tok[:, -t:]


class _Snapshots(TrainerCallback):
    """Copies the policy right before each generation and right after each probe."""

    def __init__(self, trainer: Any, monitor: LLDMonitor) -> None:
        self.trainer, self.monitor = trainer, monitor
        self.before: dict[int, Any] = {}
        self.checks: list[tuple[Any, Any, Any, Any, int]] = []

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        every = args.steps_per_generation * self.trainer.num_iterations
        if self.trainer._step % every == 0:
            self.pre = copy.deepcopy(self.trainer.model.state_dict())

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        adapter = self.monitor.adapter
        for rec, (ids, att) in zip(adapter.probe_records, adapter.probe_inputs, strict=True):
            post = copy.deepcopy(self.trainer.model.state_dict())
            self.checks.append((rec, ids, att, (self.pre, post), state.global_step))


def test_rows_probe_and_grad_norm_match_independent_recomputation(tmp_path: Any) -> None:
    """Recorded per-completion change = forward before/after; recorded grad norm = TRL's log."""
    monitor = LLDMonitor(
        tmp_path / "run", probe_fraction=1.0, strict=True, detector=None, correct_threshold=0.2
    )
    # steps_per_generation=2 with GA=1: two optimizer updates per generation batch.
    trainer = make_grpo_trainer(
        tmp_path / "tr", max_steps=4, steps_per_generation=2, reward_funcs=[reward_length]
    )
    monitor.attach(trainer)
    snaps = _Snapshots(trainer, monitor)
    trainer.add_callback(snaps)
    trainer.train()

    run = load_run(tmp_path / "run")
    steps = run.steps.set_index(C.STEP)
    assert list(steps.index) == [1, 2, 3, 4]  # one row per optimizer step
    # Probes only after the last update on a generation batch: steps 2 and 4.
    assert [c[4] for c in snaps.checks] == [2, 4]
    assert steps[C.N_CORRECT].isna().tolist() == [True, False, True, False]
    assert C.INBATCH_N_CORRECT not in steps  # one pass over each batch: no response seen twice

    # Independent recomputation: load the snapshots and forward the same ids, (a) through TRL's
    # log-prob function (its fused LM head differs from a plain log_softmax by ~1e-3 per token),
    # (b) through a plain forward + log_softmax of a fresh model, with a tolerance for that.
    plain = build_tiny_model(build_tokenizer(), hidden_size=32, num_layers=1)
    for rec, ids, att, (pre, post), step in snaps.checks:
        t = rec.mask.shape[1]
        m = rec.mask.double()
        logps = {}
        for name, state in (("before", pre), ("after", post)):
            trainer.model.load_state_dict(state)
            with torch.no_grad():
                trl_logp = trainer._get_per_token_logps_and_entropies(trainer.model, ids, att, t)[0]
            plain.load_state_dict(state)
            logps[name] = (trl_logp.double(), _token_logps(plain, ids, att, t))
        expected = ((logps["after"][0] - logps["before"][0]) * m).sum(-1)  # [B] summed change
        assert rec.delta.shape == expected.shape and rec.delta.shape[0] == 8  # whole batch
        torch.testing.assert_close(rec.delta.double(), expected, atol=1e-5, rtol=0)
        torch.testing.assert_close(
            rec.logp_old.double() * m, logps["before"][0] * m, atol=1e-5, rtol=0
        )
        expected_plain = ((logps["after"][1] - logps["before"][1]) * m).sum(-1)
        torch.testing.assert_close(rec.delta.double(), expected_plain, atol=1e-2, rtol=0)
        # The row's columns are the means of these per-completion changes.
        correct = rec.correct
        row = steps.loc[step]
        assert row[C.N_CORRECT] == int(correct.sum())
        assert row[C.N_INCORRECT] == int((~correct).sum())
        if (~correct).any():
            assert row[C.DELTA_INCORRECT] == pytest.approx(
                float(expected[~correct].mean()), abs=1e-4
            )
        if correct.any():
            assert row[C.DELTA_CORRECT] == pytest.approx(float(expected[correct].mean()), abs=1e-4)
            frac = float((expected[correct] < 0).double().mean())
            assert row[C.FRAC_CORRECT_DISPLACED] == pytest.approx(frac)

    logged = {h["step"]: h for h in trainer.state.log_history if "grad_norm" in h}
    assert sorted(logged) == [1, 2, 3, 4]
    for step, h in logged.items():
        assert steps.loc[step, C.GRAD_NORM] == pytest.approx(h["grad_norm"], rel=1e-6)
        assert steps.loc[step, C.LEARNING_RATE] == pytest.approx(h["learning_rate"], rel=1e-9)
        # The main columns also reach the trainer's own logs (so report_to carries them).
        assert h[trl_adapter.TRAINER_LOG_PREFIX + C.GRAD_NORM_MAX] == pytest.approx(h["grad_norm"])
    # Raw rewards per function and in total; tokens with text for drill-down.
    assert steps[C.REWARD_FN_PREFIX + "reward_length"].notna().all()
    fn_mean = steps[C.REWARD_FN_PREFIX + "reward_length"]
    assert steps[C.REWARD_MEAN].tolist() == pytest.approx(fn_mean.tolist(), rel=1e-6)
    tokens = run.tokens()
    assert len(tokens) > 0 and set(tokens[C.TOK_STEP]) == {2, 4}
    assert tokens[C.TOK_TEXT].str.len().gt(0).all()
    assert not tokens.duplicated([C.TOK_STEP, C.TOK_RESPONSE, C.TOK_POSITION]).any()
    top = tokens[tokens[C.TOK_SAMPLE] == "top_token"]
    assert (top[C.TOK_DELTA] < 0).all()
    # Whole responses (default 4 per step): every completion position, padding excluded, and
    # the logged generated-token changes sum to the change the probe recorded for that response.
    whole = tokens[tokens[C.TOK_SAMPLE] == "response"]
    for rec, _, _, _, step in snaps.checks:
        mine = whole[whole[C.TOK_STEP] == step]
        assert mine[C.TOK_RESPONSE].nunique() == 4
        completion = rec.completion_mask  # [8, T] TRL's completion_mask (padding 0)
        for response, group in mine.groupby(C.TOK_RESPONSE):
            n_positions = int(completion[response].sum())
            assert group[C.TOK_POSITION].tolist() == list(range(n_positions))
            assert group[C.TOK_GENERATED].tolist() == rec.mask[response, :n_positions].tolist()
            assert group[C.TOK_DELTA].sum() == pytest.approx(float(rec.delta[response]), abs=1e-5)
    assert run.meta["trainer"] == "trl.GRPOTrainer" and run.meta["lld_columns"] is True


class _EnableAt(TrainerCallback):
    def __init__(self, monitor: LLDMonitor, step: int) -> None:
        self.monitor, self.step = monitor, step

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step + 1 == self.step:
            self.monitor.llds.enable(1.0, reason="test callback")


def _history(trainer: Any) -> dict[int, tuple[float, float]]:
    return {
        h["step"]: (h["loss"], h["grad_norm"]) for h in trainer.state.log_history if "loss" in h
    }


def test_llds_enabled_at_step_k_changes_only_later_steps(tmp_path: Any) -> None:
    """No monitor vs monitor with LLDS switched on at step 3 of 4 (two updates per batch)."""
    plain = make_grpo_trainer(tmp_path / "a", max_steps=4, steps_per_generation=2)
    plain.train()
    monitor = LLDMonitor(tmp_path / "run", strict=True, detector=None)
    tr = make_grpo_trainer(tmp_path / "b", max_steps=4, steps_per_generation=2)
    monitor.attach(tr)
    tr.add_callback(_EnableAt(monitor, 3))
    tr.train()
    a, b = _history(plain), _history(tr)
    # Steps 1-2: identical to training without any monitor (no loss change while LLDS is off).
    for step in (1, 2):
        assert a[step] == b[step]
    # Step 3 is the first update on a fresh batch (pi_theta == pi_old): LLDS is exactly 0.
    assert a[3] == b[3]
    # Step 4 reuses the batch after an update: LLDS acts.
    assert a[4][1] != b[4][1]
    steps = load_run(tmp_path / "run").steps.set_index(C.STEP)
    assert steps[C.LLDS_ENABLED].tolist() == [0, 0, 1, 1]
    assert steps[C.LLDS_LAMBDA].tolist() == [0.0, 0.0, 1.0, 1.0]
    assert steps.loc[3, C.LLDS_LOSS] == 0.0 and steps.loc[4, C.LLDS_LOSS] > 0.0
    events = load_run(tmp_path / "run").events
    interventions = events[events[C.EVENT_TYPE] == "intervention"]
    assert interventions[C.EVENT_KIND].tolist() == ["llds_enable"]
    assert interventions[C.EVENT_STEP].tolist() == [3]


def test_no_batch_reuse_warns_at_attach_and_at_enable(tmp_path: Any) -> None:
    # num_iterations=1, steps_per_generation=GA=1: every update sees pi_theta == pi_old.
    trainer = make_grpo_trainer(tmp_path / "tr", max_steps=1)
    monitor = LLDMonitor(tmp_path / "run", llds=LLDSConfig(), detector=None)
    with pytest.warns(UserWarning, match="identically zero.*steps_per_generation") as said:
        monitor.attach(trainer)
    # the warning points at the user's line (this test), not at the package's code
    assert [w.filename for w in said if "identically zero" in str(w.message)] == [__file__]
    monitor.llds.disable()
    with pytest.warns(UserWarning, match="identically zero") as said:
        monitor.llds.enable()
    assert {w.filename for w in said} == {__file__}
    monitor.close()
    # With reuse (two updates per batch) there is no warning.
    trainer = make_grpo_trainer(tmp_path / "tr2", max_steps=1, steps_per_generation=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        LLDMonitor(tmp_path / "run2", llds=LLDSConfig(), detector=None).attach(trainer).close()
    assert trl_adapter.llds_reuse_problem(2, 1, 2) is not None  # both iterations in one update
    assert trl_adapter.llds_reuse_problem(2, 1, 1) is None


class _ScriptedDetector:
    """A detector that raises given alerts at given steps (the monitor's plumbing is under test)."""

    def __init__(self, script: dict[int, list[Alert]]) -> None:
        self.script = script
        self.rows: list[dict[str, Any]] = []
        self.phase = "healthy"

    def update(self, row: dict[str, Any]) -> list[Alert]:
        self.rows.append(dict(row))
        alerts = self.script.get(int(row[C.STEP]), [])
        if alerts:
            self.phase = alerts[-1].kind
        return alerts


class _RecordingSink:
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.alerts: list[Alert] = []
        self.closed = False

    def log_step(self, row: dict[str, Any]) -> None:
        self.rows.append(row)

    def alert(self, alert: Alert) -> None:
        self.alerts.append(alert)

    def close(self) -> None:
        self.closed = True


def test_event_sequence_of_a_short_run_end_to_end(tmp_path: Any) -> None:
    stagnation = Alert(2, "stagnation", "warning", "correct likelihood flat", {"slope": 0.0})
    collapse = Alert(3, "collapse", "critical", "grad norm surge", {"grad_norm": 9.0})
    detector = _ScriptedDetector({2: [stagnation], 3: [collapse]})
    sink = _RecordingSink()
    monitor = LLDMonitor(
        tmp_path / "run",
        detector=detector,
        sinks=[sink],
        auto_llds=True,
        stop_on_collapse=True,
        checkpoint_on_collapse=True,
        strict=True,
    )
    trainer = make_grpo_trainer(tmp_path / "tr", max_steps=6, steps_per_generation=2)
    monitor.attach(trainer)
    trainer.train()
    assert trainer.state.global_step == 3  # stopped by stop_on_collapse
    run = load_run(tmp_path / "run")
    seq = list(zip(run.events[C.EVENT_TYPE], run.events[C.EVENT_KIND], strict=True))
    assert seq == [
        ("lifecycle", "start"),
        ("lifecycle", "attach"),
        ("phase", "stagnation"),
        ("alert", "stagnation"),
        ("intervention", "llds_enable"),
        ("phase", "collapse"),
        ("alert", "collapse"),
        ("intervention", "stop"),
        ("intervention", "checkpoint"),
        ("lifecycle", "end"),
    ]
    assert run.steps[C.STEP].tolist() == [1, 2, 3]
    assert run.steps[C.LLDS_ENABLED].tolist() == [0, 0, 1]
    assert run.steps[C.LLDS_LAMBDA].tolist()[-1] == 0.2  # auto_llds uses the paper's lambda
    assert [r[C.STEP] for r in detector.rows] == [1, 2, 3]
    assert [r[C.STEP] for r in sink.rows] == [1, 2, 3] and sink.alerts == [stagnation, collapse]
    assert sink.closed and run.finished
    assert (tmp_path / "tr" / "checkpoint-3").is_dir()  # checkpoint_on_collapse saved


class _FailingSink:
    def log_step(self, row: dict[str, Any]) -> None:
        raise OSError("disk full (simulated)")


def test_monitor_exception_training_continues_unless_strict(tmp_path: Any) -> None:
    def bad_correct_fn(rewards: Any, advantages: Any) -> Any:
        raise RuntimeError("user correct_fn is broken")

    monitor = LLDMonitor(tmp_path / "run", correct_fn=bad_correct_fn, sinks=[_FailingSink()])
    trainer = make_grpo_trainer(tmp_path / "tr", max_steps=2)
    monitor.attach(trainer)
    trainer.train()
    assert trainer.state.global_step == 2
    run = load_run(tmp_path / "run")
    assert run.steps[C.STEP].tolist() == [1, 2]  # rows still written
    errors = run.events[run.events[C.EVENT_TYPE] == "error"]
    # Each failure is recorded once with its cause, not once per step.
    assert sorted(errors[C.EVENT_KIND]) == [
        "observe_rollout",
        "post-update probe",
        "sink _FailingSink.log_step",
    ]
    assert errors[C.EVENT_MESSAGE].str.contains("user correct_fn is broken|disk full").all()

    strict = LLDMonitor(tmp_path / "run2", correct_fn=bad_correct_fn, strict=True, detector=None)
    trainer = make_grpo_trainer(tmp_path / "tr2", max_steps=2)
    strict.attach(trainer)
    with pytest.raises(RuntimeError, match="user correct_fn is broken"):
        trainer.train()


def test_attach_refuses_unknown_objects(tmp_path: Any) -> None:
    with pytest.raises(ValueError, match="hand-written loop"):
        LLDMonitor(tmp_path / "run").attach(object())


class _ToolRollout:
    """rollout_func: completions of 1-3 actions separated by tool feedback (``env_mask`` 0).

    Completion i of a generation batch has ``i % 3`` tool rounds: ``3 generated + 2 feedback``
    tokens per round, then a final answer of 2 random tokens + EOS (3 generated tokens).
    """

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, prompts: list[str], trainer: Any) -> dict[str, Any]:
        tok = trainer.processing_class
        g = torch.Generator().manual_seed(1000 + self.calls)
        self.calls += 1

        def rand(n: int) -> list[int]:
            return torch.randint(3, len(tok), (n,), generator=g).tolist()  # no special ids

        out: dict[str, Any] = {"prompt_ids": [], "completion_ids": [], "logprobs": []}
        out["env_mask"] = []
        for i, prompt in enumerate(prompts):
            ids, mask = [], []
            for _ in range(i % 3):
                ids += rand(3) + rand(2)
                mask += [1, 1, 1, 0, 0]
            ids += [*rand(2), tok.eos_token_id]
            mask += [1, 1, 1]
            out["prompt_ids"].append(tok(prompt)["input_ids"])
            out["completion_ids"].append(ids)
            out["env_mask"].append(mask)
            out["logprobs"].append([0.0] * len(ids))
        return out


def reward_text_hash(completions: list[str], **kwargs: Any) -> list[float]:
    """A deterministic spread of rewards in [0, 1] so that groups have non-zero advantages."""
    return [(sum(map(ord, c)) % 7) / 6 for c in completions]


def _tool_run(tmp: Any, weighting: str | float) -> tuple[LLDMonitor, Any]:
    """4 steps, 2 updates per generation batch of 8, LLDS (lambda 1) with answer weighting on."""
    import os

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    monitor = LLDMonitor(
        tmp / "run",
        llds=LLDSConfig(lam=1.0, answer_weighting=weighting),
        strict=True,
        detector=None,
        probe_fraction=0.0,
    )
    trainer = make_grpo_trainer(
        tmp / "tr",
        max_steps=4,
        steps_per_generation=2,
        reward_funcs=[reward_text_hash],
        max_completion_length=16,
    )
    trainer.rollout_func = _ToolRollout()  # the factory has no rollout_func argument
    monitor.attach(trainer)
    trainer.train()
    return monitor, trainer


def _answer_span(mask: torch.Tensor) -> torch.Tensor:
    """Bool [B, T]: the last 3 generated positions of each row (the rollout's answer), by index."""
    last = (mask * torch.arange(mask.shape[1])).amax(1, keepdim=True)  # [B, 1] last generated
    pos = torch.arange(mask.shape[1])[None]  # [1, T]
    return (pos <= last) & (pos > last - 3)  # [B, T]


def test_llds_answer_weighting_under_grpo_trainer(tmp_path: Any) -> None:
    """LLDS-MA under GRPOTrainer: answer span = last action, V from the tool rounds per batch."""
    from lld_monitor.llds import llds_loss

    monitor, _ = _tool_run(tmp_path / "paper", "paper")
    records = monitor.adapter.llds_records
    assert len(records) == 4  # one per micro-batch (GA=1, 4 steps)
    # Tool rounds of a batch of 8: i % 3 for i = 0..7 -> 0,1,2,0,1,2,0,1 -> mean V = 7/8, and the
    # paper's beta = min(V / 2, 1) = 0.4375; both generation batches have the same structure.
    for rec in records:
        assert rec["mean_valid_searches"] == pytest.approx(0.875)
        assert rec["answer_weight"] == pytest.approx(0.4375)
        mask = rec["mask"].long()  # [4, T] completion_mask * tool_mask
        expected_answer = _answer_span(mask)
        assert torch.equal(rec["answer_mask"], expected_answer)
        ref = llds_loss(
            logp_new=rec["logp_new"],
            logp_old=rec["logp_old"],
            advantages=rec["advantages"],
            mask=mask,
            answer_mask=expected_answer,
            answer_weight=0.4375,
        )
        torch.testing.assert_close(rec["output"].loss, ref.loss, atol=1e-7, rtol=0)
        torch.testing.assert_close(rec["term"], ref.loss, atol=1e-7, rtol=0)  # lambda 1
    # Steps 1 and 3 are first updates on a fresh batch (pi_theta == pi_old): exactly 0; 2 and 4 act,
    # and the weighting matters there (an unweighted loss differs).
    assert [float(r["output"].loss) for r in records[::2]] == [0.0, 0.0]
    acting = records[1::2]
    assert all(float(r["output"].loss) > 0 for r in acting)
    unweighted = [
        float(
            llds_loss(
                logp_new=r["logp_new"],
                logp_old=r["logp_old"],
                advantages=r["advantages"],
                mask=r["mask"],
            ).loss
        )
        for r in acting
    ]
    assert unweighted != pytest.approx([float(r["output"].loss) for r in acting], abs=1e-6)
    steps = load_run(tmp_path / "paper" / "run").steps.set_index(C.STEP)
    assert steps[C.LLDS_LOSS].tolist() == pytest.approx([float(r["term"]) for r in records])
    # num_searches: per step, the mean tool rounds of its 4 rows; the two steps of a generation
    # batch hold all 8 rows, so their mean is 7/8.
    assert (steps.loc[1, C.NUM_SEARCHES] + steps.loc[2, C.NUM_SEARCHES]) / 2 == pytest.approx(0.875)


def test_llds_answer_weight_zero_removes_the_answer_span(tmp_path: Any) -> None:
    """answer_weighting=0.0: the loss is LLDS with the answer tokens' change set to zero."""
    from lld_monitor.llds import llds_loss

    monitor, _ = _tool_run(tmp_path / "zero", 0.0)
    acting = monitor.adapter.llds_records[1::2]
    assert len(acting) == 2
    for rec in acting:
        mask = rec["mask"].long()
        answer = _answer_span(mask)
        assert rec["answer_weight"] == 0.0 and torch.equal(rec["answer_mask"], answer)
        # With the action gate, the answer is its own action, so removing its change (new = old
        # there) leaves the other actions' gates and the per-response normaliser n_i unchanged.
        new = torch.where(answer, rec["logp_old"], rec["logp_new"])
        ref = llds_loss(
            logp_new=new, logp_old=rec["logp_old"], advantages=rec["advantages"], mask=mask
        )
        torch.testing.assert_close(rec["output"].loss, ref.loss, atol=1e-7, rtol=0)
        full = llds_loss(
            logp_new=rec["logp_new"],
            logp_old=rec["logp_old"],
            advantages=rec["advantages"],
            mask=mask,
        )
        # The answer span did lose likelihood on preserving responses, so zeroing it matters.
        assert float(full.loss) > float(rec["output"].loss)


def test_valid_searches_from_trl_tool_counts(tmp_path: Any) -> None:
    """With TRL tools the batch's (calls - failures) / completions stands for every row."""
    trainer = make_grpo_trainer(tmp_path / "tr", max_steps=1)
    monitor = LLDMonitor(tmp_path / "run", strict=True, detector=None)
    monitor.attach(trainer)
    adapter = monitor.adapter
    completion_mask = torch.ones(4, 5, dtype=torch.long)
    adapter._tool_counts = (7, 1)  # what the wrapped _tool_call_loop records: 6 valid calls
    got = trl_adapter.valid_searches({"completion_mask": completion_mask}, adapter._tool_counts)
    assert got.tolist() == [1.5] * 4  # 6 valid calls / 4 completions
    adapter._tool_counts = None  # no tools: actions - 1 from completion_mask * tool_mask
    tool_mask = torch.tensor([[1, 1, 1, 1, 1], [1, 0, 1, 0, 1], [1, 0, 0, 1, 1], [0, 1, 1, 1, 1]])
    batch = {"completion_mask": completion_mask, "tool_mask": tool_mask}
    got = trl_adapter.valid_searches(batch, None)
    assert got.tolist() == [0.0, 2.0, 1.0, 0.0]
    monitor.close()


def test_num_iterations_recomputation_precedes_the_last_update(tmp_path: Any) -> None:
    """Why the probe cannot reuse TRL's own recomputation (docs/monitor.md, "Post-update probe").

    num_iterations=2, steps_per_generation=GA=1: one batch, two optimizer steps. TRL's
    _compute_loss log-probs of step 2 are taken under the policy after step 1 (before step 2's
    update), so they differ from the policy after step 2, which the probe measures.
    """
    monitor = LLDMonitor(
        tmp_path / "run",
        llds=LLDSConfig(lam=0.0),  # on with lambda 0: records the loss inputs, loss unchanged
        probe_fraction=1.0,
        strict=True,
        detector=None,
    )
    trainer = make_grpo_trainer(tmp_path / "tr", max_steps=2, num_iterations=2)
    monitor.attach(trainer)
    trainer.train()
    first, second = monitor.adapter.llds_records  # one per _compute_loss, same rows in order
    probe = monitor.last_probe  # after step 2, the last update on the batch
    assert probe is not None and probe.step == 2 and probe.rows.tolist() == [0, 1, 2, 3]
    m = probe.mask.bool()
    # Step 2's recomputation moved away from the sampling policy (step 1 updated) ...
    assert (first["logp_new"] - second["logp_new"])[m].abs().max() > 1e-4
    # ... and it is still not the post-update policy: step 2's own update comes after it.
    assert (second["logp_new"] - probe.logp_new)[m].abs().max() > 1e-4
    torch.testing.assert_close(probe.logp_old, first["logp_new"], atol=1e-6, rtol=0)


def test_in_batch_displacement_counts_each_response_once_after_its_update(tmp_path: Any) -> None:
    """num_iterations=3, steps_per_generation=GA=1: one batch, three updates. The loss of step 2
    sees the batch again after step 1's update on it: its correct responses are counted there
    (displaced: summed change since generation < 0), and not again at step 3."""
    monitor = LLDMonitor(
        tmp_path / "run",
        llds=LLDSConfig(lam=0.0),  # records the loss inputs, loss unchanged
        probe_fraction=1.0,
        strict=True,
        detector=None,
        correct_threshold=0.16,
    )
    trainer = make_grpo_trainer(
        tmp_path / "tr", max_steps=3, num_iterations=3, reward_funcs=[reward_length]
    )
    monitor.attach(trainer)
    trainer.train()
    first, second, _ = monitor.adapter.llds_records  # one per _compute_loss, same rows in order
    correct = monitor.last_probe.correct  # the same batch, judged by the same rule
    assert 0 < int(correct.sum()) < 4  # the check below means something
    m = second["mask"].double()
    delta = ((second["logp_new"].double() - second["logp_old"].double()) * m).sum(-1)  # [B]
    assert delta.abs().min() > 1e-4  # step 1's update moved every response
    steps = load_run(tmp_path / "run").steps.set_index(C.STEP)
    assert steps[C.INBATCH_N_CORRECT].isna().tolist() == [True, False, True]
    assert steps.loc[2, C.INBATCH_N_CORRECT] == int(correct.sum())
    displaced = int((correct & (delta < 0)).sum())
    assert steps.loc[2, C.INBATCH_N_CORRECT_DISPLACED] == displaced
    assert steps.loc[2, C.INBATCH_FRAC_CORRECT_DISPLACED] == pytest.approx(
        displaced / int(correct.sum())
    )
    torch.testing.assert_close(first["logp_new"], first["logp_old"], atol=1e-5, rtol=0)


def test_finished_generations_schedule_alone() -> None:
    """A batch generated at micro-step s is finished at s + steps_per_generation*num_iterations."""
    from lld_monitor.integrations.trl_probe import finished_generations as fin

    starts = {0: 0, 1: 4, 2: 8}
    # steps_per_generation=2, num_iterations=2: each batch serves 4 micro-steps.
    assert fin(starts, 3, 2, 2) == []
    assert fin(starts, 4, 2, 2) == [0]
    assert fin(starts, 8, 2, 2) == [0, 1]
    assert fin(starts, 9, 2, 2, final=False) == [0, 1]
    assert fin(starts, 9, 2, 2, final=True) == [0, 1, 2]  # the last optimizer step probes all
    assert fin({5: 1}, 2, 1, 1) == [5]  # one micro-step per batch: finished at the next step
    assert fin({}, 10, 1, 1, final=True) == []
    with pytest.raises(ValueError, match="steps_per_generation and num_iterations must be >= 1"):
        fin(starts, 1, 0, 1)


def test_zero_std_groups_leave_unscored_completions_out() -> None:
    nan = float("nan")
    groups = torch.tensor(
        [
            [1.0, 1.0, 1.0, 1.0],  # all equal: zero std
            [1.0, nan, 1.0, 1.0],  # scored ones equal: zero std (TRL: nanstd 0)
            [1.0, nan, 0.0, 1.0],  # scored ones differ
            [1.0, nan, nan, nan],  # one scored: no std, not zero
            [nan, nan, nan, nan],  # none scored
        ]
    )
    assert trl_adapter.zero_std_groups(groups).tolist() == [1.0, 1.0, 0.0, 0.0, 0.0]


def test_probe_under_gradient_checkpointing(tmp_path: Any) -> None:
    """The probe runs with checkpointing off (as TRL's no-grad forwards) and restores it."""
    monitor = LLDMonitor(tmp_path / "run", probe_fraction=1.0, strict=True, detector=None)
    trainer = make_grpo_trainer(
        tmp_path / "tr", max_steps=2, steps_per_generation=2, gradient_checkpointing=True
    )
    monitor.attach(trainer)
    seen: list[bool] = []
    during: list[bool] = []
    probing = [False]
    forward = monitor.adapter._probe_forward
    trainer.model.register_forward_pre_hook(
        lambda m, args: during.append(m.is_gradient_checkpointing) if probing[0] else None
    )

    def probe_forward(plan: Any) -> Any:
        probing[0] = True
        try:
            return forward(plan)
        finally:
            probing[0] = False
            seen.append(trainer.model.is_gradient_checkpointing)  # restored after the probe

    monitor.adapter._probe_forward = probe_forward
    trainer.train()
    steps = load_run(tmp_path / "run").steps.set_index(C.STEP)
    assert during and not any(during)  # off inside the probe forward
    assert seen == [True]
    assert steps.loc[2, C.N_CORRECT] + steps.loc[2, C.N_INCORRECT] == 8


_UNSCORED: list[int] = []


def reward_has_a_or_none(completions: list[str], **kwargs: Any) -> list[float | None]:
    """1.0 with the word 'a', else 0.0, but None (unscored) for one completion in three."""
    out: list[float | None] = []
    for i, c in enumerate(completions):
        out.append(None if i % 3 == 1 else (1.0 if "a" in c.split() else 0.0))
    _UNSCORED.append(sum(r is None for r in out))
    return out


def test_several_reward_functions_need_a_rule_and_correct_reward_applies(tmp_path: Any) -> None:
    from lld_grpo_script import reward_has_a

    trainer = make_grpo_trainer(tmp_path / "t0", reward_funcs=[reward_has_a, reward_length])
    with pytest.warns(UserWarning, match=r"2 reward functions .* and no correctness rule"):
        LLDMonitor(tmp_path / "r0", detector=None).attach(trainer)
    with pytest.raises(ValueError, match=r"correct_reward='accuracy' is not a reward function"):
        LLDMonitor(tmp_path / "r1", correct_reward="accuracy").attach(trainer)

    monitor = LLDMonitor(
        tmp_path / "run", detector=None, strict=True, correct_reward="reward_has_a"
    )
    trainer = make_grpo_trainer(
        tmp_path / "t", max_steps=2, reward_funcs=[reward_has_a, reward_length]
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # a rule given: no warning
        monitor.attach(trainer)
    trainer.train()
    steps = load_run(tmp_path / "run").steps
    # reward_has_a is 0/1: accuracy is its mean, whatever reward_length adds to the total.
    for _, row in steps.iterrows():
        assert row[C.ACCURACY] == pytest.approx(row[C.REWARD_FN_PREFIX + "reward_has_a"])
    assert load_run(tmp_path / "run").meta["config"]["correctness"]["correct_reward"] == (
        "reward_has_a"
    )


def test_unscored_completions_match_trl_statistics(tmp_path: Any) -> None:
    monitor = LLDMonitor(tmp_path / "run", detector=None, strict=True)
    trainer = make_grpo_trainer(tmp_path / "t", max_steps=3, reward_funcs=[reward_has_a_or_none])
    monitor.attach(trainer)
    trainer.train()
    steps = load_run(tmp_path / "run").steps.set_index(C.STEP)
    logged = [h for h in trainer.state.log_history if "reward" in h]
    assert len(logged) == 3 and sum(_UNSCORED) >= 3  # unscored completions on every step
    for step, trl_row in enumerate(logged, start=1):
        row = steps.loc[step]
        assert row[C.REWARD_MEAN] == pytest.approx(trl_row["reward"], abs=1e-6)
        assert row[C.FRAC_ZERO_STD_GROUPS] == pytest.approx(trl_row["frac_reward_zero_std"])
        assert row[C.ACCURACY] == pytest.approx(trl_row["reward"], abs=1e-6)  # 0/1 rewards


def _with_attention_dropout(trainer: Any, p: float) -> Any:
    for module in trainer.model.modules():
        if hasattr(module, "attention_dropout"):
            module.attention_dropout = p  # as a model config with attention_dropout=p builds it
    return trainer


def test_dropout_warns_at_attach_and_refuses_llds_unless_forced(tmp_path: Any) -> None:
    from lld_monitor.integrations.transformers import active_dropout

    assert active_dropout(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.1))) == [
        "1: p=0.1"
    ]
    assert active_dropout(torch.nn.Sequential(torch.nn.Dropout(0.0))) == []

    def trainer(name: str) -> Any:
        return _with_attention_dropout(make_grpo_trainer(tmp_path / name, max_steps=2), 0.3)

    monitor = LLDMonitor(tmp_path / "r0", detector=None, auto_llds=True)
    with pytest.warns(UserWarning, match=r"attention_dropout=0.3.*auto_llds will not switch"):
        monitor.attach(trainer("t0"))
    with pytest.raises(ValueError, match="LLDS cannot be switched on: the model applies dropout"):
        monitor.llds.enable()
    alert = Alert(3, "stagnation", "warning", "x", {})
    monitor.responder.act(alert, 3)  # what an auto_llds alert does: refused, on the record
    assert not monitor.llds.enabled
    monitor.close()
    events = load_run(tmp_path / "r0").events
    assert "llds_enable_refused" in set(events[C.EVENT_KIND])

    with pytest.raises(ValueError, match=r"refuses LLDS here: the model applies dropout"):
        LLDMonitor(tmp_path / "r1", llds=LLDSConfig()).attach(trainer("t1"))

    forced = LLDMonitor(tmp_path / "r2", llds=LLDSConfig(), llds_with_dropout=True, detector=None)
    with pytest.warns(UserWarning, match="applies dropout"):
        forced.attach(trainer("t2"))
    assert forced.llds.enabled
    forced.close()

    with warnings.catch_warnings():  # TRL's default disable_dropout=True, no attention dropout
        warnings.simplefilter("error", UserWarning)
        LLDMonitor(tmp_path / "r3", detector=None).attach(make_grpo_trainer(tmp_path / "t3"))


def test_no_in_batch_displacement_under_dropout(tmp_path: Any) -> None:
    # every response correct (threshold 0), each batch seen twice: measured without dropout ...
    def run(name: str, dropout: float) -> Any:
        monitor = LLDMonitor(tmp_path / name, detector=None, correct_threshold=0.0)
        tr = make_grpo_trainer(tmp_path / f"t{name}", max_steps=2, num_iterations=2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            monitor.attach(_with_attention_dropout(tr, dropout) if dropout else tr)
        tr.train()
        monitor.close()
        return load_run(tmp_path / name).steps.set_index(C.STEP)

    assert run("plain", 0.0).loc[2, C.INBATCH_N_CORRECT] == 4
    # ... not with dropout: the loss's log-probs differ from generation by dropout noise
    assert C.INBATCH_N_CORRECT not in run("dropout", 0.3)


class _EnableThenStop(TrainerCallback):
    """Switches LLDS on at the end of one step; optionally stops training at another."""

    def __init__(self, monitor: LLDMonitor, enable_at: int, stop_at: int | None = None) -> None:
        self.monitor, self.enable_at, self.stop_at = monitor, enable_at, stop_at

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if state.global_step == self.enable_at:
            self.monitor.llds.enable(0.5)
        if state.global_step == self.stop_at:
            control.should_training_stop = True  # preempted after checkpoint-2
        return control


@pytest.mark.slow
@pytest.mark.parametrize("rebuild", [False, True], ids=["on_train_begin", "transformers_restore"])
def test_resume_from_checkpoint_continues_the_run_like_an_uninterrupted_one(
    tmp_path: Any, rebuild: bool
) -> None:
    """rebuild: transformers rebuilds the callback from its saved state (the option's path)."""
    config = {"max_steps": 4, "steps_per_generation": 2, "save_strategy": "steps", "save_steps": 2}
    config["restore_callback_states_from_checkpoint"] = rebuild

    def run(name: str, monitor: LLDMonitor, stop_at: int | None, enable: bool, **train: Any):
        trainer = make_grpo_trainer(tmp_path / name, **config)
        monitor.attach(trainer)
        if enable:
            trainer.add_callback(_EnableThenStop(monitor, 1, stop_at))
        trainer.train(**train)
        return trainer

    full = LLDMonitor(tmp_path / "full", probe_fraction=0.5)
    run("t_full", full, None, True)

    first = LLDMonitor(tmp_path / "run", probe_fraction=0.5)
    run("t_run", first, 3, True)
    assert load_run(tmp_path / "run").steps[C.STEP].tolist() == [1, 2, 3]
    with pytest.raises(FileExistsError, match="pass resume=True to continue it"):
        LLDMonitor(tmp_path / "run")
    resumed = LLDMonitor(tmp_path / "run", probe_fraction=0.5, resume=True)
    run("t_run", resumed, None, False, resume_from_checkpoint=str(tmp_path / "t_run/checkpoint-2"))

    a = load_run(tmp_path / "full")
    b = load_run(tmp_path / "run")
    assert b.steps[C.STEP].tolist() == [1, 2, 3, 4]  # appended, step 3 not written twice
    cols = [c for c in a.steps.columns if c != C.TIME]
    for (_, ra), (_, rb) in zip(a.steps.iterrows(), b.steps.iterrows(), strict=True):
        for c in cols:
            if isinstance(ra[c], str):
                assert rb[c] == ra[c], (ra[C.STEP], c)
            else:
                assert rb[c] == pytest.approx(ra[c], rel=1e-5, abs=1e-6, nan_ok=True), (
                    ra[C.STEP],
                    c,
                )
    # LLDS came back on from the checkpoint (nobody enabled it in the resumed part) ...
    assert b.steps[C.LLDS_ENABLED].tolist() == [0, 1, 1, 1]
    assert resumed.llds.enabled and resumed.llds.lam == 0.5
    # ... and the detector went on from the checkpoint's state, as in the uninterrupted run.
    assert resumed.detector.state_dict() == full.detector.state_dict()
    kinds = list(b.events[C.EVENT_KIND])
    assert kinds.count("llds_enable") == 1 and "resume" in kinds and "restore" in kinds
    assert b.events[b.events[C.EVENT_KIND] == "restore"][C.EVENT_STEP].tolist() == [3]


def test_second_train_call_warns_that_it_runs_unmonitored(tmp_path: Any) -> None:
    monitor = LLDMonitor(tmp_path / "run", detector=None)
    trainer = make_grpo_trainer(tmp_path / "t", max_steps=1)
    monitor.attach(trainer)
    trainer.train()
    with pytest.warns(UserWarning, match="this train\\(\\) runs unmonitored"):
        trainer.train()


def test_subclass_overriding_compute_loss_is_hooked_not_refused(tmp_path: Any) -> None:
    from trl import GRPOTrainer

    class Keeps(GRPOTrainer):
        def _compute_loss(self, model: Any, inputs: Any) -> Any:
            return super()._compute_loss(model, inputs)

    class Forwards(GRPOTrainer):
        def _compute_loss(self, *args: Any, **kwargs: Any) -> Any:
            return super()._compute_loss(*args, **kwargs)

    class Renames(GRPOTrainer):
        def _compute_loss(self, net: Any, batch: Any) -> Any:
            return super()._compute_loss(net, batch)

    assert trl_adapter.override_problems(Keeps) == []
    assert trl_adapter.override_problems(Forwards) == []
    assert trl_adapter.override_problems(Renames) == [
        "Renames._compute_loss overrides GRPOTrainer._compute_loss with parameters "
        "('self', 'net', 'batch'), expected ('self', 'model', 'inputs')"
    ]
    trainer = make_grpo_trainer(tmp_path / "t", max_steps=1)
    trainer.__class__ = Keeps  # the same trainer, as the subclass
    monitor = LLDMonitor(tmp_path / "run", detector=None, strict=True).attach(trainer)
    trainer.train()
    assert load_run(tmp_path / "run").steps[C.ACCURACY].notna().all()
    trainer.__class__ = Renames
    with pytest.raises(RuntimeError, match=r"cannot hook Renames: Renames._compute_loss overrides"):
        LLDMonitor(tmp_path / "run2").attach(trainer)
    assert monitor.closed


def _events(run_dir: Any, kind: str) -> Any:
    events = load_run(run_dir).events
    return events[events[C.EVENT_KIND] == kind]


def test_learning_rate_zero_gives_no_displacement_evidence(tmp_path: Any) -> None:
    # lr 0 (as during warm-up): the weights never move, every probed change is exactly 0.
    # Before the fix such rows read frac_correct_displaced = 1.0 (100% "displaced").
    monitor = LLDMonitor(tmp_path / "run", detector=None, strict=True, probe_fraction=1.0)
    trainer = make_grpo_trainer(
        tmp_path / "tr", max_steps=4, steps_per_generation=2, learning_rate=0.0
    )
    monitor.attach(trainer)
    trainer.train()
    rec = monitor.adapter.probe_records[0]
    assert torch.equal(rec.logp_new * rec.mask, rec.logp_old * rec.mask)  # nothing moved
    steps = load_run(tmp_path / "run").steps.set_index(C.STEP)
    assert steps[C.LEARNING_RATE].tolist() == [0.0] * 4
    for col in C.DISPLACEMENT_COLUMNS:
        assert col not in steps or steps[col].isna().all(), col
    assert steps[C.LOGP_INCORRECT].notna().all()  # confidence is still measured
    assert C.INBATCH_N_CORRECT not in steps  # no update: nothing measured inside the batch
    notes = _events(tmp_path / "run", "no_step_probe")
    assert notes[C.EVENT_STEP].tolist() == [2]  # said once, at the first probe
    assert "optimizer did not step" in notes[C.EVENT_MESSAGE].iloc[0]


def test_auto_llds_without_batch_reuse_warns_at_attach(tmp_path: Any) -> None:
    # steps_per_generation == gradient_accumulation_steps == 1, num_iterations 1: no reuse.
    trainer = make_grpo_trainer(tmp_path / "tr", max_steps=1)
    monitor = LLDMonitor(tmp_path / "run", auto_llds=True, detector=None)
    with pytest.warns(UserWarning, match=r"auto_llds may switch LLDS on.*cannot act") as rec:
        monitor.attach(trainer)
    text = " ".join(str(w.message) for w in rec)
    for setting in ("num_iterations=1", "steps_per_generation=1", "gradient_accumulation_steps=1"):
        assert setting in text
    assert "steps_per_generation > gradient_accumulation_steps" in text  # what to change
    monitor.close()
    notes = _events(tmp_path / "run", "llds_check_reuse")
    assert notes[C.EVENT_SEVERITY].tolist() == ["warning"]
    assert "cannot act" in notes[C.EVENT_MESSAGE].iloc[0]
    # LLDS off and auto_llds off: nothing to say.
    trainer = make_grpo_trainer(tmp_path / "tr2", max_steps=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        LLDMonitor(tmp_path / "run2", detector=None).attach(trainer).close()
    assert _events(tmp_path / "run2", "llds_check_reuse").empty


def test_two_generations_per_prompt_warns_at_attach(tmp_path: Any) -> None:
    trainer = make_grpo_trainer(
        tmp_path / "tr", max_steps=1, num_generations=2, steps_per_generation=2
    )
    monitor = LLDMonitor(tmp_path / "run", auto_llds=True, detector=None)
    with pytest.warns(UserWarning, match=r"gate rarely fires with num_generations=2") as rec:
        monitor.attach(trainer)
    assert not any("cannot act" in str(w.message) for w in rec)  # the batch is reused
    assert any("num_generations >= 4" in str(w.message) for w in rec)
    monitor.close()
    assert len(_events(tmp_path / "run", "llds_check_generations")) == 1


def reward_zero(completions: list[str], **kwargs: Any) -> list[float]:
    return [0.0 for _ in completions]


def test_zero_reward_variance_warns_once_during_the_run(tmp_path: Any) -> None:
    # A reward that is always 0: every prompt group has zero variance, LLDS's gate cannot fire.
    monitor = LLDMonitor(tmp_path / "run", llds=LLDSConfig(), detector=None)
    trainer = make_grpo_trainer(
        tmp_path / "tr", max_steps=12, steps_per_generation=2, reward_funcs=[reward_zero]
    )
    monitor.attach(trainer)  # LLDS on, batch reused, 4 generations: nothing to say yet
    assert _events(tmp_path / "run", "llds_check_zero_std").empty
    with pytest.warns(UserWarning, match=r"100% of the prompt groups .* zero reward variance") as w:
        trainer.train()
    said = [x for x in w if "zero reward variance" in str(x.message)]
    assert len(said) == 1 and said[0].filename == __file__  # once, at the user's line
    notes = _events(tmp_path / "run", "llds_check_zero_std")
    assert notes[C.EVENT_STEP].tolist() == [
        9
    ]  # once, after 5 rollout batches in a row (1, 3, .., 9)
    assert notes[C.EVENT_EVIDENCE].iloc[0][C.FRAC_ZERO_STD_GROUPS] == 1.0
    assert "LLDS is on" in notes[C.EVENT_MESSAGE].iloc[0]


def test_checkpoint_state_that_is_not_json_does_not_fail_the_save(tmp_path: Any) -> None:
    """A custom detector whose state is not JSON: the checkpoint is saved without it."""

    class OddDetector:
        phase = "healthy"

        def update(self, row: Any) -> list:
            return []

        def state_dict(self) -> dict:
            return {"buffer": torch.zeros(2)}  # not JSON

    monitor = LLDMonitor(tmp_path / "run", detector=OddDetector())
    trainer = make_grpo_trainer(tmp_path / "t", max_steps=2, save_strategy="steps", save_steps=1)
    monitor.attach(trainer)
    trainer.train()
    assert (tmp_path / "t" / "checkpoint-2" / "trainer_state.json").exists()
    events = load_run(tmp_path / "run").events
    assert "checkpoint state" in set(events[C.EVENT_KIND])
    resumed = LLDMonitor(tmp_path / "run", detector=OddDetector(), resume=True)
    trainer = make_grpo_trainer(tmp_path / "t", max_steps=3, save_strategy="no")
    resumed.attach(trainer)
    with pytest.warns(UserWarning, match="without the monitor's state"):
        trainer.train(resume_from_checkpoint=str(tmp_path / "t" / "checkpoint-2"))
    assert load_run(tmp_path / "run").steps[C.STEP].tolist() == [1, 2, 3]


def test_truncation_is_the_same_live_and_post_hoc(tmp_path: Any) -> None:
    """Completions at the length cap: the live row's ``frac_truncated`` equals TRL's own
    ``completions/clipped_ratio`` each step, and the live run and ``analyze`` on TRL's own
    TensorBoard folder both raise the ``truncation`` warning."""
    from lld_monitor.analysis import analyze_run
    from lld_monitor.importers import load_table
    from lld_monitor.runlog import load_run

    monitor = LLDMonitor(tmp_path / "run")
    trainer = make_grpo_trainer(
        tmp_path / "tr", max_steps=40, max_completion_length=3, report_to="tensorboard"
    )
    monitor.attach(trainer)
    trainer.train()
    monitor.close()
    trl_ratio = [h["completions/clipped_ratio"] for h in trainer.state.log_history if "loss" in h]
    run = load_run(tmp_path / "run")
    assert run.steps[C.FRAC_TRUNCATED].tolist() == pytest.approx(trl_ratio)
    assert sum(trl_ratio) / len(trl_ratio) > 0.5  # a random tiny model rarely ends in 3 tokens
    live = run.events[run.events[C.EVENT_TYPE] == "alert"][C.EVENT_KIND].tolist()
    post_hoc = [a.kind for a in analyze_run(load_table(tmp_path / "tr")).alerts]
    assert "truncation" in live and "truncation" in post_hoc


def test_meta_records_the_peft_adapters(tmp_path: Any) -> None:
    """A GRPOTrainer on a LoRA-wrapped policy: meta.json says which adapters train (type,
    rank, alpha, dropout, target modules); a plain policy has no ``peft`` entry."""
    import json

    peft = pytest.importorskip("peft")
    from datasets import Dataset
    from lld_grpo_script import PROMPTS, reward_has_a
    from trl import GRPOConfig, GRPOTrainer

    tok = build_tokenizer()
    base = build_tiny_model(tok, hidden_size=32, num_layers=1, seed=0)
    lora = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"])
    model = peft.get_peft_model(base, lora)
    args = GRPOConfig(
        output_dir=str(tmp_path / "tr"),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=4,
        max_steps=1,
        report_to="none",
        use_cpu=True,
        disable_dropout=True,
        save_strategy="no",
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[reward_has_a],
        args=args,
        train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
        processing_class=tok,
    )
    monitor = LLDMonitor(tmp_path / "run", detector=None)
    monitor.attach(trainer)
    trainer.train()
    monitor.close()
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["peft"] == {
        "active_adapter": "default",
        "adapters": {
            "default": {
                "peft_type": "LORA",
                "r": 4,
                "lora_alpha": 8,
                "lora_dropout": 0.0,
                "target_modules": ["q_proj", "v_proj"],
            }
        },
    }
    plain = make_grpo_trainer(tmp_path / "tr2", max_steps=1)
    LLDMonitor(tmp_path / "run2", detector=None).attach(plain).close()
    assert "peft" not in json.loads((tmp_path / "run2" / "meta.json").read_text())


def test_resume_inside_a_generation_batch_is_warned_and_recorded(tmp_path: Any) -> None:
    """steps_per_generation=2: a checkpoint at step 1 sits inside a generation batch; resuming
    from it departs from the uninterrupted trajectory, which the monitor says and records. A
    checkpoint at step 2 (a boundary) resumes without a word."""
    config = {"max_steps": 3, "steps_per_generation": 2, "save_strategy": "steps", "save_steps": 1}
    first = LLDMonitor(tmp_path / "run", detector=None)
    trainer = make_grpo_trainer(tmp_path / "t", **config)
    first.attach(trainer)
    trainer.train()
    first.close()
    for ckpt, expect in (("checkpoint-1", True), ("checkpoint-2", False)):
        run = tmp_path / f"resumed-{ckpt}"
        monitor = LLDMonitor(run, detector=None)
        trainer = make_grpo_trainer(tmp_path / "t", **config)
        monitor.attach(trainer)
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            trainer.train(resume_from_checkpoint=str(tmp_path / "t" / ckpt))
        monitor.close()
        off = [w for w in said if "inside a generation batch" in str(w.message)]
        events = load_run(run).events
        recorded = events[events[C.EVENT_KIND] == "resume_off_boundary"]
        if expect:
            assert len(off) == 1 and off[0].filename == __file__, [str(w.message) for w in said]
            assert "resumes at step 1" in str(off[0].message)
            assert recorded[C.EVENT_STEP].tolist() == [1]
        else:
            assert not off and recorded.empty


def test_a_grpo_reward_function_that_raises_still_ends_the_run_log(tmp_path: Any) -> None:
    """TRL's GRPOTrainer whose reward function raises at its third call: the run log keeps the
    rows before, gets its end event naming the exception and its closed.json; the exception
    reaches the caller unchanged."""
    calls = {"n": 0}

    def flaky_reward(completions: list[str], **kwargs: Any) -> list[float]:
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("reward server unreachable")
        return [1.0 if "a" in c else 0.0 for c in completions]

    monitor = LLDMonitor(tmp_path / "run", detector=None)
    trainer = make_grpo_trainer(tmp_path / "tr", max_steps=5, reward_funcs=[flaky_reward])
    monitor.attach(trainer)
    with pytest.raises(RuntimeError, match="reward server unreachable"):
        trainer.train()
    run = load_run(tmp_path / "run")
    assert list(run.steps[C.STEP]) == [1, 2]
    ends = run.events[run.events[C.EVENT_KIND] == "end"]
    assert len(ends) == 1 and "reward server unreachable" in ends[C.EVENT_MESSAGE].iloc[0]
    assert ends[C.EVENT_SEVERITY].iloc[0] == "critical"
    assert (tmp_path / "run" / "closed.json").is_file() and monitor.closed


class _SlowSink:
    """A sink that sleeps ``sleep`` s (wall, no CPU) and spins ``spin`` s of CPU per row."""

    def __init__(self, sleep: float, spin: float) -> None:
        self.sleep, self.spin = sleep, spin

    def log_step(self, row: dict[str, Any]) -> None:
        import time

        time.sleep(self.sleep)
        end = time.process_time() + self.spin
        while time.process_time() < end:
            pass

    def alert(self, alert: Alert) -> None:
        pass

    def close(self) -> None:
        pass


def test_hook_accounting_counts_wall_and_cpu_time_of_the_monitor(tmp_path: Any) -> None:
    """Work the monitor does for a row (here a sink's) is charged to its hooks: its wall time to
    ``hook_seconds``, its CPU time to ``hook_cpu_seconds`` (a sleep costs no CPU)."""
    import time

    monitor = LLDMonitor(tmp_path / "run", sinks=[_SlowSink(sleep=0.1, spin=0.05)])
    trainer = make_grpo_trainer(tmp_path / "tr", max_steps=3, steps_per_generation=2)
    monitor.attach(trainer)
    c0 = time.process_time()
    trainer.train()
    cpu = time.process_time() - c0
    adapter = monitor.adapter
    assert adapter.hook_seconds >= 3 * (0.1 + 0.05)  # three rows, each slept and spun
    assert 3 * 0.05 <= adapter.hook_cpu_seconds <= cpu  # spun, and within the process's CPU
    assert adapter.hook_cpu_seconds < adapter.hook_seconds - 0.2  # the 0.3 s slept: no CPU


def test_report_to_wandb_with_a_wandb_sink_logs_each_lld_column_once(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TRL with report_to="wandb" logs the mirrored columns as train/lld/<column>; the monitor's
    WandbSink used to log them again as lld/<column>. Now each column reaches W&B once."""
    wandb = pytest.importorskip("wandb")
    from test_sinks import _history, _wandb_records

    from lld_monitor.sinks import WandbSink

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_PROJECT", "lld-test")
    if wandb.run is not None:  # (a run another test left active would take TRL's rows)
        wandb.finish()
    sink = WandbSink()
    monitor = LLDMonitor(tmp_path / "run", sinks=[sink], detector=None)
    tr = make_grpo_trainer(tmp_path / "tr", max_steps=2, report_to="wandb")
    monitor.attach(tr)
    assert C.ACCURACY in sink.skip_columns  # (mirrored by the adapter into TRL's logs)
    try:
        tr.train()
        assert wandb.run is not None
        run_dir = Path(wandb.run.dir).parent
    finally:
        wandb.finish()
    keys = {k for row in _history(_wandb_records(run_dir)) for k in row}
    trl_lld = {k[len("train/lld/") :] for k in keys if k.startswith("train/lld/")}
    ours = {k[len("lld/") :] for k in keys if k.startswith("lld/")}
    assert C.ACCURACY in trl_lld and C.REWARD_MEAN in ours  # both logged, TRL's and ours
    assert not trl_lld & ours, sorted(trl_lld & ours)


def reward_one_in_five(completions: list[str], **kwargs: Any) -> list[float]:
    """1 for about one completion in five (by a hash of its text), else 0: a 20%-accuracy run."""
    import zlib

    return [1.0 if zlib.crc32(str(c).encode()) % 5 == 0 else 0.0 for c in completions]


def test_the_probe_measures_correct_responses_whenever_the_batch_has_one(tmp_path: Any) -> None:
    """At ~20% accuracy with probe_fraction 0.25 (2 of 8 completions probed), every step whose
    batch has a correct response gets the displacement columns: the probe takes correct
    responses first (it sampled at random, and most steps then probed none)."""
    monitor = LLDMonitor(tmp_path / "run", probe_fraction=0.25, detector=None)
    tr = make_grpo_trainer(
        tmp_path / "tr",
        max_steps=10,
        per_device_train_batch_size=8,
        reward_funcs=[reward_one_in_five],
    )
    monitor.attach(tr)
    tr.train()
    run = load_run(tmp_path / "run")
    steps = run.steps.set_index(C.STEP)
    with_correct = steps[steps[C.ACCURACY] > 0]
    assert 0.05 < steps[C.ACCURACY].mean() < 0.5 and len(with_correct) >= 3, steps[C.ACCURACY]
    assert with_correct[C.DELTA_CORRECT].notna().all(), with_correct[[C.ACCURACY, C.DELTA_CORRECT]]
    assert (with_correct[C.N_CORRECT] >= 1).all()
    # the incorrect columns stay measured: one place is kept for an incorrect response
    assert steps[C.DELTA_INCORRECT].notna().all()
    # a batch with no correct response says why, once
    none = steps[steps[C.ACCURACY] == 0]
    said = run.events[run.events[C.EVENT_KIND].astype(str).str.startswith("probe_no_correct")]
    assert len(said) == (1 if len(none) else 0)


def test_probe_rows_by_hand() -> None:
    from lld_monitor.metrics import probe_rows

    c = torch.tensor([False, True, False, False, True, False, True, False])
    g = torch.Generator().manual_seed(0)
    rows = probe_rows(c, 2, g)
    assert rows.tolist() == sorted(rows.tolist()) and len(rows) == 2
    assert c[rows].tolist().count(True) == 1  # one correct, one place kept for an incorrect
    assert c[probe_rows(c, 4, g)].tolist().count(True) == 3  # every correct one within n
    assert c[probe_rows(c, 8, g)].tolist().count(True) == 3  # the whole batch
    assert probe_rows(torch.ones(3, dtype=torch.bool), 2, g).tolist() in ([0, 1], [0, 2], [1, 2])
    assert probe_rows(torch.zeros(3, dtype=torch.bool), 5, g).tolist() == [0, 1, 2]
    assert c[probe_rows(c, 1, g)].tolist() == [True]  # n = 1: the correct one


def test_an_update_that_does_nothing_is_a_critical_alert(tmp_path: Any) -> None:
    """Learning rate 0 on a real GRPOTrainer: the probe sees no log-prob move while the loss
    and the gradient are not 0; on the third probed step the live detector raises the critical
    ``no_update`` alert, and analyze says the same post hoc. A normal run gets none."""
    from lld_monitor.analysis import analyze_run

    monitor = LLDMonitor(tmp_path / "run", probe_fraction=0.5)
    tr = make_grpo_trainer(tmp_path / "tr", max_steps=4, learning_rate=0.0)
    monitor.attach(tr)
    tr.train()
    run = load_run(tmp_path / "run")
    steps = run.steps
    assert steps[C.PROBE_STILL].tolist() == [1.0] * 4
    # the third step whose update was asked to do something (a loss or a gradient)
    asked = steps[(steps[C.LOSS] != 0) | (steps[C.GRAD_NORM] > 0)][C.STEP].tolist()
    assert len(asked) >= 3, steps
    alerts = run.events[run.events[C.EVENT_TYPE] == "alert"]
    hit = alerts[alerts[C.EVENT_KIND] == "no_update"]
    assert hit[C.EVENT_STEP].tolist() == [asked[2]]
    assert hit[C.EVENT_SEVERITY].tolist() == ["critical"]
    post = [a for a in analyze_run(tmp_path / "run").alerts if a.kind == "no_update"]
    assert [a.step for a in post] == [asked[2]]
    ok = LLDMonitor(tmp_path / "ok", probe_fraction=0.5)
    tr = make_grpo_trainer(tmp_path / "tr2", max_steps=4)
    ok.attach(tr)
    tr.train()
    run = load_run(tmp_path / "ok")
    assert run.steps[C.PROBE_STILL].tolist() == [0.0] * 4
    assert "no_update" not in run.events[C.EVENT_KIND].tolist()


class _SamplerMetrics(TrainerCallback):
    """Appends TRL's sampler-vs-trainer metric as TRL does when it samples with vLLM (this test
    has no vLLM): an importance-sampling ratio mean of ``ratio`` every step."""

    def __init__(self, trainer: Any, ratio: float) -> None:
        self.trainer, self.ratio = trainer, ratio

    def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        key = "sampling/importance_sampling_ratio/mean"
        self.trainer._metrics["train"][key].append(self.ratio)


@pytest.mark.parametrize(("ratio", "alerted"), [(0.57, True), (0.99, False)])
def test_trls_sampler_metrics_reach_the_row_and_the_mismatch_check(
    tmp_path: Any, ratio: float, alerted: bool
) -> None:
    monitor = LLDMonitor(tmp_path / "run")
    tr = make_grpo_trainer(tmp_path / "tr", max_steps=4)
    tr.add_callback(_SamplerMetrics(tr, ratio))
    monitor.attach(tr)
    tr.train()
    run = load_run(tmp_path / "run")
    assert run.steps[C.IS_RATIO_MEAN].tolist() == [ratio] * 4
    kinds = run.events[run.events[C.EVENT_TYPE] == "alert"][C.EVENT_KIND].tolist()
    assert ("sampler_mismatch" in kinds) == alerted, kinds


def test_sampler_logps_padded_with_zero_are_flagged(tmp_path: Any) -> None:
    from lld_monitor.metrics import zero_padded_share

    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    assert zero_padded_share(torch.tensor([[0.0, 0.0, -1.0, 0.0], [0.0, -2.0, 0, 0]]), mask) == 0.6
    assert math.isnan(zero_padded_share(torch.zeros(1, 2), torch.zeros(1, 2)))
    monitor = LLDMonitor(tmp_path / "run", detector=None)
    tr = make_grpo_trainer(tmp_path / "tr", max_steps=1)
    monitor.attach(tr)
    out = {
        "completion_mask": mask,
        "sampling_per_token_logps": torch.zeros(2, 4),
        "old_per_token_logps": torch.full((2, 4), -1.5),
    }
    with pytest.warns(UserWarning, match="padded with 0.0"):
        monitor.adapter._check_sampler_logps(out)
    monitor.adapter._check_sampler_logps(out)  # said once
    tr.train()
    events = load_run(tmp_path / "run").events
    said = events[events[C.EVENT_KIND] == "sampler_zero_padded"]
    assert len(said) == 1 and said[C.EVENT_SEVERITY].iloc[0] == "critical"


def test_tool_feedback_is_not_read_as_padded_sampler_logps(tmp_path: Any) -> None:
    """Tool feedback (tool_mask 0) was not sampled: its sampler log-prob is 0.0 by rule (the toy
    and TRL's tool loop write it so) while the trainer computes one. Only generated tokens count:
    a toy run whose feedback was two thirds of its completion tokens was flagged critical."""
    monitor = LLDMonitor(tmp_path / "run", detector=None)
    tr = make_grpo_trainer(tmp_path / "tr", max_steps=1)
    monitor.attach(tr)
    tool = torch.tensor([[1, 0, 0, 0, 0, 1], [1, 1, 0, 0, 0, 0]])  # 1: generated
    sampled = torch.where(tool.bool(), -0.7, 0.0)  # real on generated tokens, 0.0 on feedback
    out = {
        "completion_mask": torch.ones(2, 6, dtype=torch.long),
        "tool_mask": tool,
        "sampling_per_token_logps": sampled,
        "old_per_token_logps": torch.full((2, 6), -1.5),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no 'padded with 0.0' warning)
        monitor.adapter._check_sampler_logps(out)
    out["sampling_per_token_logps"] = torch.zeros(2, 6)  # padded on the generated ones too
    with pytest.warns(UserWarning, match="padded with 0.0"):
        monitor.adapter._check_sampler_logps(out)
    monitor.close()


def test_llds_on_without_batch_reuse_gets_the_inert_warning_with_its_reason(tmp_path: Any) -> None:
    """num_iterations=1 and one update per generation batch: LLDS is on and identically 0. The
    live detector says so after 20 steps with the reason the row gives (its gate never fired:
    no reuse or nothing displaced), and analyze says the same from the run log."""
    from lld_monitor.analysis import analyze_run

    monitor = LLDMonitor(tmp_path / "run", llds=LLDSConfig(lam=0.2))
    with pytest.warns(UserWarning):  # (the attach-time check: LLDS cannot act)
        tr = make_grpo_trainer(tmp_path / "tr", max_steps=20, reward_funcs=[reward_length])
        monitor.attach(tr)
    tr.train()
    run = load_run(tmp_path / "run")
    assert (run.steps[C.LLDS_ENABLED] == 1).all() and (run.steps[C.LLDS_LOSS] == 0).all()
    alerts = run.events[run.events[C.EVENT_TYPE] == "alert"]
    hit = alerts[alerts[C.EVENT_KIND] == "llds_inert"]
    assert hit[C.EVENT_STEP].tolist() == [20]
    assert "either the generation batch is not reused" in hit[C.EVENT_MESSAGE].iloc[0]
    post = [a for a in analyze_run(tmp_path / "run").alerts if a.kind == "llds_inert"]
    assert [(a.step, a.evidence["reason"]) for a in post] == [(20, "gate_never_fires")]


def test_the_llds_watchdog_backs_off_in_a_live_grpo_run(tmp_path: Any) -> None:
    """The watchdog's back-off through a real GRPOTrainer (issue 51, item 2): the batch is
    reused (num_iterations=2: the gate acts, and each batch's reward is logged on both of its
    steps), LLDS is switched on at step 16 at lambda 0.16, and from then on the reward is cut
    to a quarter: a stand-in for a lambda that stalls learning (the watchdog's test reads the
    fall after LLDS went on with the gate acting; why the reward fell it cannot tell, by
    design). Once 16 rewards have been measured since (31 steps: a repeated batch reward
    counts once) it halves lambda in the live loss (the llds_lambda column), an intervention
    event with its numbers."""
    first_half = set("a b c d e f g h i j k l m".split())
    cut = {"on": False}

    def reward_first_half(completions: list[str], **kwargs: Any) -> list[float]:
        # the share of a completion's words from the first half of the alphabet: varies
        # within every group, so the advantages are not all 0
        out = [
            sum(w in first_half for w in c.split()) / max(len(c.split()), 1) for c in completions
        ]
        return [r * (0.25 if cut["on"] else 1.0) for r in out]

    class SwitchOn(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == 16:
                monitor.llds.enable(0.16, reason="test: a lambda too large for this run")
                cut["on"] = True

    trainer = make_grpo_trainer(
        tmp_path / "tr",
        max_steps=60,
        num_iterations=2,
        reward_funcs=[reward_first_half],
        callbacks=[SwitchOn()],
        disable_tqdm=True,
    )
    monitor = LLDMonitor(tmp_path / "run", detector=None, llds_watchdog=True)
    monitor.attach(trainer)
    trainer.train()
    monitor.close()
    run = load_run(tmp_path / "run")
    inter = run.events[run.events[C.EVENT_TYPE] == "intervention"]
    assert inter[C.EVENT_KIND].tolist() == ["llds_enable", "llds_enable"]
    lowered = inter.iloc[1]
    msg = lowered[C.EVENT_MESSAGE]
    assert "llds_watchdog" in msg and "0.16 -> 0.08" in msg and "over the last 16" in msg, msg
    # a batch is generated at steps 1, 3, 5, ... and its reward logged on its two steps: the
    # 16th reward measured after LLDS went on (end of step 16) is the batch of step 47
    assert lowered[C.EVENT_STEP] == 47, inter[C.EVENT_STEP].tolist()
    steps = run.steps.set_index(C.STEP)
    assert (steps.loc[17:47, C.LLDS_LOSS] > 0).any()  # the gate acted before the back-off
    assert steps.loc[30, C.LLDS_LAMBDA] == pytest.approx(0.16)
    assert steps.loc[55, C.LLDS_LAMBDA] == pytest.approx(0.08)  # the live loss's lambda
