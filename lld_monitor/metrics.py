"""Pure LLD measurements: batched torch functions from per-token log-probs to step columns.

Inputs share one layout: ``logp_old`` / ``logp_new`` are ``[B, L]`` log-probs of the sampled tokens
under the sampling policy and after the update, ``mask`` is ``[B, L]`` and non-zero exactly on
model-generated tokens (0 on tool feedback and padding). An *action* is a contiguous run of
generated tokens in a row. Responses with no generated token are ignored everywhere. Sign
convention: ``delta = logp_new - logp_old``; negative means the update displaced the token.

Every statistic is a ratio of sums and counts. :func:`displacement_sums` returns those sums in a
fixed order (:data:`SUM_FIELDS`) so that ranks can ``all_reduce(SUM)`` them and
:func:`stats_from_sums` then gives the exact global statistics. Nothing here syncs with the host
except the functions that return Python objects (:meth:`LLDStats.as_row`,
:func:`top_displaced_tokens`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch

from lld_monitor import columns as C

__all__ = [
    "SUM_FIELDS",
    "LLDStats",
    "action_ids",
    "correct_mask",
    "displacement_sums",
    "last_action_mask",
    "likelihood_displacement",
    "masked_mean",
    "per_response_delta",
    "probe_rows",
    "stats_from_sums",
    "tool_rounds",
    "top_displaced_tokens",
    "zero_padded_share",
]

#: Names of the entries of :func:`displacement_sums`, in order. Sums and counts only, so a
#: cross-rank ``all_reduce(SUM)`` of the vector is exact (up to float addition order).
SUM_FIELDS: tuple[str, ...] = (
    # confidence under the sampling policy (always measured)
    "n_correct",  # correct responses with >= 1 generated token
    "n_incorrect",  # incorrect responses with >= 1 generated token
    "logp_correct_sum",  # sum over correct responses of their per-token mean logp_old
    "logp_incorrect_sum",  # same over incorrect responses
    "logp_first_action_sum",  # sum over responses of the first action's per-token mean logp_old
    "n_first_action",  # responses that have a first action
    "logp_later_actions_sum",  # sum over responses of the later actions' per-token mean logp_old
    "n_later_actions_responses",  # responses with at least two actions
    # displacement (zero when logp_new is None)
    "n_measured_shards",  # 1 per call that had logp_new: tells "not measured" from "empty"
    "n_correct_measured",  # correct responses whose displacement was measured
    "n_incorrect_measured",
    "delta_correct_sum",  # sum over correct responses of the summed change
    "delta_incorrect_sum",
    "delta_correct_per_token_sum",  # sum over correct responses of the per-token mean change
    "delta_incorrect_per_token_sum",
    "n_correct_displaced",  # correct responses with summed change < 0 (strictly)
    "n_correct_tokens_displaced",  # generated tokens of correct responses with change < 0
    "n_correct_tokens",  # generated tokens of correct responses
    "delta_first_action_sum",  # sum over correct responses of the first action's summed change
    "n_correct_first_action",  # correct responses that have a first action
    "delta_later_actions_sum",  # sum over (correct response, later action) of the summed change
    "n_correct_later_actions",  # number of (correct response, later action) pairs
)
_IDX = {name: i for i, name in enumerate(SUM_FIELDS)}


@dataclass(frozen=True)
class LLDStats:
    """One step's confidence and displacement statistics; field names are the column names.

    Fields are 0-dim tensors on the input's device (no host sync); :meth:`as_row` converts them.
    Empty groups give NaN; displacement fields are NaN when no ``logp_new`` was measured.
    ``n_correct`` / ``n_incorrect`` count the responses whose displacement was measured.
    Displaced means strictly lowered: ``frac_correct_displaced`` counts correct responses whose
    summed change is < 0 and ``frac_tokens_displaced`` their tokens whose change is < 0, so an
    update that moved nothing (learning rate 0, a skipped step) reports 0, not 1.
    """

    logp_correct: torch.Tensor
    logp_incorrect: torch.Tensor
    logp_first_action: torch.Tensor
    logp_later_actions: torch.Tensor
    delta_correct: torch.Tensor
    delta_incorrect: torch.Tensor
    delta_correct_per_token: torch.Tensor
    delta_incorrect_per_token: torch.Tensor
    frac_correct_displaced: torch.Tensor
    frac_tokens_displaced: torch.Tensor
    delta_first_action: torch.Tensor
    delta_later_actions: torch.Tensor
    n_correct: torch.Tensor
    n_incorrect: torch.Tensor

    def as_row(self) -> dict[str, float]:
        """The step-log columns as Python floats (one host transfer)."""
        values = [getattr(self, name) for name in _STAT_COLUMNS]
        if all(isinstance(v, torch.Tensor) for v in values):
            floats = torch.stack([v.detach().reshape(()) for v in values]).tolist()
        else:
            floats = [float(v) for v in values]
        return dict(zip(_STAT_COLUMNS, floats))


_STAT_COLUMNS: tuple[str, ...] = C.CONFIDENCE_COLUMNS + C.DISPLACEMENT_COLUMNS
if tuple(f.name for f in fields(LLDStats)) != _STAT_COLUMNS:  # pragma: no cover - import guard
    raise RuntimeError(
        "LLDStats fields must equal columns.CONFIDENCE_COLUMNS + DISPLACEMENT_COLUMNS in order; "
        "update LLDStats after changing columns.py"
    )


# --- input checks ---------------------------------------------------------------------------


def _check_2d(name: str, t: torch.Tensor, shape: torch.Size | None = None) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of shape [B, L], got {type(t).__name__}")
    if t.dim() != 2:
        raise ValueError(f"{name} must have shape [B, L], got {tuple(t.shape)}")
    if shape is not None and t.shape != shape:
        raise ValueError(
            f"{name} has shape {tuple(t.shape)} but logp_old has {tuple(shape)}; "
            "pass per-token tensors of the same [B, L] layout"
        )


def _check_float(name: str, t: torch.Tensor) -> None:
    if not t.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor of log-probs, got {t.dtype}")


def _check_device(name: str, t: torch.Tensor, ref: torch.Tensor) -> None:
    if t.device != ref.device:
        raise ValueError(f"{name} is on {t.device} but logp_old is on {ref.device}; move it there")


def _bool_mask(mask: torch.Tensor, logp_old: torch.Tensor) -> torch.Tensor:
    """``mask`` as a bool ``[B, L]`` tensor (non-zero = generated), after shape/device checks."""
    _check_2d("mask", mask, logp_old.shape)
    _check_device("mask", mask, logp_old)
    if mask.is_complex():
        raise ValueError("mask must be bool, integer or float (1 = generated token), got complex")
    return mask if mask.dtype == torch.bool else mask != 0


def _check_rows(name: str, t: torch.Tensor, batch: int, ref: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of shape [B], got {type(t).__name__}")
    if t.shape != (batch,):
        raise ValueError(f"{name} must have shape [B] = [{batch}], got {tuple(t.shape)}")
    _check_device(name, t, ref)


def _acc_dtype(device: torch.device) -> torch.dtype:
    """Dtype for accumulated sums: float64 where the device has it (MPS does not)."""
    return torch.float32 if device.type == "mps" else torch.float64


def _work(x: torch.Tensor) -> torch.Tensor:
    """Upcast half-precision log-probs to float32 before summing; float32/64 pass through."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


