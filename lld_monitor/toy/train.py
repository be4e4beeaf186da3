"""GRPO on the toy tool-using task through TRL's GRPOTrainer, on CPU, seeded, with a progress bar.

The generation batch is reused for several optimizer updates (``steps_per_generation`` mini-
batches times ``num_iterations`` passes, with ``gradient_accumulation_steps = 1``), as in the
paper's setting, so ``pi_theta != pi_old`` after the first update and LLDS can act.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from lld_monitor.toy.model import build_toy_model, build_toy_tokenizer
from lld_monitor.toy.rollout import RolloutConfig, ToolRolloutFunc
from lld_monitor.toy.sft import SFTConfig, evaluate_policy, warm_start
from lld_monitor.toy.task import KnowledgeBase, Retriever, ToyTaskConfig, exact_match


@dataclass(frozen=True)
class ToyGRPOConfig:
    """One toy GRPO run. ``steps`` counts optimizer updates (the trainer's global steps)."""

    steps: int = 64
    seed: int = 0
    learning_rate: float = 2e-4
    num_generations: int = 5  # G, as in the paper
    prompts_per_update: int = 2  # mini-batch = prompts_per_update * G rows
    steps_per_generation: int = 4  # mini-batches per rollout batch
    num_iterations: int = 2  # passes over each rollout batch
    beta: float = 0.0  # KL to the reference (the paper: 0.001; 0 skips the reference forward)
    epsilon: float = 0.2
    temperature: float = 1.0
    max_grad_norm: float = 1.0
    zero_negative_advantages: bool = False  # ablation: drop gradients of A < 0 responses
    hidden_size: int = 64
    num_layers: int = 2
    extra_vocab: int = 0  # unused filler words (a long tail for probability to spill into)
    threads: int = 1  # torch CPU threads (a tiny model is fastest on one; 0 leaves torch's)
    task: ToyTaskConfig = field(default_factory=ToyTaskConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if self.num_generations < 2:
            raise ValueError("num_generations must be >= 2 (GRPO needs groups)")
        if self.prompts_per_update < 1 or self.steps_per_generation < 1 or self.num_iterations < 1:
            raise ValueError(
                "prompts_per_update, steps_per_generation and num_iterations must be >= 1"
            )

    @property
    def updates_per_rollout(self) -> int:
        """Optimizer updates made on each rollout batch."""
        return self.steps_per_generation * self.num_iterations

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ToySetup:
    """The task, retriever, tokenizer and warm-started policy of one run."""

    kb: KnowledgeBase
    retriever: Retriever
    tokenizer: Any
    model: Any
    sft_losses: list[float]
    start_eval: dict[str, float]


def set_threads(n: int) -> None:
    """Use ``n`` torch CPU threads (0: leave torch's default)."""
    if n > 0:
        torch.set_num_threads(n)


def seed_everything(seed: int) -> None:
    """Seed Python, torch and transformers."""
    from transformers import set_seed

    random.seed(seed)
    torch.manual_seed(seed)
    set_seed(seed)


def build_setup(cfg: ToyGRPOConfig, *, progress: bool = True) -> ToySetup:
    """Generate the task, build the tokenizer and model, warm-start it, and measure it."""
    set_threads(cfg.threads)
    seed_everything(cfg.seed)
    kb = KnowledgeBase.generate(cfg.task)
    retriever = Retriever(kb, seed=cfg.seed + 1)
    tokenizer = build_toy_tokenizer(kb, extra_words=cfg.extra_vocab)
    model = build_toy_model(
        tokenizer, hidden_size=cfg.hidden_size, num_layers=cfg.num_layers, seed=cfg.seed
    )
    sft_cfg = cfg.sft if cfg.sft.seed == cfg.seed else _with_seed(cfg.sft, cfg.seed)
    losses = warm_start(model, tokenizer, kb, retriever, sft_cfg, progress=progress)
    start = evaluate_policy(
        model,
        tokenizer,
        Retriever(kb, seed=cfg.seed + 2),
        kb.questions(),
        temperature=cfg.temperature,
        seed=cfg.seed,
        config=cfg.rollout,
    )
    return ToySetup(kb, retriever, tokenizer, model, losses, start)


def _with_seed(sft: SFTConfig, seed: int) -> SFTConfig:
    from dataclasses import replace

    return replace(sft, seed=seed)


def make_reward_func(tokenizer) -> Callable[..., list[float]]:
    """TRL reward function: exact match of the ``<answer>`` span; also logs searches per answer."""

    def exact_match_reward(
        prompts: list[Any],
        completions: list[Any],
        completion_ids: list[list[int]],
        answer: list[str],
        num_searches: Sequence[int] | None = None,
        log_metric: Callable[[str, float], None] | None = None,
        **_: Any,
    ) -> list[float]:
        rewards = [
            exact_match(tokenizer.convert_ids_to_tokens(ids), gold)
            for ids, gold in zip(completion_ids, answer)
        ]
        if log_metric is not None and num_searches is not None and len(num_searches):
            log_metric("num_searches", float(sum(num_searches)) / len(num_searches))
        return rewards

    return exact_match_reward


def make_dataset(kb: KnowledgeBase):
    """Every question of the task as a ``datasets.Dataset`` (columns prompt, answer, hops)."""
    from datasets import Dataset

    return Dataset.from_list(
        [{"prompt": q.prompt, "answer": q.answer, "hops": q.hops} for q in kb.questions()]
    )


def grpo_args(cfg: ToyGRPOConfig, output_dir: str | Path, *, progress: bool = True):
    """The ``GRPOConfig`` of a toy run (CPU, no dropout, no reports, batches reused)."""
    from trl import GRPOConfig

    rows = cfg.prompts_per_update * cfg.num_generations
    return GRPOConfig(
        output_dir=str(output_dir),
        max_steps=cfg.steps,
        per_device_train_batch_size=rows,
        gradient_accumulation_steps=1,
        steps_per_generation=cfg.steps_per_generation,
        num_iterations=cfg.num_iterations,
        num_generations=cfg.num_generations,
        learning_rate=cfg.learning_rate,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=cfg.max_grad_norm,
        beta=cfg.beta,
        epsilon=cfg.epsilon,
        temperature=cfg.temperature,
        loss_type="grpo",
        max_completion_length=cfg.rollout.max_completion_tokens,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_dropout=True,
        seed=cfg.seed,
        data_seed=cfg.seed,
        dataloader_num_workers=0,
        disable_tqdm=not progress,
        bf16=False,
    )


def make_trainer(
    cfg: ToyGRPOConfig,
    setup: ToySetup,
    output_dir: str | Path,
    *,
    callbacks: Sequence[Any] = (),
    progress: bool = True,
):
    """A ``GRPOTrainer`` on the toy task with the multi-turn ``rollout_func``."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from trl import GRPOTrainer

    rollout = ToolRolloutFunc(setup.tokenizer, setup.retriever, config=cfg.rollout, seed=cfg.seed)
    trainer_cls = no_negative_trainer_class() if cfg.zero_negative_advantages else GRPOTrainer
    kwargs = dict(
        model=setup.model,
        reward_funcs=[make_reward_func(setup.tokenizer)],
        args=grpo_args(cfg, output_dir, progress=progress),
        train_dataset=make_dataset(setup.kb),
        processing_class=setup.tokenizer,
        rollout_func=rollout,
        callbacks=list(callbacks) or None,
    )
    if cfg.beta > 0:
        trainer = _with_reference_copy(trainer_cls, setup.model, kwargs)
    else:
        trainer = trainer_cls(**kwargs)
    trainer.toy_rollout = rollout  # the latest rollouts, for tests and inspection
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    if progress:
        trainer.add_callback(_progress_callback())
    return trainer


def _with_reference_copy(trainer_cls, model, kwargs: dict[str, Any]):
    """Build the trainer with a KL reference equal to ``model`` as it is now (the warm start).

    With ``beta > 0`` TRL loads the reference from the policy's ``config._name_or_path``; a toy
    policy is built from a config and has none, so save it to a temporary folder, point the
    config there while the trainer loads it, and restore the name."""
    import tempfile

    old_name = getattr(model.config, "_name_or_path", "")
    with tempfile.TemporaryDirectory(prefix="lld_toy_ref_") as tmp:
        model.save_pretrained(tmp)
        model.config._name_or_path = tmp
        try:
            return trainer_cls(**kwargs)
        finally:
            model.config._name_or_path = old_name


def _progress_callback():
    """A tqdm bar over optimizer steps showing the latest reward and searches (no log spam)."""
    from tqdm.auto import tqdm
    from transformers import TrainerCallback

    class ToyProgress(TrainerCallback):
        def __init__(self) -> None:
            self.bar = None
            self.post: dict[str, str] = {}

        def on_train_begin(self, args, state, control, **kwargs):
            self.bar = tqdm(total=state.max_steps, desc="GRPO", unit="step", leave=False)

        def on_step_end(self, args, state, control, **kwargs):
            if self.bar is not None:
                self.bar.update(state.global_step - self.bar.n)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if self.bar is not None and logs and "reward" in logs:
                self.post["reward"] = f"{logs['reward']:.2f}"
                if "num_searches" in logs:
                    self.post["searches"] = f"{logs['num_searches']:.2f}"
                self.bar.set_postfix(self.post)

        def on_train_end(self, args, state, control, **kwargs):
            if self.bar is not None:
                self.bar.close()

    return ToyProgress()


def no_negative_trainer_class():
    """A GRPOTrainer subclass whose loss ignores responses with negative advantage (ablation)."""
    from trl import GRPOTrainer

    class _NoNegGRPOTrainer(GRPOTrainer):
        """GRPO without negative-advantage gradients: tells LLD from generic instability."""

        def _compute_loss(self, model, inputs):
            inputs = dict(inputs)
            inputs["advantages"] = inputs["advantages"].clamp(min=0.0)  # [B] (or [B, T])
            return super()._compute_loss(model, inputs)

    return _NoNegGRPOTrainer


def train_toy(
    cfg: ToyGRPOConfig,
    output_dir: str | Path | None = None,
    *,
    attach: Callable[[Any], Any] | None = None,
    progress: bool = True,
    setup: ToySetup | None = None,
) -> dict[str, Any]:
    """Warm-start, train with GRPO, evaluate; ``attach(trainer)`` hooks a monitor in.

    ``output_dir`` is the trainer's scratch folder (nothing is saved; default: a temp folder).
    Returns the start and final sampled accuracy, searches per answer, and wall times.
    """
    import tempfile

    t0 = time.time()
    set_threads(cfg.threads)
    setup = setup or build_setup(cfg, progress=progress)
    t_sft = time.time() - t0
    with tempfile.TemporaryDirectory(prefix="lld_toy_") as tmp:
        trainer = make_trainer(cfg, setup, output_dir or tmp, progress=progress)
        if attach is not None:
            attach(trainer)
        trainer.train()
    final = evaluate_policy(
        setup.model,
        setup.tokenizer,
        Retriever(setup.kb, seed=cfg.seed + 2),
        setup.kb.questions(),
        temperature=cfg.temperature,
        seed=cfg.seed,
        config=cfg.rollout,
    )
    return {
        "start_eval": setup.start_eval,
        "final_eval": final,
        "sft_seconds": round(t_sft, 1),
        "wall_seconds": round(time.time() - t0, 1),
        "log_history": trainer.state.log_history,
    }


LLDS_MODES: tuple[str, ...] = ("off", "on", "auto")


def preset_configs(steps: int = 1000, seed: int = 0) -> dict[str, ToyGRPOConfig]:
    """Named configurations: ``default`` (learns, stays healthy), the two aggressive ones of the
    spiral attempt in ``sample_runs/README.md`` (vanilla GRPO collapses on both), and ``s3``, the
    gentler one of the second attempt (``scripts/spiral_sweep.py``, configuration ``d6``)."""
    from dataclasses import replace

    base = ToyGRPOConfig(steps=steps, seed=seed)
    # the second attempt's pick: 16 updates per rollout batch at lr 8e-4 (vanilla GRPO first
    # learns a little, then its reward decays over several hundred updates)
    s3 = replace(base, learning_rate=8e-4, steps_per_generation=8, num_iterations=2, beta=0.0)
    return {
        "default": base,
        # small model, 32 updates per rollout batch, high lr, no KL
        "s1-small-32upd-lr3e-3": replace(
            base, learning_rate=3e-3, steps_per_generation=8, num_iterations=4, beta=0.0
        ),
        # larger model and vocabulary (long tail), 4 random "thinking" words before each action
        # (long low-likelihood text shared by correct and incorrect responses), two-word answers
        # sharing words with distractors, 16 updates per rollout, no KL
        "s2-big-vocab-think-2word": replace(
            base,
            learning_rate=1e-3,
            steps_per_generation=8,
            num_iterations=2,
            beta=0.0,
            hidden_size=128,
            extra_vocab=1000,
            task=ToyTaskConfig(n_values=12, answer_words=2),
            sft=SFTConfig(steps=500, think_words=4),
            rollout=RolloutConfig(max_action_tokens=14, max_completion_tokens=128),
        ),
        "s3-16upd-lr8e-4": s3,
        # the third attempt's best (d7): s3 with 8 responses per prompt (rollout batches of
        # 16 prompts x 8); vanilla GRPO learns for ~2000 updates, then falls in some seeds
        "s4-16upd-lr8e-4-G8": replace(s3, num_generations=8),
    }


def monitored_run(
    cfg: ToyGRPOConfig,
    run_dir: str | Path,
    *,
    llds: str = "auto",
    lam: float = 0.2,
    progress: bool = True,
    token_samples_per_step: int = 4,
    response_samples_per_step: int = 4,
    meta: dict[str, Any] | None = None,
    setup: ToySetup | None = None,
    auto_llds_on: tuple[str, ...] | None = None,
    llds_watchdog: bool = False,
) -> dict[str, Any]:
    """A toy run with ``LLDMonitor`` attached, writing its run log to ``run_dir``.

    ``llds``: ``"off"`` (vanilla GRPO, still measured), ``"on"`` (LLDS from the first step) or
    ``"auto"`` (the monitor switches LLDS on at an alert of a kind in ``auto_llds_on``, default
    the monitor's ``AUTO_LLDS_KINDS``). Also writes
    ``toy_summary.json`` (config, start and final accuracy, wall time) into ``run_dir``.
    ``setup`` reuses a warm-started policy (it is trained in place; pass a copy to pair runs).
    ``token_samples_per_step`` and ``response_samples_per_step`` go to the monitor (both 0: a
    run log without token samples). ``llds_watchdog``: the monitor's.
    """
    import json

    from lld_monitor.llds import LLDSConfig
    from lld_monitor.monitor import AUTO_LLDS_KINDS, LLDMonitor

    if llds not in LLDS_MODES:
        raise ValueError(f"llds must be one of {LLDS_MODES}, got {llds!r}")
    run_dir = Path(run_dir)
    if (run_dir / "steps.jsonl").exists():
        raise ValueError(f"{run_dir} already holds a run; choose another folder or delete it")
    monitor = LLDMonitor(
        run_dir,
        llds=LLDSConfig(lam=lam, enabled=(llds == "on")),
        auto_llds=(llds == "auto"),
        auto_llds_on=AUTO_LLDS_KINDS if auto_llds_on is None else auto_llds_on,
        probe_fraction=1.0,
        token_samples_per_step=token_samples_per_step,
        response_samples_per_step=response_samples_per_step,
        meta={"toy_config": cfg.to_dict(), "llds_mode": llds, **(meta or {})},
        llds_watchdog=llds_watchdog,
    )
    error: BaseException | None = None
    try:
        result = train_toy(cfg, attach=monitor.attach, progress=progress, setup=setup)
    except BaseException as exc:
        error = exc
        raise
    finally:
        monitor.close(error)
    summary = {
        "llds_mode": llds,
        "seed": cfg.seed,
        "steps": cfg.steps,
        "start_eval": result["start_eval"],
        "final_eval": result["final_eval"],
        "sft_seconds": result["sft_seconds"],
        "wall_seconds": result["wall_seconds"],
        "config": cfg.to_dict(),
    }
    (run_dir / "toy_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return {**result, "run_dir": str(run_dir)}
