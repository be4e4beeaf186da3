"""Adapter for TRL's ``GRPOTrainer``: the ONLY module that touches GRPOTrainer's private internals.

What it wraps (instance attributes, restored by ``uninstall``), checked against the tested TRL
range at attach and by tests/integrations/test_trl.py::test_trl_internals_unchanged:

- ``_calculate_rewards``: the raw rewards per reward function (they never reach the loss).
- ``_generate_and_score_completions``: tags each generation batch with its rewards, the valid
  searches per completion and an id.
- ``_tool_call_loop``: TRL's tool call and failure counts of a generation (valid searches).
- ``_compute_loss`` + ``_get_per_token_logps_and_entropies`` (during ``_compute_loss`` only): the
  per-token log-probs with grad and the entropies TRL computes anyway; adds ``lam * L_LLDS``.
- ``training_step`` / ``_get_grad_norm`` (transformers Trainer, via TrainerAdapter): loss and
  pre-clip grad norm of each optimizer update.

After the last optimizer update on a generation batch, one no-grad forward over a
``probe_fraction`` sample of its completions gives the displacement columns and token samples.
"""

from __future__ import annotations

import importlib.metadata
import logging
import math
import os
from collections.abc import Callable, Mapping
from typing import Any

import torch
from packaging.version import Version
from trl import GRPOTrainer

from lld_monitor import columns as C
from lld_monitor.events import warn_user
from lld_monitor.integrations.transformers import (
    WRAPPED_TRAINER_METHODS,
    TrainerAdapter,
    check_trainer_internals,
    dropout_problem,
    signature_problems,
)
from lld_monitor.metrics import last_action_mask, probe_rows, tool_rounds, zero_padded_share

logger = logging.getLogger("lld_monitor")

#: TRL versions this adapter was tested with (GRPOTrainer internals move between minors).
TRL_MIN, TRL_MAX = Version("1.16"), Version("1.17")
TRL_TESTED_RANGE = f">={TRL_MIN},<{TRL_MAX}"
#: Set to 1 to attach to a TRL outside ``TRL_TESTED_RANGE`` at your own risk: a warning instead of
#: the refusal (the GRPOTrainer internals the adapter wraps are still checked, and a changed one
#: still stops the attach with its name).
ALLOW_UNTESTED_TRL_ENV = "LLD_MONITOR_ALLOW_UNTESTED_TRL"

#: GRPOTrainer methods we wrap, with the leading parameters we rely on.
WRAPPED_GRPO_METHODS: dict[str, tuple[str, ...]] = {
    "_calculate_rewards": ("self", "inputs", "prompts", "completions", "completion_ids_list"),
    "_generate_and_score_completions": ("self", "inputs"),
    "_tool_call_loop": (
        "self",
        "prompts",
        "prompt_ids",
        "completion_ids",
        "completions",
        "logprobs",
        "images",
        "multimodal_fields",
    ),
    "_compute_loss": ("self", "model", "inputs"),
    "_get_per_token_logps_and_entropies": (
        "self",
        "model",
        "input_ids",
        "attention_mask",
        "logits_to_keep",
        "batch_size",
        "compute_entropy",
    ),
}
#: GRPOTrainer attributes we read.
GRPO_ATTRIBUTES: tuple[str, ...] = (
    "_step",
    "_metrics",
    "num_iterations",
    "num_generations",
    "reward_func_names",
    "reward_weights",
    "loss_type",
    "beta",
    "accelerator",
    "processing_class",
)
#: Keys the adapter adds to TRL's per-batch input dicts (carried through shuffle and split).
KEY_REWARDS, KEY_REWARDS_PER_FUNC, KEY_GENERATION, KEY_SEARCHES = (
    "lld_rewards",
    "lld_rewards_per_func",
    "lld_generation",
    "lld_valid_searches",
)
#: Inputs with these keys are multimodal: the probe skips them (text-only forward).
_MULTIMODAL_KEYS = (
    "pixel_values",
    "image_grid_thw",
    "pixel_attention_mask",
    "image_sizes",
    "num_images",
)
#: Row columns mirrored into TRL's own logs as ``lld/<column>`` (so report_to carries them).
TRAINER_LOG_COLUMNS: tuple[str, ...] = (
    C.ACCURACY,
    C.GRAD_NORM_MAX,
    *C.CONFIDENCE_COLUMNS,
    *C.DISPLACEMENT_COLUMNS,
    *C.INBATCH_COLUMNS,
    *C.LLDS_COLUMNS,
)
TRAINER_LOG_PREFIX = "lld/"
#: TRL's own sampler-vs-trainer metrics (computed with vLLM and its importance-sampling
#: correction) copied into the row when the step appended new values: TRL key -> column.
TRL_SAMPLER_METRICS: dict[str, str] = {
    "sampling/importance_sampling_ratio/mean": C.IS_RATIO_MEAN,
    "sampling/sampling_logp_difference/mean": C.SAMPLER_LOGP_DIFF,
}
#: The share of generated tokens with a sampler log-prob of exactly 0.0 that reads as padding.
SAMPLER_ZERO_SHARE = 0.5