# --- building blocks ------------------------------------------------------------------------


def masked_mean(
    x: torch.Tensor, mask: torch.Tensor, dim: int | tuple[int, ...] | None = None
) -> torch.Tensor:
    """Mean of ``x`` where ``mask`` is non-zero (over ``dim``, or all); NaN where nothing is kept.

    Masked-out values never reach the result, even when they are inf or NaN.
    """
    if not isinstance(x, torch.Tensor) or not isinstance(mask, torch.Tensor):
        raise ValueError("masked_mean expects two tensors: x and mask")
    if x.shape != mask.shape:
        raise ValueError(f"x has shape {tuple(x.shape)} but mask has {tuple(mask.shape)}")
    if not x.is_floating_point():
        raise ValueError(f"x must be a floating-point tensor, got {x.dtype}")
    m = mask if mask.dtype == torch.bool else mask != 0
    total = torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device))
    if dim is None:
        return total.sum() / m.sum()
    return total.sum(dim) / m.sum(dim)


def _starts(m: torch.Tensor) -> torch.Tensor:
    """True where a run of generated tokens starts: ``m`` [B, L] bool -> [B, L] bool."""
    starts = m.clone()  # [B, L]
    starts[:, 1:] &= ~m[:, :-1]
    return starts


def _action_ids_of(m: torch.Tensor) -> torch.Tensor:
    """Action ids of a bool mask (see :func:`action_ids`), built in place: [B, L] long."""
    ids = _starts(m).cumsum(dim=1, dtype=torch.int64).sub_(1)  # [B, L] 0-based run number
    none = torch.full((), -1, dtype=torch.int64, device=m.device)
    return torch.where(m, ids, none, out=ids)  # in place: one [B, L] int64 allocation


