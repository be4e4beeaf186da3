"""The LLDS regularizer (Deng et al., PAPER.md): penalise likelihood drops of preserving responses.

For responses in the preserving set ``{i : A_i >= 0}``, generated tokens only, with
``d = logp_old - logp_new`` (positive = likelihood went down; ``logp_old`` detached), the loss sums
``w * max(0, d)`` over the tokens of *gated* units and normalises it:

- ``gate="action"`` (LLDS-A, the paper's default): an action (contiguous run of generated
  tokens) is gated on when the sum of ``d`` over its tokens is strictly > 0.
- ``gate="response"`` (LLDS-R): a response is gated on when the sum of ``d`` over all its
  generated tokens is strictly > 0.
- ``gate="token"`` (ablation): no gate; every preserving token contributes ``max(0, d)``.

``w`` is ``answer_weight`` (beta, LLDS-MA) on the tokens where ``answer_mask`` is set and 1
elsewhere; the gate uses the unweighted ``d``, as the authors' code does.
``L_total = L_GRPO + lam * L_LLDS``: the caller multiplies by ``lam``.

LLDS is identically zero while ``logp_new == logp_old`` (the first update on a rollout batch,
or fully on-policy training with one update per batch): it acts only when a batch is reused.
The gate is strict (``> 0``, no tolerance), so train with dropout off.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch

__all__ = [
    "GATES",
    "NORMALIZATIONS",
    "LLDSConfig",
    "LLDSOutput",
    "answer_weight_code",
    "answer_weight_paper",
    "llds_loss",
]

GATES: tuple[str, ...] = ("action", "response", "token")
NORMALIZATIONS: tuple[str, ...] = ("paper", "token_mean")
ANSWER_SCHEDULES: tuple[str, ...] = ("paper", "code")


class LLDSOutput(NamedTuple):
    """``llds_loss`` result: the loss (grad through logp_new) and detached statistics."""

    loss: torch.Tensor  # scalar, unscaled L_LLDS
    frac_gated: torch.Tensor  # float scalar: gated units / preserving units (0 when none)
    n_preserving_tokens: torch.Tensor  # int scalar: generated tokens of responses with A >= 0
    n_gated: torch.Tensor  # int scalar: gated actions / responses / tokens


def answer_weight_paper(mean_valid_searches: float | torch.Tensor) -> float | torch.Tensor:
    """The paper's adaptive answer weight ``beta = min(V / 2, 1)`` (V = mean valid searches)."""
    if isinstance(mean_valid_searches, torch.Tensor):
        return (mean_valid_searches / 2).clamp(max=1.0)
    return min(float(mean_valid_searches) / 2.0, 1.0)


def answer_weight_code(mean_valid_searches: float | torch.Tensor) -> float | torch.Tensor:
    """The authors' code's answer weight ``min(max(V - 1, 0), 1)`` (V = mean valid searches)."""
    if isinstance(mean_valid_searches, torch.Tensor):
        return (mean_valid_searches - 1).clamp(min=0.0, max=1.0)
    return min(max(float(mean_valid_searches) - 1.0, 0.0), 1.0)


@dataclass(frozen=True)
class LLDSConfig:
    """LLDS settings with the paper's defaults (lambda 0.2, action gate, paper normalisation).

    ``answer_weighting``: None (no answer masking), ``"paper"`` / ``"code"`` (adaptive beta from
    the mean number of valid searches), or a fixed beta (float >= 0).
    """

    lam: float = 0.2
    gate: str = "action"
    normalize: str = "paper"
    answer_weighting: str | float | None = None
    enabled: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.lam, bool) or not isinstance(self.lam, int | float):
            raise ValueError(f"lam must be a number (the paper uses 0.2), got {self.lam!r}")
        if not math.isfinite(self.lam) or self.lam < 0:
            raise ValueError(f"lam must be finite and >= 0 (the paper uses 0.2), got {self.lam}")
        if self.gate not in GATES:
            raise ValueError("gate must be one of 'action', 'response', 'token'")
        if self.normalize not in NORMALIZATIONS:
            raise ValueError("normalize must be one of 'paper', 'token_mean'")
        w = self.answer_weighting
        if isinstance(w, str):
            if w not in ANSWER_SCHEDULES:
                raise ValueError(
                    "answer_weighting must be None, 'paper', 'code' or a float beta >= 0, "
                    f"got {w!r}"
                )
        elif w is not None:
            if isinstance(w, bool) or not isinstance(w, int | float):
                raise ValueError(
                    f"answer_weighting must be None, 'paper', 'code' or a float, got {w!r}"
                )
            if not math.isfinite(w) or w < 0:
                raise ValueError(f"a fixed answer_weighting beta must be finite and >= 0, got {w}")
        if not isinstance(self.enabled, bool):
            raise ValueError(f"enabled must be True or False, got {self.enabled!r}")

    def answer_weight(self, mean_valid_searches: float | None = None) -> float:
        """The answer-span weight beta in force (1.0 when answer masking is off)."""
        w = self.answer_weighting
        if w is None:
            return 1.0
        if isinstance(w, str):
            if mean_valid_searches is None:
                raise ValueError(
                    f"answer_weighting={w!r} needs mean_valid_searches (mean number of valid "
                    "tool calls per response this step)"
                )
            schedule = answer_weight_paper if w == "paper" else answer_weight_code
            return float(schedule(mean_valid_searches))
        return float(w)


