"""LLDMonitor on a plain transformers Trainer (tiny causal LM), and the W&B sink end to end."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from lld_grpo_script import PROMPTS, build_tokenizer
from transformers import Trainer, TrainerCallback, TrainingArguments

from lld_monitor import LLDMonitor, load_run
from lld_monitor import columns as C
from lld_monitor.integrations.transformers import check_trainer_internals
from lld_monitor.toy.tiny import build_tiny_model


class _Texts(torch.utils.data.Dataset):
    def __init__(self, tok: Any) -> None:
        enc = tok(PROMPTS, padding="max_length", max_length=4, truncation=True)
        self.ids = torch.tensor(enc["input_ids"])

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class _PreClipNorm(TrainerCallback):
    """Independent check: the global grad norm right before the optimizer step (post-clip)."""

    def __init__(self, model: Any) -> None:
        self.model, self.norms = model, []

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        grads = [
            p.grad.detach().double().norm() for p in self.model.parameters() if p.grad is not None
        ]
        self.norms.append(float(torch.stack(grads).norm()))


def _trainer(tmp: Path, max_grad_norm: float, callbacks: list[Any] | None = None) -> Trainer:
    tok = build_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=1)
    args = TrainingArguments(
        output_dir=str(tmp),
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        max_steps=3,
        learning_rate=1e-2,
        logging_steps=2,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=0,
        max_grad_norm=max_grad_norm,
    )
    return Trainer(model=model, args=args, train_dataset=_Texts(tok), callbacks=callbacks)


def test_trainer_internals_unchanged() -> None:
    assert check_trainer_internals(Trainer) == []


def test_plain_trainer_rows_loss_grad_norm_lr(tmp_path: Any) -> None:
    trainer = _trainer(tmp_path / "tr", max_grad_norm=1e-3)  # tiny: every update is clipped
    norms = _PreClipNorm(trainer.model)
    trainer.add_callback(norms)
    monitor = LLDMonitor(tmp_path / "run", detector=None, strict=True).attach(trainer)
    trainer.train()

    run = load_run(tmp_path / "run")
    steps = run.steps.set_index(C.STEP)
    assert list(steps.index) == [1, 2, 3]
    logged = {h["step"]: h for h in trainer.state.log_history if "loss" in h and "grad_norm" in h}
    assert sorted(logged) == [2]  # logging_steps=2
    # Pre-clip norm of each update = what the Trainer logs; after clipping it is max_grad_norm.
    assert steps.loc[2, C.GRAD_NORM] == pytest.approx(logged[2]["grad_norm"], rel=1e-6)
    assert all(n == pytest.approx(1e-3, rel=1e-3) for n in norms.norms)
    assert (steps[C.GRAD_NORM] > 1e-2).all()  # recorded before clipping
    assert steps.loc[2, C.LEARNING_RATE] == pytest.approx(logged[2]["learning_rate"])
    lrs = steps[C.LEARNING_RATE].tolist()  # linear decay from 1e-2 over 3 steps
    assert lrs == pytest.approx([1e-2, 1e-2 * 2 / 3, 1e-2 / 3])
    # Per-step loss: with logging every 2 steps the Trainer logs the mean over steps 1-2.
    assert (steps.loc[1, C.LOSS] + steps.loc[2, C.LOSS]) / 2 == pytest.approx(
        logged[2]["loss"], rel=1e-5
    )
    assert steps.loc[2, "epoch"] == pytest.approx(logged[2]["epoch"])  # whatever the Trainer logs
    assert C.DELTA_CORRECT not in steps.columns and C.REWARD_MEAN not in steps.columns
    assert run.meta["trainer"] == "transformers.Trainer"
    assert run.meta["lld_columns"] is False and C.DELTA_CORRECT in run.meta["lld_columns_absent"]
    assert run.finished and monitor.closed


def test_wandb_offline_run_gets_the_rows_and_alerts(tmp_path: Any, monkeypatch: Any) -> None:
    from lld_monitor import sinks

    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    from lld_monitor.events import Alert

    class OneAlert:
        phase = "healthy"

        def update(self, row: dict[str, Any]) -> list[Alert]:
            if row[C.STEP] == 2:
                return [Alert(2, "stagnation", "warning", "flat likelihood", {"slope": 0.0})]
            return []

    from test_sinks import _alerts, _history, _wandb_records  # engineer B's .wandb reader

    run = wandb.init(project="lld-test", dir=str(tmp_path))
    run_dir = Path(run.dir).parent
    sink = sinks.WandbSink(run, step_mode="step")
    monitor = LLDMonitor(tmp_path / "run", sinks=[sink], detector=OneAlert(), strict=True)
    for step in (1, 2, 3):
        monitor.end_step(step=step, **{C.GRAD_NORM: float(step)})
    monitor.close()
    run.finish()
    records = _wandb_records(run_dir)
    history = _history(records)
    assert [h["_step"] for h in history] == [1, 2, 3]
    assert [h["lld/" + C.GRAD_NORM] for h in history] == [1.0, 2.0, 3.0]
    ((title, text),) = [(a[0], a[1]) for a in _alerts(records)]
    assert title == "lld_monitor alert: stagnation"
    assert text.startswith("LLD Phase I (stagnation) at step 2: flat likelihood (do now: switch ")
    assert text.endswith("\nevidence: flat likelihood")


class _RaiseAtStep(TrainerCallback):
    """Raises inside training at the start of step ``at`` (as a broken reward function would)."""

    def __init__(self, at: int, exc: BaseException) -> None:
        self.at, self.exc = at, exc

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step + 1 == self.at:
            raise self.exc


@pytest.mark.parametrize(
    "exc", [ValueError("reward function failed"), KeyboardInterrupt()], ids=["error", "ctrl-c"]
)
def test_a_trainer_that_raises_still_ends_the_run_log(tmp_path: Any, exc: BaseException) -> None:
    """The run folder gets its end event naming the exception and its closed.json, the rows
    written before the failure stay, and the exception reaches the caller unchanged."""
    trainer = _trainer(tmp_path / "tr", max_grad_norm=1.0, callbacks=[_RaiseAtStep(3, exc)])
    monitor = LLDMonitor(tmp_path / "run", detector=None).attach(trainer)
    with pytest.raises(type(exc)):
        trainer.train()
    run = load_run(tmp_path / "run")
    assert list(run.steps[C.STEP]) == [1, 2]
    ends = run.events[run.events[C.EVENT_KIND] == "end"]
    assert len(ends) == 1 and type(exc).__name__ in ends[C.EVENT_MESSAGE].iloc[0]
    assert ends[C.EVENT_SEVERITY].iloc[0] == "critical"
    assert run.finished and monitor.closed
    assert (tmp_path / "run" / "closed.json").is_file()


class _SigtermAtStep(TrainerCallback):
    """Sends this process SIGTERM at the start of step ``at`` (as a scheduler's stop would)."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step + 1 == self.at:
            import os
            import signal

            os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_ends_the_run_log_and_still_ends_the_process(tmp_path: Any) -> None:
    """SIGTERM with no handler of the user's: the run log gets its end event naming the signal
    and its closed.json, and the process still ends (exit status 143, as by the signal)."""
    import signal

    before = signal.getsignal(signal.SIGTERM)
    trainer = _trainer(tmp_path / "tr", max_grad_norm=1.0, callbacks=[_SigtermAtStep(3)])
    monitor = LLDMonitor(tmp_path / "run", detector=None).attach(trainer)
    with pytest.raises(SystemExit) as ended:
        trainer.train()
    assert ended.value.code == 143
    run = load_run(tmp_path / "run")
    assert list(run.steps[C.STEP]) == [1, 2]
    ends = run.events[run.events[C.EVENT_KIND] == "end"]
    assert len(ends) == 1 and "terminated by SIGTERM" in ends[C.EVENT_MESSAGE].iloc[0]
    assert (tmp_path / "run" / "closed.json").is_file() and monitor.closed
    assert signal.getsignal(signal.SIGTERM) == before  # the handler is the caller's again


def test_sigterm_goes_to_the_users_own_handler(tmp_path: Any) -> None:
    """A handler the user set before train() gets the signal (never swallowed); when it lets
    training go on, the run ends normally."""
    import signal

    got: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
    try:
        trainer = _trainer(tmp_path / "tr", max_grad_norm=1.0, callbacks=[_SigtermAtStep(2)])
        LLDMonitor(tmp_path / "run", detector=None).attach(trainer)
        trainer.train()
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert got == [signal.SIGTERM]
    run = load_run(tmp_path / "run")
    assert run.finished and len(run.steps) == trainer.state.global_step