def action_ids(mask: torch.Tensor) -> torch.Tensor:
    """Action index per token: 0, 1, 2, ... per contiguous run of generated tokens, -1 elsewhere.

    ``mask`` [B, L] -> LongTensor [B, L].
    """
    _check_2d("mask", mask)
    m = mask if mask.dtype == torch.bool else mask != 0
    return _action_ids_of(m)


def last_action_mask(mask: torch.Tensor) -> torch.Tensor:
    """Bool [B, L]: the last contiguous run of ``mask`` [B, L] per row (the final answer span).

    In a tool-using trajectory the answer follows the last tool feedback; all False on an empty row.
    """
    ids = action_ids(mask)  # [B, L], -1 off-mask
    last = ids.amax(dim=1, keepdim=True)  # [B, 1]
    return (ids == last) & (ids >= 0)  # [B, L]


def tool_rounds(mask: torch.Tensor) -> torch.Tensor:
    """Float [B]: actions - 1 per row of ``mask`` [B, L] (tool rounds answered), >= 0."""
    ids = action_ids(mask)  # [B, L]
    return ids.amax(dim=1).clamp(min=0).to(torch.float32)  # [B]


def _effective_action_ids(
    override: torch.Tensor | None, m: torch.Tensor, ref: torch.Tensor
) -> torch.Tensor | None:
    """Validated override ids with -1 forced on non-generated positions ([B, L] long), or None."""
    if override is None:
        return None
    _check_2d("action_ids", override, ref.shape)
    _check_device("action_ids", override, ref)
    if override.is_floating_point() or override.dtype == torch.bool:
        raise ValueError(
            f"action_ids must be an integer tensor (0, 1, ...; -1 = none), got {override.dtype}"
        )
    ids = override.long()
    return torch.where(m, ids, torch.full_like(ids, -1))


def correct_mask(
    rewards: torch.Tensor | None = None,
    advantages: torch.Tensor | None = None,
    threshold: float = 1.0,
) -> torch.Tensor:
    """Which responses count as correct: ``reward >= threshold``; with no rewards, advantage > 0.

    ``rewards`` or ``advantages`` [B] -> BoolTensor [B].
    """
    if rewards is not None:
        r = torch.as_tensor(rewards)
        if r.dim() != 1:
            raise ValueError(f"rewards must have shape [B], got {tuple(r.shape)}")
        return r >= threshold
    if advantages is not None:
        a = torch.as_tensor(advantages)
        if a.dim() != 1:
            raise ValueError(f"advantages must have shape [B], got {tuple(a.shape)}")
        return a > 0
    raise ValueError(
        "pass rewards (correct = reward >= correct_threshold) or advantages "
        "(correct = advantage > 0) to tell correct responses from incorrect ones"
    )