def _check_inputs(
    logp_new: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    gate: str,
    normalize: str,
) -> None:
    if gate not in GATES:
        raise ValueError("gate must be one of 'action', 'response', 'token'")
    if normalize not in NORMALIZATIONS:
        raise ValueError("normalize must be one of 'paper', 'token_mean'")
    for name, t in (("logp_new", logp_new), ("logp_old", logp_old), ("mask", mask)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a [B, L] tensor, got {shape}")
        if t.shape != logp_new.shape:
            raise ValueError(
                f"{name} has shape {tuple(t.shape)} but logp_new has {tuple(logp_new.shape)}"
            )
        if t.device != logp_new.device:
            raise ValueError(f"{name} is on {t.device} but logp_new is on {logp_new.device}")
    for name, t in (("logp_new", logp_new), ("logp_old", logp_old)):
        if not t.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor of log-probs, got {t.dtype}")
    if not isinstance(advantages, torch.Tensor):
        raise ValueError(f"advantages must be a tensor [B] or [B, L], got {type(advantages)}")
    if advantages.shape not in ((logp_new.shape[0],), logp_new.shape):
        raise ValueError(
            f"advantages must have shape [B] = [{logp_new.shape[0]}] or [B, L] = "
            f"{list(logp_new.shape)}, got {tuple(advantages.shape)}"
        )
    if advantages.device != logp_new.device:
        raise ValueError(f"advantages is on {advantages.device} but logp_new on {logp_new.device}")


def _token_weights(
    answer_mask: torch.Tensor | None,
    answer_weight: float | torch.Tensor,
    like: torch.Tensor,
) -> torch.Tensor | None:
    """Per-token weight [B, L]: beta on the answer span, 1 elsewhere; None when all ones."""
    if answer_mask is None:
        if isinstance(answer_weight, torch.Tensor) or float(answer_weight) != 1.0:
            raise ValueError(
                "answer_weight only acts on the answer span: pass answer_mask ([B, L], 1 on the "
                "tokens of the final <answer>...</answer>) or leave answer_weight at 1.0"
            )
        return None
    if answer_mask.shape != like.shape:
        raise ValueError(
            f"answer_mask must have shape {list(like.shape)} like logp_new, got "
            f"{tuple(answer_mask.shape)}"
        )
    if answer_mask.device != like.device:
        raise ValueError(f"answer_mask is on {answer_mask.device} but logp_new on {like.device}")
    am = answer_mask if answer_mask.dtype == torch.bool else answer_mask != 0  # [B, L]
    if isinstance(answer_weight, torch.Tensor):
        if answer_weight.shape not in ((), (like.shape[0],)):
            raise ValueError(
                f"answer_weight must be a float or a [B] = [{like.shape[0]}] tensor, got "
                f"{tuple(answer_weight.shape)}"
            )
        beta = answer_weight.detach().to(device=like.device, dtype=like.dtype)
        beta = beta.reshape(-1, 1) if beta.dim() == 1 else beta  # [B, 1] or []
    else:
        if isinstance(answer_weight, bool) or not math.isfinite(float(answer_weight)):
            raise ValueError(f"answer_weight must be a finite number, got {answer_weight!r}")
        beta = torch.full((), float(answer_weight), dtype=like.dtype, device=like.device)
    one = torch.ones((), dtype=like.dtype, device=like.device)
    return torch.where(am, beta, one)  # [B, L]


def llds_loss(
    *,
    logp_new: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    gate: str = "action",
    answer_mask: torch.Tensor | None = None,
    answer_weight: float | torch.Tensor = 1.0,
    normalize: str = "paper",
    action_ids: torch.Tensor | None = None,
) -> LLDSOutput:
    """The unscaled LLDS loss of a micro-batch; gradient flows through ``logp_new`` only.

    ``logp_new``/``logp_old``/``mask`` [B, L] (mask 1 on generated tokens), ``advantages`` [B]
    (or [B, L], constant per response in GRPO: reduced by a masked mean), ``answer_mask`` [B, L]
    (1 on the final answer span), ``answer_weight`` float or [B], ``action_ids`` [B, L] optional
    override of the mask's runs (0-based, < L, -1 = none; tokens with -1 are never gated).

    Normalisation ``"paper"`` (our reading of PAPER.md), with P the preserving responses,
    n_i the generated tokens of response i and g the gate indicator per token:

    - action:   ``mean_{i in P} (1/n_i) sum_t g_t w_t max(0, d_t)``
    - response: ``sum_{i in P} sum_t g_i w_t max(0, d_t) / sum_{i in P} n_i``
    - token:    ``sum_{i in P} sum_t w_t max(0, d_t) / sum_{i in P} n_i``

    ``"token_mean"`` (authors' code): the same numerator over every generated token of the
    batch, negative-advantage responses included. 0 (never NaN) when nothing is preserved.
    """
    _check_inputs(logp_new, logp_old, advantages, mask, gate, normalize)
    m = mask if mask.dtype == torch.bool else mask != 0  # [B, L]
    batch, length = m.shape
    n_tok = m.sum(1, dtype=torch.int32)  # [B]
    if advantages.dim() == 2:  # per-token advantages: one value per response in GRPO
        zero_a = torch.zeros((), dtype=advantages.dtype, device=advantages.device)
        adv = torch.where(m, advantages, zero_a).sum(1) / n_tok.clamp(min=1)  # [B]
    else:
        adv = advantages  # [B]
    pres = (adv.detach() >= 0) & (n_tok > 0)  # [B] preserving responses
    pm = m & pres[:, None]  # [B, L] preserving tokens
    n_pres_tok = torch.where(pres, n_tok, 0).sum()  # scalar

    half = (torch.float16, torch.bfloat16)
    new = logp_new.float() if logp_new.dtype in half else logp_new  # [B, L]
    old = logp_old.detach().to(new.dtype)  # [B, L]
    zero = torch.zeros((), dtype=new.dtype, device=new.device)
    diff = old - new  # [B, L] d everywhere (garbage off-mask), grad via logp_new

    with torch.no_grad():
        if gate == "token":
            keep = pm & (diff > 0)  # [B, L] tokens with max(0, d) > 0
            n_gated = keep.sum()
            n_units = n_pres_tok
        else:
            dd = torch.where(pm, diff, zero)  # [B, L] d, 0 off the preserving tokens
            positive = dd > 0  # [B, L]
            if gate == "response":
                g_row = dd.sum(1) > 0  # [B] (only preserving rows can be > 0)
                keep = positive & g_row[:, None]  # [B, L]
                n_gated = g_row.sum()
                n_units = pres.sum()
            else:
                # slot = 1 + action id (slot 0 = no action); per-slot sums of d by one scatter
                if action_ids is None:
                    starts = m.clone()  # [B, L]
                    starts[:, 1:] &= ~m[:, :-1]
                    slot = starts.cumsum(dim=1, dtype=torch.int64)  # [B, L] (gaps: d is 0)
                    n_act = slot[:, -1] if length else slot.new_zeros(batch)  # [B]
                    width = (length + 1) // 2 + 1  # at most ceil(L/2) runs in a row
                else:
                    if action_ids.shape != m.shape or action_ids.is_floating_point():
                        raise ValueError(
                            f"action_ids must be an integer [B, L] tensor like mask, got "
                            f"{action_ids.dtype} {tuple(action_ids.shape)}"
                        )
                    slot = torch.where(m, action_ids.long() + 1, 0).clamp_(min=0)  # [B, L]
                    n_act = slot.amax(1) if length else slot.new_zeros(batch)  # [B]
                    width = length + 1  # ids must be < L
                act_sum = dd.new_zeros(batch, width).scatter_add_(1, slot, dd)  # [B, A+1]
                g_act = act_sum > 0  # [B, A+1] (only preserving actions can be > 0)
                g_act[:, 0] = False  # tokens outside any action are never gated
                keep = g_act.gather(1, slot) & positive  # [B, L]
                n_gated = g_act.sum()
                n_units = torch.where(pres, n_act, 0).sum()
        frac = (n_gated / n_units.clamp(min=1)).to(torch.float32)

    # max(0, d) on the kept tokens: where() keeps off-mask garbage out of values and gradients
    gated = torch.where(keep, diff, zero)  # [B, L]
    w = _token_weights(answer_mask, answer_weight, gated)
    if w is not None:
        gated = gated * w  # [B, L]
    if normalize == "token_mean":
        loss = gated.sum() / n_tok.sum().clamp(min=1)
    elif gate == "action":
        per_row = gated.sum(1) / n_tok.clamp(min=1)  # [B]
        loss = torch.where(pres, per_row, zero).sum() / pres.sum().clamp(min=1)
    else:
        loss = gated.sum() / n_pres_tok.clamp(min=1)
    return LLDSOutput(loss.to(logp_new.dtype), frac, n_pres_tok.long(), n_gated.long())
