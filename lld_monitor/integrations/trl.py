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
from lld_monitor.integrations.trl_probe import (  # (KEY_*, finished_generations: from here too)
    KEY_GENERATION,
    KEY_REWARDS,
    KEY_REWARDS_PER_FUNC,
    KEY_SEARCHES,
    GenerationProbe,
)
from lld_monitor.metrics import last_action_mask, tool_rounds

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


def resume_off_boundary(tr: Any, step: int) -> tuple[str, dict[str, Any]] | None:
    """A resume inside a generation batch: TRL regenerates the batch from the resumed step, so
    the run no longer follows the uninterrupted trajectory from there. ``(message, evidence)``,
    or None on a batch boundary."""
    args = tr.args
    every = int(args.steps_per_generation) * int(getattr(tr, "num_iterations", 1))
    micro = step * int(args.gradient_accumulation_steps)  # TRL counts micro-batches
    if every <= 1 or micro % every == 0:
        return None
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
    return message, {"step": step, "generate_every_micro_batches": every}


def no_wandb_duplicates(sinks: Any, args: Any) -> None:
    """With ``report_to`` naming W&B, TRL already logs the mirrored columns
    (``TRAINER_LOG_COLUMNS``) as ``train/lld/<column>``: a ``WandbSink`` among ``sinks`` then
    leaves them out, so no LLD column is charted twice."""
    report_to = getattr(args, "report_to", None) or []
    report_to = [report_to] if isinstance(report_to, str) else list(report_to)
    if "wandb" not in report_to and "all" not in report_to:
        return
    from lld_monitor.sinks import WandbSink

    for sink in sinks:
        if isinstance(sink, WandbSink):
            sink.skip_columns |= set(TRAINER_LOG_COLUMNS)
            logger.info(
                "lld_monitor: report_to includes wandb: TRL logs %d LLD columns as "
                "train/%s<column>; WandbSink logs the others only",
                len(TRAINER_LOG_COLUMNS),
                TRAINER_LOG_PREFIX,
            )


def valid_searches(out: Mapping[str, Any], tool_counts: tuple[int, int] | None) -> torch.Tensor:
    """Float [B] valid searches per completion of a rank's generation batch ``out``.

    With TRL tools (``tool_counts``: TRL's (calls, failures) of the batch): (calls - failures)
    / completions (per batch, so every row holds the batch mean). Otherwise (no tools, or a
    rollout_func's env_mask): the tool rounds of each row, actions - 1 (0 without tool
    feedback).
    """
    mask = out["completion_mask"]  # [B, T]
    if tool_counts is not None:
        calls, failures = tool_counts
        n = max(mask.shape[0], 1)
        return torch.full((mask.shape[0],), (calls - failures) / n, device=mask.device)
    if out.get("tool_mask") is not None:
        mask = mask * out["tool_mask"]  # [B, T] generated tokens only
    return tool_rounds(mask)  # [B]


def truncated_responses(tr: Any, inputs: Mapping[str, Any]) -> torch.Tensor | None:
    """[B] bool, TRL's own rule for ``completions/clipped_ratio`` per response: the last
    token of the completion is neither an end-of-sequence token nor the pad token (the
    generation stopped at ``max_completion_length``). A completion whose mask TRL zeroed
    (``mask_truncated_completions``) counts as cut. None when the ids are not there."""
    ids = inputs.get("completion_ids")
    if ids is None:
        return None
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


class GRPOAdapter(GenerationProbe, TrainerAdapter):
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
        """A resume inside a generation batch (``resume_off_boundary``): warned, and recorded
        as a ``resume_off_boundary`` event."""
        said = resume_off_boundary(self.trainer, step)
        if said is None:
            return
        message, evidence = said
        if self.monitor.rank == 0:
            warn_user(f"lld_monitor: {message}")
        self.monitor.lifecycle_event(step, "resume_off_boundary", message, "warning", evidence)

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
        no_wandb_duplicates(self.monitor.sinks, args)
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
            searches = valid_searches(out, self._tool_counts)  # [B]
            out[KEY_SEARCHES] = searches  # logged (num_searches) only when tools are in play
        gid = self._n_gen
        self._n_gen += 1
        out[KEY_GENERATION] = torch.tensor(gid)  # 0-dim CPU: survives shuffle/split, no sync
        self._gens[gid] = {"start": tr._step, "micro": {}, "searches": searches}

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
            truncated=truncated_responses(self.trainer, inputs),
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

    def on_train_end(self, state: Any) -> None:
        self._gens.clear()
        super().on_train_end(state)