def probe_rows(
    correct: torch.Tensor, n: int, generator: torch.Generator | None = None
) -> torch.Tensor:
    """The rows the post-update probe measures: [min(n, B)] sorted indices into a batch whose
    ``correct`` [B] bool says which responses are correct.

    The paper's indicator is about correct responses, so they go first: every correct one up to
    the cost bound ``n``, keeping one place for an incorrect response when the batch has one and
    ``n >= 2`` (the incorrect columns stay measured), then incorrect ones. Each group is taken
    in a random order from ``generator`` (seeded by the caller: the same rows on every rank and
    after a resume). A batch of ``B`` rows gives ``min(n, B)`` rows whatever its accuracy.
    """
    c = torch.as_tensor(correct).bool().cpu()
    if c.dim() != 1:
        raise ValueError(f"correct must have shape [B], got {tuple(c.shape)}")
    batch = c.shape[0]
    k = max(0, min(int(n), batch))
    order = torch.randperm(batch, generator=generator)
    good, bad = order[c[order]], order[~c[order]]
    take = min(len(good), k - 1 if (len(bad) and k >= 2) else k)
    rows = torch.cat([good[:take], bad[: k - take]])
    return rows.sort().values


def zero_padded_share(logps: torch.Tensor, mask: torch.Tensor) -> float:
    """The share of the generated tokens (``mask`` [B, T] true) whose log-prob in ``logps``
    [B, T] is exactly 0.0 (probability 1): near 1 for a sampler's log-probs padded with 0.0
    instead of returned; NaN when ``mask`` marks no token."""
    m = torch.as_tensor(mask).bool()
    n = int(m.sum())
    if n == 0:
        return float("nan")
    return float(((torch.as_tensor(logps) == 0.0) & m).sum()) / n