def check_trl_version(version: str | None = None) -> Version:
    """The installed (or given) TRL version; ValueError outside the tested range, unless
    ``LLD_MONITOR_ALLOW_UNTESTED_TRL=1`` (then a warning: at the user's own risk)."""
    v = Version(version if version is not None else importlib.metadata.version("trl"))
    if TRL_MIN <= v < TRL_MAX:
        return v
    what = (
        f"lld_monitor's GRPOTrainer adapter is tested with trl{TRL_TESTED_RANGE} and touches "
        f"GRPOTrainer internals that change between releases; found trl {v}"
    )
    if os.environ.get(ALLOW_UNTESTED_TRL_ENV, "").strip().lower() in ("1", "true", "yes"):
        warn_user(
            f"lld_monitor: {what}; attaching anyway ({ALLOW_UNTESTED_TRL_ENV} is set): check the "
            "logged columns against a run you trust before relying on them"
        )
        return v
    raise ValueError(
        f"{what}. Install a tested version (pip install 'trl{TRL_TESTED_RANGE}'), set "
        f"{ALLOW_UNTESTED_TRL_ENV}=1 to try this one at your own risk (the wrapped internals are "
        "still checked), or drive the monitor from your own loop with "
        "observe_rollout/observe_update/end_step (docs/monitor.md)."
    )


def check_grpo_internals(cls: type = GRPOTrainer) -> list[str]:
    """Problems with the GRPOTrainer methods we wrap (empty when TRL still fits)."""
    return check_trainer_internals(cls) + signature_problems(cls, WRAPPED_GRPO_METHODS)


def override_problems(cls: type) -> list[str]:
    """Wrapped methods a GRPOTrainer subclass overrides with parameters the adapter cannot pass.

    An override is fine when it keeps the leading parameters of GRPOTrainer's method or takes
    ``*args``; TRL's own internals are checked separately (:func:`check_grpo_internals`).
    """
    import inspect

    problems = []
    for name, params in {**WRAPPED_GRPO_METHODS, **WRAPPED_TRAINER_METHODS}.items():
        fn = getattr(cls, name, None)
        if fn is None or fn is getattr(GRPOTrainer, name, None):
            continue  # not overridden
        sig = list(inspect.signature(fn).parameters.values())
        if any(p.kind is p.VAR_POSITIONAL for p in sig):
            continue
        got = tuple(p.name for p in sig)[: len(params)]
        if got != params:
            problems.append(
                f"{cls.__name__}.{name} overrides GRPOTrainer.{name} with parameters {got}, "
                f"expected {params}"
            )
    return problems


def llds_reuse_problem(
    num_iterations: int, steps_per_generation: int, gradient_accumulation_steps: int
) -> str | None:
    """Why LLDS is identically zero in this GRPO configuration, or None when it can act.

    LLDS acts only on updates that see a batch after an earlier update moved the policy, i.e.
    when one generation batch spans several optimizer updates.
    """
    generate_every = steps_per_generation * num_iterations
    if gradient_accumulation_steps % generate_every != 0:
        return None
    return (
        f"LLDS is identically zero with num_iterations={num_iterations}, "
        f"steps_per_generation={steps_per_generation}, gradient_accumulation_steps="
        f"{gradient_accumulation_steps}: each generation batch gets a single optimizer update, "
        "so pi_theta == pi_old whenever the loss is computed. For LLDS to act, reuse the batch "
        "across updates: steps_per_generation > gradient_accumulation_steps (mini-batches, as in "
        "the paper) or num_iterations > 1 with gradient_accumulation_steps not a multiple of "
        "steps_per_generation * num_iterations."
    )


def zero_std_groups(groups: torch.Tensor) -> torch.Tensor:
    """Float [N] 1 where a prompt group's scored rewards ([N, G], NaN = unscored) are all equal.

    As TRL's ``frac_reward_zero_std``: unscored completions are left out, and a group with fewer
    than two scored completions has no standard deviation (not zero).
    """
    scored = ~torch.isnan(groups)  # [N, G]
    n = scored.sum(1)  # [N]
    filled = torch.where(scored, groups, 0.0)
    mean = filled.sum(1, keepdim=True) / n.clamp(min=1).unsqueeze(1)  # [N, 1]
    dev = torch.where(scored, (groups - mean) ** 2, 0.0).sum(1)  # [N]
    return ((n >= 2) & (dev < 1e-16)).float()


def finished_generations(
    starts: Mapping[int, int],
    step: int,
    steps_per_generation: int,
    num_iterations: int,
    *,
    final: bool = False,
) -> list[int]:
    """Ids of the generation batches that get no further optimizer update, in order.

    ``starts`` maps a generation id to TRL's micro-step counter (``GRPOTrainer._step``) when it
    was generated; ``step`` is that counter now. A batch is used for ``steps_per_generation *
    num_iterations`` micro-steps, so it is finished once ``step >= start + that``; at the last
    optimizer step (``final``) every batch is. A pure function of the counters: the same on
    every rank, so ranks agree on which batches to probe without communicating.
    """
    if steps_per_generation < 1 or num_iterations < 1:
        raise ValueError(
            f"steps_per_generation and num_iterations must be >= 1, got {steps_per_generation} "
            f"and {num_iterations}"
        )
    every = steps_per_generation * num_iterations
    return sorted(gid for gid, start in starts.items() if final or step >= start + every)


