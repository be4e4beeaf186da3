"""A rollout batch: observed under the sampling policy, measured again after the update.

:func:`observe_rollout` checks the batch's tensors, judges each response by the correctness
rule and folds the batch into the step's sums; it returns the :class:`Rollout` the monitor keeps
for the post-update probe. :func:`measure_displacement` folds one post-update measurement of
those responses into the step's displacement sums and returns its :class:`ProbeRecord`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

import torch

from lld_monitor.monitor.correctness import CorrectnessRule
from lld_monitor.monitor.step_metrics import StepMetrics
from lld_monitor.monitor.token_sampling import ProbeRecord


def check_completion_mask(completion_mask: torch.Tensor | None, ref: torch.Tensor) -> None:
    """ValueError unless ``completion_mask`` is None or [B, L] like ``ref``."""
    if completion_mask is not None and completion_mask.shape != ref.shape:
        raise ValueError(
            f"completion_mask must be [B, L] = {list(ref.shape)} like the log-probs and mask, got "
            f"{tuple(completion_mask.shape)} (1 on every completion position, 0 on padding)"
        )


@dataclass(frozen=True)
class Rollout:
    """The last observed rollout batch, on the log-probs' device (kept for the probe)."""

    logp_old: torch.Tensor  # [B, L] detached
    mask: torch.Tensor  # [B, L] generated tokens
    rewards: torch.Tensor | None  # [B] float, NaN = unscored
    advantages: torch.Tensor | None  # [B] float
    token_ids: torch.Tensor | None  # [B, L]
    correct: torch.Tensor  # [B] bool
    completion_mask: torch.Tensor | None  # [B, L] every completion position

    def pick(self, rows: torch.Tensor | None) -> Rollout:
        """The rows ``rows`` [B'] of the batch (all of it when None)."""
        if rows is None:
            return self
        picked = (getattr(self, f.name) for f in fields(self))
        return Rollout(*(None if t is None else t[rows] for t in picked))


def observe_rollout(
    acc: StepMetrics,
    rule: CorrectnessRule,
    logp_old: torch.Tensor,
    mask: torch.Tensor,
    *,
    rewards: torch.Tensor | None = None,
    advantages: torch.Tensor | None = None,
    token_ids: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    num_searches: torch.Tensor | None = None,
    kl: torch.Tensor | None = None,
    completion_mask: torch.Tensor | None = None,
    rewards_per_func: Mapping[str, torch.Tensor] | None = None,
    truncated: torch.Tensor | None = None,
) -> Rollout:
    """Fold a rollout batch into ``acc`` ([B, L] ``logp_old``/``mask``, [B] ``rewards``).

    ``rule`` judges which responses are correct; ``rewards_per_func`` (name -> [B]) is folded
    into the reward-function columns too. ValueError on mismatched shapes.
    """
    if logp_old.dim() != 2 or logp_old.shape != mask.shape:
        raise ValueError(
            f"logp_old and mask must both be [B, L], got {tuple(logp_old.shape)} and "
            f"{tuple(mask.shape)}"
        )
    check_completion_mask(completion_mask, mask)
    logp_old = logp_old.detach()
    batch, device = logp_old.shape[0], logp_old.device
    if rewards is not None:
        rewards = torch.as_tensor(rewards, device=device).detach().float().reshape(-1)  # [B]
    if advantages is not None:
        advantages = torch.as_tensor(advantages, device=device).detach().float()  # [B]
    if rewards_per_func is not None:
        rewards_per_func = {
            name: torch.as_tensor(r, device=device).detach().float().reshape(-1)  # [B]
            for name, r in rewards_per_func.items()
        }
        for name, r in rewards_per_func.items():
            acc.add_reward_fn(name, r)
    correct = rule(rewards, advantages, batch, device, rewards_per_func)  # [B] bool
    rule_r = rule.rule_rewards(rewards, rewards_per_func)  # [B] or None
    if not rule.judges(rewards, advantages, rewards_per_func):
        # nothing known about correctness: every response unscored (NaN), never "incorrect"
        rewards = torch.full((batch,), float("nan"), device=device)  # [B]
    if truncated is not None and torch.as_tensor(truncated).numel() != batch:
        raise ValueError(f"truncated must hold one flag per response ({batch}), got "
                         f"{torch.as_tensor(truncated).numel()}")  # fmt: skip
    acc.add_rollout(
        logp_old,
        mask,
        correct,
        rewards,
        entropy,
        kl,
        num_searches,
        rule_rewards=rule_r,
        truncated=truncated,
    )
    return Rollout(
        logp_old,
        mask.to(device),
        rewards,
        advantages,
        token_ids,
        correct,
        None if completion_mask is None else completion_mask.to(device),
    )


def measure_displacement(
    acc: StepMetrics,
    step: int,
    logp_old: torch.Tensor,
    logp_new: torch.Tensor,
    mask: torch.Tensor,
    correct: torch.Tensor,
    *,
    token_ids: torch.Tensor | None = None,
    rows: torch.Tensor | None = None,
    rewards: torch.Tensor | None = None,
    completion_mask: torch.Tensor | None = None,
    stepped: bool | None = None,
) -> ProbeRecord:
    """Fold one post-update measurement ([B, L] log-probs and mask, [B] ``correct``) into ``acc``.

    Unscored responses (``rewards`` NaN) are in neither likelihood group. A measurement in which
    no generated token's log-prob moved, or ``stepped=False`` (the optimizer did not step), is
    counted as a still probe, not in the displacement sums.
    """
    from lld_monitor.metrics import displacement_sums

    logp_new = logp_new.detach().to(logp_old.device)
    if logp_new.shape != logp_old.shape:
        raise ValueError(
            f"logp_new {tuple(logp_new.shape)} must match the rollout's logp_old "
            f"{tuple(logp_old.shape)} (same rows, same token positions)"
        )
    check_completion_mask(completion_mask, logp_old)
    bad_new = (~torch.isfinite(logp_new) & (mask.to(logp_new.device) > 0)).any(dim=1).sum()
    acc.add_group(("logp_nonfinite_new",), [bad_new.float()])
    scored_mask = mask
    if rewards is not None:  # unscored responses are in neither likelihood group
        finite = torch.isfinite(rewards.reshape(-1).to(mask.device))  # [B]
        scored_mask = mask * finite[:, None].to(mask.dtype)  # [B, L]
    sums = displacement_sums(
        logp_old=logp_old, logp_new=logp_new, mask=scored_mask, correct=correct
    )  # [K]
    gen = mask.to(logp_old.device) != 0  # [B, L]
    moved = ((logp_new != logp_old) & gen).any()  # device bool: did any log-prob change?
    if stepped is False:
        moved = torch.zeros_like(moved)
    acc.add_probe(sums, moved)
    maskf = mask.to(logp_old.dtype)  # [B, L]
    delta = ((logp_new - logp_old) * maskf).sum(-1)  # [B]
    return ProbeRecord(
        step,
        token_ids,
        mask,
        logp_old,
        logp_new,
        correct,
        delta,
        rows,
        None if completion_mask is None else completion_mask.to(logp_old.device),
    )
