"""The TRL adapter's post-update probe (``GRPOAdapter``'s measurement part, a mixin it inherits):
after the last optimizer update on a generation batch, one no-grad forward over a
``probe_fraction`` sample of its completions, correct responses first (``metrics.probe_rows``),
gives the displacement columns and the token samples; the per-generation-batch bookkeeping it
reads (``_gens``: start step, micro-batches, whether an update changed the weights) is kept by
the adapter's hooks. Also the sampler checks that read TRL's own generation outputs: log-probs
padded with 0.0 and TRL's sampler-vs-trainer metrics of the step.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

import torch

from lld_monitor import columns as C
from lld_monitor.events import warn_user
from lld_monitor.metrics import probe_rows, zero_padded_share

logger = logging.getLogger("lld_monitor")

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
#: TRL's own sampler-vs-trainer metrics (computed with vLLM and its importance-sampling
#: correction) copied into the row when the step appended new values: TRL key -> column.
TRL_SAMPLER_METRICS: dict[str, str] = {
    "sampling/importance_sampling_ratio/mean": C.IS_RATIO_MEAN,
    "sampling/sampling_logp_difference/mean": C.SAMPLER_LOGP_DIFF,
}
#: The share of generated tokens with a sampler log-prob of exactly 0.0 that reads as padding.
SAMPLER_ZERO_SHARE = 0.5


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


class GenerationProbe:
    """The probe and the sampler checks of ``GRPOAdapter`` (which sets ``trainer``,
    ``monitor``, ``_gens``, ``_warned``, ``_sampler_seen``, ``probe_records`` and
    ``probe_inputs``)."""

    trainer: Any
    monitor: Any
    _gens: dict[int, dict[str, Any]]
    _warned: set[str]
    _sampler_seen: dict[str, tuple[Any, int]]
    probe_records: list[Any]
    probe_inputs: list[tuple[torch.Tensor, torch.Tensor]]

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
        mask = out["completion_mask"]  # [B, T]
        if out.get("tool_mask") is not None:  # generated tokens only: tool feedback was not
            mask = mask * out["tool_mask"]  # sampled, and its sampler log-prob is 0.0 by rule
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