def per_response_delta(
    logp_old: torch.Tensor, logp_new: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per response: summed change [B], per-token mean change [B] (NaN if empty), n_tokens [B]."""
    _check_2d("logp_old", logp_old)
    _check_float("logp_old", logp_old)
    _check_2d("logp_new", logp_new, logp_old.shape)
    _check_float("logp_new", logp_new)
    _check_device("logp_new", logp_new, logp_old)
    m = _bool_mask(mask, logp_old)
    diff = _work(logp_new) - _work(logp_old)  # [B, L]
    summed = torch.where(m, diff, torch.zeros((), dtype=diff.dtype, device=diff.device)).sum(1)
    n_tokens = m.sum(1)  # [B]
    return summed, summed / n_tokens, n_tokens


# --- the step statistics --------------------------------------------------------------------


def _sums_inputs(
    logp_old: torch.Tensor, logp_new: torch.Tensor | None, mask: torch.Tensor, correct: torch.Tensor
) -> torch.Tensor:
    """Check ``displacement_sums``' inputs (shapes, dtypes, devices: a clear error naming the
    argument); the mask as bool [B, L]."""
    _check_2d("logp_old", logp_old)
    _check_float("logp_old", logp_old)
    m = _bool_mask(mask, logp_old)  # [B, L]
    _check_rows("correct", correct, logp_old.shape[0], logp_old)
    if correct.dtype != torch.bool:
        raise ValueError(
            f"correct must be a bool tensor [B], got {correct.dtype}; build it with correct_mask"
        )
    if logp_new is not None:
        _check_2d("logp_new", logp_new, logp_old.shape)
        _check_float("logp_new", logp_new)
        _check_device("logp_new", logp_new, logp_old)
    return m


def displacement_sums(
    *,
    logp_old: torch.Tensor,
    logp_new: torch.Tensor | None,
    mask: torch.Tensor,
    correct: torch.Tensor,
    action_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Sums and counts behind every confidence/displacement column: Tensor [len(SUM_FIELDS)].

    ``logp_old``/``logp_new``/``mask`` [B, L], ``correct`` bool [B]. ``logp_new=None`` measures
    confidence only. ``action_ids`` [B, L] (0-based, contiguous per row, -1 = none) overrides the
    runs of the mask. Reduce across ranks with ``all_reduce(SUM)``, then :func:`stats_from_sums`.
    """
    m = _sums_inputs(logp_old, logp_new, mask, correct)  # [B, L]
    batch = logp_old.shape[0]
    if logp_new is not None:
        logp_new = logp_new.detach()  # a measurement: the loss's tensor (with grad) is fine
    logp_old = logp_old.detach()
    ids = _effective_action_ids(action_ids, m, logp_old)
    acc = _acc_dtype(logp_old.device)
    old = _work(logp_old)  # [B, L]
    zero = torch.zeros((), dtype=old.dtype, device=old.device)
    one = torch.ones((), dtype=old.dtype, device=old.device)
    # One [B, L] workspace reused through out=: on CPU, allocating (and page-faulting) fresh
    # [B, L] temporaries costs more than the arithmetic itself.
    buf = torch.empty_like(old)  # [B, L]

    def row_sum(keep: torch.Tensor, values: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Per-row sum of ``values`` where ``keep`` ([B, L] -> [B], acc dtype); clobbers ``out``."""
        torch.where(keep, values, zero, out=out)
        return out.sum(1).to(acc)

    n_tok = row_sum(m, one, buf)  # [B] generated tokens
    old_sum = row_sum(m, old, buf)  # [B]
    if ids is None:
        torch.where(_starts(m), one, zero, out=buf)
        buf.cumsum_(1)  # [B, L] 1-based run number (exact in float up to 2^24)
        n_actions = buf[:, -1].to(acc, copy=True) if m.shape[1] else n_tok.new_zeros(batch)
        first = (buf == 1) & m  # [B, L] the first action
        later = None  # the rest of the mask: done by subtraction
        n_first = row_sum(first, one, buf)  # [B]
        old_first = row_sum(first, old, buf)  # [B]
        n_later = n_tok - n_first  # [B]
        old_later = old_sum - old_first  # [B]
    else:
        first = ids == 0  # [B, L]
        later = ids > 0  # [B, L]
        n_actions = ((ids.amax(1) + 1) if m.shape[1] else ids.new_zeros(batch)).to(acc)  # [B]
        n_first = row_sum(first, one, buf)  # [B]
        old_first = row_sum(first, old, buf)  # [B]
        n_later = row_sum(later, one, buf)  # [B]
        old_later = row_sum(later, old, buf)  # [B]
    has = n_tok > 0  # [B]
    has_first = n_first > 0  # [B]
    has_later = n_later > 0  # [B]

    c = correct & has  # [B]
    inc = ~correct & has  # [B]
    fz = torch.zeros((), dtype=acc, device=old.device)

    def rsum(keep: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.where(keep, v, fz).sum()

    pt_old = old_sum / n_tok.clamp(min=1)  # [B]
    out: dict[str, torch.Tensor] = {
        "n_correct": c.sum().to(acc),
        "n_incorrect": inc.sum().to(acc),
        "logp_correct_sum": rsum(c, pt_old),
        "logp_incorrect_sum": rsum(inc, pt_old),
        "logp_first_action_sum": rsum(has_first, old_first / n_first.clamp(min=1)),
        "n_first_action": has_first.sum().to(acc),
        "logp_later_actions_sum": rsum(has_later, old_later / n_later.clamp(min=1)),
        "n_later_actions_responses": has_later.sum().to(acc),
    }
    if logp_new is None:
        for name in SUM_FIELDS[len(out) :]:
            out[name] = fz
    else:
        delta = buf  # [B, L] change per token, 0 off the mask
        torch.sub(_work(logp_new).to(old.dtype), old, out=delta)
        torch.where(m, delta, zero, out=delta)
        d_sum = delta.sum(1).to(acc)  # [B]
        neg = delta < 0  # [B, L] displaced tokens (masked positions are 0)
        if later is None:
            d_first = row_sum(first, delta, delta)  # [B] (delta is spent after this)
            d_later = d_sum - d_first  # [B]
        else:
            work = torch.empty_like(delta)  # [B, L]
            d_first = row_sum(first, delta, work)  # [B]
            d_later = row_sum(later, delta, work)  # [B]
        n_neg = row_sum(neg, one, buf)  # [B]
        pt = d_sum / n_tok.clamp(min=1)  # [B]
        c_first = c & has_first
        out.update(
            {
                "n_measured_shards": torch.ones((), dtype=acc, device=old.device),
                "n_correct_measured": c.sum().to(acc),
                "n_incorrect_measured": inc.sum().to(acc),
                "delta_correct_sum": rsum(c, d_sum),
                "delta_incorrect_sum": rsum(inc, d_sum),
                "delta_correct_per_token_sum": rsum(c, pt),
                "delta_incorrect_per_token_sum": rsum(inc, pt),
                "n_correct_displaced": (c & (d_sum < 0)).sum().to(acc),
                "n_correct_tokens_displaced": rsum(c, n_neg),
                "n_correct_tokens": rsum(c, n_tok),
                "delta_first_action_sum": rsum(c_first, d_first),
                "n_correct_first_action": c_first.sum().to(acc),
                "delta_later_actions_sum": rsum(c, d_later),
                "n_correct_later_actions": rsum(c, (n_actions - 1).clamp(min=0)),
            }
        )
    return torch.stack([out[name] for name in SUM_FIELDS])


def stats_from_sums(sums: torch.Tensor) -> LLDStats:
    """Finish :func:`displacement_sums` (possibly summed over ranks) into :class:`LLDStats`."""
    if not isinstance(sums, torch.Tensor) or sums.shape != (len(SUM_FIELDS),):
        shape = tuple(sums.shape) if isinstance(sums, torch.Tensor) else type(sums).__name__
        raise ValueError(
            f"sums must be the [{len(SUM_FIELDS)}] tensor from displacement_sums, got {shape}"
        )
    s = sums if sums.is_floating_point() else sums.to(_acc_dtype(sums.device))

    def g(name: str) -> torch.Tensor:
        return s[_IDX[name]]

    nan = torch.full((), math.nan, dtype=s.dtype, device=s.device)
    measured = g("n_measured_shards") > 0

    def disp(v: torch.Tensor) -> torch.Tensor:
        return torch.where(measured, v, nan)

    # 0/0 -> NaN is exactly the "empty group" rule.
    return LLDStats(
        logp_correct=g("logp_correct_sum") / g("n_correct"),
        logp_incorrect=g("logp_incorrect_sum") / g("n_incorrect"),
        logp_first_action=g("logp_first_action_sum") / g("n_first_action"),
        logp_later_actions=g("logp_later_actions_sum") / g("n_later_actions_responses"),
        delta_correct=disp(g("delta_correct_sum") / g("n_correct_measured")),
        delta_incorrect=disp(g("delta_incorrect_sum") / g("n_incorrect_measured")),
        delta_correct_per_token=disp(g("delta_correct_per_token_sum") / g("n_correct_measured")),
        delta_incorrect_per_token=disp(
            g("delta_incorrect_per_token_sum") / g("n_incorrect_measured")
        ),
        frac_correct_displaced=disp(g("n_correct_displaced") / g("n_correct_measured")),
        frac_tokens_displaced=disp(g("n_correct_tokens_displaced") / g("n_correct_tokens")),
        delta_first_action=disp(g("delta_first_action_sum") / g("n_correct_first_action")),
        delta_later_actions=disp(g("delta_later_actions_sum") / g("n_correct_later_actions")),
        n_correct=disp(g("n_correct_measured")),
        n_incorrect=disp(g("n_incorrect_measured")),
    )


def likelihood_displacement(
    *,
    logp_old: torch.Tensor,
    logp_new: torch.Tensor | None,
    mask: torch.Tensor,
    rewards: torch.Tensor | None = None,
    advantages: torch.Tensor | None = None,
    correct_threshold: float = 1.0,
    action_ids: torch.Tensor | None = None,
) -> LLDStats:
    """The step's confidence and displacement statistics of one batch (see :class:`LLDStats`).

    ``logp_old``/``logp_new``/``mask`` [B, L]; ``rewards`` or ``advantages`` [B]. Correct =
    ``reward >= correct_threshold``, or ``advantage > 0`` when no rewards are given.

    A response is displaced when its summed change is strictly below zero (an unchanged one is
    not).

    Readings of the column definitions: ``logp_first_action`` / ``logp_later_actions`` average,
    over the responses that have them, the per-token mean ``logp_old`` of the first action / of
    all tokens of the 2nd..last actions; ``delta_first_action`` averages the first action's
    summed change over correct responses; ``delta_later_actions`` averages the summed change of
    each later action over all (correct response, later action) pairs.
    """
    _check_2d("logp_old", logp_old)
    correct = correct_mask(rewards, advantages, correct_threshold)
    if correct.device != logp_old.device:
        correct = correct.to(logp_old.device)
    sums = displacement_sums(
        logp_old=logp_old, logp_new=logp_new, mask=mask, correct=correct, action_ids=action_ids
    )
    return stats_from_sums(sums)


def top_displaced_tokens(
    logp_old: torch.Tensor,
    logp_new: torch.Tensor,
    mask: torch.Tensor,
    k: int,
    correct: torch.Tensor | None = None,
    token_ids: torch.Tensor | None = None,
    *,
    action_ids: torch.Tensor | None = None,
    rewards: torch.Tensor | None = None,
    advantages: torch.Tensor | None = None,
    only_correct: bool = True,
) -> list[dict]:
    """The ``k`` generated tokens whose log-prob fell most, most displaced first.

    Tensors [B, L] / [B]. With ``correct`` given and ``only_correct``, candidates are the tokens
    of correct responses (the LLD signal). Rows use columns.TOKEN_COLUMNS keys (response,
    position, token_id, action, generated, logp_old, delta, and correct/reward/advantage when
    known); the caller adds step and text. Only tokens whose change is negative are returned.
    """
    _check_2d("logp_old", logp_old)
    _check_float("logp_old", logp_old)
    _check_2d("logp_new", logp_new, logp_old.shape)
    _check_float("logp_new", logp_new)
    _check_device("logp_new", logp_new, logp_old)
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"k must be a non-negative int, got {k!r}")
    m = _bool_mask(mask, logp_old)
    batch, length = logp_old.shape
    for name, t in (("correct", correct), ("rewards", rewards), ("advantages", advantages)):
        if t is not None:
            _check_rows(name, t, batch, logp_old)
    if token_ids is not None:
        _check_2d("token_ids", token_ids, logp_old.shape)
        _check_device("token_ids", token_ids, logp_old)
    k = min(k, batch * length)
    if k == 0:
        return []
    ids = _effective_action_ids(action_ids, m, logp_old)
    if ids is None:
        ids = _action_ids_of(m)
    cand = m if (correct is None or not only_correct) else m & correct.bool()[:, None]  # [B, L]
    diff = _work(logp_new) - _work(logp_old)  # [B, L]
    inf = torch.full((), math.inf, dtype=diff.dtype, device=diff.device)
    keyed = torch.where(cand & (diff < 0), diff, inf).reshape(-1)  # [B*L]
    vals, flat = torch.topk(keyed, k, largest=False, sorted=True)  # [k]
    rows, pos = flat // length, flat % length  # [k]
    acc = _acc_dtype(logp_old.device)
    tok = token_ids[rows, pos] if token_ids is not None else torch.full_like(rows, -1)  # [k]
    cols: list[tuple[str, torch.Tensor]] = [
        (C.TOK_RESPONSE, rows),
        (C.TOK_POSITION, pos),
        (C.TOK_TOKEN_ID, tok),
        (C.TOK_ACTION, ids[rows, pos]),
        (C.TOK_LOGP_OLD, logp_old[rows, pos]),
        (C.TOK_DELTA, vals),
    ]
    if correct is not None:
        cols.append((C.TOK_CORRECT, correct[rows]))
    if rewards is not None:
        cols.append((C.TOK_REWARD, rewards[rows]))
    if advantages is not None:
        cols.append((C.TOK_ADVANTAGE, advantages[rows]))
    table = torch.stack([t.to(acc) for _, t in cols] + [torch.isfinite(vals).to(acc)], dim=1)
    int_cols = {C.TOK_RESPONSE, C.TOK_POSITION, C.TOK_TOKEN_ID, C.TOK_ACTION}
    out: list[dict] = []
    for values in table.tolist():
        if values[-1] == 0.0:  # fewer candidates than k
            break
        row: dict = {C.TOK_GENERATED: 1}
        for (name, _), v in zip(cols, values):
            if name in int_cols:
                row[name] = int(v)
            elif name == C.TOK_CORRECT:
                row[name] = bool(v)
            else:
                row[name] = float(v)
        out.append(row)
    return out