class GRPOAdapter(TrainerAdapter):
    """Full LLD monitoring of a TRL ``GRPOTrainer``; one row per optimizer step at on_step_end."""

    trainer_name = "trl.GRPOTrainer"
    lld_columns = True
    #: How many LLDS records strict mode keeps (the most recent micro-batches).
    LLDS_RECORDS_KEPT = 16
    defer_to_log = False

    def __init__(self, monitor: Any, trainer: GRPOTrainer) -> None:
        super().__init__(monitor, trainer)
        self._rpf: torch.Tensor | None = None  # [N_all, F] rewards of the last generation
        self._gens: dict[int, dict[str, Any]] = {}  # generation id -> start step, micro-batches
        self._n_gen = 0
        self._n_stepped = 0  # optimizer updates that changed the weights (lr > 0, not skipped)
        self._dropout = False  # active dropout: no in-batch displacement (noise, not updates)
        self._capture: list[Any] | None = None
        self._tool_counts: tuple[int, int] | None = None  # (calls, failures) of this generation
        self._warned: set[str] = set()
        # TRL metric -> (its list, values read): _sampler_metrics
        self._sampler_seen: dict[str, tuple[Any, int]] = {}
        self.probe_records: list[Any] = []  # the ProbeRecords of the last step (tests, drill-down)
        self.probe_inputs: list[tuple[torch.Tensor, torch.Tensor]] = []  # (ids, attention) each
        # strict mode only: inputs of the last LLDS_RECORDS_KEPT LLDS terms (tests, drill-down)
        self.llds_records: list[dict[str, Any]] = []

    def meta(self) -> dict[str, Any]:
        args, tr = self.trainer.args, self.trainer
        meta = super().meta()
        meta["trainer_config"].update(
            {
                "trl_version": importlib.metadata.version("trl"),
                "num_generations": tr.num_generations,
                "num_iterations": tr.num_iterations,
                "steps_per_generation": args.steps_per_generation,
                "loss_type": tr.loss_type,
                "beta": tr.beta,
                "reward_funcs": list(tr.reward_func_names),
            }
        )
        return meta

    def resume_checks(self, step: int) -> None:
        """A resume inside a generation batch: TRL regenerates the batch from the resumed step,
        so the run no longer follows the uninterrupted trajectory from there (warned, and
        recorded as a ``resume_off_boundary`` event)."""
        args, tr = self.trainer.args, self.trainer
        every = int(args.steps_per_generation) * int(getattr(tr, "num_iterations", 1))
        micro = step * int(args.gradient_accumulation_steps)  # TRL counts micro-batches
        if every <= 1 or micro % every == 0:
            return
        before = (micro // every) * every // int(args.gradient_accumulation_steps)
        message = (
            f"training resumes at step {step}, inside a generation batch (TRL generates a new "
            f"one every {every} micro-batches: steps_per_generation={args.steps_per_generation} "
            f"x num_iterations={getattr(tr, 'num_iterations', 1)}): TRL samples a new batch "
            f"here, so from step {step + 1} the run departs from the trajectory it would have "
            f"followed uninterrupted. Checkpoints on a batch boundary (save_steps a multiple of "
            f"{every // int(args.gradient_accumulation_steps) or 1}; the last one before this "
            f"was step {before}) resume exactly"
        )
        if self.monitor.rank == 0:
            warn_user(f"lld_monitor: {message}")
        evidence = {"step": step, "generate_every_micro_batches": every}
        self.monitor.lifecycle_event(step, "resume_off_boundary", message, "warning", evidence)

    def _no_wandb_duplicates(self, args: Any) -> None:
        """With ``report_to`` naming W&B, TRL already logs the mirrored columns
        (``TRAINER_LOG_COLUMNS``) as ``train/lld/<column>``: a ``WandbSink`` of the monitor
        then leaves them out, so no LLD column is charted twice."""
        report_to = getattr(args, "report_to", None) or []
        report_to = [report_to] if isinstance(report_to, str) else list(report_to)
        if "wandb" not in report_to and "all" not in report_to:
            return
        from lld_monitor.sinks import WandbSink

        for sink in self.monitor.sinks:
            if isinstance(sink, WandbSink):
                sink.skip_columns |= set(TRAINER_LOG_COLUMNS)
                logger.info(
                    "lld_monitor: report_to includes wandb: TRL logs %d LLD columns as "
                    "train/%s<column>; WandbSink logs the others only",
                    len(TRAINER_LOG_COLUMNS),
                    TRAINER_LOG_PREFIX,
                )

    def install(self) -> None:
        check_trl_version()
        problems = check_grpo_internals(GRPOTrainer)  # TRL's own class: the library's internals
        problems += [
            f"GRPOTrainer.{a} is missing" for a in GRPO_ATTRIBUTES if not hasattr(self.trainer, a)
        ]
        if problems:
            raise RuntimeError(
                "lld_monitor cannot hook this GRPOTrainer (TRL internals changed): "
                + "; ".join(problems)
                + f". Install trl{TRL_TESTED_RANGE}."
            )
        overrides = override_problems(type(self.trainer))
        if overrides:
            raise RuntimeError(
                f"lld_monitor cannot hook {type(self.trainer).__name__}: "
                + "; ".join(overrides)
                + ". Keep the overridden methods' leading parameters (or take *args, **kwargs) "
                "so the adapter can call them as GRPOTrainer does."
            )
        args = self.trainer.args
        self._no_wandb_duplicates(args)
        self.monitor.set_llds_reuse_problem(
            llds_reuse_problem(
                self.trainer.num_iterations,
                args.steps_per_generation,
                args.gradient_accumulation_steps,
            )
        )
        self._check_dropout()
        names = list(self.trainer.reward_func_names)
        rule = self.monitor.correctness
        rule.check_reward_names(names)
        if len(names) > 1 and not rule.explicit:
            warn_user(
                f"lld_monitor: this GRPOTrainer has {len(names)} reward functions {names} and "
                f"no correctness rule: 'correct' means the weighted total reward >= "
                f"correct_threshold={rule.threshold:g}. With a format reward beside an accuracy "
                "reward that makes every response correct (or none). Pass correct_reward="
                "'<the accuracy function>' (and correct_threshold) or correct_fn (docs/monitor.md, "
                "'What correct means')"
            )
        for name in names:  # the same on every rank, in this order
            self.monitor.add_reward_fn(name)
        self.monitor.start(trainer=self.trainer_name, lld_columns=True, **self.meta())
        # LLDS on, or auto_llds: say now (not only when the switch fires) what keeps it from acting
        self.monitor.check_llds_can_act(
            reuse_problem=self.monitor.reuse_warning, num_generations=self.trainer.num_generations
        )
        self._wrap("train", self._train)
        self._wrap("training_step", self._training_step)
        self._wrap("_get_grad_norm", self._get_grad_norm)
        self._wrap("_calculate_rewards", self._calculate_rewards)
        self._wrap("_generate_and_score_completions", self._generate_and_score)
        self._wrap("_tool_call_loop", self._tool_call_loop)
        self._wrap("_get_per_token_logps_and_entropies", self._get_logps)
        self._wrap("_compute_loss", self._compute_loss)
        self.trainer.add_callback(self.callback)
        self._installed = True

    def _check_dropout(self) -> None:
        """Warn when the model has active dropout; refuse LLDS then unless forced."""
        problem = dropout_problem(self.trainer.model)
        self._dropout = problem is not None  # the loss's log-probs carry dropout noise
        if problem is None:
            return
        monitor = self.monitor
        if monitor.llds_with_dropout:
            warn_user(f"lld_monitor: {problem}")
            return
        if monitor.llds.enabled:
            raise ValueError(
                f"lld_monitor refuses LLDS here: {problem}. Pass "
                "LLDMonitor(llds_with_dropout=True) to use it anyway"
            )
        monitor.llds.block(f"{problem} (LLDMonitor(llds_with_dropout=True) forces it)")
        extra = " auto_llds will not switch LLDS on." if monitor.auto_llds else ""
        warn_user(f"lld_monitor: {problem}.{extra}")

    # -- wrappers -----------------------------------------------------------------------------

    def _calculate_rewards(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def _calculate_rewards(
            inputs: Any, prompts: Any, completions: Any, completion_ids_list: Any
        ) -> Any:
            out = original(inputs, prompts, completions, completion_ids_list)
            self._rpf = out
            return out

        return _calculate_rewards

    def _tool_call_loop(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def _tool_call_loop(*args: Any, **kwargs: Any) -> Any:
            out = original(*args, **kwargs)
            with self.hook("tool counts"):
                # (tool_mask, completions, completion_ids, logprobs, calls, failures, images)
                self._tool_counts = (int(out[4]), int(out[5]))
            return out

        return _tool_call_loop

    def _generate_and_score(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def _generate_and_score_completions(inputs: Any) -> Any:
            self._rpf = None
            self._tool_counts = None
            out = original(inputs)
            if self.trainer.model.training and not self.monitor.closed:
                with self.hook("generation"):
                    self._tag_generation(out, len(inputs))
            return out

        return _generate_and_score_completions

    def _tag_generation(self, out: dict[str, Any], n_local: int) -> None:
        """Add local raw rewards [B], [B, F] and a generation id to TRL's batch dict."""
        tr = self.trainer
        rpf = self._rpf
        if rpf is not None:
            weights = tr.reward_weights.to(rpf.device)  # [F]
            total_all = (rpf * weights).nansum(1)  # [N_all]
            total_all = torch.where(torch.isnan(rpf).all(1), torch.nan, total_all)
            start = tr.accelerator.process_index * n_local
            out[KEY_REWARDS] = total_all[start : start + n_local]
            out[KEY_REWARDS_PER_FUNC] = rpf[start : start + n_local]
            g = tr.num_generations
            if total_all.numel() % g == 0 and g > 1 and tr.accelerator.is_main_process:
                zero = zero_std_groups(total_all.view(-1, g))  # [N_all / G]
                self.monitor.observe_groups(zero.sum(), zero.numel())
        self._check_sampler_logps(out)
        searches = None  # [B]: no tool feedback in this batch means no searches (V = 0)
        if self._tool_counts is not None or out.get("tool_mask") is not None:
            searches = self._valid_searches(out)  # [B]
            out[KEY_SEARCHES] = searches  # logged (num_searches) only when tools are in play
        gid = self._n_gen
        self._n_gen += 1
        out[KEY_GENERATION] = torch.tensor(gid)  # 0-dim CPU: survives shuffle/split, no sync
        self._gens[gid] = {"start": tr._step, "micro": {}, "searches": searches}

    def _valid_searches(self, out: dict[str, Any]) -> torch.Tensor:
        """Float [B] valid searches per completion of this rank's generation batch.

        With TRL tools: (tool calls - failed calls) / completions, TRL's counts (per batch, so
        every row holds the batch mean). Otherwise (no tools, or a rollout_func's env_mask): the
        tool rounds of each row, actions - 1 (0 without tool feedback).
        """
        mask = out["completion_mask"]  # [B, T]
        if self._tool_counts is not None:
            calls, failures = self._tool_counts
            n = max(mask.shape[0], 1)
            return torch.full((mask.shape[0],), (calls - failures) / n, device=mask.device)
        if out.get("tool_mask") is not None:
            mask = mask * out["tool_mask"]  # [B, T] generated tokens only
        return tool_rounds(mask)  # [B]

    def _get_logps(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def _get_per_token_logps_and_entropies(*args: Any, **kwargs: Any) -> Any:
            out = original(*args, **kwargs)
            if self._capture is not None:
                self._capture.append(out)
            return out

        return _get_per_token_logps_and_entropies

    def _compute_loss(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def _compute_loss(model: Any, inputs: dict[str, Any]) -> torch.Tensor:
            if not self.trainer.model.training or self.monitor.closed:
                return original(model, inputs)
            self._capture = []
            try:
                loss = original(model, inputs)
            finally:
                captured, self._capture = self._capture, None
            with self.hook("GRPO loss hook"):
                loss = self._after_loss(inputs, captured, loss)
            return loss

        return _compute_loss

    def _after_loss(
        self, inputs: dict[str, Any], captured: list[Any], loss: torch.Tensor
    ) -> torch.Tensor:
        """Observe one micro-batch from TRL's own tensors; add ``lam * L_LLDS / GA`` if enabled."""
        if not captured:
            cls = type(self.trainer)
            if cls._compute_loss is not GRPOTrainer._compute_loss:
                raise RuntimeError(
                    f"{cls.__name__}._compute_loss (an override of GRPOTrainer's) did not call "
                    "self._get_per_token_logps_and_entropies: the monitor reads the per-token "
                    "log-probs from that call (LLD columns and LLDS need them)"
                )
            raise RuntimeError(
                "GRPOTrainer._compute_loss no longer calls _get_per_token_logps_and_entropies; "
                f"TRL internals changed (tested: trl{TRL_TESTED_RANGE})"
            )
        logps, entropies = captured[0][0], captured[0][1]  # [B, T] with grad, [B, T]
        mask = inputs["completion_mask"]  # [B, T]
        if inputs.get("tool_mask") is not None:
            mask = mask * inputs["tool_mask"]  # tool feedback out
        old = inputs.get("old_per_token_logps")
        reused = old is not None  # a batch trained on for several updates
        # TRL skips old logps exactly when no update happened since generation: current == old.
        old = logps.detach() if old is None else old  # [B, T]
        adv = inputs["advantages"]  # [B] or [B, T]
        kl = None
        if inputs.get("ref_per_token_logps") is not None:
            d = inputs["ref_per_token_logps"] - logps.detach()
            kl = torch.exp(d) - d - 1  # [B, T], TRL's k3 estimator
        searches = inputs.get(KEY_SEARCHES)  # [B] or None
        self.monitor.observe_rollout(
            old,
            mask,
            rewards=inputs.get(KEY_REWARDS),
            advantages=adv,
            token_ids=inputs["completion_ids"],
            entropy=entropies,
            num_searches=searches,
            kl=kl,
            rewards_per_func=self._per_func(inputs.get(KEY_REWARDS_PER_FUNC)),
            truncated=self._truncated(inputs),
        )
        gen_tag = inputs.get(KEY_GENERATION)
        gen = self._gens.get(int(gen_tag)) if gen_tag is not None else None
        if gen is not None:
            gen["micro"].setdefault(id(inputs), (inputs, old.detach()))
            if reused:
                self._in_batch(gen, id(inputs), logps)
        if self.monitor.llds.enabled:
            loss = loss + self._llds(logps, old, adv, mask, gen, searches)
        return loss

    def _truncated(self, inputs: dict[str, Any]) -> torch.Tensor | None:
        """[B] bool, TRL's own rule for ``completions/clipped_ratio`` per response: the last
        token of the completion is neither an end-of-sequence token nor the pad token (the
        generation stopped at ``max_completion_length``). A completion whose mask TRL zeroed
        (``mask_truncated_completions``) counts as cut. None when the ids are not there."""
        ids = inputs.get("completion_ids")
        if ids is None:
            return None
        tr = self.trainer
        ends = list(getattr(tr, "eos_token_ids", None) or [])
        proc = getattr(tr, "processing_class", None)
        for tok_id in (getattr(proc, "eos_token_id", None), getattr(tr, "pad_token_id", None)):
            if tok_id is not None:
                ends.append(int(tok_id))
        if getattr(proc, "pad_token_id", None) is not None:
            ends.append(int(proc.pad_token_id))
        if not ends:
            return None
        lengths = inputs["completion_mask"].sum(1).long()  # [B] tokens up to the end
        last = ids.gather(1, (lengths - 1).clamp(min=0)[:, None])[:, 0]  # [B]
        ended = torch.isin(last, torch.tensor(sorted(set(ends)), device=ids.device))
        return (lengths == 0) | ~ended

    def _in_batch(self, gen: dict[str, Any], key: int, logps: torch.Tensor) -> None:
        """Measure a micro-batch of a reused rollout batch once: the first time the loss sees
        it after an optimizer update that included it (TRL's buffered micro-batches are the same
        objects on every pass). Its responses then count once each in the ``inbatch_*`` columns,
        updates before the post-update probe can measure them."""
        if self._dropout:
            return
        seen = gen.setdefault("seen", {})  # micro-batch -> updates at first sight, or None: done
        if key not in seen:
            seen[key] = self._n_stepped
        elif seen[key] is not None and self._n_stepped > seen[key]:
            seen[key] = None
            self.monitor.observe_in_batch(logps.detach())

    def _per_func(self, rpf: torch.Tensor | None) -> dict[str, torch.Tensor] | None:
        """{reward function name: [B] raw rewards} from TRL's [B, F] (NaN where None)."""
        if rpf is None:
            return None
        return {name: rpf[:, i] for i, name in enumerate(self.trainer.reward_func_names)}

    def _llds(
        self,
        logps: torch.Tensor,
        old: torch.Tensor,
        adv: torch.Tensor,
        mask: torch.Tensor,
        gen: dict[str, Any] | None,
        searches: torch.Tensor | None,
    ) -> torch.Tensor:
        """``lam * L_LLDS / GA`` of one micro-batch; [B, T] log-probs and mask, [B] advantages.

        With ``answer_weighting``, the answer span is the last action of each completion (the
        final answer follows the last tool feedback) and V is the mean valid searches of the
        generation batch (one host read per generation batch, for the adaptive schedules).
        """
        kw: dict[str, Any] = {}
        weighting = self.monitor.llds.config.answer_weighting
        if weighting is not None:
            kw["answer_mask"] = last_action_mask(mask)  # [B, T]
            if isinstance(weighting, str):
                if gen is not None:
                    if "mean_searches" not in gen:
                        s = gen["searches"]
                        gen["mean_searches"] = 0.0 if s is None else float(s.float().mean())
                    kw["mean_valid_searches"] = gen["mean_searches"]
                else:  # a batch generated before attach: this micro-batch's own mean
                    rounds = searches if searches is not None else tool_rounds(mask)
                    kw["mean_valid_searches"] = float(rounds.float().mean())
        term, out = self.monitor.llds_term(logps, old, adv, mask, **kw)
        if self.monitor.strict and out is not None:
            cfg = self.monitor.llds.config
            beta = cfg.answer_weight(kw.get("mean_valid_searches"))
            self.llds_records.append(
                {
                    "logp_new": logps.detach(),
                    "logp_old": old.detach(),
                    "advantages": adv.detach(),
                    "mask": mask.detach(),
                    "answer_mask": kw.get("answer_mask"),
                    "answer_weight": beta if weighting is not None else 1.0,
                    "mean_valid_searches": kw.get("mean_valid_searches"),
                    "output": out._replace(loss=out.loss.detach()),
                    "term": term.detach(),
                }
            )
            del self.llds_records[: -self.LLDS_RECORDS_KEPT]  # bounded: no growth per step
        ga = getattr(self.trainer, "current_gradient_accumulation_steps", None)
        ga = ga or self.trainer.args.gradient_accumulation_steps
        return term / ga

    # -- probe and row ------------------------------------------------------------------------

    def on_optimizer_step(self) -> None:
        """Mark the open generation batches as stepped when this update changed the weights
        (learning rate > 0 and not skipped by the fp16 grad scaler)."""
        super().on_optimizer_step()
        skipped = bool(getattr(self.trainer.accelerator, "optimizer_step_was_skipped", False))
        if self._lr is not None and self._lr > 0 and not skipped:
            self._n_stepped += 1
            for gen in self._gens.values():
                gen["stepped"] = True

    def on_step_end(self, state: Any, control: Any) -> None:
        self.probe_records, self.probe_inputs = [], []
        with self.monitor.guard("post-update probe"):  # a CollectiveError goes through
            self._probe_finished(final=state.max_steps > 0 and state.global_step >= state.max_steps)
        self.finish_step(state.global_step, {})  # every rank reaches the step reduction

    def _probe_finished(self, final: bool) -> None:
        """Probe every generation batch that will get no further update (all of them if final).

        Which batches are finished is the same on every rank (:func:`finished_generations`). The
        ranks then agree that each prepared its probe (one small all_reduce) before any forward:
        under ZeRO-3/FSDP the forward is a collective, so a rank must not skip it alone. A failure
        inside the forward is a
        :class:`~lld_monitor.monitor.failure.CollectiveError` on several ranks.
        """
        tr = self.trainer
        done = finished_generations(
            {gid: g["start"] for gid, g in self._gens.items()},
            tr._step,
            tr.args.steps_per_generation,
            tr.num_iterations,
            final=final,
        )
        gens = [self._gens.pop(gid) for gid in done]
        gens = [g for g in gens if g["micro"]]
        if not gens or self.monitor.probe_fraction <= 0:
            return
        plans: list[dict[str, Any] | None] | None = None
        with self.monitor.guard("post-update probe"):
            plans = [
                self._prepare_probe(list(g["micro"].values()), g.get("stepped", False))
                for g in gens
            ]
        if not self.monitor.agree("post-update probe", plans is not None):
            return
        for plan in plans or []:
            if plan is None:  # multimodal: skipped on every rank alike
                continue
            with self.monitor.collective("post-update probe forward"):
                logp_new = self._probe_forward(plan)
            with self.monitor.guard("post-update probe"):
                self._measure(plan, logp_new)

    def _prepare_probe(
        self, micro: list[tuple[dict[str, Any], torch.Tensor]], stepped: bool | None = None
    ) -> dict[str, Any] | None:
        """The probe sample of a generation batch (rows, inputs); None for multimodal batches.

        ``stepped=False``: no update on this batch changed the weights (learning rate 0, skipped
        steps); the monitor then leaves the probe out of the displacement columns.
        """
        first = micro[0][0]
        if any(first.get(k) is not None for k in _MULTIMODAL_KEYS):
            if "multimodal" not in self._warned:
                self._warned.add("multimodal")
                logger.warning("lld_monitor: multimodal GRPO batches are not probed (text only)")
            return None
        widths = {m[0]["completion_ids"].shape[1] for m in micro} | {
            m[0]["prompt_ids"].shape[1] for m in micro
        }
        if (
            len({m[0]["completion_ids"].shape[1] for m in micro}) != 1
            or len({m[0]["prompt_ids"].shape[1] for m in micro}) != 1
        ):
            raise ValueError(
                f"micro-batches of one generation batch differ in width: {sorted(widths)}"
            )

        def cat(key: str) -> torch.Tensor | None:
            parts = [m[0].get(key) for m in micro]
            return None if any(p is None for p in parts) else torch.cat(parts, 0)

        completion_ids = cat("completion_ids")  # [B, T]
        completion_mask = cat("completion_mask")  # [B, T]
        tool_mask = cat("tool_mask")  # [B, T] or None
        mask = completion_mask if tool_mask is None else completion_mask * tool_mask
        old = torch.cat([m[1] for m in micro], 0)  # [B, T]
        batch = completion_ids.shape[0]
        n = max(1, math.ceil(self.monitor.probe_fraction * batch))
        rewards = cat(KEY_REWARDS)
        advantages = cat("advantages")
        per_func = cat(KEY_REWARDS_PER_FUNC)
        # correct responses first (the paper's indicator is about them), then incorrect ones;
        # seeded by the step: the same sample on every rank and after a resume from a checkpoint
        correct = self.monitor.correct_mask(
            rewards, advantages, batch, completion_ids.device, self._per_func(per_func)
        )
        rng = torch.Generator().manual_seed(self.trainer.state.global_step * 1009 + len(micro))
        rows = probe_rows(correct, n, rng).to(completion_ids.device)
        self._say_why_no_correct(correct, advantages)
        return {
            "rows": rows,
            "input_ids": torch.cat([cat("prompt_ids"), completion_ids], 1)[rows],  # [n, P+T]
            "attention": torch.cat([cat("prompt_mask"), completion_mask], 1)[rows],  # [n, P+T]
            "completion_ids": completion_ids[rows],  # [n, T]
            "completion_mask": completion_mask[rows],  # [n, T]
            "mask": mask[rows],  # [n, T]
            "old": old[rows],  # [n, T]
            "rewards": rewards[rows] if rewards is not None else None,  # [n]
            "rewards_per_func": None if per_func is None else per_func[rows],  # [n, F]
            "advantages": advantages[rows],  # [n] or [n, T]
            "stepped": stepped,
        }

    def _check_sampler_logps(self, out: Mapping[str, Any]) -> None:
        """Once: the sampler's log-probs (``sampling_per_token_logps``, vLLM) padded with 0.0
        on most generated tokens while the trainer's are not: its importance-sampling ratio is
        then meaningless (a critical lifecycle event, said where the trainer computes it)."""
        sampled = out.get("sampling_per_token_logps")
        if sampled is None or "sampler_zero_padded" in self._warned:
            return
        mask = out["completion_mask"]
        share = zero_padded_share(sampled, mask)
        old = out.get("old_per_token_logps")
        trainer_share = zero_padded_share(old, mask) if old is not None else 0.0
        if not (share >= SAMPLER_ZERO_SHARE and trainer_share < SAMPLER_ZERO_SHARE):
            return
        self._warned.add("sampler_zero_padded")
        step = int(self.trainer.state.global_step) + 1
        message = (
            f"step {step}: {share:.0%} of the generated tokens' sampler log-probs "
            "(sampling_per_token_logps) are exactly 0.0 (probability 1) while the trainer's are "
            f"not ({trainer_share:.0%}): the inference engine's log-probs look padded with 0.0, "
            "not returned, so the importance-sampling correction and its ratio are meaningless. "
            "Check the engine's logprobs setting and the version pairing of TRL and vLLM"
        )
        warn_user(f"lld_monitor: {message}")
        evidence = {"zero_share": share, "trainer_zero_share": trainer_share}
        self.monitor.lifecycle_event(step, "sampler_zero_padded", message, "critical", evidence)

    def _say_why_no_correct(self, correct: torch.Tensor, advantages: torch.Tensor | None) -> None:
        """Once per reason: a generation batch without a correct response leaves the step's
        displacement columns empty; say why and what to change (a lifecycle event, info)."""
        if bool(correct.any()):
            return
        zero = advantages is not None and bool((advantages == 0).all())
        reason = "probe_no_correct_zero_advantage" if zero else "probe_no_correct"
        if reason in self._warned:
            return
        self._warned.add(reason)
        step = int(self.trainer.state.global_step) + 1
        what = (
            "every advantage is zero (each group got one reward: no learning signal either)"
            if zero
            else "no response reached the correctness rule"
        )
        message = (
            f"step {step}: the generation batch has no correct response ({what}), so the "
            "displacement columns (delta_correct, frac_correct_displaced) are empty for it; "
            "said once. With low accuracy: more samples per prompt (num_generations) or a "
            "larger batch; check the correctness rule (correct_threshold, correct_reward, "
            "correct_fn) against the reward's scale"
        )
        logger.info("lld_monitor: %s", message)
        evidence = {"reason": reason, "batch": int(correct.shape[0])}
        self.monitor.lifecycle_event(step, reason, message, "info", evidence)

    def _probe_forward(self, plan: dict[str, Any]) -> torch.Tensor:
        """[n, T] log-probs under the updated policy, as TRL runs its own no-grad forwards."""
        from trl.models.utils import disable_gradient_checkpointing

        tr = self.trainer
        original = self._originals["_get_per_token_logps_and_entropies"]
        with (
            torch.no_grad(),
            disable_gradient_checkpointing(tr.model, tr.args.gradient_checkpointing_kwargs),
        ):
            logp_new, _, _ = original(
                tr.model,
                plan["input_ids"],
                plan["attention"],
                plan["completion_ids"].shape[1],
                batch_size=tr.args.per_device_train_batch_size,
            )  # [n, T]
        return logp_new

    def _measure(self, plan: dict[str, Any], logp_new: torch.Tensor) -> None:
        tr = self.trainer
        completion_ids, rows = plan["completion_ids"], plan["rows"]
        rewards, adv = plan["rewards"], plan["advantages"]
        input_ids, attention = plan["input_ids"], plan["attention"]
        n = rows.shape[0]
        correct = self.monitor.correct_mask(
            rewards, adv, n, completion_ids.device, self._per_func(plan["rewards_per_func"])
        )
        tok = getattr(tr.processing_class, "tokenizer", tr.processing_class)
        rec = self.monitor.measure_displacement(
            plan["old"],
            logp_new,
            plan["mask"],
            correct,
            token_ids=completion_ids,
            rewards=rewards,
            advantages=adv,
            rows=rows,
            tokenizer=tok,
            completion_mask=plan["completion_mask"],  # tool feedback in, padding out
            stepped=plan["stepped"],
        )
        self.probe_records.append(rec)
        self.probe_inputs.append((input_ids, attention))

    def finish_step(self, step: int, extra: Any) -> dict[str, Any]:
        with self.monitor.guard("TRL sampler metrics"):
            extra = {**(extra or {}), **self._sampler_metrics()}
        row = super().finish_step(step, extra)
        with self.monitor.guard("TRL metrics"):
            metrics = self.trainer._metrics["train"]
            for col in TRAINER_LOG_COLUMNS:
                value = row.get(col)
                if isinstance(value, int | float) and math.isfinite(value):
                    metrics[TRAINER_LOG_PREFIX + col].append(float(value))
        return row

    def _sampler_metrics(self) -> dict[str, float]:
        """TRL's sampler-vs-trainer means appended since the last step (``TRL_SAMPLER_METRICS``),
        each the mean of its new values; {} when TRL computed none (no vLLM)."""
        metrics = self.trainer._metrics["train"]
        seen = self._sampler_seen
        out: dict[str, float] = {}
        for key, col in TRL_SAMPLER_METRICS.items():
            held = metrics.get(key)
            values = list(held) if held is not None else []
            # (the list itself is kept, not its id: a new list may reuse a freed one's id)
            kept, start = seen.get(key, (None, 0))
            if kept is not held or len(values) < start:  # TRL cleared its lists at a log
                start = 0
            new = [float(v) for v in values[start:] if isinstance(v, int | float)]
            seen[key] = (held, len(values))
            new = [v for v in new if math.isfinite(v)]
            if new:
                out[col] = sum(new) / len(new)
        return out

    def on_train_end(self, state: Any) -> None:
        self._gens.clear()
        super().on_train_end(state)
